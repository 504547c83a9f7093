"""Model config.json files: every real one loads, and a hostile one is refused in one line.

Real configs: the shipped catalog and the workplace's collection of upstream config.json files
($GRPO_VRAM_MODEL_CONFIGS, default /work/shared/model_configs, skipped where absent). Their sliding-window fields
(`sliding_window`, `use_sliding_window`, `layer_types`, `sliding_window_pattern`) are checked as strictly as a
hostile file's (tests/contracts/hostile_inputs.py, class model-json), so this is the test that the checks refuse
no model transformers loads.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from estimator.model import catalog
from estimator.model.architecture import from_config, layer_windows

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("GRPO_VRAM_MODEL_CONFIGS", "/work/shared/model_configs"))


def _real_configs() -> list[Path]:
    found = sorted((REPO / "estimator" / "catalog").glob("*.json"))
    if SHARED.is_dir():
        found += sorted(SHARED.rglob("*.json"))
    return found


def _id(path: Path) -> str:
    root = REPO / "estimator" / "catalog"
    return f"catalog/{path.name}" if path.parent == root else f"shared/{path.relative_to(SHARED)}"


@pytest.mark.parametrize("path", _real_configs(), ids=_id)
def test_every_real_config_loads(path):
    arch = from_config(catalog.load_config(path), name=path.stem)
    windows = layer_windows(arch)
    assert len(windows) == arch.num_layers
    assert all(w is None or (isinstance(w, int) and w > 0) for w in windows)


def test_the_real_configs_include_sliding_windows():
    """The catalog holds the window layouts the checks must keep accepting: Gemma-2 alternating, Gemma-3's
    pattern, Phi-3 all-sliding, Qwen2 with use_sliding_window false."""
    kinds = {}
    for path in _real_configs():
        arch = from_config(catalog.load_config(path), name=path.stem)
        kinds[arch.model_type] = {w is None for w in layer_windows(arch)}
    assert kinds["gemma2"] == kinds["gemma3_text"] == {True, False}
    assert kinds["qwen2"] == {True}
    assert "phi3" in kinds
