"""The estimator against the committed fake-tensor traces: peak and every phase within 5% (the in-sample bound)."""

import json

import pytest

from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate
from estimator.terms.optimizer import DISPATCH
from sweeps.runner.predict import arch_for
from sweeps.trace.grids import GRIDS

BOUND = 0.05
# the random grids' rows are held to the validated band instead (tests/accuracy/test_validation_band.py)
TUNED = sorted({g.path for g in GRIDS.values() if g.split == "in-sample" and g.path.exists()})


def _rows() -> list[dict]:
    rows = []
    for path in TUNED:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get("status") == "ok":
                    rows.append(row)
    return rows


ROWS = _rows()


def _id(row: dict) -> str:
    c = row["config"]
    method = "qlora" if c["load_in_4bit"] else "lora" if c["use_peft"] else "full"
    return f"{c['model']}-{method}-{c['dtype']}-g{c['num_generations']}-gc{int(c['gradient_checkpointing'])}"


def test_there_are_traced_rows():
    assert len(ROWS) >= 20


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_peak_and_phases_within_bound(row):
    cfg = RunConfig.from_dict(row["config"])
    # a depth-reduced trace is held to the config.json it traced (its `model.config`), as `make accuracy` does
    traced_config = (row.get("model") or {}).get("config")
    est = estimate(cfg, arch_for(cfg, traced_config) if traced_config else None, DISPATCH)
    traced = row["observed"]
    assert est.peak_allocated_bytes == pytest.approx(traced["peak_bytes"], rel=BOUND)
    assert est.peak_phase == traced["peak_phase"]  # the estimated peak sits in the phase the trace peaked in
    for phase, traced_bytes in traced["phases"].items():
        assert est.phase_totals[phase] == pytest.approx(traced_bytes, rel=BOUND), phase
