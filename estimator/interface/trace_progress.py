"""`vram-estimate --trace` as a long job: what it is doing and the time elapsed on stderr, library output kept
out of the terminal. Stdlib only (the estimator's path imports no progress library); the trace itself is the
sweep extra's (torch, transformers, TRL), loaded here by the caller's `load` function.

On a terminal the status line is redrawn in place (a spinner and the seconds elapsed: the trace's steps are
not counted, so there is no bar); elsewhere (a log, a pipe, a test) one line per stage and one every
`EVERY_S` seconds. Everything the libraries print while the trace runs (warnings, logs, C-level stderr) goes
to a temporary log, removed when the trace succeeds and named in the error line when it fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

EVERY_S = 10.0  # seconds between progress lines when stderr is not a terminal
TICK_S = 0.25  # redraw interval on a terminal
SPIN = "|/-\\"


class Progress:
    """A status line on `stream`: `stage(text)` starts a stage, a thread keeps the elapsed time current."""

    def __init__(self, stream, tty: bool | None = None, every_s: float = EVERY_S):
        self.stream = stream
        self.tty = _isatty(stream) if tty is None else tty
        self.every_s = every_s
        self.t0 = time.monotonic()
        self.text = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _write(self, line: str, final: bool = False) -> None:
        with self._lock:
            try:
                if self.tty:
                    self.stream.write("\r\033[K" + line + ("\n" if final else ""))
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # a closed stderr must not stop the trace
                pass

    def stage(self, text: str) -> None:
        self.text = text
        self._write(f"trace: {text} ({self.elapsed():.0f} s)")

    def done(self, text: str) -> None:
        self.text = ""
        self._write(f"trace: {text} ({self.elapsed():.0f} s)", final=True)

    def _run(self) -> None:
        n, last = 0, time.monotonic()
        while not self._stop.wait(TICK_S if self.tty else min(self.every_s, 1.0)):
            if not self.text:
                continue
            if self.tty:
                n += 1
                self._write(f"trace: {self.text} {SPIN[n % len(SPIN)]} {self.elapsed():.0f} s")
            elif time.monotonic() - last >= self.every_s:
                last = time.monotonic()
                self._write(f"trace: {self.text}, {self.elapsed():.0f} s elapsed")


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def libraries_to(log_path: str, progress_stream) -> Iterator[object]:
    """Send what libraries write to stderr (Python's sys.stderr and, where stderr is the process's fd 2, C-level
    writes too) to `log_path`; yields the stream progress should use (the user's stderr, kept apart)."""
    import warnings

    user = progress_stream
    saved_fd = None
    log = open(log_path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
    try:
        if _fd(progress_stream) == 2:  # the real stderr: keep a copy for progress, point fd 2 at the log
            sys.stderr.flush()
            saved_fd = os.dup(2)
            user = os.fdopen(os.dup(saved_fd), "w", buffering=1, encoding="utf-8", errors="replace")
            os.dup2(log.fileno(), 2)
        old_stderr = sys.stderr
        sys.stderr = log
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                yield user
            finally:
                sys.stderr = old_stderr
    finally:
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            user.close()
        log.close()


def _fd(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None


def traced_with_progress(cfg, load: Callable[[], Callable], run: Callable[..., dict], stream=None) -> dict:
    """Load the tracer and trace `cfg` (`run(cfg, make_row)`), reporting each stage and the time elapsed on
    `stream` (stderr); returns the trace's result dict (`status` "ok" or an error, with `error`). `load`'s
    UsageError (the sweep extra missing) propagates."""
    stream = sys.stderr if stream is None else stream
    fd, log_path = tempfile.mkstemp(prefix="vram-estimate-trace-", suffix=".log")
    os.close(fd)
    result: dict
    try:
        with libraries_to(log_path, stream) as user, Progress(user) as p:
            p.stage("loading the tracer")
            make_row = load()
            p.stage(f"tracing one GRPO step of {cfg.model} under fake tensors (loads torch and TRL first)")
            try:
                result = run(cfg, make_row)
            except Exception as e:  # noqa: BLE001 (any library failure is the trace failing: one line)
                error = f"{type(e).__name__}: {e}".splitlines()[0]
                result = {"source": "traced", "status": "error", "error": error}
            p.done("done" if result.get("status") == "ok" else "failed")
    except BaseException:
        os.unlink(log_path)
        raise
    if result.get("status") == "ok" or os.path.getsize(log_path) == 0:
        os.unlink(log_path)
    else:
        result = {**result, "error": f"{result.get('error')} (library output: {log_path})"}
    return result
