"""`make accuracy`'s host lines (sweeps/report/host.py): the estimator's host figures against a row's process RSS."""

from __future__ import annotations

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.offload import host_ram
from sweeps.report import host

GIB = 2**30
CONFIG = {
    "model": "Qwen/Qwen2.5-1.5B-Instruct",
    "device": "cuda",
    "sharding": "zero2",
    "offload_optimizer": True,
    "gradient_checkpointing": True,
}


def _row(key: str, rss: int, hwm: int, config: dict = CONFIG) -> dict:
    return {
        "schema": 1,
        "key": key,
        "source": "measured-gpu",
        "status": "ok",
        "sweep": "zero-offload",
        "config": config,
        "observed": {
            "peak_bytes": GIB,
            "probes": {"host": {"available": True, "peak_rss_bytes": rss, "hwm_bytes": hwm}},
        },
    }


def test_host_lines_set_the_figures_against_the_rss_and_count_what_they_miss():
    ram = host_ram(RunConfig.from_dict(CONFIG), resolve_model(CONFIG["model"]))
    # one run whose RSS is the figure / 1.1 (+10.0 %), one 5 % over it (1 / 1.05 - 1 = -4.8 %): one below
    rows = [_row("a", int(ram["training"] / 1.1), int(ram["training"] / 1.1)), _row("b", int(ram["training"] * 1.05), int(ram["training"] * 1.05))]  # fmt: skip
    lines = host.host_lines(rows)
    assert lines[0] == (
        "host[measured-gpu, offload]: 2 rows, host RAM in training (estimated) vs process RSS (measured-gpu): "
        "from -4.8 % to +10.0 %, below: 1"
    )
    assert lines[1].startswith("host[measured-gpu]: 2 rows") and lines[1].endswith("below: 1")


def test_no_host_rows_is_one_line():
    assert host.host_lines([]) == [
        "host[measured-gpu]: no rows (runs with the host probe: make gpu-mincard, make gpu-zero)"
    ]
