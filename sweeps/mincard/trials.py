"""Each finished limit run, kept as it ends, so a search cut mid-way (a lease's deadline, a kill) resumes from the
limits already tried: one JSON line per run in `<results dir>/trials/<sweep>.jsonl`, appended atomically with
`records.append_row` (a folder of its own, so readers of `results/raw/*.jsonl` never take a run for a row)."""

from __future__ import annotations

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


def status_of(result: dict) -> str:
    """`ok`, `oom` (out of memory under the limit, whoever reported it) or `error` (a crash, a timeout: no bound)."""
    status = result.get("status")
    if status in ("ok", "oom"):
        return status
    text = str(result.get("error") or "").lower()
    return "oom" if any(m in text for m in OOM_MARKERS) else "error"


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


def load(path: str | Path, key: str, versions: dict | None) -> list[dict]:
    """The kept lines of `key` under the same package versions (`records.versions_match`), oldest first."""
    return [
        line
        for line in records.load_rows(path)
        if line.get("key") == key
        and isinstance(line.get("trial"), dict)
        and line["trial"].get("status") in ("ok", "oom")
        and records.versions_match(line.get("versions"), versions)
    ]


def as_trial(line: dict) -> Trial:
    """The search's view of a kept line."""
    t = line["trial"]
    return Trial(t["limit_bytes"], t["status"], t.get("peak_allocated_bytes"), t.get("peak_reserved_bytes"))
