"""Library refusals, the seeded off-grid generator, the accuracy split, the validated band.

Expected values come from outside the estimator: PEFT's own constants module, hand-computed gradient bytes,
and traced rows (results/traced/random/validation.jsonl) held to the band the estimator publishes.
"""

import json
from pathlib import Path

import pytest

from estimator.model.catalog import resolve_model
from estimator.settings.compat import PEFT_DEFAULT_TARGETS
from estimator.settings.config import RunConfig
from estimator.settings.validate import InvalidConfig, validate
from estimator.step import band
from estimator.step.estimate import estimate
from estimator.step.single import train_instants
from estimator.terms.optimizer import DISPATCH

REPO = Path(__file__).resolve().parents[2]
VALIDATION = REPO / "results" / "traced" / "random" / "validation.jsonl"
FAST_SUBSET = 5  # validation rows re-estimated in `make test` (the whole set: `make accuracy`)


def test_peft_default_targets_match_installed_peft():
    constants = pytest.importorskip("peft.utils.constants")
    table = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for model_type, targets in PEFT_DEFAULT_TARGETS.items():
        assert tuple(table[model_type]) == targets
    for refused in ("phi3", "qwen3_moe"):  # what PEFT refuses, we refuse
        assert refused not in table and refused not in PEFT_DEFAULT_TARGETS


@pytest.mark.parametrize(
    "cfg, says",
    [
        (RunConfig(model="microsoft/Phi-3-mini-4k-instruct", use_peft=True), "--lora-target-modules"),
        (RunConfig(model="Qwen/Qwen3-30B-A3B", use_peft=True), "--lora-target-modules"),
        (
            RunConfig(model="google/gemma-2-2b-it", use_peft=True, load_in_4bit=True),
            "--attn-implementation eager",
        ),
        (
            RunConfig(model="Qwen/Qwen3-30B-A3B", use_peft=True, lora_target_modules=("all-linear",)),
            "--lora-dropout 0",
        ),
        (
            RunConfig(model="Qwen/Qwen3-4B", use_peft=True, cast_lm_head_to_fp32=True),
            "drop --cast-lm-head-to-fp32",
        ),
    ],
)
def test_refused_like_the_libraries(cfg, says):
    with pytest.raises(InvalidConfig, match=says) as e:
        validate(cfg, resolve_model(cfg.model))
    assert "\n" not in str(e.value)


def test_accepted_with_what_the_refusal_names():
    phi = RunConfig(
        model="microsoft/Phi-3-mini-4k-instruct", use_peft=True, lora_target_modules=("all-linear",)
    )
    gemma = RunConfig(model="google/gemma-2-2b-it", attn_implementation="eager")
    for cfg in (phi, gemma):
        validate(cfg, resolve_model(cfg.model))


def test_gradients_resident_from_the_second_micro_step():
    """Full FT, bf16, GA=2: at the head's forward every .grad is there, P × 2 bytes (hand count of the catalog's P)."""
    cfg = RunConfig(
        model="1.5B", dtype="bfloat16", gradient_accumulation_steps=2, per_device_train_batch_size=4
    )
    arch = resolve_model(cfg.model)
    assert train_instants(cfg, arch)["head_forward"]["gradients"] == arch.total_params * 2
    assert "gradients" not in train_instants(cfg.with_(gradient_accumulation_steps=1), arch)["head_forward"]


def test_random_grid_is_seeded_valid_and_covers_every_family():
    from sweeps.trace import random_grid as rg
    from sweeps.trace.grids import GRIDS

    (first, n), (second, _) = GRIDS["validation"].spec.seeds[:2]
    a = rg.random_configs(first, n)
    assert a == rg.random_configs(first, n)
    assert a[:10] != rg.random_configs(second, 10)
    for cfg in a:
        validate(cfg, resolve_model(cfg.model))
    models = {c.model for c in a}
    assert all(models & set(ms) for ms in rg.FAMILIES.values())
    assert any(c.per_device_train_batch_size != c.num_generations for c in a)
    assert {c.attn_implementation for c in a} == {"sdpa", "eager", "flash_attention_2"}


def test_moe_configs_the_cpu_tracer_cannot_run_are_skipped_with_a_reason():
    from sweeps.trace import random_grid as rg

    # the CPU kernel of torch.grouped_mm refuses fp16 / fp32 experts ("Expected inputs of BF16 type")
    assert "bf16" in rg.skip_reason(RunConfig(model="Qwen/Qwen3-30B-A3B", dtype="float16"))
    assert rg.skip_reason(RunConfig(model="Qwen/Qwen3-30B-A3B", dtype="bfloat16")) is None
    assert rg.skip_reason(RunConfig(model="Qwen/Qwen3-4B", dtype="float16")) is None


def test_rows_split_by_the_grid_that_wrote_them():
    from sweeps.trace.grids import GRIDS, split_of

    assert split_of("validation") == "validation"
    assert split_of("heldout") == "held-out"
    assert split_of("default") == "in-sample" and split_of("multigpu") == "in-sample"
    assert split_of("cli") == "in-sample" and split_of(None) == "in-sample"  # rows of no grid
    # a seed is in one grid only, so a row's seed says which set it is in
    seeds = [s for name in ("validation", "heldout") for s, _ in GRIDS[name].spec.seeds]
    assert len(seeds) == len(set(seeds))


def test_random_rows_carry_the_seed_of_their_draw():
    """Every committed random-grid row records its seed, and its config is that seed's draw."""
    from estimator.settings.versions import MODELLED_TRANSFORMERS
    from sweeps import records
    from sweeps.trace.grids import GRIDS

    for name in ("validation", "heldout"):
        grid = GRIDS[name]
        keys = {  # each draw's key under each modelled transformers release (a row records the one it ran)
            (j.seed, records.make_key(j.config.with_(transformers_version=v).to_dict(), j.variant()))
            for j in grid.jobs()
            for v in MODELLED_TRANSFORMERS
        }
        rows = [json.loads(line) for line in grid.path.read_text().splitlines() if line.strip()]
        assert rows and all(r["sweep"] == name for r in rows)
        drawn = [r for r in rows if not r.get("retraced") and not r.get("retrace_of")]
        assert sum((r["seed"], r["key"]) in keys for r in drawn) >= 0.95 * len(drawn)


def _validation_rows() -> list[dict]:
    if not VALIDATION.exists():
        return []
    rows = [json.loads(line) for line in VALIDATION.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["status"] == "ok"][:FAST_SUBSET]


@pytest.mark.parametrize("row", _validation_rows(), ids=lambda r: r["key"])
def test_validation_rows_within_the_band(row):
    from sweeps.runner.predict import arch_for

    cfg = RunConfig.from_dict(row["config"])
    est = estimate(cfg, arch_for(cfg, (row.get("model") or {}).get("config")), DISPATCH)
    traced = row["observed"]["peak_bytes"]
    rel = (est.peak_allocated_bytes - traced) / traced
    _, b = band.regime_band(cfg)
    assert b["low"] - 1e-4 <= rel <= b["high"] + 1e-4
    assert est.peak_allocated_bytes * (1 + band.margin(cfg)) >= traced  # never under after the band


def test_band_says_where_it_comes_from():
    assert "validation" in band.describe() and band.margin() >= 0
    assert band.usable_bytes(100 * 2**30) <= 100 * 2**30
    # a regime's margin is never larger than the band over all rows (its worst row is one of them)
    for name in band.REGIMES:
        assert band.band()["regimes"][name]["low"] >= band.band()["all"]["low"]


def test_every_regime_keeps_at_least_a_two_percent_margin():
    # a regime whose validation rows never went under still raises the estimate by 1 / 0.98 − 1 before a fit
    for cfg in (RunConfig(model="7B", dtype="bfloat16"), RunConfig(model="qwen3-30b-a3b"), None):
        assert band.margin(cfg) >= 1 / 0.98 - 1 - 1e-12
    assert band.usable_bytes(98 * 2**30, RunConfig(model="7B", dtype="bfloat16")) <= 96.05 * 2**30


def test_regimes_split_as_documented():
    assert band.regime(RunConfig(model="qwen3-30b-a3b")) == "moe"
    assert band.regime(RunConfig(model="7B", attn_implementation="eager")) == "eager"
    assert band.regime(RunConfig(model="7B", dtype="bfloat16")) == "sdpa-bf16"
    assert band.regime(RunConfig(model="7B")) == "sdpa-other"  # TRL's float32 default
