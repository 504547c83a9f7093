"""`python -m sweeps.trace.streams --sample`: one row per traced draw, written as it finishes; a draw the tracer
cannot run is named on one line and the others go on; a rerun traces only what is missing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sweeps import records
from sweeps.trace import step, streams


def _refused(argv: list[str]) -> None:
    """An unknown setting is one stderr line and exit 2 (OneLineParser), never a retrace."""
    with pytest.raises(SystemExit) as e:
        streams.main(argv)
    assert e.value.code == 2


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


def test_retrace_replaces_only_the_selected_rows_keeps_their_draw_and_resumes(tmp_path, monkeypatch, capsys):
    from sweeps.trace import random_grid

    small = [("a", 1, 2**20), ("f", 1)]  # one 1 MiB block: a 2 MiB small-pool segment
    large = [("a", 1, 3 * 2**20), ("f", 1)]  # 3 MiB: a 20 MiB large-pool segment
    base = streams.RunConfig(model="0.5B")
    monkeypatch.setattr(streams, "sample_skip", lambda cfg: None)
    monkeypatch.setattr(
        random_grid,
        "random_configs",
        lambda seed, n: [base.with_(load_in_4bit=i % 2 == 1, max_prompt_length=64 + i) for i in range(n)],
    )
    monkeypatch.setattr(step, "run", lambda cfg, **kw: SimpleNamespace(events=small))
    streams.sample(9, 4, tmp_path, "held-out")
    kept = base.with_(load_in_4bit=True)
    records.append_row(
        tmp_path / "index.jsonl",
        {
            "key": "k4",
            "stream": "k4.txt.gz",
            "steps": 3,
            "config": kept.to_dict(),
            "events": 2,
            "simulated": streams.simulate_variants(small),
        },
    )

    traced = []

    def now_larger(cfg, **kw):
        traced.append(cfg)
        if len(traced) == 3:
            raise RuntimeError("out of\ntime")
        return SimpleNamespace(events=large, observed={"peak_bytes": 3 * 2**20})

    monkeypatch.setattr(step, "run", now_larger)
    assert streams.main(["--retrace", "load_in_4bit", "--tag", "t1", "--out", str(tmp_path)]) == 1
    assert "k4: not traced" not in capsys.readouterr().out
    rows = {r["draw"]: r for r in records.read_index(tmp_path / streams.SAMPLED)[0]}
    reserved = {d: r["simulated"]["default"]["peak_reserved"] for d, r in rows.items()}
    # draws 1 and 3 are the 4-bit ones; the third trace (draw 3) failed and its row is as it was
    assert reserved == {0: 2 * 2**20, 1: 20 * 2**20, 2: 2 * 2**20, 3: 2 * 2**20}
    assert (rows[1]["seed"], rows[1]["split"], rows[1]["retraced"]) == (9, "held-out", "t1")
    (index_row,) = records.read_index(tmp_path / "index.jsonl")[0]
    assert index_row["retraced"] == "t1" and index_row["traced_peak_bytes"] == 3 * 2**20
    assert (tmp_path / "k4.txt.gz").exists()

    traced.clear()
    assert streams.main(["--retrace", "load_in_4bit", "--tag", "t1", "--out", str(tmp_path)]) == 0
    assert len(traced) == 1  # resumes: only the row that failed
    _refused(["--retrace", "load_in_5bit", "--out", str(tmp_path)])
    assert "load_in_5bit" in capsys.readouterr().err


def test_retrace_field_equal_to_a_value_selects_by_that_value(tmp_path, monkeypatch, capsys):
    # attn_implementation is no flag: `--retrace attn_implementation=eager` picks the eager rows alone
    small = [("a", 1, 2**20), ("f", 1)]
    base = streams.RunConfig(model="0.5B")
    for i, attn in enumerate(("sdpa", "eager", "eager")):
        cfg = base.with_(attn_implementation=attn, max_prompt_length=64 + i)
        records.append_row(
            tmp_path / streams.SAMPLED,
            streams.simulation_row(cfg, small, 2) | {"seed": 5, "draw": i, "split": "validation"},
        )
    traced = []

    def fake_run(cfg, **kw):
        traced.append(cfg)
        return SimpleNamespace(events=small)

    monkeypatch.setattr(step, "run", fake_run)
    assert streams.main(["--retrace", "attn_implementation=eager", "--tag", "t", "--out", str(tmp_path)]) == 0
    assert [c.attn_implementation for c in traced] == ["eager", "eager"]
    rows = {r["draw"]: r for r in records.read_index(tmp_path / streams.SAMPLED)[0]}
    assert [rows[d].get("retraced") for d in range(3)] == [None, "t", "t"]
    _refused(["--retrace", "attention=eager", "--out", str(tmp_path)])
    assert "attention=eager" in capsys.readouterr().err


def test_report_scores_the_shipped_table_and_refits_only_when_asked(tmp_path, monkeypatch, capsys):
    import json

    from estimator.terms import allocator_reserve

    shipped = json.loads(allocator_reserve.TABLE.read_text())
    fits = []
    monkeypatch.setattr(streams, "build_table", lambda out: fits.append(out) or shipped)
    assert streams.main(["--report", "--out", str(tmp_path)]) == 0
    assert fits == []  # the table the estimator reads, as it is
    first = capsys.readouterr().out.splitlines()[0]
    pct = 100 * min(
        (s["variants"]["default"]["fragmentation"] / s["variants"]["default"]["peak_allocated"])
        for s in shipped["streams"]
    )
    assert first.startswith("default") and f"min {pct:.1f}%" in first
    assert streams.main(["--report", "--refit", "--out", str(tmp_path)]) == 0
    assert fits == [tmp_path]
    try:
        streams.main(["--refit", "--out", str(tmp_path)])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("--refit without --report was accepted")
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_step_fit_only_takes_the_fresh_kept_plus_tuning_fits_and_keeps_everything_else():
    from sweeps.trace.streams import with_step_fit_only

    shipped = {"source": "s", "streams": ["kept"], "fit": {"need:default": 1, "generation:need:default": 2}}
    fresh = {"source": "f", "streams": ["other"], "fit": {"need:default": 9, "sampled:need:default": 3}}
    out = with_step_fit_only(shipped, fresh)
    assert out["streams"] == ["kept"] and out["source"] == "s"
    assert out["fit"] == {"need:default": 1, "generation:need:default": 2, "sampled:need:default": 3}
