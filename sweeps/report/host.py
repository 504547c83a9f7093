"""The host RAM line on real GPU runs: the estimator's host figures (`estimator.step.offload.host_ram`, estimated,
each process's own memory measured) against the `host` probe's process RSS (measured-gpu). `make accuracy` prints
`host_lines`."""

from __future__ import annotations

from collections.abc import Iterable

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.offload import host_ram
from sweeps.report.accuracy import compared_rows
from sweeps.runner.predict import arch_for, config_of


def host_errors(rows: Iterable[dict]) -> list[dict]:
    """Per measured-gpu row with the host probe: whether states sat on the host (offload), the training figure
    against the peak RSS while training, and the larger figure (training or loading) against VmHWM, the most the
    process ever held. Signed relative errors, estimate over measurement."""
    out = []
    for r in compared_rows(rows):
        host = ((r.get("observed") or {}).get("probes") or {}).get("host") or {}
        if r.get("source") != "measured-gpu" or not host.get("available"):
            continue
        try:
            cfg = RunConfig.from_dict(config_of(r))
            ram = host_ram(
                cfg, arch_for(cfg, (r.get("model") or {}).get("config")) or resolve_model(cfg.model)
            )
        except Exception:  # a row the estimator cannot size is left out of these lines, as of the others
            continue
        out.append(
            {
                "key": r.get("key"),
                "offload": bool(cfg.offload_optimizer or cfg.offload_param),
                "training": ram["training"] / host["peak_rss_bytes"] - 1,
                "life": max(ram["training"], ram["loading"]) / host["hwm_bytes"] - 1,
            }
        )
    return out


def host_lines(rows: Iterable[dict]) -> list[str]:
    """`host[measured-gpu, ...]` lines: the offload rows' training figure against their RSS, and every row's larger
    figure against its VmHWM (below: how many the estimate did not cover)."""
    errs = host_errors(rows)
    if not errs:
        return ["host[measured-gpu]: no rows (runs with the host probe: make gpu-mincard, make gpu-zero)"]

    def span(values: list[float]) -> str:
        return f"from {100 * min(values):+.1f} % to {100 * max(values):+.1f} %, below: {sum(v < 0 for v in values)}"

    lines = []
    off = [e["training"] for e in errs if e["offload"]]
    if off:
        lines.append(
            f"host[measured-gpu, offload]: {len(off)} rows, host RAM in training (estimated) vs process RSS (measured-gpu): {span(off)}"
        )
    life = [e["life"] for e in errs]
    lines.append(
        f"host[measured-gpu]: {len(life)} rows, the larger host figure (estimated) vs the process's VmHWM (measured-gpu): {span(life)}"
    )
    return lines
