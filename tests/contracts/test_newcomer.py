"""A newcomer's first commands: an install without packaging deprecation warnings, and a smoke sweep that
measures (into a git-ignored scratch file) instead of skipping every config that is already committed."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_license_is_an_spdx_string_with_a_setuptools_that_reads_it():
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is 3.11+; the project supports 3.10)
    # a table (license = { text = ... }) is deprecated by setuptools and stops working in Feb 2027
    assert re.search(r'^license = "Apache-2.0"', text, re.M)
    assert int(re.search(r'"setuptools>=(\d+)', text).group(1)) >= 77  # PEP 639 strings need 77


def _make_var(name: str) -> str:
    text = (REPO / "Makefile").read_text()
    return re.search(rf"^{name}\s*\?=\s*(\S+)", text, re.M).group(1)


def test_smoke_sweep_measures_into_an_ignored_scratch_file_and_prints_the_comparison():
    smoke_dir = _make_var("SMOKE_DIR")
    target = f"{smoke_dir}/smoke.jsonl"
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", target])
    assert ignored.returncode == 0, f"{target} is not git-ignored"
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", smoke_dir], capture_output=True, text=True
    ).stdout
    assert tracked == "", "committed rows in the scratch folder would make a fresh clone skip"
    recipe = (REPO / "Makefile").read_text().split("sweep-smoke: install", 1)[1].split("\n\n", 1)[0]
    assert "sweep.results_dir=$(SMOKE_DIR)" in recipe
    assert "grpo-vram-accuracy $(SMOKE_DIR)/smoke.jsonl" in recipe
