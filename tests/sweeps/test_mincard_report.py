"""The mincard report's percentages, worked by hand from synthetic rows; the lineup and its make target."""

import re
from pathlib import Path

import yaml

from sweeps.mincard import lineup
from sweeps.report import mincard, row_traces

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
YAML = REPO / "sweeps" / "runner" / "conf" / "experiment" / "mincard.yaml"


def _row(key, measured, source="measured-gpu", status="ok"):
    config = {"model": "Qwen/Qwen3-4B", "use_peft": True, "load_in_4bit": True, "max_prompt_length": 1024,
              "max_completion_length": 256}  # fmt: skip
    return {"schema": 1, "key": key, "source": source, "status": status, "config": config,
            "mincard": {"min_torch_bytes": measured, "max_failing_bytes": None}}  # fmt: skip


FIGURES = {"a": (int(10.2 * GIB), int(10.5 * GIB)), "b": (int(7.6 * GIB), int(8.08 * GIB))}


def figures(row):
    return FIGURES[row["key"]]


def test_errors_against_the_measured_minimum_by_hand():
    rows = [_row("a", 10 * GIB), _row("b", 8 * GIB), _row("c", 9 * GIB, source="measured-cpu")]
    t = {r["key"]: r for r in mincard.table(rows, figures)}
    assert set(t) == {"a", "b"}  # the CPU row is not a card's measurement
    # a: (10.2 - 10) / 10 = +2.0 %, (10.5 - 10) / 10 = +5.0 %; b: (7.6 - 8) / 8 = -5.0 %, (8.08 - 8) / 8 = +1.0 %
    assert round(t["a"]["torch_limit_error_pct"], 2) == 2.0 and round(t["a"]["fit_error_pct"], 2) == 5.0
    assert round(t["b"]["torch_limit_error_pct"], 2) == -5.0 and round(t["b"]["fit_error_pct"], 2) == 1.0
    assert t["a"]["config"] == "Qwen/Qwen3-4B qlora p1024 c256"
    assert t["a"]["measured_source"] == "measured-gpu" and t["a"]["estimate_source"] == "estimated"
    assert mincard.summary_lines(rows, figures) == [
        "mincard[measured-gpu]: 2 configs, fit figure vs measured minimum: median +3.0 %, min +1.0 %, "
        "max +5.0 %, below: 0"
    ]
    assert "| Qwen/Qwen3-4B qlora p1024 c256 | 10.00 GiB | 10.20 GiB | +2.0 % | 10.50 GiB | +5.0 % |" in (
        mincard.markdown(mincard.table(rows, figures))
    )


def test_no_rows_and_unfinished_rows():
    assert mincard.summary_lines([]) == ["mincard[measured-gpu]: no rows yet (make gpu-mincard on a GPU)"]
    assert mincard.table([_row("a", None), _row("b", 8 * GIB, status="oom")], figures) == []


def test_the_estimator_figures_take_the_outside_of_the_allocator_off_need_and_fit():
    row = _row("a", 10 * GIB)
    row["config"].update(dtype="bfloat16", bf16=True, device="cuda")
    limit_fig, fit_fig = mincard.estimated_figures(row)
    assert 0 < limit_fig <= fit_fig


def test_lineup_rows_compose_into_gpu_runs_and_cover_each_method_early():
    from estimator.step.estimate import estimate
    from estimator.terms import allocator_reserve

    rows = yaml.safe_load(YAML.read_text())["mincard"]["rows"]
    entries = lineup.entries()
    assert [e.row for e in entries] == list(rows) and len({e.job.key for e in entries}) == 10
    methods = []
    for e in entries[:8]:  # the methods at two prompt lengths, TRL's shapes otherwise
        c = e.job.config
        assert (c.device, c.dtype, c.per_device_train_batch_size, c.num_generations) == (
            "cuda",
            "bfloat16",
            8,
            8,
        )
        assert c.max_completion_length == 256 and c.max_prompt_length in (256, 1024)
        assert c.attn_implementation == "sdpa" and c.steps_per_generation is None
        assert e.job.variant["weights"] == "random" and e.job.variant["steps"] == 2
        method = "qlora" if c.load_in_4bit else "lora" if c.use_peft else "full"
        assert (method == "full") == (c.model in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"))
        assert method == "full" or c.model == "Qwen/Qwen3-4B"
        methods.append((method, c.model, c.max_prompt_length))
        assert e.need_bytes and e.need_bytes * lineup.BASELINE_MARGIN < 75 * GIB  # estimated
    assert len(set(methods)) == 8 and {m[0] for m in methods[:3]} == {"full", "lora", "qlora"}
    for e in entries[8:]:  # runs whose peak is set in generation: eager prefills of 80 sequences
        c = e.job.config
        assert c.attn_implementation == "eager" and c.generation_sequences == 80 and c.gradient_checkpointing
        assert allocator_reserve.regime(c, allocator_reserve.shares_of(estimate(c).phases)) == "generation"
        assert (
            e.need_bytes and e.need_bytes < 75 * GIB
        )  # one run fits the card; the baseline is clamped to it


def test_makefile_target_runs_the_yaml_rows_in_order():
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^MINCARD_ROWS \?= (\S+)$", make, re.M).group(1).split(",") == list(
        yaml.safe_load(YAML.read_text())["mincard"]["rows"]
    )
    assert "gpu-mincard:" in make and "-m sweeps.mincard.cli" in make


def test_empty_table_says_so_instead_of_a_bare_header():
    text = mincard.markdown([])
    assert text.startswith("No measured-gpu min-card rows yet") and "|" not in text


def test_the_traced_figure_replays_the_row_configs_own_stream(tmp_path):
    # a stream the caching allocator cannot serve in less than 180 MiB: a 100 MiB block freed, 30 MiB split off
    # it (the rest, 70 MiB, stays cached inside a segment in use), then 80 MiB, which needs a segment of its own
    # (110 MiB allocated, 180 MiB reserved); the trace lacks the two 32 MiB cuBLAS / cuBLASLt workspaces
    from estimator.hardware.allocator import ALLOC, FREE, dump_stream
    from sweeps import records

    mib = 1 << 20
    row = _row("a", 10 * GIB)
    dump_stream(
        [(ALLOC, 1, 100 * mib), (FREE, 1), (ALLOC, 2, 30 * mib), (ALLOC, 3, 80 * mib)], tmp_path / "s.txt.gz"
    )
    other = {**row["config"], "max_prompt_length": 256}
    records.append_row(tmp_path / "index.jsonl", {"config": other, "stream": "missing.txt.gz"})
    records.append_row(tmp_path / "index.jsonl", {"config": row["config"], "stream": "s.txt.gz"})
    streams = row_traces.traced_streams(tmp_path)
    sim = mincard.simulated_figure(row, streams)
    assert 180 * mib + 64 * mib <= sim < 188 * mib + 64 * mib
    assert mincard.simulated_figure({**row, "config": other}, streams) is None  # indexed, but no file
    t = mincard.table([row], figures, simulated=lambda r: mincard.simulated_figure(r, streams))
    assert round(t[0]["simulated_error_pct"], 3) == round((sim - 10 * GIB) / (10 * GIB) * 100, 3)
    assert f"| {sim / GIB:.2f} GiB | {t[0]['simulated_error_pct']:+.1f} % |" in mincard.markdown(t)
    assert mincard.markdown(mincard.table([row], figures)).rstrip().endswith("| - | - |")


def test_the_summary_adds_a_line_for_the_traces_where_there_are_any():
    rows = [_row("a", 10 * GIB), _row("b", 8 * GIB)]
    # a's trace needs 10.3 GiB against 10 measured: +3.0 %; b has no trace
    lines = mincard.summary_lines(rows, figures, simulated=lambda r: {"a": int(10.3 * GIB)}.get(r["key"]))
    assert lines[1:] == [
        "mincard[traced, simulated]: 1 configs, its trace's need vs measured minimum: median +3.0 %, min +3.0 %, "
        "max +3.0 %, below: 0"
    ]
    assert len(mincard.summary_lines(rows, figures)) == 1


def test_bad_paths_are_one_line_and_exit_2(tmp_path, capsys):
    assert mincard.main([str(tmp_path / "none.jsonl")]) == 2
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert mincard.main([str(rows), "--markdown", str(blocked / "t.md")]) == 2
    assert mincard.main([str(rows), "--traced", str(blocked / "d"), "--trace-missing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("mincard: ") and "accepted" in e for e in err)
    assert "none.jsonl" in err[0]


def _lineup_row(name, prompt):
    config = {"model": "Qwen/Qwen3-4B", "use_peft": True, "load_in_4bit": True, "max_prompt_length": prompt,
              "max_completion_length": 256}  # fmt: skip
    return {"row": name, "key": name, "config": config, "variant": {"steps": 2}}


def test_the_forecast_leaves_out_measured_configs_and_works_by_hand():
    measured = _row("a", 10 * GIB)  # p1024: the same configuration as lineup row r01
    lineup_rows = [_lineup_row("r01", 1024), _lineup_row("r04", 256), _lineup_row("r05", 512)]
    figs = {"r04": (int(5.0 * GIB), int(5.25 * GIB)), "r05": (int(6.0 * GIB), int(6.3 * GIB))}
    sims = {"r04": 5 * GIB, "r05": None}
    p = mincard.preview(lineup_rows, [measured], lambda r: figs[r["key"]], lambda r: sims[r["key"]])
    assert [r["row"] for r in p] == ["r04", "r05"]
    # r04: (5.25 - 5) / 5 = +5.0 % above its trace's need; r05 has no stream
    assert round(p[0]["fit_vs_trace_pct"], 2) == 5.0 and p[1]["fit_vs_trace_pct"] is None
    assert mincard.preview_line(p) == (
        "mincard[lineup, not measured yet]: 2 configs, fit figure vs its trace's need (traced, simulated) on 1: "
        "median +5.0 %, min +5.0 %, max +5.0 %, below: 0"
    )
    text = mincard.preview_markdown(p)
    assert "| r04 | Qwen/Qwen3-4B qlora p256 c256 | 5.00 GiB | 5.25 GiB | 5.00 GiB | +5.0 % |" in text
    assert "| r05 | Qwen/Qwen3-4B qlora p512 c256 | 6.00 GiB | 6.30 GiB | - | - |" in text
    unmeasured = dict(measured, status="oom")  # a run that did not finish leaves its config in the forecast
    assert [
        r["row"]
        for r in mincard.preview(lineup_rows, [unmeasured], lambda r: figs.get(r["key"], figs["r04"]))
    ][0] == "r01"
    assert (
        mincard.preview_line([])
        == "mincard[lineup, not measured yet]: 0 configs, none traced (--trace-missing traces them)"
    )
    assert mincard.preview_markdown([]) == ""
