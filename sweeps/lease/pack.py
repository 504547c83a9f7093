"""What a lease call measured, packed for the trip back: tarballs of repo-relative paths under a size cap.

    python -m sweeps.lease.pack [OUT_DIR] [--cap-mib 15] [--max-files 7]

A lent machine returns at most 8 files of 16 MiB each (docs/gpu-lease.md), so everything the stages write (the rows
in results/raw, the min-card trials, the real allocator streams and their index, the min-card table, the tail of
each run's log) is split into `lease-N.tgz` files of at most `cap` MiB each, in that order of importance. A file
that cannot fit is named in `lease-left-out.txt` instead of silently dropped. Unpack with `tar xzf` at the repo root.
"""

from __future__ import annotations

import io
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from sweeps.oneline import OneLineParser

MIB = 2**20
# what the stages write, most important first (rows before streams before logs)
PATTERNS = (
    "results/raw/*.jsonl",
    "results/raw/trials/*.jsonl",
    "results/streams/gpu/index.jsonl",
    "results/streams/gpu/*.gpu.txt.gz",
    "outputs/mincard/*/*.log",
    "multirun/*/*/*/*.log",
)
LOG_TAIL = 64 * 1024  # bytes kept from the end of each log


@dataclass(frozen=True)
class Item:
    """One file to carry back: its repo-relative name and its bytes (a log's tail only)."""

    name: str
    data: bytes


def collect(root: Path) -> list[Item]:
    """Every file the stages may have written, in PATTERNS order, each once."""
    seen: set[str] = set()
    items = []
    for pattern in PATTERNS:
        for path in sorted(root.glob(pattern)):
            name = path.relative_to(root).as_posix()
            if name in seen or not path.is_file():
                continue
            seen.add(name)
            data = path.read_bytes()
            items.append(Item(name, data[-LOG_TAIL:] if name.endswith(".log") else data))
    return items


def bins(items: list[Item], cap: int, max_files: int) -> tuple[list[list[Item]], list[Item]]:
    """Items in order into at most `max_files` groups whose compressed size stays under `cap` bytes (first fit,
    judged by each item's own gzip size); the items no group can take are returned apart."""
    groups: list[list[Item]] = []
    sizes: list[int] = []
    left_out = []
    for item in items:
        size = len(_gz([item]))
        fit = next((i for i, s in enumerate(sizes) if s + size <= cap), None)
        if fit is None and len(groups) < max_files and size <= cap:
            groups.append([])
            sizes.append(0)
            fit = len(groups) - 1
        if fit is None:
            left_out.append(item)
            continue
        groups[fit].append(item)
        sizes[fit] += size
    return groups, left_out


def _gz(items: list[Item]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for item in items:
            info = tarfile.TarInfo(item.name)
            info.size = len(item.data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(item.data))
    return buf.getvalue()


def pack(root: Path, out: Path, cap: int = 15 * MIB, max_files: int = 7) -> list[Path]:
    """Write lease-N.tgz (and lease-left-out.txt when something could not fit) into `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    groups, left_out = bins(collect(root), cap, max_files)
    written = []
    for i, group in enumerate(groups):
        path = out / f"lease-{i}.tgz"
        path.write_bytes(_gz(group))
        written.append(path)
    if left_out:
        path = out / "lease-left-out.txt"
        path.write_text("".join(f"{item.name}\t{len(item.data)} bytes\n" for item in left_out))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m sweeps.lease.pack", description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="outputs/lease", help="the folder the lease returns ($OUT)")
    p.add_argument("--cap-mib", type=float, default=15.0, help="largest tarball in MiB (default 15)")
    p.add_argument("--max-files", type=int, default=7, help="most tarballs (default 7; $OUT returns 8 files)")
    args = p.parse_args(argv)
    if not 0 < args.cap_mib <= 16 or not 1 <= args.max_files <= 8:
        print(
            f"pack: --cap-mib {args.cap_mib!r} / --max-files {args.max_files!r}: accepted are MiB in (0, 16] "
            "and 1 to 8 files",
            file=sys.stderr,
        )
        return 2
    root = Path.cwd()
    for path in pack(root, Path(args.out), int(args.cap_mib * MIB), args.max_files):
        print(f"pack: {path} {path.stat().st_size / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
