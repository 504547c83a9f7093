"""grpo-vram-mincard end to end on CPU: the tiny model's lineup, children replaced by a stand-in that applies the
`simulated_need_bytes` test double (tests/sweeps/mincard_fake_child.py), the rows, the kept runs and resuming;
the child's limit hook itself (run_one), and on a GPU the real torch limit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweeps import records
from sweeps.mincard import cli, lineup, trials
from sweeps.runner import memory_limit, run_one

REPO = Path(__file__).resolve().parents[2]
NEED = 200_000_000
MIB = 1 << 20
TINY = ["model.name=tiny-2M", "device=cpu", "trainer.dtype=float32", "trainer.bf16=false"]


def _args(tmp_path, *extra):
    return [
        "--rows",
        "r00",
        "--cap-gib",
        "0.5",
        "--device-total-bytes",
        str(8 << 30),
        "--context-gib",
        "0",
        "--simulated-need-bytes",
        str(NEED),
        "--child-module",
        "mincard_fake_child",
        "--results-dir",
        str(tmp_path / "res"),
        "--log-dir",
        str(tmp_path / "logs"),
        *extra,
        *TINY,
    ]


@pytest.fixture
def fake_child_path(monkeypatch):
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), here, os.environ.get("PYTHONPATH", "")]))


def _kept(tmp_path, *runs: tuple[int, str]) -> Path:
    """The kept runs a cut lease leaves behind for r00: (limit, "ok" | "oom") in order; the trials file."""
    job = lineup.entries(["r00"], TINY)[0].job
    path = trials.trials_path(tmp_path / "res" / "mincard.jsonl")
    ok = {"status": "ok", "observed": {"probes": {"torch_cuda": {"available": True, "peak_allocated_bytes": 160_000_000, "peak_reserved_bytes": 210_000_000}}}, "versions": records.package_versions(), "device": {"type": "cpu", "name": "fake", "total_bytes": 1}}  # fmt: skip
    for limit, status in runs:
        result = ok if status == "ok" else {"status": "oom", "error": "x"}
        trials.record(path, trials.trial_line(job.key, "mincard", limit, result, 1.0))
    return path


def _with_history(kept: list[dict]) -> list[int]:
    """The limits of the kept runs that carried the history probe (a failed run keeps no result)."""
    probes = [k.get("result", {}).get("observed", {}).get("probes", {}) for k in kept]
    return [k["trial"]["limit_bytes"] for k, p in zip(kept, probes, strict=True) if "history" in p]


def test_search_finds_the_simulated_need_writes_one_row_and_a_rerun_skips_it(
    tmp_path, fake_child_path, capsys
):
    assert cli.main(_args(tmp_path)) == 0
    rows = records.load_rows(tmp_path / "res" / "mincard.jsonl")
    assert len(rows) == 1 and records.validate_row(rows[0]) == []
    m = rows[0]["mincard"]
    # 200,000,000 B is 190.7 MiB: the smallest passing limit on the 2 MiB grid is 192 MiB
    assert NEED <= m["min_torch_bytes"] <= NEED * 1.015 and m["min_torch_bytes"] == 192 * MIB
    assert m["max_failing_bytes"] == 190 * MIB and m["baseline"]["limit_bytes"] == 512 * MIB
    assert m["baseline"]["peak_reserved_bytes"] == int(NEED * 1.05)
    kept = records.load_rows(trials.trials_path(tmp_path / "res" / "mincard.jsonl"))
    assert [k["trial"]["limit_bytes"] for k in kept] == [t["limit_bytes"] for t in m["limits_tried"]]
    capsys.readouterr()
    assert cli.main(_args(tmp_path)) == 0
    assert "skip r00" in capsys.readouterr().out
    assert len(records.load_rows(trials.trials_path(tmp_path / "res" / "mincard.jsonl"))) == len(kept)


def test_the_baseline_run_alone_gets_the_history_probe_when_its_limit_is_off_the_grid(
    tmp_path, fake_child_path
):
    # a cap of 0.4321 GiB (442.5 MiB) is off the 2 MiB grid: the baseline runs at 444 MiB, and it is that run,
    # and no other, that must carry the history probe (the stand-in reports a probe it was asked for)
    assert cli.main(_args(tmp_path, "--cap-gib", "0.4321")) == 0
    kept = records.load_rows(trials.trials_path(tmp_path / "res" / "mincard.jsonl"))
    assert kept[0]["trial"]["limit_bytes"] == 444 * MIB and _with_history(kept) == [444 * MIB]


def test_a_cut_search_resumes_from_the_kept_runs(tmp_path, fake_child_path):
    # what a lease cut after the baseline and one failing run leaves behind
    path = _kept(tmp_path, (512 * MIB, "ok"), (170 * MIB, "oom"))
    assert cli.main(_args(tmp_path)) == 0
    limits = [k["trial"]["limit_bytes"] for k in records.load_rows(path)]
    assert limits[:2] == [512 * MIB, 170 * MIB] and len(limits) == len(set(limits))  # none run again
    row = records.load_rows(tmp_path / "res" / "mincard.jsonl")[0]
    assert row["mincard"]["min_torch_bytes"] == 192 * MIB


def test_a_resumed_search_without_a_stream_runs_its_baseline_limit_again_with_the_probe(
    tmp_path, fake_child_path, monkeypatch
):
    # a lease cut after the baseline, which recorded no stream: the resumed search's first round holds the baseline
    # limit again, that run alone carrying the history probe, and the search's answer is unchanged
    monkeypatch.setattr(cli.Searches, "stream_missing", lambda self, job: True)
    path = _kept(tmp_path, (512 * MIB, "ok"))
    assert cli.main(_args(tmp_path)) == 0
    kept = records.load_rows(path)
    assert (
        _with_history(kept) == [512 * MIB] and [k["trial"]["limit_bytes"] for k in kept].count(512 * MIB) == 2
    )
    assert records.load_rows(tmp_path / "res" / "mincard.jsonl")[0]["mincard"]["min_torch_bytes"] == 192 * MIB


def test_a_resumed_search_whose_baseline_failed_records_its_stream_at_its_largest_pass(
    tmp_path, fake_child_path, monkeypatch
):
    # a cap of 0.15 GiB puts the baseline at 154 MiB, under the 190.7 MiB the runs need: the stream goes to the
    # largest limit passed (232 MiB), never to a limit known to fail
    monkeypatch.setattr(cli.Searches, "stream_missing", lambda self, job: True)
    path = _kept(tmp_path, (154 * MIB, "oom"), (232 * MIB, "ok"))
    assert cli.main(_args(tmp_path, "--cap-gib", "0.15")) == 0
    kept = records.load_rows(path)
    assert _with_history(kept) == [232 * MIB]
    assert [k["trial"]["limit_bytes"] for k in kept].count(154 * MIB) == 1


def test_a_cpu_search_never_asks_for_a_stream(tmp_path):
    # the history probe records only on CUDA: a CPU lineup never adds a run for it
    args = cli._parser().parse_args(_args(tmp_path))
    job = lineup.entries(["r00"], TINY)[0].job
    assert job.config.device == "cpu" and not cli.Searches(args, [], tmp_path, None).stream_missing(job)


def test_a_gpu_search_asks_for_a_stream_until_its_key_is_in_the_stream_index(tmp_path):
    args = cli._parser().parse_args(_args(tmp_path))
    out = tmp_path / "streams"
    job = lineup.entries(["r00"], ["model.name=tiny-2M", "device=cuda", f"+probe.history.out_dir={out}"])[
        0
    ].job
    searches = cli.Searches(args, [], tmp_path, None)
    assert searches.stream_missing(job)
    records.append_row(out / "index.jsonl", {"key": "another", "config": {}})
    assert searches.stream_missing(job)
    records.append_row(out / "index.jsonl", {"key": job.key, "config": {}})
    assert not searches.stream_missing(job)
    args.baseline_probes = "host"  # the probe not asked for: no stream wanted
    assert not searches.stream_missing(job)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--k", "0"], "--k=0"),
        (["--rows", "r99"], "'r99'"),
        (["--resolution", "2"], "--resolution=2.0"),
        (["--k", "100000000000"], "--k=100000000000"),
        (["--cap-gib", "1e300"], "--cap-gib=1e+300"),
        (["--device-total-bytes", str(1 << 60)], f"--device-total-bytes={1 << 60}"),
        (["--rows", ""], "--rows=''"),
        (["--leave-gib", "-1"], "--leave-gib=-1.0"),
        (["--leave-gib", "7.6"], "--leave-gib=7.6"),  # more than the 8 GiB card's usable 7.6 GiB
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, named):
    assert cli.main(_args(tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "accepted" in err[0]


def test_a_search_on_a_share_of_the_card_that_fits_nowhere_stays_open_for_the_whole_card(
    tmp_path, fake_child_path, capsys
):
    # 8 GiB x 0.95 less 7.5 GiB left to other work: 102 MiB for the search, under the 190.7 MiB it needs
    assert cli.main(_args(tmp_path, "--leave-gib", "7.5")) == 0
    assert not (tmp_path / "res" / "mincard.jsonl").exists()  # no oom row: that would be final
    assert "left for a search with the whole card" in capsys.readouterr().out
    kept = trials.load(
        trials.trials_path(tmp_path / "res" / "mincard.jsonl"), lineup.entries(["r00"], TINY)[0].job.key, None
    )
    assert kept and all(k["trial"]["status"] == "oom" for k in kept)
    # the whole card resumes from those runs and finds the need
    assert cli.main(_args(tmp_path)) == 0
    rows = records.load_rows(tmp_path / "res" / "mincard.jsonl")
    assert len(rows) == 1 and rows[0]["mincard"]["min_torch_bytes"] == 192 * MIB


def test_the_child_fails_under_a_limit_below_the_simulated_need(tmp_path):
    spec = {"config": {"model": "tiny-2M", "device": "cpu"}, "result_path": str(tmp_path / "r.json"),
            "workdir": str(tmp_path / "w"), "memory_limit_bytes": 100, "simulated_need_bytes": 101}  # fmt: skip
    assert run_one.main([json.dumps(spec)]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["status"] == "oom" and "simulated" in result["error"]
    assert result["memory_limit"]["limit_bytes"] == 100


def test_limit_values_and_the_fraction():
    for limit in (2 * MIB, 6 * (1 << 30), 13_026 * MIB, 79 * (1 << 30)):
        assert int(memory_limit.fraction_for(limit, 85_520_809_984) * 85_520_809_984) == limit
    with pytest.raises(ValueError, match="memory_limit_bytes=-1"):
        memory_limit.spec_value({"memory_limit_bytes": -1}, "memory_limit_bytes")
    assert memory_limit.simulated_fails(99, 100) and not memory_limit.simulated_fails(100, 100)
    assert not memory_limit.simulated_fails(None, 100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the torch limit needs a CUDA device")
def test_a_real_limit_holds_the_reserved_total():
    code = (
        "import torch\n"
        "from sweeps.runner import memory_limit\n"
        "seen = memory_limit.apply({'memory_limit_bytes': 512 << 20}, 'cuda')\n"
        "assert seen['applied']\n"
        "a = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\n"
        "try:\n"
        "    torch.empty(300 << 20, dtype=torch.uint8, device='cuda')\n"
        "    print('passed')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('oom', torch.cuda.memory_reserved())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[0] == "oom", out.stderr[-2000:]
    assert int(out.stdout.split()[1]) <= 512 << 20


def test_a_kept_run_that_is_not_a_run_is_skipped_with_a_note(tmp_path, fake_child_path, capsys):
    path = _kept(tmp_path, (512 * MIB, "ok"), (170 * MIB, "oom"))
    good = records.load_rows(path)[0]
    records.append_row(path, {**good, "trial": {**good["trial"], "limit_bytes": "lots"}, "written_at": None})
    assert cli.main(_args(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "1 trial.limit_bytes is not a positive integer (first: line 3)" in err
    assert records.load_rows(tmp_path / "res" / "mincard.jsonl")[0]["mincard"]["min_torch_bytes"] == 192 * MIB
