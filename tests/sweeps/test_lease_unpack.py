"""Bringing a lease home: rows merged line by line whatever order the calls are unpacked in, other files written
whole, a second unpack a no-op, and a tarball with a member outside the repo's result folders refused whole."""

import io
import tarfile
from pathlib import Path

from sweeps.lease import pack, unpack


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_two_calls_merge_into_the_local_rows_in_any_order(tmp_path):
    root = tmp_path / "repo"
    (root / "results/raw").mkdir(parents=True)
    (root / "results/raw/mincard.jsonl").write_bytes(b'{"k": "old"}\n{"k": "local"}\n')
    # call 1 was given the tree with "old"; call 2 was given it without call 1's row
    one = tmp_path / "1"
    one.mkdir()
    _tgz(one / "lease-0.tgz", {"results/raw/mincard.jsonl": b'{"k": "old"}\n{"k": "call1"}\n',
                               "results/streams/gpu/a.gpu.txt.gz": b"stream-a"})  # fmt: skip
    two = tmp_path / "2"
    two.mkdir()
    _tgz(two / "lease-0.tgz", {"results/raw/mincard.jsonl": b'{"k": "old"}\n{"k": "call2"}'})
    placed = unpack.unpack([two, one], root)
    assert (root / "results/raw/mincard.jsonl").read_bytes() == (
        b'{"k": "old"}\n{"k": "local"}\n{"k": "call2"}\n{"k": "call1"}\n'
    )
    assert (root / "results/streams/gpu/a.gpu.txt.gz").read_bytes() == b"stream-a"
    assert [p.action for p in placed] == ["merged 1 new line(s)", "merged 1 new line(s)", "written"]
    again = unpack.unpack([one, two], root)
    assert {p.action for p in again} == {"unchanged"}


def test_what_pack_writes_comes_back_where_it_was(tmp_path):
    lent = tmp_path / "lent"
    for name, data in {"results/raw/trials/mincard.jsonl": b'{"t": 1}\n', "results/raw/mincard.jsonl": b'{"r": 1}\n',
                       "outputs/mincard/x/r00-1.log": b"log"}.items():  # fmt: skip
        (lent / name).parent.mkdir(parents=True, exist_ok=True)
        (lent / name).write_bytes(data)
    out = tmp_path / "out"
    pack.pack(lent, out)
    home = tmp_path / "home"
    assert unpack.main([str(out), "--root", str(home)]) == 0
    for name in (
        "results/raw/trials/mincard.jsonl",
        "results/raw/mincard.jsonl",
        "outputs/mincard/x/r00-1.log",
    ):
        assert (home / name).read_bytes() == (lent / name).read_bytes()


def test_a_member_outside_the_result_folders_stops_everything_in_one_line(tmp_path, capsys):
    root = tmp_path / "repo"
    root.mkdir()
    bad = _tgz(tmp_path / "lease-0.tgz", {"results/raw/a.jsonl": b"{}\n", "../../etc/evil": b"x"})
    assert unpack.main([str(bad), "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'../../etc/evil'" in err[0] and "accepted" in err[0]
    assert not (root / "results").exists()  # nothing written


def test_bad_paths_are_one_line_and_exit_2(tmp_path, capsys):
    assert unpack.main([str(tmp_path / "nowhere")]) == 2
    assert unpack.main([str(tmp_path)]) == 2  # a folder without tarballs
    (tmp_path / "lease-0.tgz").write_bytes(b"not a tarball")
    assert unpack.main([str(tmp_path / "lease-0.tgz"), "--root", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("unpack: ") and "accepted" in line for line in lines)
