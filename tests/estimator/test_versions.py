"""The upstream releases as an input: transformers keyed by release, installed versions read from metadata,
records from before the setting read as the release they were made under, `--version`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.model.catalog import resolve_model
from estimator.settings import trl_versions, versions
from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate
from estimator.terms import generation as gen
from sweeps import records

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("parse", [versions.parse_version, trl_versions.parse_version])
def test_hostile_version_text_is_refused_at_once(parse):
    # the old pattern `(?:[.\-+]?\w*)*` doubled its work with each character: 30 took minutes
    for text in ("0.14" + "a" * 30 + "!", "1" * 100_000, "v" + "." * 5000):
        with pytest.raises(ValueError):
            parse(text)


@pytest.mark.parametrize(
    "text, want", [("5.24", (5, 24)), ("v5.24.1", (5, 24)), ("2.13.0+cpu", (2, 13)), ("0.19.0.dev0", (0, 19))]
)
def test_release_text(text, want):
    assert versions.parse_version(text) == want


def test_each_modelled_transformers_release_has_its_row_and_others_are_refused():
    assert versions.transformers_profile("5.23").cache_values_own_dtype is False
    assert versions.transformers_profile("5.24.0").cache_values_own_dtype is True
    with pytest.raises(ValueError, match="accepted: 5.23, 5.24"):
        versions.transformers_profile("5.25")


def test_value_cache_dtype_follows_the_release():
    fp32_autocast = RunConfig(dtype="float32", bf16=True)
    assert gen.value_cache_dtype(fp32_autocast.with_(transformers_version="5.23")) == "float32"
    assert gen.value_cache_dtype(fp32_autocast.with_(transformers_version="5.24")) == "bfloat16"
    # a bnb 4-bit base returns its input's dtype (the load dtype): V is fp32 under both releases
    qlora = fp32_autocast.with_(use_peft=True, load_in_4bit=True, transformers_version="5.24")
    assert gen.value_cache_dtype(qlora) == "float32"
    assert gen.value_cache_dtype(RunConfig(dtype="bfloat16", transformers_version="5.24")) == "bfloat16"


def test_the_generation_phase_saves_the_bf16_half_of_every_value():
    # Qwen2.5-0.5B: 24 layers, 2 KV heads x 64; 8 sequences of 256 + 512 positions; 5.24 keeps V in bf16
    # (2 bytes) where 5.23 promoted it to fp32 (4 bytes)
    cfg = RunConfig(model="0.5B", use_peft=True, per_device_train_batch_size=8)
    arch = resolve_model("0.5B")
    old = estimate(cfg.with_(transformers_version="5.23"), arch).phases["generate"]["kv_cache"]
    new = estimate(cfg.with_(transformers_version="5.24"), arch).phases["generate"]["kv_cache"]
    values_saved = 8 * 24 * 2 * 64 * (256 + 512) * (4 - 2)
    # the decode step's transient is the larger of the doubled cache tensor (K, fp32, under both releases:
    # 8 x 128 x 768 x 4 B) and sdpa's bf16 casts (K and V under 5.23, 2 x 8 x 128 x 768 x 2 B, the same; K alone
    # under 5.24): the doubled K under both
    k_doubled = 8 * 2 * 64 * (256 + 512) * 4
    assert gen.kv_concat_transient(cfg.with_(transformers_version="5.23"), arch) == k_doubled
    assert gen.kv_concat_transient(cfg.with_(transformers_version="5.24"), arch) == k_doubled
    assert old - new == values_saved


def test_records_without_the_setting_keep_their_key_and_read_as_5_23():
    row = records.load_rows(REPO / "results" / "traced" / "random" / "validation.jsonl")[0]
    assert "transformers_version" not in row["config"]
    assert row["versions"]["transformers"].startswith("5.23")
    cfg = RunConfig.from_dict(row["config"])
    assert cfg.transformers_version == "5.23"
    assert records.make_key(cfg.to_dict(), row["variant"]) == row["key"]
    # the same run under 5.24 is another record
    later = cfg.with_(transformers_version="5.24").to_dict()
    assert later["transformers_version"] == "5.24"
    assert records.make_key(later, row["variant"]) != row["key"]


def test_installed_releases_outside_the_modelled_ones_get_one_line(monkeypatch):
    fake = {"trl": "1.16.0", "transformers": "5.25.0", "peft": "0.21.2", "torch": "2.13.0+cpu"}
    monkeypatch.setattr(versions, "installed", lambda package: fake.get(package))
    assert versions.default_transformers() == versions.NEWEST_TRANSFORMERS
    notes = versions.installed_notes("1.16", "5.24")
    assert len(notes) == 1
    assert "transformers 5.25.0 is installed, newer than the releases modelled (5.23-5.24)" in notes[0]
    fake["transformers"] = "5.23.0"
    assert versions.default_transformers() == "5.23"
    assert versions.installed_notes("1.16", "5.23") == []
    fake["bitsandbytes"] = "0.48.0"
    assert "bitsandbytes 0.48.0 is installed, older" in versions.installed_notes("1.16", "5.23")[0]


def test_cli_names_the_releases_and_takes_the_transformers_release():
    run = [sys.executable, "-m", "estimator.interface.cli"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([*run, "--version"], capture_output=True, text=True, cwd=REPO, env=env)
    assert out.returncode == 0
    assert "transformers 5.23-5.24" in " ".join(out.stdout.split()) and "TRL 0.14-1.16" in out.stdout
    base = ["--model", "0.5B", "--lora", "--json"]
    got = {}
    for rel in ("5.23", "5.24"):
        res = subprocess.run(
            [*run, *base, "--transformers-version", rel], capture_output=True, text=True, env=env
        )
        assert res.returncode == 0, res.stderr
        got[rel] = json.loads(res.stdout)
    assert got["5.24"]["phase_totals"]["generate"] < got["5.23"]["phase_totals"]["generate"]
    bad = subprocess.run(
        [*run, *base, "--transformers-version", "4.57"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "5.23" in bad.stderr


def test_an_allocation_stream_stands_for_every_release_its_step_is_the_same_under():
    from estimator.terms import allocator_reserve as allocator_term

    bf16 = RunConfig(model="7B", use_peft=True, dtype="bfloat16")  # V is bf16 under both releases
    fp32 = RunConfig(model="7B", use_peft=True)  # V is fp32 under 5.23, bf16 under 5.24
    source = {
        rel: allocator_term.reserve(cfg.with_(transformers_version=rel), 30 * 2**30).source
        for cfg in (bf16,)
        for rel in ("5.23", "5.24")
    }
    assert source["5.23"] == source["5.24"] and "traced stream" in source["5.24"]
    # the fp32 config's streams were traced once under each release: each release reads its own
    index = [
        json.loads(line) for line in (REPO / "results" / "streams" / "index.jsonl").read_text().splitlines()
    ]
    fp32_keys = {
        row["config"].get("transformers_version", "5.23"): row["key"]
        for row in index
        if row["config"]["model"] == "7B"
        and row["config"]["dtype"] == "float32"
        and row["config"]["use_peft"]
    }
    for rel in ("5.23", "5.24"):
        got = allocator_term.reserve(fp32.with_(transformers_version=rel), 30 * 2**30).source
        assert fp32_keys[rel] in got, (rel, got)
