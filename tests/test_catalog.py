"""--model resolution: sizes, catalog names, bare names, config.json paths, the local HF cache, errors."""

from __future__ import annotations

import json

import pytest

from estimator.hardware.gpus import GPUS, UnknownGPU, lookup
from estimator.model.architecture import ConfigError
from estimator.model.catalog import UnknownModel, closest_names, resolve_model

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 128,
    "tie_word_embeddings": True,
}
# 128*64 embedding + 2 layers * (64*64 + 2*64*32 + 64*64 + 3*64*96 + 2*64) + 64 final norm
TINY_PARAMS = 128 * 64 + 2 * (4096 + 4096 + 4096 + 18432 + 128) + 64


@pytest.mark.parametrize("spec", ["7B", "7b", " 7B "])
def test_shorthand_is_qwen25_instruct(spec):
    assert resolve_model(spec).name == "Qwen/Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("spec", ["Qwen/Qwen3-8B", "qwen/qwen3-8b", "qwen3-8b", "QWEN3-8B"])
def test_catalog_names_case_insensitive_and_bare(spec):
    arch = resolve_model(spec)
    assert arch.name == "Qwen/Qwen3-8B"
    assert arch.total_params == 8_190_735_360  # SOURCES.md computed total


def test_config_file_and_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert resolve_model(str(tmp_path / "config.json")).total_params == TINY_PARAMS
    assert resolve_model(str(tmp_path)).total_params == TINY_PARAMS


def test_hf_cache_lookup(tmp_path, monkeypatch):
    snap = tmp_path / "models--acme--Tiny-LM" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    arch = resolve_model("acme/tiny-lm")
    assert arch.total_params == TINY_PARAMS
    assert arch.name == "acme/tiny-lm"


def test_hf_home_hub_lookup(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--Other" / "snapshots" / "s1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(TINY))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert resolve_model("acme/Other").total_params == TINY_PARAMS


def test_unknown_names_closest(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UnknownModel) as e:
        resolve_model("qwen3-8bx")
    assert "Qwen/Qwen3-8B" in str(e.value)
    assert "\n" not in str(e.value)
    assert closest_names("llama-3.1-8b")[0] == "meta-llama/Llama-3.1-8B-Instruct"


def test_malformed_json_is_one_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError) as e:
        resolve_model(str(p))
    assert "not valid JSON" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "bad",
    [{"hidden_size": 64}, {**TINY, "hidden_size": "wide"}, {**TINY, "num_attention_heads": 0}, [1, 2]],
)
def test_malformed_config_values(tmp_path, bad):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ConfigError):
        resolve_model(str(p))


# ---- GPU catalog ----


@pytest.mark.parametrize(
    "name, mib",
    [
        ("H100", 81559),
        ("h100 80gb", 81559),
        ("NVIDIA H100 80GB", 81559),
        ("a100-40", 40960),
        ("A100", 40960),  # ambiguous: the smaller card (gpus.resolve says so)
        ("A100-80", 81920),
        ("rtx4090", 24564),
        ("RTX 5090", 32607),
        ("tesla-t4", 15360),
        ("L4", 23034),
        ("a10g", 23028),
        ("3080-laptop", 16384),
        ("H200", 143771),
        ("b200", 183359),
    ],
)
def test_gpu_lookup(name, mib):
    assert lookup(name).memory_bytes == mib * 2**20


def test_gpu_catalog_is_sourced_and_unique():
    assert len({g.name for g in GPUS}) == len(GPUS)
    assert all(g.source for g in GPUS)
    # H100 80GB: 81559 MiB reported = 79.65 GiB of the 80 marketed
    assert round(lookup("H100").memory_gib, 2) == 79.65


def test_unknown_gpu():
    with pytest.raises(UnknownGPU) as e:
        lookup("X100")
    assert "H100 80GB" in str(e.value) and "\n" not in str(e.value)
