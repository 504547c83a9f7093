"""What a lease brought back, put in place: the `lease-N.tgz` files of one or more calls unpacked at the repo root.

    python -m sweeps.lease.unpack /work/.device/1 [/work/.device/2 ...]   (folders of lease-N.tgz, or the files)

The counterpart of `sweeps.lease.pack`. Each call's tarballs hold the rows files as they stood on the lent machine:
the tree it was given plus what it measured. A later call may have been given a tree without an earlier call's
rows, so a `.jsonl` file is merged, never replaced: every line not already in the local file is appended, in the
order it comes (a second unpack of the same tarballs adds nothing), under the lock `records.append_row` takes, so
rows a running sweep appends meanwhile are kept. Every other file (allocator streams, the min-card table, log
tails) is written whole. Files are written atomically, through a symlink to its target, keeping their mode.

Everything is checked before anything is written, and a problem is one line naming it: a lease that is not a
regular file of at most 16 MiB, a gzip stream that is not whole (a wrong CRC, a cut trailer, a flipped bit), a
member that is not a plain file under `results/`, `outputs/` or `multirun/` (an absolute path, a `..`, a link),
two members where one is the other's folder, a local file where a member needs a folder (or a folder where it
needs a file), and too little free space. A write that still fails (the disk filled meanwhile) names the file and
the error; what was placed before it stays, and a rerun places only what is missing.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sweeps import records
from sweeps.oneline import OneLineParser, shown

ROOTS = ("results", "outputs", "multirun")  # where pack.PATTERNS collect from
MIB = 2**20
MAX_TGZ = 16 * MIB  # the most a lease returns per file (pack's --cap-mib is at most 16)
MAX_UNPACKED = 512 * MIB  # the most one tarball may hold once unzipped
ACCEPTED = "accepted are the lease-N.tgz files a lease call returns"


class BadLease(ValueError):
    """A lease tarball, or what it would write, that this unpacker refuses; the message is one line."""


class UnsafeMember(BadLease):
    """A tarball member this unpacker will not write."""


class PlaceFailed(OSError):
    """Writing one file failed; `placed` are the files put in place before it."""

    def __init__(self, message: str, placed: list[Placed]):
        super().__init__(message)
        self.placed = placed


@dataclass(frozen=True)
class Placed:
    """One file put in place: its repo-relative name and what happened (`merged N lines`, `written`, `unchanged`)."""

    name: str
    action: str


def _number(path: Path) -> tuple[int, str]:
    n = path.name.removeprefix("lease-").removesuffix(".tgz")
    return (int(n), "") if n.isascii() and n.isdigit() else (1 << 30, n)


def tarballs(paths: list[Path]) -> list[Path]:
    """The lease-N.tgz files named, or found in the folders named, in the order given (a folder's by N)."""
    out = []
    for path in paths:
        if path.is_dir():
            out += sorted(path.glob("lease-*.tgz"), key=_number)
        else:
            out.append(path)
    return out


def _kind(mode: int) -> str:
    for test, kind in records._KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def _named(tgz: Path) -> str:
    """`tgz` for a one-line message: its name first, so a long folder cut short never hides it."""
    return f"{shown(tgz.name, 60)} in {shown(str(tgz.parent), 80)}"


def read_tarball(tgz: Path) -> bytes:
    """The bytes of `tgz`, a regular file of at most MAX_TGZ bytes. Opened without blocking, so a FIFO is refused
    at once instead of waited on."""
    try:
        fd = os.open(tgz, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise BadLease(f"{_named(tgz)}: cannot be read ({exc.strerror or exc}); {ACCEPTED}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadLease(f"{_named(tgz)} is {_kind(st.st_mode)}, not a regular file; {ACCEPTED}")
        if st.st_size > MAX_TGZ:
            raise BadLease(f"{_named(tgz)} holds {st.st_size} bytes, over {MAX_TGZ // MIB} MiB; {ACCEPTED}")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_TGZ + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TGZ:
        raise BadLease(f"{_named(tgz)} grew over {MAX_TGZ // MIB} MiB while read; {ACCEPTED}")
    return data


def gunzip(tgz: Path, blob: bytes) -> bytes:
    """`blob` unzipped to its end, every gzip member's CRC and length checked, at most MAX_UNPACKED bytes; a
    stream that is not whole raises BadLease naming `tgz`."""
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(blob), mode="rb") as gz:
            while chunk := gz.read(MIB):
                out += chunk
                if len(out) > MAX_UNPACKED:
                    raise BadLease(f"{_named(tgz)} unzips to over {MAX_UNPACKED // MIB} MiB; {ACCEPTED}")
    except (OSError, EOFError, zlib.error) as exc:
        why = shown(str(exc) or type(exc).__name__, 100)
        raise BadLease(f"{_named(tgz)} is not a whole gzip stream ({why}); {ACCEPTED}") from None
    return bytes(out)


def members(tgz: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member, the whole gzip stream checked first (BadLease), then each member
    (UnsafeMember names the first that is not a plain file under ROOTS)."""
    raw = gunzip(tgz, read_tarball(tgz))
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar.getmembers():
                name = PurePosixPath(info.name)
                parts = name.parts
                if (
                    not info.isfile()
                    or name.is_absolute()
                    or ".." in parts
                    or len(parts) < 2
                    or parts[0] not in ROOTS
                ):
                    raise UnsafeMember(
                        f"{tgz.name}: member {shown(info.name, 80)}: accepted are plain files under "
                        f"{', '.join(ROOTS)}/"
                    )
                out.append((name.as_posix(), tar.extractfile(info).read()))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BadLease(
            f"{_named(tgz)} is not a whole tar archive ({shown(str(exc), 80)}); {ACCEPTED}"
        ) from None
    return out


def merged_lines(local: bytes, incoming: bytes) -> tuple[bytes, int]:
    """`local` with every line of `incoming` it lacks appended, in incoming's order; and how many were added."""
    have = set(local.splitlines())
    head = local if not local or local.endswith(b"\n") else local + b"\n"
    added = []
    for line in incoming.splitlines():
        if line.strip() and line not in have:
            added.append(line)
            have.add(line)
    return head + b"".join(line + b"\n" for line in added), len(added)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _existing_folder(path: Path) -> Path:
    """The nearest folder at or above `path` that exists."""
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def check(items: list[tuple[Path, str, bytes]], root: Path) -> None:
    """Raise BadLease, before anything is written, when an item (tarball, name, bytes) cannot be put in place
    under `root`: a member under another member, a local file or special file where a folder is needed, a
    folder or special file where a file goes, a broken link on the way, or too little free space."""
    names = {name: tgz for tgz, name, _ in items}
    for tgz, name, _ in items:
        parts = PurePosixPath(name).parts
        for k in range(1, len(parts)):
            above = "/".join(parts[:k])
            if above in names:
                raise BadLease(
                    f"{tgz.name}: member {shown(name, 80)} lies under member {shown(above, 80)} "
                    f"(of {names[above].name}), a file; {ACCEPTED}"
                )
        for k in range(len(parts)):
            folder = root.joinpath(*parts[:k])
            try:
                mode = os.stat(folder).st_mode
            except FileNotFoundError:
                if os.path.lexists(folder):
                    raise BadLease(f"{shown(str(folder), 100)} is a broken link where {shown(name, 80)} needs a "
                                   f"folder; remove it or point it at a folder") from None  # fmt: skip
                break
            if not stat.S_ISDIR(mode):
                raise BadLease(
                    f"{shown(str(folder), 100)} is {_kind(mode) if not stat.S_ISREG(mode) else 'a file'} where "
                    f"{shown(name, 80)} needs a folder; accepted is a folder there, or nothing"
                )
        try:
            records.resolve_target(root / name)
        except records.SpecialFile as exc:
            raise BadLease(f"{shown(str(exc), 160)} (where {shown(name, 80)} goes)") from None
    _check_space(items, root)


def _check_space(items: list[tuple[Path, str, bytes]], root: Path) -> None:
    """BadLease when a filesystem has too little free space for the files as they are replaced in order: each
    new file is written beside the old one before the old one goes."""
    grown: dict[int, int] = {}
    need: dict[int, tuple[int, Path]] = {}
    for _, name, data in items:
        target = records.resolve_target(root / name)
        folder = _existing_folder(target.parent)
        dev = os.stat(folder).st_dev
        old = _size(target)
        new = (
            old + len(data) if name.endswith(".jsonl") else len(data)
        )  # a merge adds at most the incoming lines
        step = grown.get(dev, 0) + new + 4096
        if step > need.get(dev, (0, folder))[0]:
            need[dev] = (step, folder)
        grown[dev] = grown.get(dev, 0) + max(new - old, 0)
    for step, folder in need.values():
        vfs = os.statvfs(folder)
        free = vfs.f_bavail * vfs.f_frsize
        if step > free:
            raise BadLease(
                f"{shown(str(folder), 100)}: {free // 1024} KiB free, the lease needs about {step // 1024} KiB "
                "there; free some space and rerun"
            )


def place(name: str, data: bytes, root: Path) -> Placed:
    """Put one member in place under `root`: merge a .jsonl (under the rows file's lock), write anything else;
    both atomically, through a symlink to its target, keeping the file's mode."""
    path = records.resolve_target(root / name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".jsonl"):
        with records.file_lock(records._lock_path(path)):
            path = records.resolve_target(path)  # what it is now, under the lock
            old = path.read_bytes() if path.exists() else b""
            new, added = merged_lines(old, data)
            if added:
                records._replace_file(path, new)
        return Placed(name, f"merged {added} new line(s)" if added else "unchanged")
    old = path.read_bytes() if path.exists() else None
    if old == data:
        return Placed(name, "unchanged")
    records._replace_file(path, data)
    return Placed(name, "written")


def unpack(paths: list[Path], root: Path) -> list[Placed]:
    """Every member of every tarball, all checked first (BadLease), then put in place in order (PlaceFailed
    names the file a write failed on, with what was placed before it)."""
    items = [(tgz, name, data) for tgz in tarballs(paths) for name, data in members(tgz)]
    check(items, root)
    placed: list[Placed] = []
    for _, name, data in items:
        try:
            placed.append(place(name, data, root))
        except OSError as exc:
            raise PlaceFailed(
                f"{shown(str(root / name), 100)}: {exc.strerror or shown(str(exc), 80)}; placed before it: "
                f"{len(placed)} of {len(items)} (a rerun places only what is missing)",
                placed,
            ) from None
    return placed


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m sweeps.lease.unpack", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path, help="folders holding lease-N.tgz, or the tarballs")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the repo root (default: here)")
    args = p.parse_args(argv)
    for path in args.paths:
        if not path.exists():
            print(f"unpack: {shown(str(path), 80)}: no such file or folder; accepted are lease folders or tarballs",
                  file=sys.stderr)  # fmt: skip
            return 2
    found = tarballs(args.paths)
    if not found:
        print(
            "unpack: no lease-N.tgz in the folders given; accepted are lease folders or tarballs",
            file=sys.stderr,
        )
        return 2
    try:
        placed = unpack(args.paths, args.root)
    except BadLease as exc:
        print(f"unpack: {exc}", file=sys.stderr)
        return 2
    except PlaceFailed as exc:
        for item in exc.placed:
            print(f"unpack: {item.name}: {item.action}")
        print(f"unpack: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"unpack: {shown(str(exc), 160)}", file=sys.stderr)
        return 2
    for item in placed:
        print(f"unpack: {item.name}: {item.action}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
