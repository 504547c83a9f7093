"""argparse for the sweeps' command-line tools: bad input is one line on stderr and exit code 2 (no usage dump)."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """`prog: error: message` on one stderr line, exit 2, instead of argparse's usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def shown(value, limit: int = 80) -> str:
    """`value` for a one-line message: repr (control characters escaped), cut to about `limit` characters
    with its full length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = (
        f"{len(value)} characters" if isinstance(value, (str, bytes)) else f"{len(text)} characters as text"
    )
    return f"{text[: limit - 3]}... ({size})"
