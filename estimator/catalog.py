"""Which model `--model` names: a shorthand size, a catalog name / HF id, a config.json path, or the local HF cache."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from estimator.architecture import Arch, from_config

CATALOG_DIR = Path(__file__).parent / "catalog"
# Shorthand sizes name the Qwen2.5-Instruct family (the sizes the sweeps measure).
SHORTHANDS = {
    "0.5B": "Qwen/Qwen2.5-0.5B-Instruct",
    "1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "3B": "Qwen/Qwen2.5-3B-Instruct",
    "7B": "Qwen/Qwen2.5-7B-Instruct",
    "14B": "Qwen/Qwen2.5-14B-Instruct",
    "32B": "Qwen/Qwen2.5-32B-Instruct",
    "72B": "Qwen/Qwen2.5-72B-Instruct",
}


class UnknownModel(ValueError):
    """A --model value that names nothing we can size."""


@lru_cache(maxsize=1)
def catalog() -> dict[str, Path]:
    """HF id -> shipped config.json (file names are the id with '/' written '--')."""
    return {p.stem.replace("--", "/"): p for p in sorted(CATALOG_DIR.glob("*.json"))}


def load_config(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def resolve_model(spec: str) -> Arch:
    """Arch for a shorthand size, catalog name / HF id (case-insensitive) or config.json path."""
    name = SHORTHANDS.get(spec.upper().replace("b", "B"), spec) if spec.upper() in SHORTHANDS else spec
    by_lower = {k.lower(): k for k in catalog()}
    if name.lower() in by_lower:
        hf_id = by_lower[name.lower()]
        return from_config(load_config(catalog()[hf_id]), name=hf_id)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return from_config(load_config(path), name=str(spec))
    raise UnknownModel(f"unknown model {spec!r}")
