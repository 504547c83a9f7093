"""Write docs/estimate.schema.json: the JSON Schema of `vram-estimate --json` (`python docs/make_schema.py`).

The hand-written part is below; the `config` object's properties come from RunConfig's one schema of run
settings (estimator/settings/config.py), so a new setting appears here when this is rerun. tests/estimator/test_json_schema.py
validates real answers against the file and fails when it is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "estimate.schema.json"

BYTES = {"type": "integer"}
SOURCE = {"type": "string", "description": "where the number came from: estimated, simulated, fitted, traced"}
EST = {"const": "estimated"}


def obj(props: dict, required: list[str] | None = None, extra: bool = False, desc: str = "") -> dict:
    d = {"type": "object", "properties": props, "required": required if required is not None else list(props)}
    if not extra:
        d["additionalProperties"] = False
    if desc:
        d["description"] = desc
    return d


def nullable(s: dict) -> dict:
    return {"anyOf": [s, {"type": "null"}]}


def config_schema() -> dict:
    from estimator.settings.config import schema

    kinds = {
        "bool": {"type": "boolean"},
        "int": {"type": "integer"},
        "float": {"type": "number"},
        "str": {"type": "string"},
        "strs": {"type": "array", "items": {"type": "string"}},
    }
    props, required = {}, []
    for f in schema():
        s = dict(kinds[f.kind])
        if f.nullable:
            s = {"type": [s["type"], "null"], **({"items": s["items"]} if "items" in s else {})}
        s["description"] = f.meta.help.split(". ")[0][:200]
        props[f.name] = s
        if f.meta.since == "0.1.0":
            required.append(f.name)
    return obj(
        props,
        required,
        desc="every run setting (RunConfig, TRL's names); a setting added after 0.1.0 appears only when it "
        "differs from its default",
    )


def non_tensor_item() -> dict:
    return obj({"name": {"type": "string"}, "bytes": BYTES, "source": EST, "basis": {"type": "string"}})


def fit() -> dict:
    return obj(
        {
            "source": EST,
            "gpu": {"type": "string", "description": "card name as docs/GPUS.md lists it"},
            "gpu_memory_bytes": {**BYTES, "description": "total as nvidia-smi reports it"},
            "gpu_memory_source": {"type": "string"},
            "usable_bytes": {**BYTES, "description": "what torch can use on it (total_memory)"},
            "usable_source": {"type": "string"},
            "compared": {"type": "string", "description": "what the verdict compares"},
            "fits": {"type": "boolean"},
            "fit_bytes": {**BYTES, "description": "what this card must hold: its own cuBLAS workspaces"},
            "free_bytes": {**BYTES, "description": "usable_bytes - fit_bytes; negative = short"},
            "blocked": {"type": ["string", "null"], "description": "what fails whatever the bytes say"},
        }
    )


def option() -> dict:
    change = obj({"key": {"type": "string"}, "label": {"type": "string"}})
    return obj(
        {
            "source": EST,
            "changes": {"type": "array", "items": change, "minItems": 1},
            "peak_device_bytes": BYTES,
            "need_bytes": {**BYTES, "description": "fit_bytes after the change"},
            "saved_bytes": BYTES,
            "fits": {
                "type": ["boolean", "null"],
                "description": "within the budget and, with vLLM, vLLM starts; null without a budget",
            },
            "cost": {"type": "string"},
            "starts": {
                "type": "boolean",
                "description": "vLLM's own start-up checks pass (runs with vLLM only)",
            },
        },
        ["source", "changes", "peak_device_bytes", "need_bytes", "saved_bytes", "fits", "cost"],
    )


def layout() -> dict:
    from typing import get_args

    from estimator.plan.layout import FailureKind

    role = obj(
        {"role": {"type": "string"}, "resident": BYTES, "working": BYTES, "loaded": BYTES},
        ["role"],
        extra=True,
    )
    group = obj(
        {
            "name": {"type": "string"},
            "count": {"type": "integer"},
            "roles": {"type": "array", "items": role},
            "peak_device_bytes": BYTES,
            "total_bytes": BYTES,
            "need_bytes": {
                "type": ["integer", "null"],
                "description": "training GPUs: what the card must hold as the fit verdicts count it (fit_bytes "
                "with the roles beside the policy); the group fits when it is within total_bytes. null: the peak "
                "decides",
            },
        },
        ["name", "count", "roles", "peak_device_bytes", "total_bytes"],
        extra=True,
    )
    vllm = obj(
        {
            "mode": {"enum": ["colocate", "server"]},
            "utilization": {"type": "number"},
            "requested": BYTES,
            "weights": BYTES,
            "kv_cache": BYTES,
            "kv_tokens": {"type": "integer"},
            "max_model_len": {"type": "integer"},
            "failure": {"type": ["string", "null"]},
            "failure_kind": {"enum": [*get_args(FailureKind), None]},
            "graphs_on_top": BYTES,
        },
        ["mode", "utilization", "failure"],
        extra=True,
        desc="vLLM's own accounting (estimator/plan/layout.py VllmCheck); further byte fields as named there",
    )
    return obj(
        {
            "source": EST,
            "total_gpus": {"type": "integer", "minimum": 1},
            "fits": {"type": "boolean"},
            "groups": {"type": "array", "items": group, "minItems": 1},
            "vllm": nullable(vllm),
            "notes": {"type": "array", "items": {"type": "string"}},
            "fixes": {"type": "array", "items": {"type": "string"}},
        },
        ["source", "total_gpus", "fits", "groups", "vllm", "fixes"],
        extra=True,
    )


def schema() -> dict:
    from estimator.interface.report import SCHEMA_VERSION
    from estimator.terms.phase_names import PHASES

    phase_map = {
        "type": "object",
        "propertyNames": {"enum": list(PHASES)},
        "additionalProperties": {"type": "object", "additionalProperties": BYTES},
    }
    layers = obj(
        {
            "allocated": obj({"bytes": BYTES, "source": EST, "what": {"type": "string"}}),
            "fragmentation": obj(
                {
                    "bytes": BYTES,
                    "source": SOURCE,
                    "basis": {"type": "string"},
                    "allocator_settings": {"type": "string"},
                    "what": {"type": "string"},
                }
            ),
            "in_reserved": {"type": "array", "items": non_tensor_item()},
            "reserved": obj({"bytes": BYTES, "source": EST}),
            "outside_allocator": {"type": "array", "items": non_tensor_item()},
            "nvidia_smi_peak": obj({"bytes": BYTES, "source": EST}),
            "need": obj(
                {
                    "bytes": BYTES,
                    "allocator_extra_bytes": {"type": ["integer", "null"]},
                    "allocator_margin_bytes": {"type": "integer", "minimum": 0},
                    "source": SOURCE,
                    "what": {"type": "string"},
                }
            ),
        }
    )
    top = {
        "schema_version": {"const": SCHEMA_VERSION},
        "verdict": {"type": "string"},
        "source": EST,
        "model": obj({"name": {"type": "string"}, "params": BYTES, "trainable_params": BYTES}),
        "config": config_schema(),
        "phases": phase_map,
        "phase_totals": {
            "type": "object",
            "propertyNames": {"enum": list(PHASES)},
            "additionalProperties": BYTES,
        },
        "peak_phase": {"enum": list(PHASES)},
        "peak_allocated_bytes": BYTES,
        "allocator_overhead_bytes": BYTES,
        "peak_reserved_bytes": BYTES,
        "cuda_context_bytes": BYTES,
        "peak_device_bytes": BYTES,
        "peak_device_gib": {"type": "number"},
        "need_bytes": BYTES,
        "band_bytes": BYTES,
        "fit_bytes": BYTES,
        "layers": layers,
        "notes": {"type": "array", "items": {"type": "string"}},
        "fits": {"type": "array", "items": fit()},
        "target": fit(),
        "advice": obj(
            {
                "source": EST,
                "baseline_bytes": BYTES,
                "budget_bytes": {"type": ["integer", "null"]},
                "singles": {"type": "array", "items": option()},
                "plan": nullable(option()),
                "baseline_starts": {
                    "type": "boolean",
                    "description": "vLLM starts at the run as given (runs with vLLM only)",
                },
            },
            ["source", "baseline_bytes", "budget_bytes", "singles", "plan"],
        ),
        "solve": obj(
            {
                "source": EST,
                "knob": {"type": "string"},
                "value": {"type": ["integer", "number", "null"]},
                "peak_device_bytes": {"type": ["integer", "null"]},
                "need_bytes": {"type": ["integer", "null"]},
                "budget_bytes": BYTES,
                "note": {"type": ["string", "null"]},
            }
        ),
        "layout": layout(),
        "band": obj(
            {
                "regime": {"type": "string"},
                "low": {"type": "number"},
                "high": {"type": "number"},
                "n": {"type": "integer"},
                "margin": {"type": "number"},
                "source": {"type": "string"},
            },
            ["regime", "low", "high", "n", "margin", "source"],
            extra=True,
        ),
        "settings_from": {"type": "object", "additionalProperties": {"type": "string"}},
        "trace": obj(
            {
                "source": {"const": "traced"},
                "status": {"type": ["string", "null"]},
                "error": {"type": ["string", "null"]},
                "peak_bytes": BYTES,
                "peak_phase": {"type": "string"},
                "phases": {"type": "object", "additionalProperties": BYTES},
                "need_bytes": BYTES,  # the smallest allocator limit the traced step runs under (simulated)
                "card_bytes": BYTES,  # need_bytes + the estimate's workspaces and CUDA context
            },
            ["source", "status"],
        ),
    }
    optional = {"target", "advice", "solve", "layout", "settings_from", "trace"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/grpo-vram/grpo-vram/docs/estimate.schema.json",
        "title": "vram-estimate --json",
        "description": "The JSON answer of vram-estimate (and estimator.step.estimate(...).to_dict()); every field is "
        "documented in docs/json-output.md. Bytes are integers; every number carries or inherits a source.",
        **obj(top, [k for k in top if k not in optional]),
    }


def text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(text())
    print(f"wrote {OUT.relative_to(ROOT)}")
