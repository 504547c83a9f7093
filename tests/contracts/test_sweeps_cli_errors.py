"""Bad input to the sweeps' command-line tools is one line on stderr and exit code 2, never a usage dump."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "sweeps.trace",
    "sweeps.trace.streams",
    "sweeps.runner.legacy",
    "sweeps.report.allocator_check",
    "sweeps.report.accuracy_cli",
    "sweeps.report.mincard",
    "sweeps.report.replay",
    "sweeps.report.gpu_streams",
    "sweeps.report.stranding",
    "sweeps.mincard.cli",
    "sweeps.lease.pack",
    "sweeps.runner.zero_rehearsal",
    "sweeps.report.tables",
    "sweeps.report.fit_overheads",
]


@pytest.mark.parametrize("module", MODULES)
def test_unknown_flag_is_one_line_and_exit_2(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--no-such-flag"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--no-such-flag" in lines[0], done.stderr


def test_a_bad_choice_names_the_value_and_what_is_accepted():
    done = subprocess.run(
        [sys.executable, "-m", "sweeps.trace", "grid", "bogus"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "'bogus'" in line and "heldout" in line and "validation" in line


def test_a_missing_rows_file_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "no-rows.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "sweeps.report.replay", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "no-rows.jsonl" in line and "accepted" in line
