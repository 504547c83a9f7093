"""The FakeTensorMode trace of GRPO steps agrees with the same steps on real CPU tensors, and is plausible at size."""

from __future__ import annotations

import json

import pytest

from estimator.catalog import resolve_model
from estimator.config import RunConfig

pytestmark = pytest.mark.slow

TINY = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 8000,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}


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
def test_fake_trace_matches_real_cpu_run(tiny_path, extra):
    from sweeps.trace import step

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
    assert fake["peak_bytes"] == pytest.approx(real["peak_bytes"], rel=0.01)
    for ph in ("generate", "score", "train", "optimizer"):
        assert fake["phases"][ph] == pytest.approx(real["phases"][ph], rel=0.01), ph


def test_mid_config_trace_has_four_phases_in_plausible_order():
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
    w = resolve_model("0.5B").total_params * 2  # bf16 weights, from the estimator's exact count
    assert set(obs["phases"]) == {"generate", "score", "train", "optimizer"}
    s1, s2 = obs["steps"]["1"], obs["steps"]["2"]
    assert w <= s1["generate"] < 1.5 * w  # no optimizer state before the first step
    assert s2["generate"] >= 3 * w  # params + AdamW exp_avg + exp_avg_sq (bf16) resident from step 2
    assert s2["train"] >= 4 * w and s2["optimizer"] >= 4 * w  # + full gradients
    assert obs["peak_bytes"] == max(obs["phases"].values())
    assert obs["at_peak_by_label"]["param"] == w


def test_bad_trace_input_is_one_line_and_exit_2(capsys):
    from sweeps.trace.cli import main

    assert main(["--model", "9B"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'9B'" in err[0]
    assert main(["--gens", "3", "--per-device-train-batch-size", "4"]) == 2
    assert "divisible by num_generations (3)" in capsys.readouterr().err
