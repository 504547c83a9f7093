"""`python -m sweeps.trace.streams --sample`: one row per traced draw, written as it finishes; a draw the tracer
cannot run is named on one line and the others go on; a rerun traces only what is missing."""

from __future__ import annotations

from types import SimpleNamespace

from sweeps import records
from sweeps.trace import step, streams


def test_a_failed_draw_keeps_the_others_and_a_rerun_retries_only_it(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(cfg, **kw):
        calls.append(cfg)
        if len(calls) == 2:
            raise RuntimeError("shape mismatch\nin layer 3")
        return SimpleNamespace(events=[("a", 1, 3 * 2**20), ("a", 2, 2**20), ("f", 1), ("f", 2)])

    monkeypatch.setattr(streams, "sample_skip", lambda cfg: None)
    monkeypatch.setattr(step, "run", fake_run)
    streams.sample(7, 4, tmp_path)
    out = capsys.readouterr().out
    rows, bad = records.read_index(tmp_path / streams.SAMPLED)
    assert (len(rows), bad) == (3, 0)
    assert sorted(r["draw"] for r in rows) == [0, 2, 3]
    assert {r["split"] for r in rows} == {"validation"}
    (line,) = [ln for ln in out.splitlines() if "not traced" in ln]
    assert line == "draw 7/1: not traced: RuntimeError: 'shape mismatch\\nin layer 3'"  # one line, escaped
    # the row holds the simulation: 3 MiB takes a 20 MiB large-pool segment (torch's kLargeBuffer), 1 MiB a 2 MiB
    # small-pool one (kSmallSize 1 MiB, kSmallBuffer 2 MiB)
    assert rows[0]["simulated"]["default"]["peak_reserved"] == 22 * 2**20

    calls.clear()
    streams.sample(7, 4, tmp_path)  # resumes: only the failed draw is traced again
    assert len(calls) == 1
    assert len(records.read_index(tmp_path / streams.SAMPLED)[0]) == 4


def test_tuning_rows_are_marked_and_a_split_must_come_with_sample(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(streams, "sample_skip", lambda cfg: None)
    monkeypatch.setattr(step, "run", lambda cfg, **kw: SimpleNamespace(events=[("a", 1, 2**20), ("f", 1)]))
    assert streams.main(["--sample", "5", "2", "--tuning", "--out", str(tmp_path)]) == 0
    rows, _ = records.read_index(tmp_path / streams.SAMPLED)
    assert [r["split"] for r in rows] == ["tuning", "tuning"]
    for argv in (["--tuning"], ["--sample", "5", "2", "--tuning", "--held-out"]):
        try:
            streams.main(argv + ["--out", str(tmp_path)])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"{argv} accepted")
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_generation_peaked_draws_are_the_only_ones_traced_and_say_so(tmp_path, monkeypatch, capsys):
    from estimator.terms import allocator_reserve

    traced = []
    monkeypatch.setattr(streams, "sample_skip", lambda cfg: None)
    monkeypatch.setattr(
        step,
        "run",
        lambda cfg, **kw: traced.append(cfg) or SimpleNamespace(events=[("a", 1, 2**20), ("f", 1)]),
    )
    # draw i is generation-peaked when i is even: the share the estimate would give is faked per draw
    shares = iter([1.0, 0.5, 0.95, 0.2])
    monkeypatch.setattr(streams, "shares", lambda cfg: allocator_reserve.Shares(next(shares), 1.0, 0.0, 1.0))
    from sweeps.trace import random_grid

    base = streams.RunConfig(model="0.5B")
    monkeypatch.setattr(
        random_grid,
        "random_configs",
        lambda seed, n: [base.with_(max_prompt_length=64 + i) for i in range(n)],
    )
    streams.sample(3, 4, tmp_path, "tuning", generation_peaked=True)
    rows, _ = records.read_index(tmp_path / streams.SAMPLED)
    assert [r["draw"] for r in rows] == [0, 2] and len(traced) == 2
    assert {r["drawn"] for r in rows} == {"generation-peaked"}
    skipped = [ln for ln in capsys.readouterr().out.splitlines() if "skipped" in ln]
    assert [ln.split(":")[0] for ln in skipped] == ["draw 3/1", "draw 3/3"] and "50 %" in skipped[0]
