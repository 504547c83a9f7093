"""Unpacking a lease loses nothing and writes nothing it should not: rows a sweep appends during a merge are
kept, a symlinked rows file stays a link with its mode, a gzip stream that is not whole is refused, conflicting
targets are found before anything is written, a failed write names its file and leaves no temp file, and a lease
that is not a regular file is refused at once."""

import io
import os
import resource
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from sweeps import records
from sweeps.lease import unpack

REPO = Path(__file__).resolve().parents[2]
ROW = b'{"schema":1,"key":"k1"}\n'


def _tgz(path: Path, files: list[tuple[str, bytes]], level: int = 9) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz", compresslevel=level) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("unpack: "), err
    return err[0]


def test_a_merge_waits_for_the_lock_a_sweep_holds_and_keeps_its_row(tmp_path):
    rows = tmp_path / "results/raw/x.jsonl"
    rows.parent.mkdir(parents=True)
    rows.write_bytes(b'{"key":"old"}\n')
    with records.file_lock(records._lock_path(rows)):
        merge = threading.Thread(
            target=unpack.place, args=("results/raw/x.jsonl", b'{"key":"lease"}\n', tmp_path)
        )
        merge.start()
        merge.join(0.5)
        assert merge.is_alive()  # waiting for the lock, not merging into what it read before the sweep's row
        rows.write_bytes(b'{"key":"old"}\n{"key":"sweep"}\n')  # the sweep's append, under its lock
    merge.join(10)
    assert rows.read_bytes() == b'{"key":"old"}\n{"key":"sweep"}\n{"key":"lease"}\n'


def test_a_symlinked_rows_file_stays_a_link_and_its_target_keeps_its_mode(tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b'{"key":"local"}\n')
    elsewhere.chmod(0o640)
    link = tmp_path / "repo/results/raw/x.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    unpack.place("results/raw/x.jsonl", b'{"key":"lease"}\n', tmp_path / "repo")
    assert link.is_symlink()
    assert elsewhere.read_bytes() == b'{"key":"local"}\n{"key":"lease"}\n'
    assert oct(elsewhere.stat().st_mode & 0o777) == oct(0o640)
    table = tmp_path / "repo/results/table.md"
    table.write_bytes(b"old")
    table.chmod(0o600)
    unpack.place("results/table.md", b"new", tmp_path / "repo")
    assert table.read_bytes() == b"new" and oct(table.stat().st_mode & 0o777) == oct(0o600)


def _stored(tmp_path: Path) -> tuple[Path, bytes]:
    """A lease whose rows are stored, not deflated (level 0): a changed byte of a row changes only the CRC."""
    tgz = _tgz(
        tmp_path / "lease/lease-0.tgz",
        [("results/raw/a.jsonl", ROW + b'{"schema":1,"key":"k2","peak":123}\n')],
        0,
    )
    return tgz, tgz.read_bytes()


def _changed_digit(blob: bytes) -> bytes:
    at = blob.index(b'"peak":123') + len(b'"peak":1')
    return blob[:at] + b"9" + blob[at + 1 :]


def _flipped_bit(blob: bytes) -> bytes:
    at = len(blob) // 2
    return blob[:at] + bytes([blob[at] ^ 0x10]) + blob[at + 1 :]


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(_changed_digit, id="changed-digit"),
        pytest.param(lambda b: b[:-8] + bytes([b[-8] ^ 1]) + b[-7:], id="wrong-crc"),
        pytest.param(lambda b: b[:-8], id="cut-trailer"),
        pytest.param(lambda b: b[:-3], id="cut-length"),
        pytest.param(_flipped_bit, id="flipped-bit"),
        pytest.param(lambda b: b + b"garbage", id="trailing-garbage"),
        pytest.param(lambda b: b[10:], id="no-header"),
    ],
)
def test_a_gzip_stream_that_is_not_whole_is_refused_in_one_line_with_nothing_written(tmp_path, capsys, spoil):
    tgz, blob = _stored(tmp_path)
    tgz.write_bytes(spoil(blob))
    root = tmp_path / "repo"
    assert unpack.main([str(tgz), "--root", str(root)]) == 2
    line = _one_line(capsys)
    assert "lease-0.tgz" in line and "gzip" in line and "accepted" in line
    assert _files(root) == []


def test_a_bit_flipped_in_deflated_data_is_one_line_not_a_traceback(tmp_path, capsys):
    rows = b"".join(b'{"schema":1,"key":"k%d","peak":%d}\n' % (i, i * 7919) for i in range(2000))
    tgz = _tgz(tmp_path / "lease-0.tgz", [("results/raw/a.jsonl", rows)])
    blob = tgz.read_bytes()
    root = tmp_path / "repo"
    for at in range(40, len(blob) - 8, max(1, len(blob) // 40)):
        tgz.write_bytes(blob[:at] + bytes([blob[at] ^ 0x04]) + blob[at + 1 :])
        assert unpack.main([str(tgz), "--root", str(root)]) == 2, at
        _one_line(capsys)
        assert _files(root) == []


def test_a_tarball_that_unzips_past_the_bound_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(unpack, "MAX_UNPACKED", 64 * 1024)
    tgz = _tgz(tmp_path / "lease-0.tgz", [("results/raw/big.bin", bytes(1 << 20))])
    assert unpack.main([str(tgz), "--root", str(tmp_path / "repo")]) == 2
    assert "unzips to over" in _one_line(capsys)
    assert _files(tmp_path / "repo") == []


def test_a_member_under_another_member_is_refused_before_anything_is_written(tmp_path, capsys):
    tgz = _tgz(
        tmp_path / "lease-1.tgz",
        [("results/raw/b.txt", b"B"), ("results/raw/a.jsonl", ROW), ("results/raw/a.jsonl/x", b"y")],
    )
    root = tmp_path / "repo"
    assert unpack.main([str(tgz), "--root", str(root)]) == 2
    line = _one_line(capsys)
    assert "'results/raw/a.jsonl/x'" in line and "'results/raw/a.jsonl'" in line
    assert _files(root) == []


def test_a_member_named_as_a_result_folder_is_refused(tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    tgz = _tgz(tmp_path / "lease-1.tgz", [("results/raw/b.txt", b"B"), ("results", b"oops")])
    assert unpack.main([str(tgz), "--root", str(root)]) == 2
    assert "'results'" in _one_line(capsys)
    assert _files(root) == ["results"]


@pytest.mark.parametrize("where", ["results/raw", "results"])
def test_a_local_file_where_a_folder_is_needed_is_refused_before_anything_is_written(tmp_path, capsys, where):
    root = tmp_path / "repo"
    (root / where).parent.mkdir(parents=True, exist_ok=True)
    (root / where).write_bytes(b"a file")
    before = _files(root)
    tgz = _tgz(tmp_path / "lease-1.tgz", [("outputs/x.log", b"log"), ("results/raw/a.jsonl", ROW)])
    assert unpack.main([str(tgz), "--root", str(root)]) == 2
    line = _one_line(capsys)
    assert repr(str(root / where)) in line and "needs a folder" in line
    assert _files(root) == before


def test_a_local_folder_where_a_file_goes_is_refused_before_anything_is_written(tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "results/raw/a.jsonl").mkdir(parents=True)
    tgz = _tgz(tmp_path / "lease-1.tgz", [("outputs/x.log", b"log"), ("results/raw/a.jsonl", ROW)])
    assert unpack.main([str(tgz), "--root", str(root)]) == 2
    assert "a directory" in _one_line(capsys)
    assert not (root / "outputs").exists()


def _big_in_the_middle(tmp_path):
    """A lease of three files whose middle one (3 MiB) does not fit where the other two would."""
    return _tgz(
        tmp_path / "lease-1.tgz",
        [
            ("results/raw/a.txt", b"a"),
            ("results/raw/big.bin", os.urandom(3 << 20)),
            ("results/raw/c.txt", b"c"),
        ],
    )


def test_too_little_free_space_is_found_before_anything_is_written(tmp_path, capsys, monkeypatch):
    class Full:
        f_bavail, f_frsize = 256, 4096  # 1 MiB free

    monkeypatch.setattr(unpack.os, "statvfs", lambda path: Full)
    tgz = _big_in_the_middle(tmp_path)
    root = tmp_path / "repo"
    assert unpack.main([str(tgz), "--root", str(root)]) == 2
    assert "KiB free" in _one_line(capsys)
    assert _files(root) == []


def _limited(limit: int):
    def run():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return run


def test_a_write_that_fails_names_its_file_and_the_error_and_leaves_no_temp_file(tmp_path):
    tgz = _big_in_the_middle(tmp_path)
    root = tmp_path / "repo"
    done = subprocess.run(
        [sys.executable, "-m", "sweeps.lease.unpack", str(tgz), "--root", str(root)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=_limited(1 << 20),  # a file past 1 MiB fails as on a full disk, after a.txt is placed
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "big.bin" in err[0] and os.strerror(27) in err[0], err
    assert "results/raw/a.txt: written" in done.stdout
    assert _files(root) == ["results", "results/raw", "results/raw/a.txt"]  # no temp file left


def _unpack_in_a_child(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sweeps.lease.unpack", *args],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,  # a lease that is opened and waited on would hang here
    )


def test_a_fifo_named_as_a_lease_is_refused_at_once(tmp_path):
    leases = tmp_path / "lease"
    leases.mkdir()
    os.mkfifo(leases / "lease-1.tgz")
    for given in (leases, leases / "lease-1.tgz"):
        done = _unpack_in_a_child([str(given), "--root", str(tmp_path / "repo")])
        err = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(err) == 1 and "FIFO" in err[0] and "lease-1.tgz" in err[0], err


def test_a_folder_named_as_a_lease_is_refused(tmp_path, capsys):
    leases = tmp_path / "lease"
    (leases / "lease-1.tgz").mkdir(parents=True)
    assert unpack.main([str(leases), "--root", str(tmp_path / "repo")]) == 2
    assert "not a regular file" in _one_line(capsys)
