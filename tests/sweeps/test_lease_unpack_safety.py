"""Unpacking a lease loses nothing and writes nothing it should not: rows a sweep appends during a merge are
kept, a symlinked rows file stays a link with its mode, a gzip stream that is not whole is refused, conflicting
targets are found before anything is written, a failed write names its file and leaves no temp file, and a lease
that is not a regular file is refused at once."""

import io
import tarfile
import threading
from pathlib import Path

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
