"""DeepSpeed ZeRO's own buffers (DeepSpeed 0.19.8 stage3.py / stage_1_and_2.py / config.py), worked by hand for
Qwen2.5-7B (7,615,616,512 parameters) in bf16 over 8 GPUs."""

from __future__ import annotations

import json

from cli_json import estimate

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate as run_estimate
from estimator.terms import deepspeed_buffers as ds

P = 7_615_616_512
SHARE = -(-P // 8)  # 951,952,064 elements per rank


def phases(**kw) -> dict:
    return run_estimate(RunConfig(model="7B", num_gpus=8, **kw)).phases


def test_zero3_holds_its_gradient_partitions_and_reduce_bucket_in_every_phase():
    got = phases(sharding="zero3")
    for name, comps in got.items():
        # grad_partitions_flat_buffer: one bf16 slot per partition element, never freed
        assert comps["gradients"] >= SHARE * 2, name
        # reduce_bucket_size 5e8 (DeepSpeed's default: accelerate's own DeepSpeed config names none), bf16
        assert comps["zero_reduce_buckets"] == 500_000_000 * 2, name
    assert got["generate"]["gradients"] == SHARE * 2  # nothing else holds .grad while generating
    # the optimizer step flattens the partition (one sub-group: 952 M < 1e9) into bf16, then fp32
    assert got["optimizer"]["optimizer_temporaries"] == SHARE * (2 + 4)


def test_optimizer_offload_moves_the_partitions_and_the_step_to_the_host():
    got = phases(sharding="zero3", offload_optimizer=True)
    assert got["generate"].get("gradients", 0) == 0
    assert got["optimizer"].get("optimizer_temporaries", 0) < SHARE * 6
    assert got["generate"]["zero_reduce_buckets"] == 10**9  # the bucket stays on the GPU


def test_zero2_keeps_one_reduce_bucket_in_backward_and_copies_at_the_step():
    got = phases(sharding="zero2")
    # setup_buckets at the first gradient, _release_ipg_buffers at the backward's end
    assert got["train"]["zero_reduce_buckets"] == 10**9
    for name in ("generate", "score", "optimizer"):
        assert got[name].get("zero_reduce_buckets", 0) == 0, name
    assert got["optimizer"]["optimizer_temporaries"] == SHARE * 6
    assert got["generate"].get("gradients", 0) == 0  # ZeRO-2's partitions live from backward to the step


def test_a_json_reduce_bucket_auto_is_hidden_squared(tmp_path, capsys):
    # transformers fills "auto" with hidden_size^2 (integrations/deepspeed.py trainer_config_process)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}))
    got = estimate(["--model", "7B", "--gpus", "8", "--config", str(path)], capsys)
    assert got["phases"]["generate"]["zero_reduce_buckets"] == 3584**2 * 2
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": 2e8}}))
    got = estimate(["--model", "7B", "--gpus", "8", "--config", str(path)], capsys)
    assert got["phases"]["generate"]["zero_reduce_buckets"] == 2 * 10**8 * 2


def test_zero2_with_overlap_comm_keeps_two_buckets(tmp_path, capsys):
    # stage_1_and_2.py setup_buckets: a second buffer with overlap_comm (a common JSON's "overlap_comm": true)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": True}}))
    got = estimate(["--model", "7B", "--gpus", "8", "--config", str(path)], capsys)
    assert got["phases"]["train"]["zero_reduce_buckets"] == 2 * 500_000_000 * 2
    assert phases(sharding="zero3", zero_overlap_comm=True)["generate"]["zero_reduce_buckets"] == 10**9


# Qwen2.5-1.5B-Instruct: 1,543,714,304 parameters, tied embedding 151,936 x 1,536 = 233,373,696 elements, the
# largest decoder linear 8,960 x 1,536 = 13,762,560 elements (its config.json)
P15, EMB15, MLP15 = 1_543_714_304, 151_936 * 1_536, 8_960 * 1_536


def _offload_step(sharding: str) -> tuple[dict, str]:
    est = run_estimate(
        RunConfig(
            model="Qwen/Qwen2.5-1.5B-Instruct",
            sharding=sharding,
            offload_optimizer=True,
            offload_param=sharding == "zero3",
            max_prompt_length=256,
            max_completion_length=256,
        )
    )
    instant = next(n for n in est.notes if n.startswith("train peak instant")).split(": ")[1]
    return est.phases["train"], instant


def test_zero2_offload_peaks_when_the_embedding_gradient_leaves_in_fp64():
    # the backward's end: bf16 weights, stage_1_and_2.py's GPU staging buffer (2 bytes x the largest parameter),
    # the 5e8-element bf16 bucket, and set_norm_for_param_grad_in_gpu's fp64 copy of the embedding's gradient
    train, instant = _offload_step("zero2")
    assert instant == "offload_epilogue"
    on_gpu = sum(v for k, v in train.items() if k != "rollout_buffers")
    assert on_gpu == 2 * P15 + 2 * EMB15 + 500_000_000 * 2 + 8 * EMB15
    assert train["offload_gradient_copies"] == 8 * EMB15


def test_zero3_offload_copies_the_partition_back_and_norms_it_in_pieces():
    # partition_grads: the 16-bit partition copied back to the GPU, and _constant_buffered_norm2's fp64 piece
    # (at most 2.5e8 elements); at the end beside the embedding's full 16-bit gradient; no stage_1_and_2 staging
    train, _ = _offload_step("zero3")
    assert "offload_staging" not in train
    cfg = RunConfig(model="Qwen/Qwen2.5-1.5B-Instruct", sharding="zero3", offload_optimizer=True)
    arch = resolve_model(cfg.model)
    assert ds.offload_epilogue(cfg, arch)["offload_gradient_copies"] == 2 * EMB15 + 8 * EMB15 + 2 * EMB15
    assert ds.offload_backward_transient(cfg, arch) == 2 * MLP15 + 8 * MLP15


def test_no_offload_no_gradient_copies():
    assert "offload_gradient_copies" not in phases(sharding="zero2")["train"]
