"""Run `vram-estimate` in-process for tests: (exit code, stdout, stderr), or the `--json` answer."""

from __future__ import annotations

import json

from estimator.interface import cli


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def estimate(argv, capsys) -> dict:
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)
