"""A 4-bit load under transformers 5.0-5.3 reads weights ahead of its quantizer: one note, with the load's worst case.

The worst case is the model in its load dtype. Qwen3-4B's 4,022,468,096 parameters are its published count
(estimator/catalog/SOURCES.md): 8,044,936,192 bytes (7.49 GiB) in bfloat16, 16,089,872,384 (14.98 GiB) in float32.
"""

from __future__ import annotations

import pytest

from estimator.interface import cli, flags
from estimator.model import catalog
from estimator.settings.config import RunConfig
from estimator.terms import loading

QWEN3_4B_PARAMS = 4_022_468_096


@pytest.fixture(scope="module")
def arch():
    return catalog.resolve_model("Qwen/Qwen3-4B")


def qlora(dtype: str) -> RunConfig:
    return RunConfig(
        model="Qwen/Qwen3-4B", use_peft=True, load_in_4bit=True, dtype=dtype, transformers_version="5.24"
    )


@pytest.mark.parametrize("dtype, bytes_per", [("bfloat16", 2), ("float32", 4)])
def test_worst_case_is_the_model_in_its_load_dtype(arch, dtype, bytes_per):
    assert loading.read_ahead_load_bytes(qlora(dtype), arch) == QWEN3_4B_PARAMS * bytes_per


@pytest.mark.parametrize("release", ["5.0.0", "5.1.0", "5.3.0", "5.3.0.dev0"])
def test_releases_that_read_ahead_get_the_note(arch, release):
    (note,) = loading.read_ahead_note(qlora("bfloat16"), arch, release)
    assert f"transformers {release} is installed" in note
    assert "up to 7.5 GiB" in note and "HF_DEACTIVATE_ASYNC_LOAD=1" in note and "model 5.24" in note
    (note,) = loading.read_ahead_note(qlora("float32"), arch, release)
    assert "in float32" in note and "up to 15.0 GiB" in note


@pytest.mark.parametrize("release", ["4.57.1", "5.4.0", "5.23.0", "5.24.0", "6.0.0", None, "main", ""])
def test_sequential_or_unknown_releases_get_none(arch, release):
    assert loading.read_ahead_note(qlora("bfloat16"), arch, release) == []


def test_a_load_without_4bit_quantization_gets_none(arch):
    lora = RunConfig(model="Qwen/Qwen3-4B", use_peft=True, dtype="bfloat16")
    assert loading.read_ahead_note(lora, arch, "5.3.0") == []


def test_the_cli_prints_it_for_the_installed_release(monkeypatch, capsys):
    argv = ["--model", "Qwen/Qwen3-4B", "--use-peft", "--load-in-4bit", "--dtype", "bfloat16"]
    monkeypatch.setattr(flags, "installed", lambda package: "5.3.0" if package == "transformers" else None)
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert sum("its loader reads a 4-bit model's weights" in line for line in err.splitlines()) == 1
    monkeypatch.setattr(flags, "installed", lambda package: "5.24.0" if package == "transformers" else None)
    assert cli.main(argv) == 0
    assert "its loader reads" not in capsys.readouterr().err
