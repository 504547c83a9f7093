"""Text from the user's files made safe to print on one terminal line."""

from __future__ import annotations

MAX_NAME_SHOWN = 120


def printable(text: str, n: int = MAX_NAME_SHOWN) -> str:
    """`text` as one printable line: control characters (a newline, an ANSI escape from a config.json's
    `_name_or_path`) escaped as Python writes them, cut to `n` characters."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= n else out[: n - 3] + "..."
