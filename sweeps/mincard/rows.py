"""One row per configuration once its search is over: the usual row of its baseline run (`measure.make_row`:
key, config, variant, versions, device, commit) plus `mincard`, what the search found (results/SCHEMA.md)."""

from __future__ import annotations

from sweeps.mincard import search
from sweeps.mincard.trials import as_trial
from sweeps.runner.job import Job
from sweeps.runner.measure import make_row

OUTCOME_STATUS = {"found": "ok", "no-fit": "oom", "failed": "error"}


def baseline_line(lines: list[dict]) -> dict | None:
    """The passing run with the largest limit: the least constrained one, whose peaks are the run's own."""
    passes = [line for line in lines if line["trial"]["status"] == "ok"]
    return max(passes, key=lambda line: line["trial"]["limit_bytes"]) if passes else None


def mincard_block(lines: list[dict], params: search.Params, steps: int, source: str) -> dict:
    """What the search found, every limit tried (in the order they ended) and the baseline's layers."""
    found = search.found([as_trial(line) for line in lines], params.granularity)
    base = baseline_line(lines)
    bt = base["trial"] if base else {}
    return {
        "source": source,
        "min_torch_bytes": found.min_passing_bytes,
        "max_failing_bytes": found.max_failing_bytes,
        "lower_bound_bytes": found.lower_bound_bytes,
        "resolution": params.resolution,
        "granularity_bytes": params.granularity,
        "k": params.k,
        "steps": steps,
        "limits_tried": [
            {
                k: line["trial"].get(k)
                for k in ("limit_bytes", "status", "peak_reserved_bytes", "peak_allocated_bytes", "seconds")
            }
            for line in lines
        ],
        "baseline": {
            "limit_bytes": bt.get("limit_bytes"),
            "peak_allocated_bytes": bt.get("peak_allocated_bytes"),
            "peak_reserved_bytes": bt.get("peak_reserved_bytes"),
            "nvidia_smi_peak_bytes": bt.get("nvidia_smi_peak_bytes"),
            "cuda_context_bytes": bt.get("cuda_context_bytes"),
        },
    }


def make_mincard_row(job: Job, lines: list[dict], outcome: str, params: search.Params) -> dict:
    """The configuration's row: status ok (found), oom (no limit up to the card's passes) or error."""
    status = OUTCOME_STATUS[outcome]
    base = baseline_line(lines)
    if status == "ok" and base is not None:
        result = {"status": "ok", "error": None, **base.get("result", {})}
    elif status == "oom":
        result = {"status": "oom", "error": f"no limit up to {params.max_limit} bytes passes"}
    else:
        result = {"status": "error", "error": "the search's runs kept failing without running out of memory"}
    row = make_row(job, result)
    row["mincard"] = mincard_block(lines, params, job.variant.get("steps", 2), row["source"])
    return row
