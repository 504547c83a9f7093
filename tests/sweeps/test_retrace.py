"""`records.replace_row` and `sweeps.trace.retrace`: a retrace replaces only the rows it selects, keeps every
other line byte for byte, never writes over a finished row with a failure, and resumes."""

from __future__ import annotations

import json

import pytest

from sweeps import records
from sweeps.trace import retrace


def _row(key: str, four_bit: bool, peak: int, status: str = "ok") -> dict:
    return {
        "schema": 1,
        "key": key,
        "status": status,
        "sweep": "validation",
        "variant": {"decode": "fast-forward", "k": 2, "max_micro": 2, "layers": 3},
        "config": {"model": "0.5B", "load_in_4bit": four_bit, "use_peft": True},
        "observed": {"peak_bytes": peak},
        "written_at": "2026-01-01T00:00:00.000000Z",
    }


@pytest.fixture
def traced(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [_row("a", True, 100), _row("b", False, 200), _row("c", True, 300), _row("d", True, 0, "skipped")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_replace_row_keeps_other_lines_byte_for_byte(traced):
    before = traced.read_text().splitlines(keepends=True)
    assert records.replace_row(traced, {**_row("c", True, 999), "written_at": "x"})
    after = traced.read_text().splitlines(keepends=True)
    assert len(after) == 4 and after[:2] == before[:2] and after[3] == before[3]
    assert json.loads(after[2])["observed"]["peak_bytes"] == 999
    assert not records.replace_row(traced, _row("zz", True, 1))
    assert traced.read_text().splitlines(keepends=True) == after


def test_retrace_selects_4bit_ok_rows_passes_their_variant_and_resumes(traced):
    calls = []

    def fake_trace(cfg, sweep, k, max_micro, num_layers):
        calls.append((cfg.model, sweep, k, max_micro, num_layers))
        key = "a" if not calls[1:] else "c"
        return {**_row(key, True, 7), "written_at": None}

    assert retrace.run([traced], ["load_in_4bit"], "tag1", timeout=60, trace=fake_trace) == 0
    assert calls == [("0.5B", "validation", 2, 2, 3)] * 2  # a and c; not b (16-bit) nor d (skipped)
    rows = {r["key"]: r for r in records.load_rows(traced)}
    assert [rows[k].get("retraced") for k in "abcd"] == ["tag1", None, "tag1", None]
    assert rows["a"]["observed"]["peak_bytes"] == 7 and rows["b"]["observed"]["peak_bytes"] == 200

    calls.clear()
    assert retrace.run([traced], ["load_in_4bit"], "tag1", timeout=60, trace=fake_trace) == 0
    assert calls == []  # resumed: both already carry the tag


def test_a_failed_retrace_keeps_the_finished_row(traced):
    before = traced.read_text()

    def failing(cfg, sweep, k, max_micro, num_layers):
        return {"key": "a", "status": "error", "error": "RuntimeError: boom"}

    assert retrace.run([traced], ["load_in_4bit"], "tag2", timeout=60, trace=failing) == 2
    assert traced.read_text() == before


def test_retrace_cli_rejects_a_missing_file(tmp_path, capsys):
    from sweeps.trace import cli

    code = cli.main(["retrace", "--tag", "t", str(tmp_path / "nope.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nope.jsonl" in err


def test_a_key_written_twice_is_retraced_once_and_left_on_one_line(tmp_path):
    path = tmp_path / "t.jsonl"
    older = {**_row("a", True, 100), "written_at": "2026-01-01T00:00:00.000000Z"}
    newer = {**_row("a", True, 110), "written_at": "2026-01-02T00:00:00.000000Z"}
    path.write_text(json.dumps(older) + "\n" + json.dumps(newer) + "\n")
    calls = []

    def fake_trace(cfg, sweep, k, max_micro, num_layers):
        calls.append(cfg.model)
        return {**_row("a", True, 7), "written_at": None}

    assert retrace.run([path], ["load_in_4bit"], "t", timeout=60, trace=fake_trace) == 0
    assert len(calls) == 1
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["observed"]["peak_bytes"] == 7


def test_where_conditions_compare_json_values():
    rows = [_row("a", True, 1), {**_row("b", True, 1), "config": {"load_in_4bit": True, "bf16": True}}]
    assert [r["key"] for r in retrace.selected(rows, ["load_in_4bit", "bf16=true"], "t")] == ["b"]
    assert [r["key"] for r in retrace.selected(rows, ["bf16=true"], "t")] == ["b"]
    assert [r["key"] for r in retrace.selected(rows, ['model="0.5B"'], "t")] == ["a"]
