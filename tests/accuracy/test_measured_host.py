"""The host RAM line against the process RSS the committed measured-gpu rows recorded (the `host` probe: results/raw/
mincard.jsonl, zero-offload.jsonl). The process's own memory is a measured constant (`PROCESS_*` in
estimator/terms/offload.py); the model states are read from code. Held here: the constants cover what each run
measured and are no larger than the largest, and every run's host figure covers its process's whole life."""

from __future__ import annotations

import pytest
from measured_rows import rows_of

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.offload import host_ram
from estimator.terms import offload as off
from sweeps.runner.predict import arch_for, config_of

GIB = 2**30


def _rows() -> list[dict]:
    out = []
    for name in ("mincard", "zero-offload"):
        for r in rows_of(name):
            host = ((r.get("observed") or {}).get("probes") or {}).get("host") or {}
            if r.get("source") == "measured-gpu" and host.get("available"):
                out.append(r)
    return out


def _host(row: dict) -> dict:
    return row["observed"]["probes"]["host"]


def _offloads(row: dict) -> bool:
    return bool(row["config"].get("offload_optimizer") or row["config"].get("offload_param"))


def _id(row: dict) -> str:
    c = row["config"]
    return f"{c['model'].split('/')[-1]}-{c.get('sharding', 'none')}-P{c['max_prompt_length']}"


def test_the_rows_exist():
    assert (
        len([r for r in _rows() if _offloads(r)]) >= 2 and len([r for r in _rows() if not _offloads(r)]) >= 4
    )


def test_the_process_constants_are_the_largest_measured():
    # before loading: the probe's first sample, taken before the model is built (ZeRO-3 builds it under
    # zero.Init inside the trainer's setup, before the probe starts: not a before-load figure)
    before = [_host(r)["baseline_rss_bytes"] for r in _rows() if r["config"].get("sharding") != "zero3"]
    # in training with nothing on the host: the whole process
    training = [_host(r)["peak_rss_bytes"] for r in _rows() if not _offloads(r)]
    assert max(before) <= off.PROCESS_BEFORE_LOAD_BYTES <= max(before) * 1.02
    assert max(training) <= off.PROCESS_TRAINING_BYTES <= max(training) * 1.02


@pytest.mark.parametrize("row", _rows(), ids=_id)
def test_the_host_figure_covers_the_process_life(row):
    cfg = RunConfig.from_dict(config_of(row))
    ram = host_ram(cfg, arch_for(cfg) or resolve_model(cfg.model))
    h = _host(row)
    # VmHWM: the most the process ever held, loading included
    assert max(ram["training"], ram["loading"]) >= h["hwm_bytes"]
    if _offloads(row):
        # the states on the host are read from code: training within 3 % above the measured RSS
        assert h["peak_rss_bytes"] <= ram["training"] <= h["peak_rss_bytes"] * 1.03
