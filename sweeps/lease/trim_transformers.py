"""Trim a transformers wheel to the model folders a lease runs, so the wheels and the tree travel in one 64 MiB call
(docs/gpu-lease.md): 10.9 of the 13.5 MB of transformers 5.24's wheel are its ~550 model folders.

    python -m sweeps.lease.trim_transformers WHEEL [MODEL_TYPE...]

Kept: the folders of the given model types (default: those of the estimator's catalog, which the lineups and the
tiny test models use), `auto`,
and every folder those, the library outside `models/`, TRL and PEFT import (`from ..X` / `transformers.models.X`),
to a fixed point. The wheel is rewritten in place; its RECORD keeps the removed files' lines, which pip does not
check on install.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

PREFIX = "transformers/models/"
IMPORTS = re.compile(
    r"(?:from \.\.(\w+)[ .]|transformers\.models\.(\w+)|from \.models\.(\w+)|from \.\.models\.(\w+))"
)
# what TRL 1.16 and PEFT 0.21 import from transformers.models or by a model class's name (grep of their sources:
# PEFT's constants import BloomPreTrainedModel)
LIBRARIES = ("auto", "gpt2", "mixtral", "bart", "bloom")


CATALOG = Path(__file__).resolve().parents[2] / "estimator" / "catalog"


def catalog_types() -> list[str]:
    """The model types of the estimator's catalog (and of their text configs)."""
    types = set()
    for path in sorted(CATALOG.glob("*.json")):
        data = json.loads(path.read_text())
        config = data.get("config", data)
        types.add(config.get("model_type"))
        types.add((config.get("text_config") or {}).get("model_type"))
    return sorted(t for t in types if t)


def folder(name: str) -> str | None:
    """The model folder a wheel entry belongs to, or None outside `transformers/models/<folder>/`."""
    if not name.startswith(PREFIX):
        return None
    rest = name[len(PREFIX) :]
    return rest.split("/", 1)[0] if "/" in rest else None


def imported(text: str) -> set[str]:
    """Model folders a source file imports."""
    return {next(g for g in m.groups() if g) for m in IMPORTS.finditer(text)}


def kept_folders(zf: zipfile.ZipFile, roots: set[str]) -> set[str]:
    """`roots`, `LIBRARIES` and what the library outside models/ imports, closed under the kept folders' imports."""
    names = [n for n in zf.namelist() if n.endswith(".py")]
    keep = set(roots) | set(LIBRARIES)
    for n in names:
        if folder(n) is None:
            keep |= imported(zf.read(n).decode("utf-8", "replace"))
    while True:
        more = set()
        for n in names:
            if folder(n) in keep:
                more |= imported(zf.read(n).decode("utf-8", "replace"))
        if more <= keep:
            return keep
        keep |= more


def trim(wheel: Path, model_types: list[str]) -> tuple[int, int]:
    """Rewrite `wheel` without the model folders not kept; (bytes before, bytes after)."""
    before = wheel.stat().st_size
    # gemma3_text lives in gemma3, qwen3_moe in its own folder: a type maps to its folder by the longest prefix
    with zipfile.ZipFile(wheel) as zf:
        folders = {folder(n) for n in zf.namelist()} - {None}
        roots = {
            t if t in folders else max((f for f in folders if t.startswith(f)), key=len, default=t)
            for t in model_types
        }
        keep = kept_folders(zf, roots)
        tmp = wheel.with_name(wheel.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in zf.infolist():
                f = folder(info.filename)
                if f is None or f in keep:
                    out.writestr(info, zf.read(info.filename))
    tmp.replace(wheel)
    return before, wheel.stat().st_size


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or not Path(args[0]).is_file():
        print(
            "trim_transformers: usage: WHEEL [MODEL_TYPE...] (WHEEL a transformers wheel file)",
            file=sys.stderr,
        )
        return 2
    before, after = trim(Path(args[0]), args[1:] or catalog_types())
    print(f"trim_transformers: {Path(args[0]).name} {before / 1e6:.1f} -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
