"""The lineup: the rows of `+experiment=mincard` (sweeps/runner/conf/experiment/mincard.yaml), each composed with
Hydra's compose API and checked by `job.to_job` (the one validator), plus the estimator's figures for each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sweeps.runner import schema
from sweeps.runner.job import BadInput, Job, to_job
from sweeps.runner.predict import predict

CONF_DIR = Path(__file__).resolve().parents[1] / "runner" / "conf"
EXPERIMENT = "mincard"
# the baseline's limit: the estimator's need × this. A cap, so a run cannot take the card from the runs beside it,
# and far enough above the need that the baseline's reserved peak is the allocator's own (on a real H100 a 4B QLoRA
# run reserved 1.8 × the estimated need in its first step): that uncapped figure is what the reserve layer is
# compared with.
BASELINE_MARGIN = 2.0


@dataclass(frozen=True)
class Entry:
    """One configuration of the lineup: its row name, the composed job, the expected seconds of one run, and the
    estimator's need_bytes (estimated; None where it cannot size the run)."""

    row: str
    job: Job
    expected_s: float
    need_bytes: int | None


def row_names(overrides: list[str] = ()) -> list[str]:
    """The lineup's row names, in the yaml's order."""
    from omegaconf import OmegaConf

    cfg = _compose([f"+experiment={EXPERIMENT}", *overrides])
    return list(OmegaConf.to_container(cfg.mincard.rows, resolve=False))


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    schema.register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def entries(rows: list[str] | None = None, overrides: list[str] = ()) -> list[Entry]:
    """The named rows (all, in order, when None) composed with `overrides` after the experiment's own settings;
    BadInput (one line) for an unknown row or a value to_job refuses."""
    known = row_names()
    rows = known if rows is None else rows
    for r in rows:
        if r not in known:
            raise BadInput(f"row {r!r}: accepted rows are {', '.join(known)}")
    out = []
    for r in rows:
        try:
            cfg = _compose([f"+experiment={EXPERIMENT}", f"mincard_row={r}", *overrides])
        except BadInput:
            raise
        except Exception as exc:  # Hydra's own refusal of an override (unknown group, bad syntax)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BadInput(f"row {r}: {first}") from None
        job = to_job(cfg)
        est, _ = predict(job.config.to_dict())
        out.append(
            Entry(
                row=r,
                job=job,
                expected_s=float(cfg.mincard.rows[r].get("s", job.timeout_s)),
                need_bytes=est["need_bytes"] if est else None,
            )
        )
    return out


def baseline_limit(entry: Entry, cap_bytes: int | None = None) -> int | None:
    """The baseline's limit: the given cap, else the estimator's need × BASELINE_MARGIN (None: neither known)."""
    if cap_bytes is not None:
        return cap_bytes
    return int(entry.need_bytes * BASELINE_MARGIN) if entry.need_bytes else None
