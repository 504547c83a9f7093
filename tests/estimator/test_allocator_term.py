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


def test_every_shipped_stream_is_found_by_its_own_config_and_only_by_it():
    # The lookup answers for each stream in the shipped table with that stream's own simulation, whatever the
    # fields that do not change a stream (the card's size) say; one token more is another stream (none here).
    streams = allocator_term._table()["streams"]
    assert streams
    for s in streams:
        cfg = RunConfig.from_dict(s["config"])
        assert allocator_term.simulated(cfg, "default") is s["variants"]["default"]
        assert allocator_term.simulated(cfg.with_(gpu_memory_gib=13.0), "default") is s["variants"]["default"]
        longer = cfg.with_(max_completion_length=cfg.max_completion_length + 1)
        assert allocator_term.simulated(longer, "default") is None
    # a list where the config holds a tuple (unhashable, so never cached) is matched as the tuple is
    cfg = RunConfig.from_dict(streams[0]["config"] | {"lora_target_modules": ["q_proj"]})
    assert cfg.lora_target_modules == ("q_proj",)
    listed = cfg.with_(lora_target_modules=["q_proj"])
    assert allocator_term._match_key(listed) == allocator_term._match_key(cfg)


@pytest.mark.skipif(not INDEX, reason="no recorded streams in results/streams")
def test_fallback_does_not_predict_the_rows_it_was_fitted_on_low():
    # An estimate too low is the failure to prevent: on every row a model was fitted on (the kept streams for the
    # step model; they and the tuning rows of the generation regime for the generation model), the fallback with
    # its LOO margin is at or above the simulated reserve and need. Least squares' left-out residual is never
    # smaller than its in-sample one, so a margin left out, or a regime's rows scored by the wrong model, shows.
    from sweeps.trace import streams

    fitted = [(r["config"], r["simulated"]["default"], None) for r in INDEX]
    fitted += [
        (r["config"], r["simulated"]["default"], r["min_limits"]["default"])
        for r in SAMPLED
        if r["split"] == "tuning"
    ]
    generation = 0
    for config, sim, min_limit in fitted:
        cfg = RunConfig.from_dict(config)
        pa, where = sim["peak_allocated"], streams.shares(cfg)
        if min_limit is None:
            assert allocator_term.fitted_fraction(cfg, pa) >= sim["fragmentation"] / pa - 1e-9, config
        elif allocator_term.regime(cfg, where) == "generation":
            generation += 1
            got = allocator_term.fitted_fraction(cfg, pa, "need:default", where)
            assert got >= (min_limit - pa) / pa - 1e-9, config
    assert generation >= 5  # the generation model has rows of its own to be held to


def test_generation_regime_is_where_transformers_generate_sets_the_peak():
    gc, plain = (
        RunConfig(model="7B", gradient_checkpointing=True),
        RunConfig(model="7B", gradient_checkpointing=False),
    )
    vllm = RunConfig(model="7B", use_vllm=True)
    # every phase holds 60 of weights; generation works with 36 above it, the train phase with 40
    phases = {
        "generate": {"weights": 60, "kv_cache": 20, "activations": 16},
        "score": {"weights": 60},
        "train": {"weights": 60, "activations": 40},
    }
    assert allocator_term.shares_of(phases) == allocator_term.Shares(0.9, 0.96, 16 / 96, 36 / 96)
    assert allocator_term.shares_of({"train": {"weights": 1}}) == allocator_term.NO_GENERATION
    assert allocator_term.regime(gc, allocator_term.Shares(0.9, 1.0, 0.0, 1.0)) == "generation"
    assert allocator_term.regime(gc, allocator_term.Shares(0.89, 1.0, 0.5, 1.0)) == "step"
    assert allocator_term.regime(plain, allocator_term.Shares(1.0, 1.0, 0.5, 1.0)) == "generation"
    assert allocator_term.regime(vllm, allocator_term.Shares(1.0, 1.0, 0.5, 1.0)) == "step"
    assert allocator_term.regime(gc) == "generation"  # not known: the side that errs high


FITS = {
    "need:default": {"intercept": 0.05, "coef": {}, "loo_errors": [-0.01]},
    "generation:need:default": {
        "intercept": 0.10,
        "coef": {"generation_activations": 0.5},
        "loo_errors": [-0.02],
        "working_cap": 1.0,
    },
}


def _frac(shares, cfg=None):
    cfg = cfg or RunConfig(model="7B")
    return allocator_term.predicted_fraction(FITS, "need:default", cfg, 2**34, shares)


def test_the_card_holds_the_larger_of_the_peak_and_generation_each_with_its_extra():
    # generation at the peak: 0.10 + 0.5 * 0.4 + 0.02 of it; the step model alone gives 0.06
    assert _frac(allocator_term.Shares(1.0, 1.0, 0.4, 1.0)) == pytest.approx(0.32)
    # generation at 90 % of the peak: it needs 0.9 * 1.32 = 1.188 of the peak
    assert _frac(allocator_term.Shares(0.8, 0.9, 0.4, 1.0)) == pytest.approx(0.188)
    # generation at half the peak: 0.5 * 1.32 < 1.06, the step model's figure
    assert _frac(allocator_term.Shares(0.3, 0.5, 0.4, 1.0)) == pytest.approx(0.06)
    # weight-heavy generation: its extra stops at working_cap x its working memory (1.0 x 0.1)
    assert _frac(allocator_term.Shares(1.0, 1.0, 0.4, 0.1)) == pytest.approx(0.10)
    assert _frac(allocator_term.Shares(1.0, 1.0, 0.4, 0.01)) == pytest.approx(
        0.06
    )  # never below the step model
    assert _frac(
        allocator_term.Shares(1.0, 1.0, 0.4, 1.0), RunConfig(model="7B", use_vllm=True)
    ) == pytest.approx(0.06)


def test_more_memory_elsewhere_never_lowers_what_the_card_must_hold():
    # a phase growing past generation (a larger training batch, a role's pass beside the policy) may move the peak
    # away from generation; what the card must hold must not fall for it
    gen = {"weights": 50, "kv_cache": 10, "activations": 20}
    before, last = None, 0.0
    for train_act in range(0, 80, 5):
        phases = {
            "generate": gen,
            "score": {"weights": 50},
            "train": {"weights": 50, "activations": train_act},
        }
        peak = max(sum(c.values()) for c in phases.values())
        held = peak * (1 + _frac(allocator_term.shares_of(phases)))
        assert held >= last - 1e-9, (train_act, held, last)
        last, before = held, before or held
    assert last > before


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
    # every sampled row is scored under its own split (held-out ones per seed); a row whose simulated need is
    # raised by half its allocated peak must come out predicted low by about that much
    from sweeps.trace import streams

    table = {"fit": allocator_term._table()["fit"]}
    base = next(r for r in SAMPLED if r["split"] == "validation")
    raised = json.loads(json.dumps(base)) | {"split": "check"}
    pa = raised["simulated"]["default"]["peak_allocated"]
    raised["min_limits"]["default"] += pa // 2
    errors = streams.sampled_errors(table, SAMPLED + [raised])

    def split(r):
        return r["split"] + (f" {r['seed']}" if r["split"] == "held-out" else "")

    assert {s: len(e["need:default"]) for s, e in errors.items()} == {
        s: sum(split(r) == s for r in SAMPLED + [raised]) for s in errors
    }
    (low,) = errors["check"]["need:default"]
    (same,) = streams.sampled_errors(table, [base | {"split": "check"}])["check"]["need:default"]
    assert low == pytest.approx(same - 0.5, abs=1e-6)


def test_a_fitted_reserve_is_never_below_the_need_and_names_the_model_that_set_it():
    # an allocator with room reserves at least what it needs at its limit; no stream of this config was traced
    cfg = RunConfig(model="Qwen/Qwen3-4B", use_peft=True, attn_implementation="eager", max_prompt_length=700)
    at_peak = allocator_term.Shares(1.0, 1.0, 0.5, 0.8)
    for variant in allocator_term.VARIANTS:
        r = allocator_term.reserve(cfg, 30 * 2**30, variant, at_peak)
        n = allocator_term.need(cfg, 30 * 2**30, variant, at_peak)
        assert r.source.startswith("fitted") and r.bytes >= n.bytes, variant
    step_only = allocator_term.need(cfg, 30 * 2**30, shares=allocator_term.NO_GENERATION)
    assert "step model" in step_only.source
    assert "generation-regime model" in allocator_term.need(cfg, 30 * 2**30, shares=at_peak).source


@pytest.mark.skipif(not SAMPLED, reason="no sampled rows in results/streams")
def test_need_parts_is_the_fallbacks_own_arithmetic():
    # The split a report prints (least-squares value, margin, the model that sets the need) gives back the need
    # fraction the estimator uses, in both regimes; a value is never above the same model with its margin.
    from sweeps.trace.streams import shares

    seen = set()
    for row in SAMPLED[:40]:
        cfg = RunConfig.from_dict(row["config"])
        peak = row["simulated"]["default"]["peak_allocated"]
        where = shares(cfg)
        parts = allocator_term.need_parts(cfg, peak, shares=where)
        fallback = allocator_term.predicted_fraction(
            allocator_term._table()["fit"], "need:default", cfg, peak, where
        )
        assert parts[parts["model"]]["fraction"] == pytest.approx(fallback, abs=1e-12)
        for model in ("step", "generation"):
            if model in parts:
                assert parts[model]["central"] <= parts[model]["fraction"] + 1e-12
        seen.add(parts["model"])
    assert seen == {"step", "generation"}


def _fit(intercept: float, low: float = 0.0) -> dict:
    """A constant model: `intercept` everywhere, its worst leave-one-out error `low` below (its margin)."""
    return {"intercept": intercept, "coef": {}, "loo_errors": [-low, 0.01]}


def test_an_eager_runs_step_need_is_the_larger_of_the_two_step_fits_and_an_sdpa_run_keeps_the_kept_streams():
    from estimator.terms import allocator_reserve as at

    cfg = RunConfig(model="0.5B", use_peft=True)
    eager = cfg.with_(attn_implementation="eager")
    # kept streams' fit 0.05 + 0.02 margin = 0.07; the kept + tuning fit 0.06 + 0.04 = 0.10 (no generation fit)
    fits = {"need:default": _fit(0.05, 0.02), "sampled:need:default": _fit(0.06, 0.04)}
    assert at.predicted_fraction(fits, "need:default", cfg, 2**30, at.NO_GENERATION) == pytest.approx(0.07)
    assert at.predicted_fraction(fits, "need:default", eager, 2**30, at.NO_GENERATION) == pytest.approx(0.10)
    # never below the kept streams' fit: a smaller kept + tuning fit leaves an eager run where it was
    fits["sampled:need:default"] = _fit(0.01, 0.01)
    assert at.predicted_fraction(fits, "need:default", eager, 2**30, at.NO_GENERATION) == pytest.approx(0.07)
