"""What a lease brought back, put in place: the `lease-N.tgz` files of one or more calls unpacked at the repo root.

    python -m sweeps.lease.unpack /work/.device/1 [/work/.device/2 ...]   (folders of lease-N.tgz, or the files)

The counterpart of `sweeps.lease.pack`. Each call's tarballs hold the rows files as they stood on the lent machine:
the tree it was given plus what it measured. A later call may have been given a tree without an earlier call's
rows, so a `.jsonl` file is merged, never replaced: every line not already in the local file is appended, in the
order it comes (a second unpack of the same tarballs adds nothing), under the lock `records.append_row` takes, so
rows a running sweep appends meanwhile are kept. Every other file (allocator streams, the min-card table, log
tails) is written whole. Files are written atomically, through a symlink to its target, keeping their mode. A member that is not a plain file under
`results/`, `outputs/` or `multirun/` (an absolute path, a `..`, a link) stops the unpack before anything is
written, with one line naming it.
"""

from __future__ import annotations

import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sweeps import records
from sweeps.oneline import OneLineParser, shown

ROOTS = ("results", "outputs", "multirun")  # where pack.PATTERNS collect from


class UnsafeMember(ValueError):
    """A tarball member this unpacker will not write."""


@dataclass(frozen=True)
class Placed:
    """One file put in place: its repo-relative name and what happened (`merged N lines`, `written`, `unchanged`)."""

    name: str
    action: str


def _number(path: Path) -> tuple[int, str]:
    n = path.name.removeprefix("lease-").removesuffix(".tgz")
    return (int(n), "") if n.isdigit() else (1 << 30, n)


def tarballs(paths: list[Path]) -> list[Path]:
    """The lease-N.tgz files named, or found in the folders named, in the order given (a folder's by N)."""
    out = []
    for path in paths:
        if path.is_dir():
            out += sorted(path.glob("lease-*.tgz"), key=_number)
        else:
            out.append(path)
    return out


def members(tgz: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member, each checked (UnsafeMember names the first that is not a plain file under
    ROOTS)."""
    out = []
    with tarfile.open(tgz, "r:gz") as tar:
        for info in tar.getmembers():
            name = PurePosixPath(info.name)
            parts = name.parts
            if not info.isfile() or name.is_absolute() or ".." in parts or not parts or parts[0] not in ROOTS:
                raise UnsafeMember(
                    f"{tgz.name}: member {shown(info.name, 80)}: accepted are plain files under {', '.join(ROOTS)}/"
                )
            out.append((name.as_posix(), tar.extractfile(info).read()))
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
    """Every member of every tarball, checked first, then put in place in order."""
    everything = [m for tgz in tarballs(paths) for m in members(tgz)]
    return [place(name, data, root) for name, data in everything]


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
    except UnsafeMember as exc:
        print(f"unpack: {exc}", file=sys.stderr)
        return 2
    except (tarfile.TarError, OSError, EOFError) as exc:
        print(
            f"unpack: {shown(str(exc), 120)}; accepted are the lease-N.tgz files a lease call returns",
            file=sys.stderr,
        )
        return 2
    for item in placed:
        print(f"unpack: {item.name}: {item.action}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
