"""The results file under faults: special files, symlinks, full disks, modes, a missing last newline,
lock files, and a measurement whose append fails (kept, said in one line, appended by the next run)."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sweeps import records

REPO = Path(__file__).resolve().parents[2]
ROW = {"schema": 1, "key": "a", "status": "ok"}


def _keys(path: Path) -> list[str]:
    return [json.loads(line)["key"] for line in path.read_text().splitlines()]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix in (".tmp", ".lock"))


def _char_device(path: Path) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the same device as /dev/null
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a character device here ({exc.strerror})")
    return path


def test_a_character_device_is_refused_and_stays_a_device(tmp_path):
    dev = _char_device(tmp_path / "r.jsonl")
    with pytest.raises(OSError, match="character device"):
        records.append_row(dev, ROW)
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    problem = records.writable_problem(dev)
    assert problem and "character device" in problem and "\n" not in problem


def test_a_symlink_to_dev_null_is_refused_and_stays_a_link(tmp_path):
    link = tmp_path / "r.jsonl"
    link.symlink_to("/dev/null")
    with pytest.raises(OSError, match="character device"):
        records.append_row(link, ROW)
    assert link.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_refused_at_once_not_read_forever(tmp_path):
    fifo = tmp_path / "r.jsonl"
    os.mkfifo(fifo)
    code = textwrap.dedent(f"""
        from sweeps import records
        try:
            records.append_row({str(fifo)!r}, {ROW!r})
        except OSError as exc:
            print(exc)
    """)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("append_row on a FIFO hung (it read the pipe)")
    assert "FIFO" in done.stdout, done.stdout + done.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlinked_results_file_is_written_through_to_its_target(tmp_path):
    target = tmp_path / "real" / "r.jsonl"
    target.parent.mkdir()
    records.append_row(target, ROW)
    link = tmp_path / "r.jsonl"
    link.symlink_to(target)
    records.append_row(link, {**ROW, "key": "b"})
    assert link.is_symlink()
    assert _keys(target) == ["a", "b"]
    assert records.writable_problem(link) is None


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "r.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    records.append_row(link, ROW)
    assert link.is_symlink() and _keys(tmp_path / "elsewhere.jsonl") == ["a"]


def test_the_file_keeps_its_mode(tmp_path):
    path = tmp_path / "r.jsonl"
    records.append_row(path, ROW)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~_umask()
    os.chmod(path, 0o664)
    records.append_row(path, {**ROW, "key": "b"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o664
    assert records.replace_row(path, {**ROW, "key": "b", "status": "oom"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o664


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_whole_last_line_without_a_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(ROW))  # an editor saved it without the final newline
    records.append_row(path, {**ROW, "key": "b"})
    assert _keys(path) == ["a", "b"]


def test_a_partial_last_line_is_dropped_and_said(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(ROW) + '\n{"schema": 1, "key": "b", "n"')
    records.append_row(path, {**ROW, "key": "c"})
    assert _keys(path) == ["a", "c"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "partial last line" in err[0] and "line 2" in err[0]


def test_no_lock_or_temp_file_is_left_beside_the_results(tmp_path):
    path = tmp_path / "r.jsonl"
    records.append_row(path, ROW)
    records.replace_row(path, {**ROW, "status": "oom"})
    assert records.writable_problem(path) is None
    assert _leftovers(tmp_path) == []


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_up_front_check_finds_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    monkeypatch.setattr(os, "write", _no_space)
    problem = records.writable_problem(path)
    assert problem and "No space left on device" in problem
    assert list(tmp_path.iterdir()) == []  # its probe file is gone


def test_a_failed_append_raises_and_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    records.append_row(path, ROW)
    before = path.read_bytes()
    for name in ("write", "replace"):
        with monkeypatch.context() as m:
            m.setattr(os, name, _no_space)
            with pytest.raises(OSError, match="No space left"):
                records.append_row(path, {**ROW, "key": "b"})
        assert path.read_bytes() == before
        assert _leftovers(tmp_path) == []


def test_an_unsaved_row_is_kept_and_recovered(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    records.append_row(path, ROW)
    kept = records.save_unsaved(path, {**ROW, "key": "b"})
    assert kept is not None and kept.parent == records.unsaved_dir(path)
    assert json.loads(kept.read_text())["row"]["key"] == "b"
    assert records.recover_unsaved(path) == (1, [])
    assert _keys(path) == ["a", "b"] and not records.unsaved_dir(path).exists()


def test_an_unsaved_row_falls_back_to_the_state_dir(tmp_path, monkeypatch):
    path = tmp_path / "res" / "r.jsonl"
    path.parent.mkdir()
    records.unsaved_dir(path).write_text("in the way")  # <results>.unsaved cannot be a folder
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    kept = records.save_unsaved(path, {**ROW, "key": "b"})
    assert kept is not None and kept.is_relative_to(tmp_path / "state")
    other = tmp_path / "other.jsonl"
    assert records.recover_unsaved(other) == (0, [])  # rows of another results file stay
    assert records.recover_unsaved(path) == (1, [])
    assert _keys(path) == ["b"] and not kept.exists()


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")


def test_a_real_full_disk(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "256k")
    try:
        path = disk / "r.jsonl"
        assert records.writable_problem(path) is None
        records.append_row(path, ROW)
        (disk / "filler").write_bytes(b"x" * 200_000)
        problem = records.writable_problem(path)
        assert problem and "No space left on device" in problem
        before = path.read_bytes()
        with pytest.raises(OSError, match="No space left"):
            records.append_row(path, {**ROW, "key": "b", "pad": "x" * 80_000})
        assert path.read_bytes() == before and _leftovers(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_concurrent_appends_keep_every_row(tmp_path):
    """The lock file is removed after each append; two writers still never lose a row."""
    path = tmp_path / "r.jsonl"
    code = textwrap.dedent(f"""
        import sys
        from sweeps import records
        for i in range(40):
            records.append_row({str(path)!r}, {{"schema": 1, "key": sys.argv[1] + str(i)}})
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code, w], env=env) for w in "xy"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    keys = _keys(path)
    assert sorted(keys) == sorted(f"{w}{i}" for w in "xy" for i in range(40))
    assert _leftovers(tmp_path) == []


def test_the_legacy_runner_keeps_a_row_it_could_not_append(tmp_path, monkeypatch, capsys):
    from sweeps.runner import legacy

    monkeypatch.setattr(records, "append_row", _no_space)
    out = tmp_path / "legacy.jsonl"
    assert legacy.record_unrunnable(out, "0.14", "cannot build") == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "No space left on device" in line and "legacy.jsonl.unsaved" in line
    monkeypatch.undo()
    assert records.recover_unsaved(out) == (1, [])
    assert [r["error"] for r in records.load_rows(out)] == ["cannot build"]


def test_gpu_locks_are_per_user_and_removed(tmp_path, monkeypatch):
    from sweeps.runner import measure

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with measure.claim_gpu([3]) as gpu:
        assert gpu == 3 and (tmp_path / "grpo-vram" / "gpu-3.lock").exists()
    assert list((tmp_path / "grpo-vram").iterdir()) == []
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with measure.claim_gpu([0]):
        pass
    assert [p.name for p in (tmp_path / "t").iterdir()] == [f"grpo-vram-{os.getuid()}"]


DEEP = b"[" * 200_000 + b"]" * 200_000  # whole JSON, nested deeper than the parser's recursion limit


def test_a_deeply_nested_last_line_is_kept_and_the_row_appended(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + DEEP)
    records.append_row(path, {**ROW, "key": "b"})
    lines = path.read_bytes().splitlines()
    assert lines[1] == DEEP and json.loads(lines[2])["key"] == "b"
    assert records.replace_row(path, {**ROW, "key": "b", "status": "oom"})
    assert path.read_bytes().splitlines()[1] == DEEP
    loaded = records.read_rows(path)
    assert [r["key"] for r in loaded.rows] == ["a", "b"] and len(loaded.skipped) == 1
    index = tmp_path / "index.jsonl"
    index.write_bytes(b'{"config": {}}\n' + DEEP + b"\n")
    assert records.read_index(index) == ([{"config": {}}], 1)


def test_a_measurement_whose_append_fails_in_any_way_is_kept(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from sweeps.runner import measure

    def _parser_fails(*_args, **_kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(records, "append_row", _parser_fails)
    path = tmp_path / "r.jsonl"
    job = SimpleNamespace(results_path=path, key="a", config=SimpleNamespace(model="tiny"))
    assert measure.store_row(job, {**ROW}, tmp_path)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "RecursionError" in line and "r.jsonl.unsaved" in line
    monkeypatch.undo()
    assert records.recover_unsaved(path) == (1, [])
    assert _keys(path) == ["a"]


def test_a_fifo_among_the_result_files_is_noted_not_read(tmp_path):
    (tmp_path / "b.jsonl").write_text(json.dumps(ROW) + "\n")
    os.mkfifo(tmp_path / "a.jsonl")
    code = textwrap.dedent(f"""
        from sweeps.report import accuracy_cli
        raise SystemExit(accuracy_cli.main([{str(tmp_path)!r}]))
    """)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a folder holding a FIFO hung (it opened the pipe)")
    assert done.returncode == 0, done.stderr
    assert (
        f"skipped {tmp_path / 'a.jsonl'}: not read (a FIFO (named pipe), not a regular file)" in done.stderr
    )
    loaded = records.read_rows(tmp_path)
    assert [r["key"] for r in loaded.rows] == ["a"]
    assert records.read_index(tmp_path / "a.jsonl") == ([], 1)
