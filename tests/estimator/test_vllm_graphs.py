"""Where vLLM's CUDA graphs sit follows the vLLM a TRL release accepts: from vLLM 0.21 `determine_available_memory`
charges them to gpu_memory_utilization (the KV pool is that much smaller, the footprint is the request); before,
they are captured after the KV cache, beyond the request. TRL 0.24-0.29 pin vLLM 0.10.2-0.12.0, 1.0-1.9 accept
0.10.2 up to 0.25.1 (counted both ways), 1.16 accepts 0.22-0.31 (trl/import_utils.py of each release)."""

from __future__ import annotations

import json

import pytest
from cli_json import run

from estimator.terms.vllm import CUDA_GRAPH_BYTES

ARGV = ["--model", "Qwen/Qwen3-1.7B", "--dtype", "bfloat16", "--use-vllm", "--vllm-mode", "colocate",
        "--vllm-gpu-memory-utilization", "0.3", "--per-device-train-batch-size", "8", "--num-generations", "8",
        "--max-prompt-length", "256", "--max-completion-length", "512", "--gpu", "A100-80", "--json"]  # fmt: skip


def _vllm(release: str, capsys) -> dict:
    code, out, err = run([*ARGV, "--trl-version", release], capsys)
    assert code in (0, 1), err
    return json.loads(out)["layout"]["vllm"]


@pytest.mark.parametrize(
    ("release", "charged", "on_top"),
    [("0.27", False, True), ("1.5", True, True), ("1.16", True, False)],
)
def test_cuda_graphs_sit_where_the_releases_vllm_puts_them(release, charged, on_top, capsys):
    v, newest = _vllm(release, capsys), _vllm("1.16", capsys)
    assert v["cuda_graphs"] == (CUDA_GRAPH_BYTES if charged else 0)
    assert v["graphs_on_top"] == (CUDA_GRAPH_BYTES if on_top else 0)
    # the KV pool is the request less what is charged to it: larger by the graphs where they are not charged
    assert v["kv_cache"] - newest["kv_cache"] == (0 if charged else CUDA_GRAPH_BYTES)
