"""A lease call carries the working tree and the wheels in 64 MiB (docs/gpu-lease.md): the tracked files must leave
room for `make lease-wheels`' folder, so a large file committed here (an every-token allocator stream, a dataset)
fails here rather than on the lent machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CALL_BYTES = 64 * 2**20  # what one `run` call carries
WHEELS_BYTES = 19 * 10**6  # `.whl/` as `sweeps/lease/wheels.sh` builds it (17.9 MB, measured here)


def test_the_tracked_tree_leaves_room_for_the_wheels():
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    names = [n for n in out.decode().split("\0") if n]
    tracked = sum((REPO / n).stat().st_size for n in names if (REPO / n).is_file())
    assert tracked + WHEELS_BYTES < CALL_BYTES, f"tracked files {tracked / 2**20:.1f} MiB"
