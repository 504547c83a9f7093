"""Regenerate (or check) what `vram-estimate` says for each worked example: `make examples` / `--check`.

Each case folder holds the config files its user had and `runs.txt` (one `NAME | flags` line per run); the output
of `vram-estimate FLAGS` (the policy report, the per-GPU layout, vLLM's own accounting, advice)
goes to `NAME.txt` beside them, with the exit code. `--check` exits 1 when a stored output is stale.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python examples/make_examples.py` from a checkout
    sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples"


def runs(case: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) of every run line in a case's runs.txt."""
    out = []
    for line in (case / "runs.txt").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, flags = line.partition("|")
        out.append((name.strip(), shlex.split(flags)))
    return out


def render(argv: list[str]) -> str:
    """The command, what it prints (stdout, then stderr notes) and its exit code, run from the repo root."""
    from estimator.interface import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(argv)
    cmd = "vram-estimate " + " ".join(shlex.quote(a) for a in argv)
    return f"$ {cmd}\n{stdout.getvalue()}{stderr.getvalue()}exit code: {code}\n"


def outputs() -> dict[Path, str]:
    """Every example output file and its fresh text."""
    return {
        case / f"{name}.txt": render(argv)
        for case in sorted(EXAMPLES.glob("case*"))
        for name, argv in runs(case)
    }


def main(argv: list[str]) -> int:
    import os

    os.chdir(ROOT)
    fresh = outputs()
    if "--check" in argv:
        stale = [p for p, text in fresh.items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run `make examples`)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in fresh.items():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
