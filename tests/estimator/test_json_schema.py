"""`vram-estimate --json` answers validate against docs/estimate.schema.json, which is current, versioned and
documented field by field in docs/json-output.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from estimator.interface import cli

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "docs" / "estimate.schema.json"
DOC = REPO / "docs" / "json-output.md"
CASE5 = "examples/case5_trl_user_files"

RUNS = {
    "single GPU, full fine-tune": ["--model", "0.5B", "--gpu", "H100"],
    "LoRA": ["--model", "7B", "--lora"],
    "QLoRA, does not fit, advice": ["--model", "14B", "--qlora", "--gpu", "T4"],
    "FSDP over 4 GPUs": [
        "--model",
        "7B",
        "--gpus",
        "4",
        "--fsdp",
        "--fsdp-sharding-strategy",
        "SHARD_GRAD_OP",
    ],
    "ZeRO-2 offload": [
        "--model",
        "1.5B",
        "--gpus",
        "4",
        "--zero",
        "2",
        "--offload-optimizer",
        "--host-ram",
        "64",
    ],
    "vLLM colocate": [
        "--model",
        "7B",
        "--lora",
        "--use-vllm",
        "--vllm-gpu-memory-utilization",
        "0.3",
        "--gpu",
        "A100-40",
    ],
    "roles on their own GPUs": [
        "--model",
        "1.5B",
        "--zero",
        "3",
        "--gpus",
        "4",
        "--reward-model",
        "1.5B",
        "--value-model",
        "1.5B@own:2",
        "--gpu",
        "A100-80",
    ],
    "solve": [
        "--model",
        "14B",
        "--lora",
        "--dtype",
        "bfloat16",
        "--solve",
        "num_generations",
        "--gpu",
        "H100",
    ],
    "advice when it fits": ["--model", "7B", "--lora", "--advice", "--gpu", "H200"],
    "cpu": ["--model", "0.5B", "--device", "cpu"],
    "files": [
        "--config",
        f"{CASE5}/grpo.yaml",
        "--config",
        f"{CASE5}/accelerate_zero3.yaml",
        "--gpu",
        "H100",
    ],
}


@pytest.fixture(scope="module")
def schema() -> dict:
    s = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(s)
    return s


def answer(argv, capsys, fmt=("--json",)) -> dict:
    code = cli.main([*argv, *fmt])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    return json.loads(out)


@pytest.mark.parametrize("name", list(RUNS))
def test_real_answers_validate(name, schema, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    d = answer(RUNS[name], capsys)
    jsonschema.validate(d, schema)
    assert d["schema_version"] == schema["properties"]["schema_version"]["const"]
    # the relations the document states, checked on the numbers themselves
    assert d["fit_bytes"] == d["need_bytes"] + d["band_bytes"]
    assert d["peak_allocated_bytes"] == max(d["phase_totals"].values()) == d["phase_totals"][d["peak_phase"]]
    assert all(sum(c.values()) == d["phase_totals"][p] for p, c in d["phases"].items())
    for f in d["fits"] + ([d["target"]] if "target" in d else []):
        assert f["free_bytes"] == f["usable_bytes"] - f["fit_bytes"]
        # a card's own workspaces are never more than the H100's the answer counts (Ampere: 52-59 MiB fewer)
        assert d["fit_bytes"] - 60 * 2**20 <= f["fit_bytes"] <= d["fit_bytes"] or d["config"]["use_vllm"]
        assert f["fits"] == (f["free_bytes"] >= 0 and not f["blocked"])


def test_format_json_is_the_same_answer_as_json(capsys):
    argv = ["--model", "1.5B", "--lora"]
    assert answer(argv, capsys) == answer(argv, capsys, ("--format", "json"))


def test_python_api_to_dict_validates(schema):
    from estimator import estimate

    jsonschema.validate(estimate(model="7B", use_peft=True, gpu="4090").to_dict(), schema)


def test_a_missing_field_or_a_wrong_type_is_caught(schema, capsys):
    d = answer(["--model", "0.5B"], capsys)
    del d["fit_bytes"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, schema)
    d = answer(["--model", "0.5B"], capsys)
    d["peak_phase"] = "warmup"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, schema)


def test_schema_file_is_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_schema", REPO / "docs" / "make_schema.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert SCHEMA_FILE.read_text() == mod.text(), "stale: run python docs/make_schema.py"


def test_every_top_level_field_is_documented(schema):
    doc = DOC.read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.MULTILINE))
    assert set(schema["properties"]) <= documented, set(schema["properties"]) - documented
