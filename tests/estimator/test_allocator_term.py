"""The estimator's allocator term (estimator/terms/allocator_reserve.py) against the simulated traced streams it is built from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.hardware.allocator import load_stream, simulate
from estimator.settings.config import RunConfig
from estimator.terms import allocator_reserve as allocator_term

STREAMS = Path(__file__).resolve().parents[2] / "results" / "streams"
INDEX = (
    [json.loads(line) for line in (STREAMS / "index.jsonl").read_text().splitlines()]
    if STREAMS.exists()
    else []
)
SAMPLED = (  # seeded random configs: simulations only, never fitted
    [json.loads(line) for line in (STREAMS / "sampled.jsonl").read_text().splitlines()]
    if (STREAMS / "sampled.jsonl").exists()
    else []
)


@pytest.mark.skipif(not INDEX, reason="no recorded streams in results/streams")
def test_traced_config_uses_its_own_stream():
    # The reserve of a config whose stream was recorded is that stream's replay (re-simulated here from the file).
    row = min(INDEX, key=lambda r: r["events"])
    cfg = RunConfig.from_dict(row["config"])
    r = simulate(load_stream(STREAMS / row["stream"]))
    got = allocator_term.reserve(cfg, r.peak_allocated)
    assert got.source.startswith("simulated")
    assert got.bytes == pytest.approx(r.peak_reserved - r.peak_allocated, abs=1)


@pytest.mark.skipif(not INDEX, reason="no recorded streams in results/streams")
def test_fallback_does_not_predict_the_traced_streams_low():
    # An estimate too low is the failure to prevent: the fitted fallback (with its LOO margin) is at or above
    # every traced stream's simulated reserve / allocated.
    for row in INDEX:
        cfg = RunConfig.from_dict(row["config"])
        sim = row["simulated"]["default"]
        got = allocator_term.fitted_fraction(cfg, sim["peak_allocated"])
        assert got >= sim["fragmentation"] / sim["peak_allocated"] - 1e-9, row["key"]


def test_variant_for_user_settings():
    assert allocator_term.variant_for("expandable_segments:True") == "expandable_segments"
    assert allocator_term.variant_for("", 1) == "torch_empty_cache_steps_1"
    assert allocator_term.variant_for("max_split_size_mb:256") == "max_split_size_mb_128"
    assert allocator_term.variant_for() == "default"


def test_settings_flag_vllm_colocate():
    cfg = RunConfig(model="7B", use_peft=True, use_vllm=True, vllm_mode="colocate")
    s = {x.setting: x for x in allocator_term.setting_savings(cfg, 20 * 2**30)}
    assert "vLLM" in s["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"].caveat
    assert allocator_term.setting_savings(cfg.with_(device="cpu"), 2**30) == []


@pytest.mark.skipif(not INDEX, reason="no recorded streams in results/streams")
def test_need_is_between_allocated_and_reserve():
    # The smallest passing limit lies between the allocated peak and the unlimited reserved peak.
    for row in INDEX:
        cfg = RunConfig.from_dict(row["config"])
        peak = row["simulated"]["default"]["peak_allocated"]
        need, res = allocator_term.need(cfg, peak), allocator_term.reserve(cfg, peak)
        assert 0 <= need.bytes <= res.bytes, row["key"]


@pytest.mark.skipif(len(SAMPLED) < 2, reason="no sampled streams in results/streams")
def test_sampled_rows_are_scored_apart_and_a_low_prediction_shows():
    # every sampled row is scored under its own split; a row whose simulated need is raised by half its
    # allocated peak must come out predicted low by about that much
    from sweeps.trace import streams

    table = {"fit": allocator_term._table()["fit"]}
    base = next(r for r in SAMPLED if r["split"] == "validation")
    raised = json.loads(json.dumps(base)) | {"split": "check"}
    pa = raised["simulated"]["default"]["peak_allocated"]
    raised["min_limits"]["default"] += pa // 2
    errors = streams.sampled_errors(table, SAMPLED + [raised])
    assert {s: len(e["need:default"]) for s, e in errors.items()} == {
        s: sum(r["split"] == s for r in SAMPLED + [raised]) for s in errors
    }
    (low,) = errors["check"]["need:default"]
    (same,) = streams.sampled_errors(table, [base | {"split": "check"}])["check"]["need:default"]
    assert low == pytest.approx(same - 0.5, abs=1e-6)
