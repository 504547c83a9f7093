"""The seed table's configuration under TRL 0.14 semantics: a companion to results/README.md's headline table.

The Oxen.ai H100 table that started this project was made with TRL 0.14: 1 prompt × 4 completions per device,
gradient accumulation 4, prompt 256 and completion 786 tokens, bf16 weights, LoRA on q_proj, k_proj, o_proj,
up_proj, down_proj. Every cell here is `estimated` (the estimator with TRL 0.14's profile,
estimator/settings/trl_versions.py), with vram-estimate's fit verdict for the H100 80GB: what the card must hold + the
validated error band of the config's regime ≤ the memory torch can use on it.
"""

from __future__ import annotations

import pandas as pd

from estimator.settings.release_config import for_release
from estimator.step.estimate import estimate
from estimator.units import GIB

VERSION = "0.14"
MODELS = {
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B-Instruct",
    "Llama-3.2-1B": "meta-llama/Llama-3.2-1B-Instruct",
    "Llama-3.2-3B": "meta-llama/Llama-3.2-3B-Instruct",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen2.5-14B": "Qwen/Qwen2.5-14B-Instruct",
}
SEED = {
    "per_device_train_batch_size": 1,  # prompts, in TRL 0.14's unit: 1 × 4 = 4 completions per micro-batch
    "num_generations": 4,
    "gradient_accumulation_steps": 4,
    "max_prompt_length": 256,
    "max_completion_length": 786,
    "dtype": "bfloat16",
    "bf16": True,
    "optim": "adamw_torch",  # transformers 4.48's TrainingArguments default
}
LORA_TARGETS = ("q_proj", "k_proj", "o_proj", "up_proj", "down_proj")
ROWS = {
    "full fine-tune": {},
    "+ 8-bit AdamW": {"optim": "adamw_bnb_8bit"},
    "+ 8-bit AdamW + gradient checkpointing": {"optim": "adamw_bnb_8bit", "gradient_checkpointing": True},
    "LoRA": {"use_peft": True, "lora_target_modules": LORA_TARGETS},
}
H100_GB = 80


def h100_bytes() -> int:
    """What torch can use on the catalog's H100 80GB (estimator/hardware/gpus.py `usable_bytes`), as vram-estimate decides."""
    from estimator.hardware.gpus import GPUS

    return min(g.usable_bytes for g in GPUS if round(g.marketed_gb) == H100_GB and "H100" in g.name)


def seed_frame() -> pd.DataFrame:
    """One line per (method, model): estimated peak allocated and on-card bytes, and whether it fits the H100."""
    card = h100_bytes()
    recs = []
    for method, changes in ROWS.items():
        for label, model in MODELS.items():
            est = estimate(for_release(VERSION, {**SEED, **changes, "model": model}))
            need = est.fit_bytes  # vram-estimate's verdict: what the card must hold + the regime's error band
            recs.append(
                {
                    "method": method,
                    "model": label,
                    "allocated_bytes": est.peak_allocated_bytes,
                    "device_bytes": need,
                    "fits": need <= card,
                    "peak_phase": est.peak_phase,
                }
            )
    return pd.DataFrame(recs)


def seed_markdown(frame: pd.DataFrame | None = None) -> str:
    """The markdown section: method × model cells 'X.X GiB (estimated), fits / OOM on H100 80GB'."""
    from sweeps.report.frames import md_table

    frame = seed_frame() if frame is None else frame
    cell = frame.apply(
        lambda r: (
            f"{r['device_bytes'] / GIB:.1f} GiB (estimated), "
            + ("fits" if r["fits"] else "**OOM** on H100 80GB")
        ),
        axis=1,
    )
    table = frame.assign(cell=cell).pivot(index="method", columns="model", values="cell")
    table = table.reindex(index=list(ROWS), columns=list(MODELS)).reset_index()
    settings = ", ".join(f"{k}={v}" for k, v in SEED.items())
    return "\n\n".join(
        [
            "## Companion: the seed table's configuration under TRL 0.14 (estimated)",
            "The Oxen.ai H100 table that started this project ran TRL 0.14. Same configuration, modelled with "
            "TRL 0.14's semantics (`--trl-version 0.14`: per_device_train_batch_size counts prompts, beta=0.04 "
            "so full fine-tuning holds a reference copy, full [B, C+1, V] logits with a row-wise log_softmax, "
            "reference log-probs computed while the policy's graph is alive, generation per micro-batch with "
            f"the earlier micro-batches' gradients resident). Settings: {settings}; LoRA r=16 on "
            f"{', '.join(LORA_TARGETS)}. Cells: GiB the card must hold plus the validated error band of the "
            "config's regime (what `vram-estimate --gpu H100` compares), all `estimated`, and that verdict on the "
            "H100 80GB (the memory torch can use on it).",
            md_table(table),
            releases_markdown(),
        ]
    )


def releases_markdown() -> str:
    """The modelled TRL ranges (estimator/settings/trl_versions.py) as a markdown table, with what changed at each."""
    from estimator.settings.trl_versions import TABLE
    from sweeps.report.frames import md_table

    recs = []
    for row in TABLE:
        d = row.defaults
        recs.append(
            {
                "TRL": row.label,
                "batch counts": row.batch_unit,
                "beta": d.beta,
                "bf16": d.bf16,
                "grad. ckpt": d.gradient_checkpointing,
                "load dtype": d.dtype,
                "reference": "always (no PEFT)" if not row.reference_needs_beta else "beta != 0",
                "log-prob head": row.logprob_path + (" + T copy" if row.temperature_copy else ""),
                "generation": row.generation_unit,
                "old-policy pass": row.old_pass_rule,
                "vLLM": "/".join(row.vllm_modes),
                "what changed (source)": "; ".join(row.changes),
            }
        )
    return "\n\n".join(
        [
            "### TRL releases modelled (`--trl-version`)",
            "Each row is one range of `estimator/settings/trl_versions.py`; every minor release from 0.14 to 1.16 "
            "maps to one. Defaults as each release ships them (checked against the releases' own "
            "`grpo_config.py` by `tests/estimator/test_trl_versions.py`).",
            md_table(pd.DataFrame(recs)),
        ]
    )
