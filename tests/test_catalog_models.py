"""The catalog models added for "any model id": each file's exact parameter count (the one
estimator/catalog/SOURCES.md records) from the estimator and from transformers on the meta device, and the
size aliases: case-insensitive, each naming a shipped model, with a one-line note saying which."""

from __future__ import annotations

import json

import pytest

from estimator.model.architecture import from_config
from estimator.model.catalog import UnknownModel, catalog, resolve_model, resolve_model_with_note, sizes

ADDED = {  # HF id -> (computed total, model_type); SOURCES.md gives the source and grade of each
    "meta-llama/Llama-3.1-8B": (8_030_261_248, "llama"),
    "meta-llama/Llama-3.2-3B": (3_212_749_824, "llama"),
    "mistralai/Mistral-7B-Instruct-v0.3": (7_248_023_552, "mistral"),
    "microsoft/phi-4": (14_659_507_200, "phi3"),
    "allenai/OLMo-2-1124-13B": (13_716_198_400, "olmo2"),
}


@pytest.mark.parametrize("hf_id", sorted(ADDED))
def test_added_model_counts(hf_id):
    cfg = json.loads(catalog()[hf_id].read_text())
    arch = from_config(cfg)
    assert (arch.total_params, arch.model_type) == ADDED[hf_id]


@pytest.mark.parametrize("hf_id", sorted(ADDED))
def test_added_model_matches_transformers(hf_id):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in json.loads(catalog()[hf_id].read_text()).items() if k != "auto_map"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    assert sum(p.numel() for p in model.parameters()) == ADDED[hf_id][0]


def test_every_catalog_file_is_in_sources_md():
    text = (next(iter(catalog().values())).parent / "SOURCES.md").read_text()
    missing = [p.name for p in catalog().values() if f"{p.name}`" not in text]
    assert not missing, f"SOURCES.md has no row for {missing}"


@pytest.mark.parametrize(
    "spec,hf_id",
    [
        ("8b", "Qwen/Qwen3-8B"),
        ("8B", "Qwen/Qwen3-8B"),
        ("70b", "meta-llama/Llama-3.1-70B-Instruct"),
        (" 7b ", "Qwen/Qwen2.5-7B-Instruct"),
        ("0.6b", "Qwen/Qwen3-0.6B"),
        ("30b-a3b", "Qwen/Qwen3-30B-A3B"),
        ("135m", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ],
)
def test_sizes_are_case_insensitive_and_say_what_they_chose(spec, hf_id):
    arch, note = resolve_model_with_note(spec)
    assert arch.name == hf_id
    assert hf_id in note and spec.strip().upper() in note and "\n" not in note
    assert resolve_model(spec) is arch


def test_every_size_names_a_shipped_model_smallest_first():
    table = sizes()
    assert set(table.values()) <= set(catalog())
    assert list(table)[:2] == ["135M", "360M"] and list(table)[-1] == "72B"
    # the sweeps' sizes keep naming Qwen2.5-Instruct (every existing estimate stays as it was)
    for size in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B"):
        assert table[size] == f"Qwen/Qwen2.5-{size}-Instruct"


@pytest.mark.parametrize(
    "spec", ["qwen/qwen3-8b", "MISTRALAI/MISTRAL-7B-INSTRUCT-V0.3", "phi-4", "Mistral-7B-Instruct-v0.3"]
)
def test_names_are_case_insensitive_without_a_note(spec):
    arch, note = resolve_model_with_note(spec)
    assert arch.name in catalog() and note is None


def test_unknown_model_says_path_form_and_sizes(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UnknownModel) as e:
        resolve_model("no-such-model")
    msg = str(e.value)
    assert "config.json" in msg and "--model ./path/to/config.json" in msg
    assert "8B" in msg and "70B" in msg and "\n" not in msg


@pytest.mark.parametrize("spec", ["x" * 5000, "\x00", "a\nb", "../../etc/passwd", "acme/a@b@c", "   "])
def test_bad_specs_are_one_line(spec, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises((UnknownModel, ValueError)) as e:
        resolve_model(spec)
    assert "\n" not in str(e.value) and len(str(e.value)) < 600
