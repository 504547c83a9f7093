"""The estimator's validated error band, per regime, and "fits" decided on its safe side.

The band is data (`estimator/band.json`), computed by `make band` (`python -m sweeps.report.band`) from the
traced rows of the validation grids (`results/traced/random/validation.jsonl`, the seeded random grids of
`sweeps/trace/grids.py`): per regime, the lowest and highest (estimated − traced) / traced over those rows. A
negative `low` is the worst under-prediction seen in that regime; `--gpu`, `--solve`, the advice and the "fits
on" list compare the estimate with the GPU's memory shrunk by that regime's margin, so a run the band says might
not fit is never reported as fitting. The held-out grid (`results/traced/random/heldout.jsonl`) checks that the
bands hold on configs nobody tuned on.

Regimes split the validation rows where the errors differ most (see `make accuracy`): mixture-of-experts
models, eager attention, sdpa with a 16-bit bf16 base, and sdpa otherwise (fp16 / fp32 weights or an fp32
head). A regime is a grouping of the validation rows, not a fitted factor: its band is the worst error seen.
A regime with fewer than MIN_ROWS rows uses the band over all validation rows.

Every regime keeps a safe-side margin of at least MIN_MARGIN_LOW (2 %): the worst of n validation rows
understates the worst of the next rows (about one new row in n + 1 falls below it). The floor is a decision,
not fitted to any row (docs/HISTORY.md says which row prompted it).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from estimator.model.catalog import resolve_model

BAND_FILE = Path(__file__).resolve().parents[1] / "band.json"
REGIMES = ("moe", "eager", "sdpa-bf16", "sdpa-other")
MIN_ROWS = 5
MIN_MARGIN_LOW = -0.02  # every regime's low is at most −2 % (see the module docstring)


@lru_cache(maxsize=1)
def band() -> dict:
    """{"regimes": {name: {"low", "high", "n"}}, "all": {...}, "source"}: relative errors on the validation rows."""
    return json.loads(BAND_FILE.read_text())


def regime(cfg, model_type: str | None = None) -> str:
    """The band regime of a config: moe, eager, sdpa-bf16 or sdpa-other (`model_type` from its config.json)."""
    if model_type is None:
        try:
            model_type = resolve_model(cfg.model).model_type
        except Exception:  # a model resolved elsewhere (a row's own config.json): no MoE information here
            model_type = ""
    if "moe" in (model_type or ""):
        return "moe"
    if cfg.attn_implementation == "eager":
        return "eager"
    if cfg.dtype == "bfloat16" and not cfg.cast_lm_head_to_fp32:
        return "sdpa-bf16"
    return "sdpa-other"


def regime_band(cfg=None, model_type: str | None = None) -> tuple[str, dict]:
    """(name, {"low", "high", "n"}) of the band that applies to `cfg` (all validation rows when cfg is None)."""
    b = band()
    if cfg is None:
        return "all", b["all"]
    name = regime(cfg, model_type)
    r = b["regimes"].get(name)
    if r is None or r["n"] < MIN_ROWS:
        return "all", b["all"]
    return name, r


def margin(cfg=None, model_type: str | None = None) -> float:
    """Safe-side margin m: estimate × (1 + m) covers the worst under-prediction, m = 1 / (1 + low) − 1, with low
    at most MIN_MARGIN_LOW."""
    low = min(float(regime_band(cfg, model_type)[1]["low"]), MIN_MARGIN_LOW)
    return 1.0 / (1.0 + low) - 1.0


def usable_bytes(memory_bytes: int, cfg=None) -> int:
    """GPU memory an estimate may use and still be called a fit: memory / (1 + margin)."""
    return int(memory_bytes / (1.0 + margin(cfg)))


def describe(cfg=None) -> str:
    """One line for the output and --help: the band, its size and where it comes from."""
    name, r = regime_band(cfg)
    where = "all regimes" if name == "all" else f"regime {name}"
    return (
        f"error band ({where}): {r['low'] * 100:+.1f}% / {r['high'] * 100:+.1f}% on {r['n']} off-grid traces "
        f"({band()['source']}); fits are decided with the estimate raised by {margin(cfg) * 100:.1f}% "
        f"(the band's low end, at least {-MIN_MARGIN_LOW * 100:.0f}%)"
    )


def to_json(cfg=None) -> dict:
    """The band that applies, for `--json`."""
    name, r = regime_band(cfg)
    return {"regime": name, **r, "margin": margin(cfg), "source": band()["source"]}
