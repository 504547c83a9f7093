"""Rank 0 of a 2-rank FSDP2 GRPO trace of a tiny model: shards, optimizer state and gathers as FSDP2 lays them out."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from tiny_configs import TINY_QWEN2

from estimator.settings.config import RunConfig

pytestmark = pytest.mark.slow

TINY = {**TINY_QWEN2, "num_hidden_layers": 2}  # the tracer test's tiny Qwen2, two layers


def _rank0_shard_elements(n: int) -> int:
    """Σ ceil(dim0 / n) · rest over the Qwen2 parameters of TINY, written out by hand."""
    h, i, v, kv = 256, 704, 8000, 2 * 64

    def c(rows: int) -> int:
        return -(-rows // n)

    layer = (
        c(h) * h
        + c(h)  # q_proj weight + bias
        + 2 * (c(kv) * h + c(kv))  # k_proj, v_proj weight + bias
        + c(h) * h  # o_proj
        + 2 * c(i) * h  # gate_proj, up_proj
        + c(h) * i  # down_proj
        + 2 * c(h)  # input / post-attention norms
    )
    return 2 * c(v) * h + 2 * layer + c(h)  # embedding, lm_head, layers, final norm


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    from sweeps.trace import distributed

    p = tmp_path_factory.mktemp("tiny") / "config.json"
    p.write_text(json.dumps(TINY))
    cfg = RunConfig(
        model=str(p),
        dtype="bfloat16",
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=24,
        max_completion_length=32,
        device="cpu",
        num_gpus=2,
        sharding="fsdp",
    )
    # a temp folder of its own, so another process tracing at the same time cannot leave a folder in the count
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp_path_factory.mktemp("tmp"))
    try:
        result = distributed.run(cfg, distributed.Layout(2, "FULL_SHARD"))
        left = set(Path(tempfile.gettempdir()).glob("grpo-vram-trace-*"))
    finally:
        tempfile.tempdir = saved
    return result, left


def test_no_trainer_folder_is_left_behind(traced):
    assert traced[1] == set()


def test_rank0_holds_fp32_shards_and_fp32_adamw_state(traced):
    traced = traced[0]
    at_opt = traced.observed["phase_at_peak_by_label"]["optimizer"]
    shard = _rank0_shard_elements(2)
    assert at_opt["param"] == 4 * shard  # bf16 load upcast to fp32 by accelerate (mixed precision bf16)
    tensors = 2 + 2 * 12 + 1  # embedding, lm_head; 12 per layer (7 weights, 3 biases, 2 norms); final norm
    assert (
        at_opt["optimizer_state"] == 2 * 4 * shard + 4 * tensors
    )  # exp_avg, exp_avg_sq; one fp32 `step` each


def test_gathers_are_seen_and_params_counted_whole(traced):
    traced = traced[0]
    gen = traced.observed["phase_at_peak_by_label"]["generate"]
    assert gen.get("fsdp_unsharded_param", 0) > 0  # FSDP2's in-place storage resizes reached the probe
    assert (
        traced.params
        == 2 * 8000 * 256 + 2 * (256 * 256 * 2 + 2 * 128 * 256 + 256 + 2 * 128 + 3 * 704 * 256 + 512) + 256
    )


def test_layout_rejects_bad_values():
    from sweeps.trace.distributed import Layout

    with pytest.raises(ValueError, match="world_size"):
        Layout(1)
    with pytest.raises(ValueError, match="HYBRID_SHARD"):
        Layout(2, "HYBRID_SHARD")


def test_trace_cli_refuses_zero_up_front_with_the_reason(capsys):
    """`grpo-vram-trace one --gpus 2 --zero 2`: the rank-0 tracer cannot run DeepSpeed; one line says why, exit 2
    (a grid records such a config as a skipped row instead: `distributed.run`)."""
    from sweeps.trace.cli import main

    assert main(["one", "--model", "0.5B", "--gpus", "2", "--zero", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zero2" in err and "DeepSpeed" in err
