"""The accuracy numbers published in README.md and results/README.md are those of the one accuracy function
(sweeps/report/accuracy.py) on the committed rows: same counts, medians and worst errors."""

import re
from pathlib import Path

import pytest

from sweeps import records
from sweeps.report import accuracy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def summary():
    rows = records.load_rows(records.RESULT_DIRS)
    acc = accuracy.accuracy_frame(rows)
    assert acc["prediction_error"].isna().all()
    return acc


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def test_readme_paragraph_matches_make_accuracy(summary):
    s = accuracy.summary_frame(summary, ("source",)).set_index("source")
    text = " ".join((REPO / "README.md").read_text().split())
    traced = re.search(
        r"against (\d+) traced configurations.*?median ([\d.]+) % and at worst ([\d.]+) %", text
    )
    assert traced, "README lost its accuracy paragraph"
    t = s.loc["traced"]
    assert traced.groups() == (
        str(int(t["count"])),
        _pct(t["median_abs_rel_error"]),
        _pct(abs(t["worst_rel_error"])),
    )
    cpu = re.search(
        r"Against (\d+) real GRPO runs.*?\(`measured-cpu`\): median ([\d.]+) %, worst ([\d.]+) %", text
    )
    assert cpu, "README lost its measured-cpu accuracy sentence"
    c = s.loc["measured-cpu"]
    assert cpu.groups() == (
        str(int(c["count"])),
        _pct(c["median_abs_rel_error"]),
        _pct(abs(c["worst_rel_error"])),
    )


def test_results_readme_summary_matches_make_accuracy(summary):
    text = (REPO / "results" / "README.md").read_text()
    for _, r in accuracy.summary_frame(summary, ("source",)).iterrows():
        line = f"| {r['source']} | {r['count']} | {_pct(r['median_abs_rel_error'])}% |"
        assert line in text, line
    for _, r in accuracy.summary_frame(summary, ("source", "method")).iterrows():
        line = f"| {r['source']} | {r['method']} | {r['count']} | {_pct(r['median_abs_rel_error'])}% |"
        assert line in text, line


def test_readme_three_set_table_matches_make_accuracy(summary):
    """The README's in-sample / validation / held-out rows are `make accuracy`'s split lines, cell for cell."""
    rows = records.load_rows(records.RESULT_DIRS)
    text = (REPO / "README.md").read_text()
    line = re.compile(
        r"accuracy\[(\S+)\]: (\d+) configs, median \|error\| ([\d.]+)%, worst signed ([+-][\d.]+)%, "
        r"([\d.]+)% under-predicted by > 2%; after the band ([\d.]+)%"
    )
    for split_line in accuracy.split_lines_of(summary, rows):
        m = line.fullmatch(split_line)
        assert m, split_line
        _, n, median, worst, under, after = m.groups()
        worst = worst.replace("-", "−")
        cells = f"| {n} | {median} % | {worst} % | {under} % | {after} % |"
        assert cells in text, f"README's three-set table lacks {cells} ({split_line})"
