"""Release numbers as text: `5.24.0`, `v1.16`, `2.13.0+cpu` -> (major, minor)."""

from __future__ import annotations

import re

Version = tuple[int, int]

# MAJOR.MINOR, an optional .PATCH and a short tail (rc1, .dev0, +cu130): no nested repetition, so hostile input
# costs linear time
_VERSION = re.compile(
    r"v?(\d{1,6})\.(\d{1,6})(?:\.\d{1,6})?[-+.]?[A-Za-z0-9.+]{0,40}", re.ASCII
)  # ASCII digits only


def parse_version(text: str) -> Version:
    """`5.24`, `5.24.0`, `v5.24.1`, `2.13.0+cpu`, `0.19.0.dev0` -> (major, minor); ValueError otherwise."""
    m = _VERSION.fullmatch(str(text).strip()[:80])
    if not m:
        raise ValueError(f"{str(text)[:40]!r}: expected MAJOR.MINOR, e.g. 1.16")
    return int(m.group(1)), int(m.group(2))


def fmt(v: Version) -> str:
    return f"{v[0]}.{v[1]}"


def span(first: Version, last: Version) -> str:
    """`0.14` or `0.20-0.21`: the minor releases first..last."""
    a, b = fmt(first), fmt(last)
    return a if a == b else f"{a}-{b}"
