"""The sweep's command line and its faults, through the real entry point (`python -m sweeps.runner.app`):
bad Hydra-level input is one stderr line and exit 2 (never a traceback or a hang), a failed append keeps the row,
corrupt lines are counted, locks leave nothing behind, and Ctrl-C ends with one line and nothing lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweep import TINY_ARGS

from sweeps import records

REPO = Path(__file__).resolve().parents[2]
TINY = TINY_ARGS
UNSET = "GRPO_VRAM_SURELY_UNSET_VARIABLE"


def _env(tmp_path: Path) -> dict:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    env.pop(UNSET, None)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def _cmd(
    tmp_path: Path, *overrides: str, multirun: bool = True, python: list[str] | None = None
) -> list[str]:
    return [
        *(python or [sys.executable, "-m", "sweeps.runner.app"]),
        *(["--multirun"] if multirun else []),
        *TINY,
        f"sweep.results_dir={tmp_path / 'res'}",
        f"hydra.sweep.dir={tmp_path / 'hydra'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        "run.inject_failure=raise",  # anything wrongly accepted ends in a second, as an error row
        *overrides,
    ]


def _run(tmp_path: Path, *overrides: str, multirun: bool = True, timeout: float = 60, **kw):
    try:
        return subprocess.run(
            _cmd(tmp_path, *overrides, multirun=multirun, **kw),
            cwd=tmp_path,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: {overrides}")


def _ours_in(tmp: Path) -> list[str]:
    """What the sweep left in its temp dir (torch's own compile cache, torchinductor_<user>, is not ours)."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


def _ours(stderr: str) -> list[str]:
    """The sweep's own stderr lines (not Hydra's or bitsandbytes' log lines)."""
    return [line for line in stderr.splitlines() if line.startswith(("grpo-vram-sweep", "records:"))]


BAD = [
    # (override, single run?, what the one line must say)
    ("trainer.beta=${ceil_div:1,0}", False, "ZeroDivisionError"),
    (f"trainer.beta=${{oc.env:{UNSET}}}", False, UNSET),
    (f"model.name=${{oc.env:{UNSET}}}", False, UNSET),
    (f"hydra.run.dir=${{oc.env:{UNSET}}}", True, UNSET),
    ("trainer.beta=${no_such_resolver:1}", False, "no_such_resolver"),
    ("sweep.name=" + "a" * 300, False, "(300 characters)"),
    ("sweep.name=" + "a" * 300, True, "(300 characters)"),
    ("hydra.run.dir=/proc/x", True, "/proc"),
    ("hydra.sweep.dir=/proc/x/y", False, "/proc"),
    ("trainer.beta=interval(0,1)", False, "interval() sweep needs a sweeper plugin"),
    ("run.seed=range(2,50000000)", False, "49,999,998 jobs"),
    ("run.seed=1,2", True, "--multirun"),
    ("trainer.beta=[1", False, "cannot parse"),
    ("sweep.name=a\x1bb", False, "\\x1b"),
    ("~sweep", True, "sweep is required"),
    ("sweep=null", False, "sweep is required"),
    ("probe.names=null", True, "probe.names=None: accepted values are a list of probe names"),
    ("model=nosuch", False, "model=nosuch: no such model option; accepted: llama3.1-8b"),
    ("+experiment=nosuch", True, "experiment=nosuch: no such experiment option; accepted: ddp,"),
    ("trainer=nosuch", True, "trainer=nosuch: no such trainer option; accepted: default"),
    ("hydra/launcher=nosuch", False, "no such hydra/launcher option; accepted: basic,"),
    ("=", True, "has no key"),
    ("model.name=", True, "model.name=''"),
    ("run.seed=4294967296", True, "run.seed=4294967296: accepted values are integers from 0 to 4294967295"),
    ("run.seed=99999999999999999999999", True, "run.seed=99999999999999999999999: accepted values"),
    ("run.num_prompts=1000000000", True, "run.num_prompts=1000000000: accepted values are integers from 1"),
    ("run.steps=99999999999999999999999", True, "run.steps=99999999999999999999999: accepted values"),
]


@pytest.mark.parametrize(("override", "single", "says"), BAD, ids=[f"{b[0][:40]}-{b[1]}" for b in BAD])
def test_bad_hydra_level_input_is_one_line_and_exit_2(tmp_path, override, single, says):
    t0 = time.monotonic()
    proc = _run(tmp_path, override, multirun=not single)
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr[-1500:]
    assert proc.returncode == 2, proc.stderr[-1500:]
    lines = _ours(proc.stderr)
    assert len(lines) == 1 and says in lines[0], proc.stderr[-1500:]
    assert len(lines[0]) < 600 and lines[0].isprintable()
    assert not (tmp_path / "res").exists()  # nothing ran
    assert time.monotonic() - t0 < 30


def test_a_big_valid_range_is_checked_at_its_ends_not_value_by_value(tmp_path):
    t0 = time.monotonic()
    proc = _run(tmp_path, "run.seed=range(0,9000)", "trainer.beta=-1")
    assert proc.returncode == 2 and "beta" in _ours(proc.stderr)[0]
    assert time.monotonic() - t0 < 30


def test_an_interpolation_that_resolves_is_accepted(tmp_path):
    proc = _run(
        tmp_path,
        "trainer.gradient_accumulation_steps='${ceil_div:${trainer.num_generations},4}'",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-1500:]
    (row,) = records.load_rows(tmp_path / "res" / "t.jsonl")
    assert row["config"]["gradient_accumulation_steps"] == 1


def test_a_results_file_linked_to_dev_null_is_refused_up_front(tmp_path):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "t.jsonl").symlink_to("/dev/null")
    proc = _run(tmp_path)
    assert proc.returncode == 2 and "character device" in _ours(proc.stderr)[0], proc.stderr[-1500:]
    assert os.path.islink(tmp_path / "res" / "t.jsonl")


def test_locks_live_beside_the_results_and_are_removed(tmp_path):
    """A `grpo-vram-locks` left in the shared temp dir by another user (here: a file in the way) stops nobody."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "grpo-vram-locks").write_text("another user's")
    proc = _run(tmp_path, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert len(records.load_rows(tmp_path / "res" / "t.jsonl")) == 1
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == ["t.jsonl"]
    assert _ours_in(tmp_path / "tmp") == ["grpo-vram-locks"]


def test_corrupt_lines_are_counted_in_one_line(tmp_path):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "t.jsonl").write_text('not json\n{"also": "not a row"}\n')
    proc = _run(tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]
    (line,) = [x for x in _ours(proc.stderr) if "skipped" in x]
    assert "skipped 2 line(s)" in line and "corrupt (not JSON)" in line


FULL_DISK = """
import errno, os, sys
from sweeps import records
from sweeps.runner import app
def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
records.append_row = full  # the disk fills between the up-front check and the append
sys.argv = ["grpo-vram-sweep", *sys.argv[1:]]
app.main()
"""


def test_a_failed_append_keeps_the_row_says_where_and_the_next_run_appends_it(tmp_path):
    proc = _run(tmp_path, timeout=300, python=[sys.executable, "-c", FULL_DISK])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0
    (line,) = [x for x in _ours(proc.stderr) if "could not append" in x]
    assert "No space left on device" in line and "t.jsonl.unsaved" in line
    (kept,) = (tmp_path / "res" / "t.jsonl.unsaved").glob("*.json")
    row = json.loads(kept.read_text())["row"]
    assert row["status"] == "error" and row["error"] == "RuntimeError: injected failure"
    assert not list((tmp_path / "tmp").glob("grpo-vram-*"))  # the work dir went only once the row was kept

    again = _run(tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-1500:]
    assert any("appended 1 kept row(s)" in x for x in _ours(again.stderr))
    rows = records.load_rows(tmp_path / "res" / "t.jsonl")
    assert (
        rows[0]["written_at"] == row["written_at"] and len(rows) == 2
    )  # kept row, then the rerun's error row
    assert not (tmp_path / "res" / "t.jsonl.unsaved").exists()


def _children(spec_root: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sweeps.runner.run_one" in cmd and any(str(spec_root).encode() in c for c in cmd):
            pids.append(int(proc.name))
    return pids


def _wait(pred, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail("timed out waiting")


def test_ctrl_c_is_one_line_the_child_stops_no_row_is_lost_nothing_is_left(tmp_path):
    cmd = _cmd(tmp_path, "run.inject_failure=raise,hang")
    sweep = subprocess.Popen(cmd, cwd=tmp_path, env=_env(tmp_path), stderr=subprocess.PIPE, text=True)
    try:
        results = tmp_path / "res" / "t.jsonl"
        _wait(lambda: results.exists() and records.load_rows(results))  # job 0 wrote its row
        children = _wait(lambda: _children(tmp_path / "tmp"))  # job 1's child hangs
        time.sleep(1.0)
        sweep.send_signal(signal.SIGINT)
        _, err = sweep.communicate(timeout=60)
    finally:
        sweep.kill()
    assert "Traceback" not in err, err[-2000:]
    assert sweep.returncode == 130
    (line,) = _ours(err)
    assert "interrupted" in line and "no row for it" in line and str(results) in line
    _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), timeout=20)
    assert [r["status"] for r in records.load_rows(results)] == ["error"]
    assert sorted(p.name for p in (tmp_path / "res").iterdir()) == ["t.jsonl"]  # no lock, no temp file
    assert _ours_in(tmp_path / "tmp") == []  # no work dir, empty or not
