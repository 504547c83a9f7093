"""Ordinary mistakes give one line, never a traceback: a closed pipe, a binary or non-UTF-8 --config."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.interface import cli

REPO = Path(__file__).resolve().parent.parent


def test_reader_leaving_the_pipe_is_not_a_traceback():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "estimator.interface.cli", "--model", "7B", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # like `| head -1` having exited before the estimate is printed
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    # the size alias's note (which model 7B means) and nothing else: no traceback
    assert all(line.startswith("vram-estimate: note: ") for line in err.splitlines()), err
    assert proc.returncode == 3  # no verdict was delivered: neither 0 (fits) nor 1 (does not fit)


@pytest.mark.parametrize(
    "data",
    [bytes(range(256)) * 8, "beta: 0.1\nmodel_name_or_path: café\n".encode("latin-1"), b"\xff\xfe\x00b\x00"],
)
def test_binary_or_non_utf8_config_file(tmp_path, capsys, data):
    path = tmp_path / "grpo.yaml"
    path.write_bytes(data)
    assert cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not UTF-8 text" in err[0] and str(path) in err[0]


@pytest.mark.parametrize(
    "redirect, message",
    [(">&-", "stdout is closed"), (">/dev/full", "could not write the answer to stdout (No space left")],
)
def test_an_answer_that_cannot_be_written_is_one_line_and_no_verdict(redirect, message):
    if redirect == ">/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    cmd = f"{shlex.quote(sys.executable)} -m estimator.interface.cli --model 0.5B --dtype bfloat16 {redirect}"
    proc = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    errors = [line for line in proc.stderr.splitlines() if "note:" not in line]
    assert proc.returncode == 3, proc.stderr
    assert len(errors) == 1 and message in errors[0], proc.stderr


def test_control_characters_in_a_config_name_are_escaped(tmp_path, capsys):
    config = json.loads((REPO / "estimator" / "catalog" / "Qwen--Qwen2.5-0.5B-Instruct.json").read_text())
    config["_name_or_path"] = "evil\n\x1b[31mRED\x1b[0m\rname"
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert cli.main(["--model", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert out.splitlines()[0].startswith("evil\\n\\x1b[31mRED\\x1b[0m\\rname: 494.03 M params")


def _alias_bomb(key: str) -> str:
    """A YAML file of ten lines whose `key` holds 10**9 values through nested aliases."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return "\n".join(lines + [f"{key}: *a8"]) + "\n"


@pytest.mark.parametrize("key", ["max_completion_length", "deepspeed"])
def test_a_yaml_alias_bomb_is_named_without_being_expanded(tmp_path, key):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(key))
    run = subprocess.run(  # the timeout only guards the suite: expanding the value first never ends
        [sys.executable, "-m", "estimator", "--config", str(bomb)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"bomb.yaml: {key}" in lines[0] and "[[[" in lines[0] and len(lines[0]) < 300


def test_a_shown_value_is_cut_and_escaped():
    from estimator.text import shown

    full = ascii("é\n" * 100)  # 'é' and the newline escaped as Python writes them
    assert shown("é\n" * 100, 20) == full[:17] + "..."
    deep = [[[[[1] * 5] * 5] * 5] * 5] * 5
    text = shown(deep, 10_000)
    assert text.startswith("[[[[...]") and "1" not in text  # three levels, never the leaves
