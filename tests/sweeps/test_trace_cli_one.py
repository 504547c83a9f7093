"""`grpo-vram-trace one`: what cannot be traced here, and digits of other scripts, are refused up front."""

from __future__ import annotations

from sweeps.trace import cli as trace_cli


def _refused(argv, capsys) -> str:
    code = trace_cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("grpo-vram-trace: error: "), err
    return err[0]


def test_several_ranks_without_fsdp_are_refused_before_tracing(capsys, monkeypatch):
    monkeypatch.setattr(trace_cli, "make_row", lambda *a: (_ for _ in ()).throw(AssertionError("traced")))
    line = _refused(["one", "--model", "0.5B", "--gpus", "3"], capsys)
    assert "--gpus 3" in line and "only FSDP2" in line
    line = _refused(["one", "--model", "0.5B", "--gpus", "2", "--fsdp", "--beta", "0.04"], capsys)
    assert "beta = 0" in line


def test_digits_of_other_scripts_are_not_numbers(capsys):
    # int('٣') is 3 in Python; a flag takes ASCII digits only
    assert "invalid integer" in _refused(["grid", "default", "--limit", "\u0663"], capsys)
    assert "invalid integer" in _refused(["one", "--gpus", "\u0663"], capsys)
