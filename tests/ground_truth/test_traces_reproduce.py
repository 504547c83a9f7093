"""The tracer under the installed torch, transformers, PEFT and bitsandbytes gives committed traced rows back byte
for byte: a fixed sample of rows from results/traced/ (full fine-tune, LoRA and QLoRA, checkpointing on and off, a
fused AdamW, 8-bit and paged optimizers, SGD, six families including an MoE) retraced with their own config,
variant, sweep and seed (`sweeps.trace.retrace.retrace_row`). The committed peak was traced under the lock's
releases (these rows' generation path is the same under transformers 5.23 and 5.24); a release that changes what a
GRPO step allocates under FakeTensorMode moves it, and `make upstream-check` then names this test."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")  # the tracer runs transformers', PEFT's and bitsandbytes' modules

from estimator.settings.config import RunConfig  # noqa: E402
from sweeps import records  # noqa: E402
from sweeps.trace.retrace import retrace_row  # noqa: E402

TRACED = Path(__file__).resolve().parents[2] / "results" / "traced"
SAMPLE = (
    "2eb7b8691c2ab5ef",  # QLoRA, 8-bit AdamW, fp16: DeepSeek-R1-Distill-Qwen-1.5B
    "b054244d5b6eaafb",  # QLoRA + checkpointing, paged AdamW 32-bit: DeepSeek-R1-Distill-Qwen-1.5B
    "6bb2761317adcfd6",  # full, paged 8-bit AdamW, bf16: Llama-3.1-8B-Instruct
    "3f68e88d1d66b0b7",  # full + checkpointing, fused AdamW: Qwen2.5-3B
    "63c976a7158fa130",  # LoRA + checkpointing, 8-bit AdamW: DeepSeek-R1-Distill-Qwen-1.5B
    "0bb3ee150fa17ce7",  # LoRA, fused AdamW: OLMo-2-1124-13B
    "20a8047c68d8b017",  # full, SGD: gemma-3-1b-it
    "6b67313d3cd55053",  # full, fused AdamW, fp16: Phi-3-mini-4k-instruct
    "a413ef5ce56d07f6",  # QLoRA on an MoE, paged 8-bit AdamW: Qwen3-30B-A3B
)


def _committed() -> dict[str, dict]:
    rows = {}
    for path in sorted(TRACED.rglob("*.jsonl")):
        for r in records.latest_rows(records.load_rows(path)):
            if r.get("key") in SAMPLE and r.get("status") == "ok":
                rows[r["key"]] = r
    return rows


COMMITTED = _committed()


def test_every_sampled_row_is_committed():
    assert sorted(COMMITTED) == sorted(SAMPLE)


@pytest.mark.parametrize("key", SAMPLE)
def test_a_retrace_gives_the_committed_peak(key):
    old = COMMITTED[key]
    new = retrace_row(old)
    assert new["status"] == "ok", new.get("error")
    # the same configuration (a row from before configs named their releases gets the installed transformers)
    retraced = RunConfig.from_dict(new["config"])
    assert (
        RunConfig.from_dict(old["config"]).with_(transformers_version=retraced.transformers_version)
        == retraced
    )
    assert new["observed"]["peak_bytes"] == old["observed"]["peak_bytes"]
