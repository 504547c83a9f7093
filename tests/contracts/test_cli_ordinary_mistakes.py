"""Ordinary mistakes give one line, never a traceback: a closed pipe, a binary or non-UTF-8 --config."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.interface import cli

REPO = Path(__file__).resolve().parents[2]


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
    assert cli.main(["--model", str(tmp_path / "config.json"), "--detail"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert out.splitlines()[0].startswith("evil\\n\\x1b[31mRED\\x1b[0m\\rname: 494.03 M params")
    assert cli.main(["--model", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "estimated for evil\\n\\x1b[31mRED" in out


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


@pytest.mark.parametrize("kind", ["trl", "accelerate"])
def test_file_names_and_key_names_in_notes_are_escaped_and_the_list_cut(tmp_path, capsys, kind):
    head = "beta: 0.1\n" if kind == "trl" else "distributed_type: MULTI_GPU\nnum_processes: 2\n"
    keys = "".join(f'"zz\\x1b[2J{i}": 1\n' for i in range(30))  # 30 keys no TRL / accelerate release knows
    path = tmp_path / "g\x1b[2J\n.yaml"
    path.write_text(head + keys)
    assert cli.main(["--model", "0.5B", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err
    lines = err.splitlines()
    assert all(line.startswith("vram-estimate: note: ") for line in lines), lines
    unread = next(line for line in lines if "zz" in line)
    assert "g\\x1b[2J\\n.yaml: " in unread and "zz\\x1b[2J0" in unread
    assert unread.count("zz") < 30 and "more" in unread and len(unread) < 400


def _error(argv, capsys) -> str:
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": note: " not in line]
    assert len(errors) == 1, errors
    return errors[0]


def test_gpu_memory_gib_on_cpu_names_the_flag_given(capsys):
    line = _error(["--model", "0.5B", "--gpu-memory-gib", "24", "--device", "cpu"], capsys)
    assert "--gpu-memory-gib" in line and "--gpu " not in line
    assert "--gpu checks" in _error(["--model", "0.5B", "--gpu", "4090", "--device", "cpu"], capsys)


def test_all_linear_beside_names_is_refused_as_a_combination(capsys):
    line = _error(["--model", "0.5B", "--lora", "--lora-target-modules", "all-linear", "q_proj"], capsys)
    assert "cannot be combined" in line and "not found" not in line


@pytest.mark.parametrize("names, shown", [([""], "''"), (["0.5B", ""], "'0.5B' ''")])
def test_an_empty_role_name_is_shown_as_typed_with_what_is_accepted(capsys, names, shown):
    line = _error(["--model", "0.5B", "--reward-model", *names], capsys)
    assert f"--reward-model {shown}: " in line and "(" not in line and "none empty" in line


def test_an_overflowing_number_says_why_it_reads_as_inf(capsys):
    # float('1e400') is inf: the value shown is the one typed, with why it is not a number here
    line = _error(["--model", "0.5B", "--from-command", "python train.py --beta 1e400"], capsys)
    assert "'1e400'" in line and "not a finite number" in line and "1.8e308" in line


def test_a_flag_value_starting_with_a_dash_gets_the_equals_form(capsys):
    line = _error(["--model", "0.5B", "--gpu", "-24GB"], capsys)
    assert "--gpu=VALUE" in line


@pytest.mark.parametrize("gib", ["0.5", "5000", "1e6", "1e300"])
def test_gpu_memory_gib_bounds_are_the_generic_cards_in_one_unit(capsys, gib):
    from estimator.hardware.gpus import GENERIC_MAX_GB, GENERIC_MIN_GB

    line = _error(["--model", "0.5B", "--gpu-memory-gib", gib], capsys)
    assert f">= {GENERIC_MIN_GB} and <= {GENERIC_MAX_GB}" in line and " GB" not in line
