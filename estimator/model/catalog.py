"""Which model `--model` names: a shorthand size, a catalog name / HF id, a config.json path, the local HF cache,
or (with huggingface_hub and the network) any Hub id `ORG/NAME[@REV]`, whose config.json alone is fetched."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from functools import lru_cache
from pathlib import Path

from estimator.model import hub
from estimator.model.architecture import Arch, ConfigError, from_config
from estimator.text import UnreadableFile, read_user_file

CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog"
# Shorthand sizes (case-insensitive: 7b, 7B). A size names the Qwen2.5-Instruct model of that size (the sizes
# the sweeps measure); sizes Qwen2.5 lacks name Qwen3, then the catalog's best-known model of that size.
# Resolving a size says which model it chose (resolve_model_with_note); a full name picks any other.
SHORTHANDS = {
    "0.5B": "Qwen/Qwen2.5-0.5B-Instruct",
    "1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    "3B": "Qwen/Qwen2.5-3B-Instruct",
    "7B": "Qwen/Qwen2.5-7B-Instruct",
    "14B": "Qwen/Qwen2.5-14B-Instruct",
    "32B": "Qwen/Qwen2.5-32B-Instruct",
    "72B": "Qwen/Qwen2.5-72B-Instruct",
}
MORE_SIZES = {
    "135M": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "360M": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "0.6B": "Qwen/Qwen3-0.6B",
    "1B": "meta-llama/Llama-3.2-1B-Instruct",
    "1.7B": "Qwen/Qwen3-1.7B",
    "2B": "google/gemma-2-2b-it",
    "4B": "Qwen/Qwen3-4B",
    "8B": "Qwen/Qwen3-8B",
    "30B-A3B": "Qwen/Qwen3-30B-A3B",
    "70B": "meta-llama/Llama-3.1-70B-Instruct",
}
SIZES = {**SHORTHANDS, **MORE_SIZES}


class UnknownModel(ValueError):
    """A --model value that names nothing we can size."""


@lru_cache(maxsize=1)
def catalog() -> dict[str, Path]:
    """HF id -> shipped config.json (file names are the id with '/' written '--')."""
    return {p.stem.replace("--", "/"): p for p in sorted(CATALOG_DIR.glob("*.json"))}


def catalog_names() -> list[str]:
    """Every name --model accepts from the catalog: shorthand sizes, then HF ids."""
    return list(sizes()) + list(catalog())


def sizes() -> dict[str, str]:
    """Shorthand size -> catalog HF id, smallest first (only sizes whose model is shipped); a fresh dict."""
    return dict(_shipped_sizes())


@lru_cache(maxsize=1)
def _shipped_sizes() -> tuple[tuple[str, str], ...]:
    shipped = catalog()
    return tuple(
        sorted(((k, v) for k, v in SIZES.items() if v in shipped), key=lambda kv: _size_value(kv[0]))
    )


def _size_value(size: str) -> float:
    n = size.upper().split("-", 1)[0]
    return float(n[:-1]) * (1e-3 if n.endswith("M") else 1.0)


def size_note(size: str, hf_id: str) -> str:
    """The one line that says which catalog model a size alias chose."""
    return f"--model {size}: sized as {hf_id} (the catalog's {size} model; give a full name for another)"


# A model's config.json is a few KiB (the catalog's largest is under 2 KiB); 4 MiB leaves room for configs that
# carry label maps or per-layer lists, and keeps a FIFO, /dev/zero or a stray large file from being read whole.
MAX_CONFIG_BYTES = 4 << 20


def load_config(path: Path) -> dict:
    """Parse one config.json (a regular UTF-8 file of at most MAX_CONFIG_BYTES, read by
    estimator.text.read_user_file); anything else, or anything but a JSON object, is a one-line ConfigError."""
    try:
        text = read_user_file(path, MAX_CONFIG_BYTES, "a config.json", "a config.json")
    except UnreadableFile as e:
        raise ConfigError(f"cannot read {shown(str(path), 120)}: {e}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a config.json") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} holds a JSON {type(cfg).__name__}, not a config object")
    return cfg


def catalog_id(spec: str) -> str | None:
    """The catalog HF id `spec` names (shorthand size, HF id or bare name; case-insensitive), or None."""
    short = sizes().get(spec.strip().upper())
    if short:
        return short
    key = spec.strip().lower()
    for hf_id in catalog():
        if key in (hf_id.lower(), hf_id.split("/", 1)[-1].lower()):
            return hf_id
    return None


def hf_cache_dirs() -> list[Path]:
    """Hub cache folders to look in: huggingface_hub's own (hub.hub_cache_dir), $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub."""
    dirs = [hub.hub_cache_dir()]
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(dirs))


def find_in_hf_cache(hf_id: str, revision: str | None = None) -> Path | None:
    """config.json of `org/name` in the local HF cache (at `revision`: a branch, tag or commit; else refs/main or
    the newest snapshot), or None; never touches the network."""
    if "/" not in hf_id:
        return None
    return hub.cached_config(hf_id.strip("/"), revision, hf_cache_dirs())


def closest_names(spec: str, n: int = 3) -> list[str]:
    """Catalog names closest to `spec` (difflib over ids and bare names, case-insensitive)."""
    by_key: dict[str, str] = {}
    for name in catalog_names():
        by_key.setdefault(name.lower(), name)
        by_key.setdefault(name.split("/", 1)[-1].lower(), name)
    query = spec.strip().lower()
    # Names the query begins (`llama-3.1-8b` -> `...-8B-Instruct`), shortest first, then difflib's nearest.
    prefixed = sorted((k for k in by_key if query and k.startswith(query) and k != query), key=len)
    keys = prefixed + difflib.get_close_matches(query, list(by_key), n=2 * n, cutoff=0.4)
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


def _is_dir(spec: str) -> bool:
    """`--model` names a folder (a checkpoint, whose missing generation_config.json means it has none)."""
    try:
        return Path(spec).expanduser().is_dir()
    except (OSError, ValueError):
        return False


def resolve_model(spec: str, revision: str | None = None) -> Arch:
    """Arch for a shorthand size, catalog name / HF id / bare name, config.json path (or dir), HF-cache id or Hub id."""
    return resolve_model_with_note(spec, revision)[0]


def resolve_model_with_note(spec: str, revision: str | None = None) -> tuple[Arch, str | None]:
    """(Arch, note) for `spec`; the note (one line, else None) says which catalog model a size alias chose.

    Order: size or catalog name (case-insensitive) -> config.json path or folder -> `ORG/NAME[@REV]` in the local
    HF cache -> that id's config.json fetched from the Hub (estimator.model.hub: huggingface_hub, HF_TOKEN, HF_ENDPOINT;
    never when HF_HUB_OFFLINE is set). `revision` (or `@REV` in `spec`) pins a branch, tag or commit; a catalog
    name with a revision is looked up in the cache / on the Hub, not in the shipped file.
    Raises UnknownModel or ConfigError, whose text is one line.
    """
    sizes_text = " ".join(sizes())
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownModel(
            f"--model {shown(spec) if isinstance(spec, str) else repr(spec)[:80]}: give a size ({sizes_text}), "
            "a catalog name, an HF id or a config.json path"
        )
    if len(spec) > MAX_NAME:
        raise UnknownModel(f"--model {shown(spec)}: too long for a model name or path (at most {MAX_NAME})")
    if revision is not None and (not isinstance(revision, str) or not hub.REVISION.fullmatch(revision)):
        raise UnknownModel(
            f"--model {shown(spec)}: revision {shown(str(revision))} is not a branch, tag or commit"
        )
    hf_id = catalog_id(spec)
    if hf_id and revision is None:
        size = spec.strip().upper()
        return _catalog_arch(hf_id), (size_note(size, hf_id) if size in sizes() else None)
    path = _as_path(spec) if not hf_id else None
    if path is not None:
        cfg = load_config(path)
        label = cfg.get("_name_or_path") if isinstance(cfg.get("_name_or_path"), str) else None
        arch = _arch(cfg, label or str(spec), str(path))
        return _with_generation_cache(arch, path, whole_checkpoint=_is_dir(spec)), None
    parsed = (hf_id, None) if hf_id else hub.split_id(spec)
    if parsed is None:
        raise _unknown(spec, sizes_text)
    repo_id, rev = parsed
    if revision is not None:
        if rev is not None and rev != revision:
            raise UnknownModel(f"--model {shown(spec)}: two revisions given ({rev!r} and {revision!r})")
        rev = revision
    label = repo_id + (f"@{rev}" if rev else "")
    try:
        cached = find_in_hf_cache(repo_id, rev)
    except (OSError, ValueError):
        cached = None
    if cached is None:
        try:
            cached = hub.fetch_config(repo_id, rev)
        except hub.HubError as e:
            raise UnknownModel(str(e)) from None
    return _with_generation_cache(_arch(load_config(cached), label, str(cached)), cached), None


def generation_use_cache(config_path: Path, config: dict, whole_checkpoint: bool) -> bool | None:
    """Whether transformers' `generate` keeps a KV cache for the checkpoint whose config.json is `config_path`,
    as `from_pretrained` resolves its generation config (tests/ground_truth/test_generation_without_cache.py): a
    `generation_config.json` beside it decides (`use_cache` false, else true); without one, config.json's
    `use_cache`. None where that cannot be told: no readable generation config beside a config.json that may have
    come alone (the Hub fetches config.json only; the HF cache keeps what was downloaded)."""
    gen = Path(config_path).with_name("generation_config.json")
    try:
        text = (
            read_user_file(gen, MAX_CONFIG_BYTES, "a generation_config.json", "a JSON file")
            if gen.is_file()
            else None
        )
        said = json.loads(text) if text is not None else None
    except (OSError, ValueError, RecursionError):  # UnreadableFile and JSONDecodeError are ValueErrors
        return None
    if isinstance(said, dict):
        return said.get("use_cache") is not False
    if said is not None or not whole_checkpoint:
        return None
    return config.get("use_cache") is not False


def _with_generation_cache(arch: Arch, config_path: Path, whole_checkpoint: bool = False) -> Arch:
    """`arch` with `extra["generation_use_cache"]` (`generation_use_cache`) where it can be told."""
    said = generation_use_cache(config_path, (arch.extra or {}).get("config") or {}, whole_checkpoint)
    if said is None:
        return arch
    return dataclasses.replace(arch, extra={**(arch.extra or {}), "generation_use_cache": said})


def _unknown(spec: str, sizes_text: str) -> UnknownModel:
    near = closest_names(spec)
    hint = f"closest: {', '.join(near)}; " if near else ""
    return UnknownModel(
        f"unknown model {shown(spec)} (not a size, catalog name, config.json path or ORG/NAME Hub id); {hint}"
        f"sizes: {sizes_text}; or point at a config.json: --model ./path/to/config.json (or its folder)"
    )
