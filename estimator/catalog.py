"""Which model `--model` names: a shorthand size, a catalog name / HF id, a config.json path, or the local HF cache."""

from __future__ import annotations

import difflib
import json
import os
from functools import lru_cache
from pathlib import Path

from estimator.architecture import Arch, ConfigError, from_config

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


def catalog_names() -> list[str]:
    """Every name --model accepts from the catalog: shorthands, then HF ids."""
    return list(SHORTHANDS) + list(catalog())


def load_config(path: Path) -> dict:
    """Parse one config.json; anything that is not a JSON object is a ConfigError."""
    try:
        cfg = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text (a binary file?); give a config.json") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a config.json") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} holds a JSON {type(cfg).__name__}, not a config object")
    return cfg


def catalog_id(spec: str) -> str | None:
    """The catalog HF id `spec` names (shorthand, HF id or bare name; case-insensitive), or None."""
    short = SHORTHANDS.get(spec.strip().upper())
    if short:
        return short
    key = spec.strip().lower()
    for hf_id in catalog():
        if key in (hf_id.lower(), hf_id.split("/", 1)[-1].lower()):
            return hf_id
    return None


def hf_cache_dirs() -> list[Path]:
    """Hub cache folders to look in: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def find_in_hf_cache(hf_id: str) -> Path | None:
    """config.json of `org/name` in the local HF cache (newest snapshot), or None; never touches the network."""
    if "/" not in hf_id:
        return None
    folder = "models--" + hf_id.strip("/").replace("/", "--")
    for cache in hf_cache_dirs():
        if not cache.is_dir():
            continue
        # The cache folder keeps the id's case; match it case-insensitively.
        matches = [d for d in cache.iterdir() if d.name.lower() == folder.lower()]
        snaps = [p for d in matches for p in (d / "snapshots").glob("*/config.json")]
        if snaps:
            return max(snaps, key=lambda p: p.stat().st_mtime)
    return None


def closest_names(spec: str, n: int = 3) -> list[str]:
    """Catalog names closest to `spec` (difflib over ids and bare names, case-insensitive)."""
    by_key: dict[str, str] = {}
    for name in catalog_names():
        by_key.setdefault(name.lower(), name)
        by_key.setdefault(name.split("/", 1)[-1].lower(), name)
    keys = difflib.get_close_matches(spec.strip().lower(), list(by_key), n=2 * n, cutoff=0.4)
    out: list[str] = []
    for k in keys:
        if by_key[k] not in out:
            out.append(by_key[k])
    return out[:n]


def _arch(cfg: dict, name: str, where: str) -> Arch:
    """from_config with every malformed value turned into a one-line ConfigError."""
    try:
        return from_config(cfg, name=name)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"{where}: malformed config ({e})") from None


@lru_cache(maxsize=64)
def _catalog_arch(hf_id: str) -> Arch:
    return _arch(load_config(catalog()[hf_id]), hf_id, str(catalog()[hf_id]))


MAX_NAME = 1024  # longer --model values are refused without touching the file system


def shown(spec: str, n: int = 80) -> str:
    """`spec` quoted for a one-line message, cut to `n` characters (saying how long it was)."""
    return repr(spec) if len(spec) <= n else f"{spec[:n]!r}... ({len(spec)} characters)"


def _as_path(spec: str) -> Path | None:
    """The config.json `spec` names on disk, or None; a name the OS cannot even look up is not a path."""
    try:
        path = Path(spec).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise UnknownModel(f"--model {shown(spec)}: folder has no config.json")
            return path / "config.json"
        return path if path.is_file() else None
    except (OSError, ValueError):  # name too long, embedded NUL, ...
        return None


def resolve_model(spec: str) -> Arch:
    """Arch for a shorthand size, catalog name / HF id / bare name, config.json path (or dir), or HF-cache id."""
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModel(
            f"--model {spec!r}: give a size ({' '.join(SHORTHANDS)}), a catalog name or a config.json"
        )
    if len(spec) > MAX_NAME:
        raise UnknownModel(f"--model {shown(spec)}: too long for a model name or path (at most {MAX_NAME})")
    hf_id = catalog_id(spec)
    if hf_id:
        return _catalog_arch(hf_id)
    path = _as_path(spec)
    if path is not None:
        cfg = load_config(path)
        label = cfg.get("_name_or_path") if isinstance(cfg.get("_name_or_path"), str) else None
        return _arch(cfg, label or str(spec), str(path))
    try:
        cached = find_in_hf_cache(spec)
    except (OSError, ValueError):
        cached = None
    if cached:
        return _arch(load_config(cached), spec, str(cached))
    near = closest_names(spec)
    hint = f"closest: {', '.join(near)}" if near else f"sizes: {' '.join(SHORTHANDS)}"
    raise UnknownModel(
        f"unknown model {shown(spec)} (not a size, catalog name, config.json path or HF-cache id); {hint}"
    )
