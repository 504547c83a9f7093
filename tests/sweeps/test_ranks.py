"""A run on several GPUs: the launcher's command, where each rank writes, and the one result the row gets."""

from __future__ import annotations

import sys
from pathlib import Path

from sweeps.runner import ranks


def test_one_process_runs_the_module_itself_several_under_torchs_launcher():
    assert ranks.launch_argv("m", Path("s.json"), 1) == [sys.executable, "-m", "m", "s.json"]
    assert ranks.launch_argv("m", Path("s.json"), 4) == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
        "m",
        "s.json",
    ]


def test_each_rank_writes_its_own_result_and_the_parent_finds_them(tmp_path):
    base = tmp_path / "result.json"
    assert ranks.result_path(base, {}) == base
    assert ranks.result_path(base, {"WORLD_SIZE": "2", "RANK": "1"}) == tmp_path / "result.json.rank1"
    for r in (0, 1, 10):
        (tmp_path / f"result.json.rank{r}").write_text("{}")
    (tmp_path / "result.json.rank1.tmp").write_text("{}")  # a write in flight is not a result
    assert list(ranks.rank_results(base)) == [0, 1, 10]


def test_each_rank_sees_its_own_gpu_as_device_0():
    env = {"WORLD_SIZE": "2", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}
    ranks.narrow_to_local_rank(env, "cuda")
    assert (env["CUDA_VISIBLE_DEVICES"], env["LOCAL_RANK"]) == ("6", "0")
    env = {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}  # the sweep left devices alone: the machine's second GPU
    ranks.narrow_to_local_rank(env, "cuda")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    for device, env in (("cpu", {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}), ("cuda", {"LOCAL_RANK": "0"})):
        before = dict(env)
        ranks.narrow_to_local_rank(env, device)
        assert env == before


def _ok(peak: int, phase: str = "train") -> dict:
    return {
        "status": "ok",
        "error": None,
        "observed": {"peak_bytes": peak, "peak_phase": phase, "phases": {}},
    }


def test_the_row_holds_the_largest_rank_and_every_ranks_peak():
    merged = ranks.merge({0: _ok(100), 1: _ok(120, "generate")}, 2)
    assert merged["observed"]["peak_bytes"] == 120 and merged["observed"]["rank"] == 1
    assert merged["observed"]["ranks"] == [
        {"rank": 0, "peak_bytes": 100, "peak_phase": "train"},
        {"rank": 1, "peak_bytes": 120, "peak_phase": "generate"},
    ]


def test_an_oom_on_any_rank_is_the_runs_outcome_and_a_missing_rank_an_error():
    broken = {"status": "error", "error": "RuntimeError: Connection closed by peer"}
    oom = {"status": "oom", "error": "OutOfMemoryError: CUDA out of memory"}
    merged = ranks.merge({0: broken, 1: oom}, 2)  # rank 0 fails because rank 1 ran out of memory
    assert merged["status"] == "oom" and merged["error"] == "rank 1: OutOfMemoryError: CUDA out of memory"
    assert ranks.merge({0: _ok(100)}, 2) == {"status": "error", "error": "rank 1 of 2 wrote no result"}
