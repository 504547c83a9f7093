"""The estimator and the CLI's main paths never import torch (nor transformers / trl)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "trl", "peft", "numpy")

SCRIPT = """
import contextlib, io, sys
import estimator, estimator.step.estimate, estimator.model.catalog, estimator.plan.advice, estimator.interface.report
from estimator.interface.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    codes = [
        main(["--model", "7B", "--lora", "--gens", "8"]),
        main(["--model", "7B", "--gpu", "T4", "--json"]),
        main(["--model", "7B", "--lora", "--gpu", "4090", "--solve", "num_generations", "--advice"]),
        main(["--model", "qwen3-8b", "--qlora", "--gpu", "L4", "--solve", "max_completion_length"]),
    ]
print(codes, sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


def test_main_paths_do_not_import_torch():
    code = SCRIPT.replace("{HEAVY!r}", repr(HEAVY))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    codes, loaded = r.stdout.strip().split("] ")
    assert loaded == "[]", f"heavy modules imported: {loaded}"
    assert codes == "[0, 1, 1, 0"


def test_console_script_module_does_not_import_torch():
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "estimator.interface.cli",
            "--model",
            "7B",
            "--lora",
            "--gens",
            "8",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert not imported & set(HEAVY)
