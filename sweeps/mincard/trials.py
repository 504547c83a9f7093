"""Each finished limit run, kept as it ends, so a search cut mid-way (a lease's deadline, a kill) resumes from the
limits already tried: one JSON line per run in `<results dir>/trials/<sweep>.jsonl`, appended atomically with
`records.append_row` (a folder of its own, so readers of `results/raw/*.jsonl` never take a run for a row)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sweeps import records
from sweeps.mincard.search import Trial

# Messages of a run that ran out of memory under its limit without torch's OutOfMemoryError: a library that
# allocated through torch's allocator and reported the failure itself (cuBLAS: CUBLAS_STATUS_ALLOC_FAILED).
OOM_MARKERS = ("out of memory", "alloc_failed")
KEPT_RESULT = ("observed", "model", "step_seconds", "train_seconds", "lengths", "versions", "device")


def trials_path(results_path: str | Path) -> Path:
    """Where the runs of the sweep whose rows go to `results_path` are kept."""
    results_path = Path(results_path)
    return results_path.parent / "trials" / results_path.name


# torch's OutOfMemoryError text (CUDACachingAllocator.cpp, `DeviceCachingAllocator::malloc`): "Tried to allocate
# <size>. GPU <n> has a total capacity of <size> of which <size> is free." -- sizes as c10's format_size prints them
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
_ASKED = re.compile(r"Tried to allocate " + _SIZE)
_FREE = re.compile(r"of which " + _SIZE + r" is free")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _bytes(match: re.Match) -> float:
    return float(match.group(1)) * _UNITS[match.group(2)]


def device_was_full(error: str) -> bool:
    """Whether torch's OOM text says the card itself had less free than the allocation asked for: the process's
    limit is then not what failed it (another process on the card took the memory), so the run bounds nothing.
    Under `set_per_process_memory_fraction` a limit's own failure comes before any cudaMalloc (`alloc_block`
    refuses a segment that would pass the cap), so the card still shows the room the allocation wanted."""
    asked, free = _ASKED.search(error), _FREE.search(error)
    return asked is not None and free is not None and _bytes(free) < _bytes(asked)


def status_of(result: dict) -> str:
    """`ok`, `oom` (out of memory under the limit, whoever reported it) or `error` (a crash, a timeout, an OOM the
    card's other processes caused: no bound)."""
    status = result.get("status")
    text = str(result.get("error") or "")
    if status == "ok":
        return status
    if status != "oom" and not any(m in text.lower() for m in OOM_MARKERS):
        return "error"
    return "error" if device_was_full(text) else "oom"


def peaks(result: dict) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) the run's torch counters saw: the torch_cuda probe's whole-run peaks for a
    finished run, the counters at the failure (since the last phase boundary) for a failed one."""
    probe = ((result.get("observed") or {}).get("probes") or {}).get("torch_cuda") or {}
    if probe.get("available"):
        return probe.get("peak_allocated_bytes"), probe.get("peak_reserved_bytes")
    seen = result.get("memory_limit") or {}
    return seen.get("peak_allocated_bytes"), seen.get("peak_reserved_bytes")


def trial_line(key: str, sweep: str, limit: int, result: dict, seconds: float) -> dict:
    """The kept line of one finished run: what the search and the row need (the measurement itself for a pass)."""
    allocated, reserved = peaks(result)
    nvml = ((result.get("observed") or {}).get("probes") or {}).get("nvml") or {}
    context = (result.get("observed") or {}).get("cuda_context") or {}
    line = {
        "schema": records.SCHEMA,
        "key": key,
        "sweep": sweep,
        "versions": result.get("versions") or records.package_versions(),
        "trial": {
            "limit_bytes": limit,
            "status": status_of(result),
            "error": result.get("error"),
            "peak_allocated_bytes": allocated,
            "peak_reserved_bytes": reserved,
            "nvidia_smi_peak_bytes": nvml.get("peak_process_bytes"),
            "cuda_context_bytes": context.get("context_bytes"),
            "seconds": round(seconds, 2),
        },
    }
    if line["trial"]["status"] == "ok":
        line["result"] = {k: result[k] for k in KEPT_RESULT if k in result}
    return line


def record(path: str | Path, line: dict) -> None:
    """Append one run's line atomically (never a half line, whatever kills the sweep)."""
    records.append_row(path, line)


def _is_bytes(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def trial_problem(line: dict) -> str | None:
    """Why a kept line cannot be read as a finished run (None when it can): its `trial` must be an object with a
    positive integer `limit_bytes` and peaks that are positive integers or null."""
    t = line.get("trial")
    if not isinstance(t, dict):
        return "trial is not an object"
    if not _is_bytes(t.get("limit_bytes")):
        return "trial.limit_bytes is not a positive integer"
    for name in ("peak_allocated_bytes", "peak_reserved_bytes"):
        if t.get(name) is not None and not _is_bytes(t[name]):
            return f"trial.{name} is neither null nor a positive integer"
    return None


_NOTED: set[str] = set()


def load(path: str | Path, key: str, versions: dict | None) -> list[dict]:
    """The kept lines of `key` under the same package versions (`records.versions_match`), oldest first. Lines
    that are not runs are skipped, said once per file and reason on stderr (`records.Loaded.report_lines`)."""
    loaded = records.read_rows(path, check=trial_problem)
    kept = [
        line
        for line in loaded.rows
        if line.get("key") == key
        and line["trial"].get("status") in ("ok", "oom")
        and records.versions_match(line.get("versions"), versions)
    ]
    for note in loaded.report_lines():
        if note not in _NOTED:
            _NOTED.add(note)
            print(f"grpo-vram-mincard: {note}; those runs are tried again", file=sys.stderr, flush=True)
    return kept


def as_trial(line: dict) -> Trial:
    """The search's view of a kept line."""
    t = line["trial"]
    return Trial(t["limit_bytes"], t["status"], t.get("peak_allocated_bytes"), t.get("peak_reserved_bytes"))
