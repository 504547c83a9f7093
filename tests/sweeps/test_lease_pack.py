"""The lease's way back: what a call wrote, packed in tarballs under the cap, nothing dropped silently; and the
call script's refusals."""

import os
import subprocess
import tarfile
from pathlib import Path

from sweeps.lease import pack

REPO = Path(__file__).resolve().parents[2]


def _write(root: Path, name: str, data: bytes) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_rows_first_logs_trimmed_and_everything_unpacks(tmp_path):
    _write(tmp_path, "results/raw/mincard.jsonl", b'{"key": "a"}\n')
    _write(tmp_path, "results/raw/trials/mincard.jsonl", b'{"trial": 1}\n')
    _write(tmp_path, "results/streams/gpu/abc.gpu.txt.gz", os.urandom(1000))
    _write(tmp_path, "outputs/mincard/20260101-000000/r00-1.log", b"x" * (pack.LOG_TAIL + 10) + b"END")
    _write(tmp_path, "elsewhere/not-carried.txt", b"no")
    items = pack.collect(tmp_path)
    assert [i.name for i in items] == [
        "results/raw/mincard.jsonl",
        "results/raw/trials/mincard.jsonl",
        "results/streams/gpu/abc.gpu.txt.gz",
        "outputs/mincard/20260101-000000/r00-1.log",
    ]
    log = items[-1].data
    assert len(log) == pack.LOG_TAIL and log.endswith(b"END")  # the tail, where the error is
    written = pack.pack(tmp_path, tmp_path / "out")
    assert [p.name for p in written] == ["lease-0.tgz"]
    dest = tmp_path / "unpacked"
    with tarfile.open(written[0]) as tar:
        tar.extractall(dest, filter="data")
    assert (dest / "results/raw/mincard.jsonl").read_bytes() == b'{"key": "a"}\n'
    assert (dest / "results/streams/gpu/abc.gpu.txt.gz").read_bytes() == (
        tmp_path / "results/streams/gpu/abc.gpu.txt.gz"
    ).read_bytes()


def test_cap_splits_and_what_cannot_fit_is_named(tmp_path):
    # random bytes do not compress: each stream is ~40 KB gzipped; a 100 KB cap holds two per tarball
    for i in range(5):
        _write(tmp_path, f"results/streams/gpu/s{i}.gpu.txt.gz", os.urandom(40_000))
    _write(tmp_path, "results/streams/gpu/huge.gpu.txt.gz", os.urandom(300_000))
    groups, left = pack.bins(pack.collect(tmp_path), cap=100_000, max_files=2)
    assert [len(g) for g in groups] == [2, 2]  # two tarballs at most, two streams each
    assert sorted(i.name.split("/")[-1] for i in left) == ["huge.gpu.txt.gz", "s4.gpu.txt.gz"]
    written = pack.pack(tmp_path, tmp_path / "out", cap=100_000, max_files=2)
    assert [p.name for p in written] == ["lease-0.tgz", "lease-1.tgz", "lease-left-out.txt"]
    assert all(p.stat().st_size <= 100_000 for p in written[:2])
    assert "huge.gpu.txt.gz\t300000 bytes" in written[2].read_text()


def test_call_script_refuses_an_unknown_stage_in_one_line():
    run = subprocess.run(
        ["bash", str(REPO / "sweeps/lease/call.sh"), "measure-everything"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "call.sh: stage 'measure-everything': accepted stages are mincard, zero, validate, or several joined by + "
        "(mincard+zero)"
    ]
    for stages, named in (
        ("mincard+zero+mincard", "'mincard' is named twice"),
        ("zero+", None),
        ("+zero", "''"),
    ):
        both = subprocess.run(
            ["bash", str(REPO / "sweeps/lease/call.sh"), stages, "x"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        # "zero+" is the zero stage alone: its budget "x" is what is refused
        assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1
        assert (named or "'x': accepted values are whole seconds") in both.stderr
    bad = subprocess.run(
        ["bash", str(REPO / "sweeps/lease/call.sh"), "zero", "ten"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "accepted values are whole seconds" in bad.stderr
