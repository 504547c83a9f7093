"""argparse for the sweeps' command-line tools: bad input is one line on stderr and exit code 2 (no usage dump)."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """`prog: error: message` on one stderr line, exit 2, instead of argparse's usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")
