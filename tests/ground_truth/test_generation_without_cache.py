"""Generation without a KV cache, against the installed transformers' own `generate`.

transformers 5.24's `generate` keeps no cache when the model's generation config resolves `use_cache` to False:
a `generation_config.json` that says `"use_cache": false` (what `save_pretrained` writes for a model built from a
config.json that says so), or no `generation_config.json` and such a config.json. TRL 1.16 passes its own
`GenerationConfig`, whose `use_cache` is unset unless `generation_kwargs` set it, so the checkpoint decides. Then
every step is a forward over the whole sequence so far. These tests pin that upstream behaviour (the runner says
`use_cache` explicitly, the tracer and the estimate follow `RunConfig.generation_use_cache`), check that the
tracer's loop runs the same forwards, and hold the estimate's largest step to a real one.
"""

from __future__ import annotations

import json

import pytest
import torch

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.step import single

B, P, C = 4, 96, 6
CONF = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "vocab_size": 64,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 1,
}


def _model(use_cache: bool, path=None):
    """A tiny model built from a config.json with `use_cache`, saved and loaded back when `path` is given."""
    import transformers

    torch.manual_seed(0)
    conf = transformers.AutoConfig.for_model(**(CONF | {"use_cache": use_cache}))
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    if path is None:
        return model
    model.save_pretrained(path)
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _forward_lengths(model, run) -> list[int]:
    """The sequence length of every forward `run()` makes, with gradient checkpointing on and the model in
    training mode (as TRL 1.16 generates inside a training step)."""
    lengths: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda mod, args, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    model.gradient_checkpointing_enable()
    model.config.use_cache = False  # what TRL sets beside gradient checkpointing
    model.train()
    try:
        with torch.no_grad():
            run()
    finally:
        hook.remove()
    return lengths


def _generate(model, **generation_kwargs) -> None:
    """`generate` as TRL 1.16 calls it: its own GenerationConfig (generation_kwargs on top), full length."""
    from transformers import GenerationConfig

    gc = GenerationConfig(
        max_new_tokens=C,
        min_new_tokens=C,
        do_sample=True,
        pad_token_id=0,
        disable_compile=True,
        **generation_kwargs,
    )
    ids = torch.randint(2, CONF["vocab_size"], (B, P))
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)


WHOLE = [P + i for i in range(C)]  # every forward over the whole sequence so far
CACHED = [P] + [1] * (C - 1)


def test_a_checkpoint_saying_use_cache_false_generates_without_a_cache(tmp_path):
    model = _model(False, tmp_path / "ckpt")
    written = json.loads((tmp_path / "ckpt" / "generation_config.json").read_text())
    assert written.get("use_cache") is False  # save_pretrained carried config.json's value over
    assert _forward_lengths(model, lambda: _generate(model)) == WHOLE
    # generation_kwargs={"use_cache": True} (the runner says it) brings the cache back
    assert _forward_lengths(model, lambda: _generate(model, use_cache=True)) == CACHED


def test_config_json_alone_decides_only_without_a_generation_config(tmp_path):
    import transformers

    _model(False, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "generation_config.json").unlink()

    bare = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert _forward_lengths(bare, lambda: _generate(bare)) == WHOLE
    # a generation_config.json that does not mention use_cache (a hub checkpoint's usual one) keeps the cache
    (tmp_path / "ckpt" / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 1})
    )
    silent = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert _forward_lengths(silent, lambda: _generate(silent)) == CACHED


@pytest.mark.parametrize("k", [C, 2], ids=["every-token", "fast-forward"])
def test_the_tracer_runs_the_forwards_generate_runs(k):
    from sweeps.trace.generate import generate

    model = _model(True)
    lengths = _forward_lengths(model, lambda: generate(model, B, P, C, bf16=False, k=k, use_cache=False))
    assert lengths == (WHOLE if k >= C - 1 else [P] + WHOLE[-k:])
    cached = _forward_lengths(model, lambda: generate(model, B, P, C, bf16=False, k=C, use_cache=True))
    assert cached == CACHED


def test_the_estimate_holds_the_largest_step_of_a_real_generate(tmp_path):
    """Bytes above the weights at generate's peak, counted op by op on a real no-cache generate, against the
    estimate's generate phase less what it holds through the step (fp32, no autocast: every tensor one dtype)."""
    from sweeps.probes.tensors import LiveStorageMode

    model = _model(False, tmp_path / "ckpt").eval()
    ids = torch.randint(2, CONF["vocab_size"], (B, P))
    from transformers import GenerationConfig

    gc = GenerationConfig(
        max_new_tokens=C, min_new_tokens=C, do_sample=True, pad_token_id=0, disable_compile=True
    )
    with torch.no_grad(), LiveStorageMode() as probe:
        probe.register(model)  # the weights (and views of them) are not the step's
        probe.set_phase("generate")
        before = probe.current_bytes
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        measured = probe.phase_peaks["generate"] - before

    arch = from_config(CONF | {"use_cache": False}, name="tiny")
    cfg = RunConfig(
        model="tiny",
        dtype="float32",
        bf16=False,
        per_device_train_batch_size=B,
        num_generations=B,
        max_prompt_length=P,
        max_completion_length=C,
        use_peft=True,  # no gradients or optimizer state to subtract
        generation_use_cache=False,
    )
    phase = single.generate_phase(cfg, arch)
    estimated = sum(v for k, v in phase.items() if k not in ("gradients", "gathered_weights"))
    # every tensor counted: the MLP's three [T, I] at T = B·(P + C - 1), the residuals and norm output, rotary's
    # tables, the int64 ids and masks, the previous step's [B, V] logits; the estimate's logits term is a little
    # larger than the three fp32 [B, V] copies the step keeps (it also counts the compute-dtype output)
    logits_slack = B * CONF["vocab_size"] * 2
    assert measured <= estimated <= measured + logits_slack, (measured, estimated)
