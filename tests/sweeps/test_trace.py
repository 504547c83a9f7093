"""The FakeTensorMode trace of GRPO steps agrees with the same steps on real CPU tensors, and is plausible at size."""

from __future__ import annotations

import json

import pytest
from tiny_configs import TINY_QWEN2

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig

pytestmark = pytest.mark.slow
TRACED_PACKAGES = {"torch", "transformers", "trl", "accelerate", "peft"}

TINY = TINY_QWEN2


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("tiny") / "config.json"
    p.write_text(json.dumps(TINY))
    return str(p)


@pytest.mark.parametrize(
    "extra",
    [
        {"dtype": "float32"},
        {"dtype": "bfloat16", "use_peft": True, "beta": 0.04, "gradient_checkpointing": False},
    ],
    ids=["full-fp32", "lora-beta-nogc"],
)
def test_fake_trace_matches_real_cpu_run(tiny_path, extra, tmp_path, monkeypatch):
    import tempfile

    from sweeps.trace import step

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the trainer's output_dir is created

    cfg = RunConfig(
        model=tiny_path,
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=24,
        max_completion_length=32,
        device="cpu",
        **extra,
    )
    fake = step.run(cfg, fake=True).observed
    real = step.run(cfg, fake=False).observed
    assert list(tmp_path.glob("grpo-vram-trace-*")) == []  # the trainer's output_dir is removed afterwards
    assert fake["peak_bytes"] == pytest.approx(real["peak_bytes"], rel=0.01)
    for ph in ("generate", "score", "train", "optimizer"):
        assert fake["phases"][ph] == pytest.approx(real["phases"][ph], rel=0.01), ph


def test_mid_config_trace_matches_hand_counted_bytes():
    from sweeps.trace import step

    cfg = RunConfig(
        model="0.5B",
        dtype="bfloat16",
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=64,
        max_completion_length=64,
        device="cpu",  # no 512-byte rounding, so byte counts compare exactly
    )
    obs = step.run(cfg, fake=True).observed
    # Qwen2.5-0.5B by hand: H 896, I 4864, 24 layers, 14 heads / 2 KV heads of 64, vocab 151936, tied embeddings.
    # Per layer q 896·896+896, k and v 896·128+128, o 896·896, MLP 3·896·4864, 2 norms 896 -> 20,548,992;
    # × 24 + embedding 151936·896 + final norm 896 = 494,032,768 params, 290 parameter tensors (12 per layer + 2).
    w = 2 * 494_032_768  # bf16 weights
    assert resolve_model("0.5B").total_params * 2 == w
    states = 2 * w + 290 * 4  # AdamW exp_avg + exp_avg_sq in the param dtype, + one fp32 `step` per tensor
    assert set(obs["phases"]) == {"generate", "score", "train", "optimizer"}
    s1, s2 = obs["steps"]["1"], obs["steps"]["2"]
    # Generate peak, step 1 (no optimizer state yet), at the last decode step's sampling: KV cache of P + C - 1 =
    # 127 positions, 2 · 24 · 4 seqs · 128 · 127 · 2 B = 6,242,304, + three fp32 [4, 151936] logits (accelerate's
    # fp32 copy, `_sample`'s copy, softmax probs) 7,292,928 = 13,535,232; + int64 ids and mask [4, 128] (8,192)
    # and scalars: allow 16 KiB.
    gen = 6_242_304 + 7_292_928
    assert gen <= s1["generate"] - w <= gen + 16 * 1024
    # The buffered rollout batch: int64 ids and masks [4, 64] × 4 = 8,192, fp32 advantages [4] and an int64
    # count = 24 -> 8,216 B. Step 2 generates the same way with the optimizer state and step 1's batch resident
    # (the trainer drops it only when the next batch is scored).
    rollout = 8_216
    assert s2["generate"] - s1["generate"] == states + rollout
    # Optimizer step 2: params + grads + states + the rollout batch + rotary inv_freq buffers (2 × 32 fp32 = 256)
    assert s2["optimizer"] == 2 * w + states + rollout + 256
    # Peak (step 2, backward): params + grads + states + the tied embedding's dense gradient [151936, 896] bf16
    # and its bf16 copy for the shared lm_head (2 × 272,269,312), + the same rollout batch, buffers and scalars.
    peak = 2 * w + states + 2 * 151936 * 896 * 2
    assert peak <= obs["peak_bytes"] <= peak + 16 * 1024
    assert obs["peak_phase"] == "train"
    assert (
        sum(obs["at_peak_by_label"].values()) == obs["peak_bytes"]
    )  # the snapshot at the peak adds up to it
    assert obs["at_peak_by_label"]["param"] == w


def test_a_trace_leaves_torch_transformers_and_trl_as_it_found_them(tiny_path):
    """Every callable of every torch / transformers / TRL / accelerate / PEFT module (and of the classes they
    define), the RNG states and the environment are the same objects and values after a traced run."""
    import os
    import random
    import sys
    import types

    import numpy as np
    import torch

    from sweeps.trace import step

    cfg = RunConfig(
        model=tiny_path,
        dtype="bfloat16",
        use_peft=True,
        beta=0.04,
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=24,
        max_completion_length=32,
        device="cpu",
    )
    step.run(cfg, fake=True)  # first run: imports everything the trace imports

    def snapshot() -> dict:
        out = {}
        for name, mod in list(sys.modules.items()):
            if not isinstance(mod, types.ModuleType) or name.split(".")[0] not in TRACED_PACKAGES:
                continue
            for k, v in list(vars(mod).items()):
                if callable(v):
                    out[name, k] = v
                if isinstance(v, type) and v.__module__ == name:
                    out.update(
                        {(f"{name}.{v.__name__}", a): b for a, b in list(vars(v).items()) if callable(b)}
                    )
        return out

    before, env = snapshot(), dict(os.environ)
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.random.get_rng_state())
    step.run(cfg, fake=True)
    after = snapshot()
    assert len(before) > 10_000
    assert sorted(k for k, v in before.items() if after.get(k, v) is not v) == []
    assert dict(os.environ) == env
    assert random.getstate() == rng[0]
    assert (np.random.get_state()[1] == rng[1]).all()
    assert torch.equal(torch.random.get_rng_state(), rng[2])


def test_bad_trace_input_is_one_line_and_exit_2(capsys):
    from sweeps.trace.cli import main

    assert main(["one", "--model", "9B"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'9B'" in err[0]
    assert main(["one", "--gens", "3", "--per-device-train-batch-size", "4"]) == 2
    assert "divisible by num_generations (3)" in capsys.readouterr().err
