"""Result rows (results/SCHEMA.md): stable keys, atomic appends, tolerant loading, environment info."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from estimator.config import NEWEST_TRL

SCHEMA = 1
VERSION_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes")
# Versions that must match for a finished row to count as done when a sweep is rerun.
KEY_VERSIONS = VERSION_PACKAGES
# Every field of a row's `versions` that describes the environment (environment_info adds CUDA and the driver).
VERSION_FIELDS = ("python", *VERSION_PACKAGES, "cuda", "driver")
REPO = Path(__file__).resolve().parent.parent


def canonical_json(obj) -> str:
    """JSON with sorted keys and no whitespace: the same value always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable)


def _jsonable(obj):
    """Fallback encoder: tuples/sets as lists, everything else as str."""
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def make_key(config: dict, variant: dict) -> str:
    """Stable sha256 (first 16 hex chars) of the canonical JSON of config + variant."""
    if config.get("trl_version") == NEWEST_TRL:  # rows made before trl_version existed keep their keys
        config = {k: v for k, v in config.items() if k != "trl_version"}
    text = canonical_json({"config": config, "variant": variant})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Append one row atomically: rewrite the whole file to a temp file, fsync, os.replace (under a lock)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row, sort_keys=True, default=_jsonable) + "\n"
    with open(_lock_path(path), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = path.read_bytes() if path.exists() else b""
            if old and not old.endswith(b"\n"):
                old = old[: old.rfind(b"\n") + 1]  # drop a partial trailing line left by someone else
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(old)
                    f.write(line.encode())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            _fsync_dir(path.parent)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fsync_dir(directory: Path) -> None:
    """fsync a directory so the rename is durable (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_jsonl(path: Path) -> list[dict]:
    """Rows of one .jsonl file; blank, partial or corrupt lines are skipped."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    return rows


def load_rows(path_or_dir: str | os.PathLike | Iterable[str | os.PathLike]) -> list[dict]:
    """All rows of a .jsonl file, of every .jsonl in a directory (sorted), or of several such paths."""
    if not isinstance(path_or_dir, (str, os.PathLike)):
        return [row for p in path_or_dir for row in load_rows(p)]
    p = Path(path_or_dir)
    if p.is_dir():
        return [row for f in sorted(p.glob("*.jsonl")) for row in _read_jsonl(f)]
    if p.exists():
        return _read_jsonl(p)
    return []


def versions_match(row_versions: dict | None, versions: dict | None) -> bool:
    """True when the package versions that matter (KEY_VERSIONS) agree; None for `versions` accepts any."""
    if versions is None:
        return True
    row_versions = row_versions or {}
    return all(row_versions.get(k) == versions.get(k) for k in KEY_VERSIONS)


def package_versions() -> dict[str, str | None]:
    """Installed versions of python and the packages that shape a run (None when absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        out["grpo_vram"] = metadata.version("grpo-vram")
    except metadata.PackageNotFoundError:
        out["grpo_vram"] = None
    return out


def _driver_version() -> str | None:
    """NVIDIA driver version from NVML, or None where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def device_info(device: str) -> dict:
    """{"type", "name", "total_bytes"} of the device a run uses (torch imported lazily)."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return {"type": "cuda", "name": props.name, "total_bytes": int(props.total_memory)}
        return {"type": "cuda", "name": None, "total_bytes": None}
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "total_bytes": total}


def environment_info(device: str) -> dict:
    """{"versions": {... "cuda", "driver"}, "device": {...}} for the row of a run on `device`."""
    versions = package_versions()
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
    except ImportError:
        pass
    versions["cuda"] = cuda
    versions["driver"] = _driver_version()
    return {"versions": versions, "device": device_info(device)}


def git_commit(repo: str | os.PathLike = REPO) -> str | None:
    """HEAD commit of this repo (with a `-dirty` suffix when the tree has changes), or None."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def base_row(
    *,
    key: str,
    source: str,
    sweep: str,
    config: dict,
    variant: dict,
    status: str = "ok",
    error: str | None = None,
) -> dict:
    """A row with the identifying fields filled and measurement fields empty (SCHEMA.md order)."""
    return {
        "schema": SCHEMA,
        "key": key,
        "source": source,
        "status": status,
        "error": error,
        "sweep": sweep,
        "variant": variant,
        "config": config,
        "model": None,
        "observed": None,
        "prediction": None,
        "step_seconds": [],
        "versions": None,
        "device": None,
        "git_commit": None,
    }
