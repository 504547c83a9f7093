"""Faults around a sweep: unwritable results, a killed sweep, invalid multirun jobs, bad sweep settings."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize
from test_sweep import TINY_ARGS

from sweeps import records
from sweeps.runner import measure, schema
from sweeps.runner.job import BadInput, to_job

REPO = Path(__file__).resolve().parents[2]
TINY = TINY_ARGS  # the smallest sweep run (tests/sweeps/test_sweep.py)


def _env(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(tmp),  # work dirs and run locks land here
    }


def _cmd(tmp_path, *overrides, multirun=True):
    return [
        sys.executable,
        "-m",
        "sweeps.runner.app",
        *(["--multirun"] if multirun else []),
        *TINY,
        f"hydra.sweep.dir={tmp_path / 'hydra'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        *overrides,
    ]


def _compose(*overrides):
    schema.register()
    with initialize(config_path="../../sweeps/runner/conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_unwritable_results_dir_stops_before_any_run(tmp_path):
    proc = subprocess.run(
        _cmd(tmp_path, "method=full,lora", "sweep.results_dir=/proc/x", "run.inject_failure=raise"),
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "grpo-vram-sweep: sweep.results_dir='/proc/x': cannot write"
    )
    assert not list((tmp_path / "hydra").rglob("run.log"))  # no child was started


def test_read_only_results_file_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("")
    path.chmod(0o444)
    if os.access(path, os.W_OK):
        pytest.skip("running as root: permissions are not enforced")
    with pytest.raises(BadInput, match="cannot write results there"):
        measure.check_writable(path)


def test_invalid_multirun_job_is_reported_and_the_valid_one_runs(tmp_path):
    proc = subprocess.run(
        _cmd(
            tmp_path,
            "trainer.num_generations=3,4",
            f"sweep.results_dir={tmp_path / 'res'}",
            "run.inject_failure=raise",
        ),
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rejected = [line for line in proc.stderr.splitlines() if "not run:" in line]
    assert len(rejected) == 1 and "trainer.num_generations=3" in rejected[0]
    assert "divisible by num_generations (3)" in rejected[0]
    rows = records.load_rows(tmp_path / "res" / "t.jsonl")
    assert [r["config"]["num_generations"] for r in rows] == [4]
    assert rows[0]["error"] == "RuntimeError: injected failure"  # it ran (and failed on purpose)


def _child_pids(spec_dir: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "sweeps.runner.run_one" in cmd and str(spec_dir) in cmd:
            out.append(int(d.name))
    return out


def _wait(pred, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    return pred()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_sweep_takes_the_child_down_and_a_rerun_sees_the_running_duplicate(tmp_path):
    env = _env(tmp_path)
    tmp = Path(env["TMPDIR"])
    args = ["run.inject_failure=hang", "sweep.timeout_s=600", f"sweep.results_dir={tmp_path / 'res'}"]
    sweep = subprocess.Popen(_cmd(tmp_path, *args, multirun=False), cwd=tmp_path, env=env)
    try:
        children = _wait(lambda: _child_pids(tmp))
        assert children, "the sweep never started its child"
        workdirs = list(tmp.glob("grpo-vram-*-*"))
        assert len(workdirs) == 1

        # a rerun while the first one measures: the duplicate is detected, nothing runs, no row is written
        again = subprocess.run(
            _cmd(tmp_path, *args, "hydra.run.dir=" + str(tmp_path / "h2"), multirun=False),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr[-2000:]
        assert "another process is running this config" in again.stdout

        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(timeout=30)
        assert _wait(lambda: not _child_pids(tmp) and [1], timeout=20) is not None
        assert _child_pids(tmp) == [], "the child outlived the killed sweep"
        assert _wait(lambda: not workdirs[0].exists(), timeout=10), "the child's work dir was left behind"
    finally:
        for pid in [sweep.pid, *_child_pids(tmp)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not (tmp_path / "res" / "t.jsonl").exists() or not records.load_rows(tmp_path / "res" / "t.jsonl")


@pytest.mark.parametrize(
    "override, message",
    [
        ("sweep.timeout_s=-1", "sweep.timeout_s=-1: accepted values are numbers of seconds > 0"),
        ("sweep.timeout_s=0", "sweep.timeout_s=0"),
        ("sweep.timeout_s=nan", "sweep.timeout_s=nan"),
        ("sweep.timeout_s=abc", "sweep.timeout_s='abc'"),
        ("sweep.name=a/b", "sweep.name='a/b'"),
        ("sweep.name=''", "sweep.name=''"),
        ("sweep.keep_workdir=maybe", "sweep.keep_workdir='maybe'"),
        ("sweep.gpus=[-1]", "sweep.gpus[]=-1"),
        ("trainer.beta=nan", "trainer.beta=nan: must be a number >= 0"),
        ("trainer.beta=-1", "trainer.beta=-1.0: must be a number >= 0"),
        ("trainer.beta=inf", "beta=inf"),
        ("trainer.lora_target_modules=[]", "lora_target_modules=[]"),
        ("trainer.lora_target_modules=[' ']", "lora_target_modules="),
        ("run.steps=abc", "run.steps='abc'"),
        ("run.num_prompts=0", "run.num_prompts=0"),
        ("run.learning_rate=-1", "run.learning_rate=-1"),
        ("run.force_length=maybe", "run.force_length='maybe'"),
    ],
)
def test_bad_sweep_settings_are_refused_up_front(override, message):
    with pytest.raises(BadInput) as exc:
        to_job(_compose(override))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "override",
    [
        "trainer.gradient_checkpointing=maybe",
        "trainer.max_completion_length=8.5",
        "trainer.per_device_train_batch_size=true",
        "trainer.per_device_train_batch_size=abc",
    ],
)
def test_wrong_types_never_reach_a_row(override):
    """The structured trainer schema refuses these while composing; were one to get through, to_job would."""
    try:
        cfg = _compose(override)
    except Exception as exc:  # Hydra / OmegaConf validation error: nothing runs
        assert "trainer." in str(exc)
        return
    with pytest.raises(BadInput):
        to_job(cfg)


def test_a_wrong_value_on_the_sweep_command_line_is_one_line_before_anything_runs(tmp_path):
    proc = subprocess.run(
        _cmd(tmp_path, "trainer.max_completion_length=8,8.5", f"sweep.results_dir={tmp_path / 'res'}"),
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "grpo-vram-sweep: trainer.max_completion_length=8.5: Value '8.5' of type 'float' could not be "
        "converted to Integer"
    ]
    assert not (tmp_path / "res").exists()  # not even the valid value ran
