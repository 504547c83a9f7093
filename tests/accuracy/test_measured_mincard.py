"""The fit figure against the smallest card measured on a GPU (results/raw/mincard.jsonl, `make gpu-mincard`):
for every committed row, the estimator's torch-limit fit figure (fit_bytes minus what lives outside torch's
allocator) is never below the smallest torch memory limit the run passed under, and at most 3 % above it (rows
measured above that target are listed with their reason and fail the upper check until fixed). The
measured minimum comes from real runs under `set_per_process_memory_fraction`, not from the estimator. Until a
GPU lease has written rows, the parametrized test has no case and pytest reports it skipped."""

from __future__ import annotations

import pytest
from measured_rows import method_of, rows_of

from sweeps.report.mincard import breakdown, estimated_figures


def _rows() -> list[dict]:
    return [r for r in rows_of("mincard") if (r.get("mincard") or {}).get("min_torch_bytes")]


def _id(row: dict) -> str:
    c = row["config"]
    method = method_of(c)
    return f"{c['model'].split('/')[-1]}-{method}-p{c.get('max_prompt_length')}"


# rows measured above the 3 % target, each with what keeps it there: the upper check fails for them until a
# fix brings them inside (strict: a row that comes inside must be taken off this list)
ABOVE_TARGET = {
    "ab6f5bc7b0e3ed46": "Qwen2.5-0.5B full fine-tune, H200, torch 2.11: the tensor peak with the workspaces and "
    "the step model's reserve land on the measured minimum (its trace, replayed with in-place sums, +0.1 %); the "
    "step model's safety margin and the band (about 0.26 GiB together) put the fit figure +5.3 % above it "
    "(docs/ACCURACY.md)",
    "5879bf2ab6b7e60c": "Qwen3-4B LoRA P256, H200, torch 2.11: the GPU needed 0.33 GiB above its tensors and "
    "workspaces (3.7 % of the peak); the step model's own value is 5.7 % (+0.18 GiB over that), and its safety "
    "margin (4.5 points, 0.41 GiB) and the band (0.18 GiB) put the fit figure +7.5 % above the measured minimum "
    "(results/MINCARD.md, second table)",
    "aab280e30945a87d": "Qwen3-4B LoRA under eager attention, 80 prefills of 740 tokens, H200, torch 2.11: "
    "generate sets the peak; the generation model's own value (14.1 % of the peak) is 2.79 GiB below the 23.1 % "
    "the GPU needed, and its safety margin (27.3 points, 8.47 GiB: the worst leave-one-out error, set by tuning "
    "rows needing 34 to 38 % that no feature the estimator has explains) and the band (0.63 GiB) put the fit "
    "figure +16.5 % above the measured minimum (results/MINCARD.md, second table)",
    "3c92e4741454e419": "Qwen2.5-1.5B full fine-tune P1024, H200, torch 2.11: the GPU needed 0.49 GiB above its "
    "tensors and workspaces (3.9 % of the peak); the step model, fitted on 256-token-prompt streams, gives 8.9 % "
    "(+0.64 GiB over that), and its safety margin (4.5 points, 0.58 GiB) and the band (0.26 GiB) put the fit "
    "figure +10.1 % above the measured minimum (results/MINCARD.md, second table)",
}


def _upper(row: dict):
    reason = ABOVE_TARGET.get(row["key"])
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(row, id=_id(row), marks=marks)


@pytest.mark.parametrize("row", _rows(), ids=_id)
def test_fit_figure_is_never_below_the_measured_minimum(row):
    assert row["source"] == "measured-gpu" and row["device"]["type"] == "cuda"
    measured = row["mincard"]["min_torch_bytes"]
    figures = estimated_figures(row)
    assert figures is not None, "the estimator cannot size a measured configuration"
    _, fit = figures
    assert fit >= measured, f"fit figure {fit} below the measured minimum {measured}"


@pytest.mark.parametrize("row", [_upper(r) for r in _rows()])
def test_fit_figure_is_at_most_3_percent_above_the_measured_minimum(row):
    measured = row["mincard"]["min_torch_bytes"]
    _, fit = estimated_figures(row)
    assert fit <= measured * 1.03, f"fit figure {fit} more than 3 % above the measured minimum {measured}"


@pytest.mark.parametrize("row", _rows(), ids=_id)
def test_the_breakdown_of_the_distance_adds_up(row):
    # the second table of results/MINCARD.md: tensor error + reserve model value vs the GPU's need + margin + band
    # is the fit figure less the measured minimum, to the byte
    parts = breakdown(row)
    assert parts is not None
    _, fit = estimated_figures(row)
    total = parts["tensors"] + parts["central"] + parts["margin"] + parts["band"]
    assert total == fit - row["mincard"]["min_torch_bytes"]
    assert parts["margin"] >= 0 and parts["band"] >= 0


@pytest.mark.parametrize("row", _rows(), ids=_id)
def test_the_answers_reserve_margin_row_is_the_tables_margin(row):
    # the short answer's "reserve margin (safe side)" row (the need with and without the models' margins) and the
    # margin column of results/MINCARD.md (need_parts: the model that sets the need, its fraction less its
    # least-squares value) are two computations of the same bytes
    from estimator.step.estimate import estimate
    from sweeps.report import row_traces

    parts = breakdown(row)
    cfg, arch = row_traces.config_and_arch(row["config"], (row.get("model") or {}).get("config"))
    assert abs(estimate(cfg, arch).need_margin_bytes - parts["margin"]) <= 2**20
