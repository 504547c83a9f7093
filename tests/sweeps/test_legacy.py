"""Rows measured under old TRL releases (make sweep-legacy) and the seed table's TRL 0.14 companion table."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps import records
from sweeps.report import legacy_table
from sweeps.runner.predict import predict

LEGACY = Path(__file__).resolve().parents[2] / "results" / "raw" / "legacy.jsonl"
ROWS = records.load_rows(LEGACY) if LEGACY.exists() else []
OK = [r for r in ROWS if r.get("status") == "ok"]


@pytest.mark.skipif(not ROWS, reason="no results/raw/legacy.jsonl (make sweep-legacy)")
def test_every_legacy_row_says_its_release_and_failures_say_why():
    for r in ROWS:
        assert r["config"]["trl_version"] and r["source"] == "measured-cpu"
        if r["status"] != "ok":
            assert r["error"], r["key"]
        else:
            assert r["versions"]["trl"].startswith(r["config"]["trl_version"] + ".")


@pytest.mark.skipif(not OK, reason="no ok legacy rows")
@pytest.mark.parametrize("row", OK, ids=[f"{r['config']['trl_version']}-{r['key']}" for r in OK])
def test_estimator_with_the_release_profile_holds_to_the_measured_peak(row):
    pred, err = predict(row["config"], row["model"]["config"])
    assert err is None
    observed = row["observed"]["peak_bytes"]
    rel = (pred["peak_allocated_bytes"] - observed) / observed
    assert -0.05 <= rel <= 0.15, f"TRL {row['config']['trl_version']}: {rel:+.1%}"


def test_seed_table_under_014():
    frame = legacy_table.seed_frame()
    cell = frame.set_index(["method", "model"])
    # Llama-3.1-8B (8,030,261,248 parameters) full fine-tune in bf16 under 0.14: policy + reference copy +
    # gradients (2 bytes each) + two bf16 AdamW moments = 10 bytes per parameter before any activation
    full_8b = cell.loc[("full fine-tune", "Llama-3.1-8B")]
    assert full_8b["allocated_bytes"] >= 10 * 8_030_261_248
    assert not full_8b["fits"]
    assert cell.loc[("LoRA", "Qwen2.5-0.5B")]["fits"]
    text = legacy_table.seed_markdown(frame)
    assert text.count("GiB (estimated)") == len(legacy_table.ROWS) * len(legacy_table.MODELS)
    assert "TRL 0.14" in text
