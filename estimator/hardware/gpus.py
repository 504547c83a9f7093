"""The GPUs `--gpu` and "fits on:" know: marketed memory and the memory the driver reports.

The cards live in `estimator/data/gpus.json` (one object per card, fields as in `GPU` below); docs/GPUS.md is
generated from them (`python -m estimator.hardware.gpus > docs/GPUS.md`, checked by tests/estimator/test_gpu_catalog.py).

`driver_mib` is `nvidia-smi --query-gpu=name,memory.total` (MiB), the whole framebuffer a process can see
in nvidia-smi; we compare the estimated nvidia-smi peak of the process against it. Each entry names where
its driver figure comes from: "stored" = the line `NAME, N MiB` as printed by nvidia-smi, found verbatim in
several public repositories (search tool's GitHub index, ids given); "spec" = the vendor's marketed size only.
For AMD cards the driver figure is rocm-smi's `VRAM Total Memory (B)`, in MiB.

`torch_mib` is what torch can really use: `torch.cuda.get_device_properties(i).total_memory` (cudaMemGetInfo's
total), below the nvidia-smi total by the framebuffer the driver reserves (0.35-0.85 GiB on datacenter cards,
AgileRL's published nvidia-smi vs torch gap). Each figure is the smallest `_CudaDeviceProperties(name=..., total_memory=N MB)`
line found printed in public repositories (torch prints MiB; search tool's index, ids given), or, where none
was found, the driver total minus `UNMEASURED_GAP_MIB`, the largest gap the notes give (AgileRL's 0.85 GiB on
an A100-80GB), so an unmeasured card errs small. `sm` is the compute capability (major, minor), which selects
the cuBLAS/cuBLASLt workspace sizes (estimator/terms/overhead.py); for AMD it is torch's (major, minor) of the
gfx architecture (gfx942 -> (9, 4)), not a CUDA compute capability.

`listed` cards are the short "fits on:" list every estimate shows (`GPUS`); every card, listed or not, is
found by `--gpu` (`ALL_GPUS`, `lookup`, `resolve`).

Sizes: `--gpu 24GB` (also `24 GB`, `24gib`, `80G`) is a generic card of that size. The rule: a GPU's marketed
"GB" are read as GiB, so the driver total is GB x 1024 MiB (24 GB -> 24576 MiB, what an RTX 3090 reports), and
torch can use that less `UNMEASURED_GAP_MIB`, as for any unmeasured card. Real cards report up to ~7% less than
GB x 1024 (L4: 23034 of 24576 MiB; B200: 183359 of 196608), so a generic card can err large by that much: name
the card when it is in the catalog. `for_memory_gib(48)` is the same card for `--gpu-memory-gib 48`.

Ambiguous names (`A100` is 40 GB or 80 GB) check the smaller card; `resolve` says so in a one-line note.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

from estimator.units import GIB, MIB

# 0.85 GiB: AgileRL's A100-80GB nvidia-smi vs torch gap (published; see estimator/terms/SOURCES.md)
UNMEASURED_GAP_MIB = 870

DATA = Path(__file__).resolve().parents[1] / "data" / "gpus.json"

GENERIC_MIN_GB = 1  # below this the unmeasured gap would leave nothing
GENERIC_MAX_GB = 4096  # no GPU has more
_SHOWN = 40  # characters of an unknown --gpu value echoed back
_MATCHED = 64  # characters of it compared with the known names


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One GPU model: its marketed size, the total its driver reports and the total torch can use."""

    name: str
    marketed_gb: float  # as sold ("80 GB"); vendors mean GB or GiB loosely
    driver_mib: int  # nvidia-smi memory.total (AMD: rocm-smi VRAM total)
    aliases: tuple[str, ...] = ()
    source: str = ""
    sm: tuple[int, int] = (0, 0)  # compute capability; (0, 0): unknown (a generic card)
    torch_mib: int | None = None  # torch total_memory (MiB); None: driver_mib - UNMEASURED_GAP_MIB
    torch_source: str = ""
    vendor: str = "nvidia"  # "nvidia" or "amd" ("generic" for a size)
    listed: bool = False  # in the default "fits on:" list (GPUS)
    # non-empty where the non-tensor items (context, workspaces, allocator) are CUDA's figures used as an
    # estimate for another stack (ROCm): the report should print it, the error is wider than the band
    overheads_note: str = ""

    @property
    def memory_bytes(self) -> int:
        """Total device memory as the driver reports it (bytes)."""
        return self.driver_mib * MIB

    @property
    def usable_bytes(self) -> int:
        """Memory torch can allocate in (its `total_memory`): the capacity a fit verdict must compare with."""
        return self.usable_mib * MIB

    @property
    def usable_mib(self) -> int:
        return self.torch_mib if self.torch_mib is not None else self.driver_mib - UNMEASURED_GAP_MIB

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def overheads_estimated(self) -> bool:
        """True where the non-tensor items are CUDA's figures standing in for another stack's (AMD ROCm)."""
        return bool(self.overheads_note)


@dataclass(frozen=True)
class Ambiguous:
    """A name several cards answer to (A100: 40 GB or 80 GB); `pick` is the smallest, the one checked."""

    name: str
    keys: tuple[str, ...]
    cards: tuple[GPU, ...]
    pick: GPU
    say: tuple[tuple[str, str], ...]  # (name to type, which card it is)

    @property
    def note(self) -> str:
        """The one-line note, e.g. 'A100 is 40 GB or 80 GB: checked the 40 GB card (A100 40GB); say A100-80 for the other'."""
        sizes = [f"{s:g} GB" for s in sorted({c.marketed_gb for c in self.cards})]
        sized = " or ".join([", ".join(sizes[:-1]), sizes[-1]] if len(sizes) > 1 else sizes)
        hints = ", ".join(f"{alias} for {what}" for alias, what in self.say)
        return f"{self.name} is {sized}: checked the {self.pick.marketed_gb:g} GB card ({self.pick.name}); say {hints}"


class UnknownGPU(ValueError):
    """A --gpu value that is neither a known card nor a size; its message is one line."""


def _key(name: str) -> str:
    """Case-, space- and underscore-insensitive lookup key, vendor words dropped."""
    k = name.strip().lower().replace(" ", "-").replace("_", "-")
    for word in ("nvidia-", "geforce-", "tesla-", "amd-"):
        k = k.replace(word, "")
    return re.sub(r"-+", "-", k)


def _load(path: Path = DATA) -> tuple[tuple[GPU, ...], tuple[Ambiguous, ...]]:
    """The cards and the ambiguous names in gpus.json; ValueError for a malformed file."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    names = {f.name for f in fields(GPU)}
    cards = []
    for d in raw["gpus"]:
        extra = set(d) - names
        if extra:
            raise ValueError(f"{path.name}: {d.get('name')!r} has unknown fields {sorted(extra)}")
        cards.append(GPU(**{**d, "aliases": tuple(d.get("aliases", ())), "sm": tuple(d.get("sm", (0, 0)))}))
    by_name = {c.name: c for c in cards}
    if len(by_name) != len(cards):
        raise ValueError(f"{path.name}: duplicate card names")
    amb = tuple(
        Ambiguous(
            name=a["name"],
            keys=tuple(a["keys"]),
            cards=tuple(by_name[n] for n in a["cards"]),
            pick=by_name[a["pick"]],
            say=tuple((alias, what) for alias, what in a["say"]),
        )
        for a in raw.get("ambiguous", ())
    )
    return tuple(cards), amb


ALL_GPUS, AMBIGUOUS = _load()
# the short "fits on:" list every estimate shows, in the file's order
GPUS: tuple[GPU, ...] = tuple(g for g in ALL_GPUS if g.listed)


def _index() -> dict[str, GPU | Ambiguous]:
    """Every lookup key (with and without dashes) -> its card or ambiguous name; ValueError on a clash."""
    idx: dict[str, GPU | Ambiguous] = {}

    def put(k: str, v: GPU | Ambiguous) -> None:
        for key in (k, k.replace("-", "")):
            if idx.setdefault(key, v) is not v:
                raise ValueError(f"gpus.json: {key!r} names both {idx[key].name!r} and {v.name!r}")

    for g in ALL_GPUS:
        for k in (g.name, *g.aliases):
            put(_key(k), g)
    for a in AMBIGUOUS:
        for k in (a.name, *a.keys):
            put(_key(k), a)
    return idx


_INDEX = _index()

_SIZE = re.compile(r"(\d{1,7}(?:\.\d{1,4})?)\s*(gb|gib|g)", re.IGNORECASE)


def _generic(gb: float, label: str, source: str) -> GPU:
    """A card of `gb` GiB as the driver reports it; torch can use that less UNMEASURED_GAP_MIB."""
    mib = round(gb * 1024)
    return GPU(
        name=f"{gb:g} {label} (generic)",
        marketed_gb=gb,
        driver_mib=mib,
        source=source,
        torch_mib=None,
        torch_source=f"derived: driver total - {UNMEASURED_GAP_MIB} MiB (UNMEASURED_GAP_MIB), no card measured",
        vendor="generic",
    )


def _size_note(gpu: GPU) -> str:
    return (
        f"{gpu.name}: read as {gpu.driver_mib} MiB as the driver reports it, {gpu.usable_mib} MiB torch can use "
        f"(real cards report up to ~7% less; name the card for its measured figures)"
    )


def _check_size(gb: float, what: str, unit: str = "GB") -> None:
    if not (math.isfinite(gb) and GENERIC_MIN_GB <= gb <= GENERIC_MAX_GB):
        raise UnknownGPU(f"{what}: a GPU size is from {GENERIC_MIN_GB} to {GENERIC_MAX_GB} {unit}")


def for_memory_gib(gib: float) -> GPU:
    """A generic card whose driver reports `gib` GiB (`--gpu-memory-gib 48`), torch-usable by the same rule
    as an unmeasured card; UnknownGPU (one line) outside GENERIC_MIN_GB..GENERIC_MAX_GB."""
    try:
        gib = float(gib)
    except (TypeError, ValueError):
        raise UnknownGPU(f"--gpu-memory-gib {_shown(gib)}: not a number") from None
    _check_size(gib, f"--gpu-memory-gib {gib:g}", "GiB")
    return _generic(gib, "GiB", f"given: --gpu-memory-gib {gib:g} = {round(gib * 1024)} MiB")


def _shown(value: object) -> str:
    """The value as one escaped, truncated line (repr escapes control characters and line breaks)."""
    text = value if isinstance(value, str) else str(value)
    cut = text[:_SHOWN]
    return repr(cut) + ("…" if len(text) > _SHOWN else "")


def closest(text: str, n: int = 5) -> list[str]:
    """Up to `n` card names nearest `text` (difflib over names and aliases; an ambiguous name counts for each
    of its cards), listed cards first among equals."""
    key = _key(text[:_MATCHED])
    if not key:
        return []
    order = {g.name: i for i, g in enumerate(ALL_GPUS)}
    best: dict[str, float] = {}
    for k, v in _INDEX.items():
        score = difflib.SequenceMatcher(None, key, k).ratio()
        if len(key) >= 3 and k.startswith(key):  # "4070-ti" -> "4070-ti-super"
            score = max(score, 0.9)
        if score < 0.5:
            continue
        for g in v.cards if isinstance(v, Ambiguous) else (v,):
            best[g.name] = max(best.get(g.name, 0.0), score)
    listed = {g.name for g in GPUS}
    ranked = sorted(best, key=lambda name: (-best[name], name not in listed, order[name]))
    return ranked[:n]


def resolve(text: str) -> tuple[GPU, str | None]:
    """The card `text` names, and a one-line note when it is not exactly one card: an ambiguous name (the
    smaller card is checked) or a size (`24GB`: a generic card). UnknownGPU (one line) for anything else."""
    if not isinstance(text, str):
        raise UnknownGPU(f"--gpu takes a name or a size such as 24GB, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise UnknownGPU("--gpu is empty: give a GPU name (H100, 4090, ...) or a size (--gpu 24GB)")
    if len(stripped) <= _MATCHED:
        hit = _INDEX.get(_key(stripped)) or _INDEX.get(_key(stripped).replace("-", ""))
        if isinstance(hit, GPU):
            return hit, None
        if isinstance(hit, Ambiguous):
            return hit.pick, hit.note
        size = _SIZE.fullmatch(stripped)
        if size:
            gb = float(size.group(1))
            _check_size(gb, f"--gpu {_shown(stripped)}")
            gpu = _generic(gb, "GB", f"size: --gpu {stripped} read as {gb:g} GiB = {round(gb * 1024)} MiB")
            return gpu, _size_note(gpu)
    near = closest(stripped)
    hint = f"closest: {', '.join(near)}; " if near else ""
    raise UnknownGPU(
        f"unknown --gpu {_shown(text)}; {hint}or give a size: --gpu 24GB (docs/GPUS.md lists the {len(ALL_GPUS)} known)"
    )


def lookup(name: str) -> GPU:
    """The GPU called `name` (case-insensitive, aliases allowed; an ambiguous name gives the smaller card, a
    size a generic card), else UnknownGPU."""
    return resolve(name)[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """docs/GPUS.md: every card, its figures and their sources, the ambiguous names and the size rule."""
    out = [
        "# GPUs `--gpu` knows",
        "",
        "<!-- generated from estimator/data/gpus.json by `python -m estimator.hardware.gpus > docs/GPUS.md`; "
        "tests/estimator/test_gpu_catalog.py checks this file equals that output -->",
        "",
        f"{len(ALL_GPUS)} cards; the {len(GPUS)} marked *listed* are the short `fits on:` list every estimate "
        "shows. `--gpu` takes a card's name or any alias (case, spaces, dashes and the words NVIDIA / GeForce / "
        "Tesla / AMD ignored).",
        "",
        "- **nvidia-smi MiB**: `memory.total` as the driver reports it (AMD: rocm-smi's VRAM total). "
        "*stored*: the line found verbatim in public repositories (ids of the search index).",
        f"- **torch MiB**: `torch.cuda.get_device_properties(i).total_memory`, what the fit verdicts compare with. "
        f"*printed*: the smallest `_CudaDeviceProperties(...)` line found; otherwise derived as the nvidia-smi "
        f"total - {UNMEASURED_GAP_MIB} MiB (marked *derived*).",
        "",
        "| card | aliases | vendor | GB | nvidia-smi MiB | torch MiB | sm | listed | nvidia-smi source | torch source |",
        "|---|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for g in sorted(ALL_GPUS, key=lambda g: (g.marketed_gb, g.driver_mib, g.name)):
        torch = f"{g.usable_mib}" if g.torch_mib is not None else f"{g.usable_mib} *derived*"
        row = [
            g.name,
            ", ".join(f"`{a}`" for a in g.aliases),
            g.vendor,
            f"{g.marketed_gb:g}",
            str(g.driver_mib),
            torch,
            f"{g.sm[0]}.{g.sm[1]}",
            "listed" if g.listed else "",
            g.source,
            g.torch_source,
        ]
        out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    out += ["", "## Ambiguous names", "", "The smaller card is checked, and the estimate says so:", ""]
    out += [f"- `--gpu {a.name}`: {a.note}" for a in AMBIGUOUS]
    notes = [g for g in ALL_GPUS if g.overheads_note]
    if notes:
        out += ["", "## Other vendors", ""]
        out += [f"- {g.name} ({g.vendor}): {g.overheads_note}" for g in notes]
    example = _generic(24, "GB", "")
    out += [
        "",
        "## Any other GPU: give its size",
        "",
        "`--gpu 24GB` (also `24 GB`, `24gib`, `80G`) checks a generic card of that size, and "
        "`--gpu-memory-gib 48` one of 48 GiB. The rule: a GPU's marketed GB are read as GiB, so the driver "
        f"total is GB x 1024 MiB (24 GB: {example.driver_mib} MiB, what an RTX 3090 reports), and torch can use "
        f"that less {UNMEASURED_GAP_MIB} MiB ({example.usable_mib} MiB), as for any unmeasured card. Real cards "
        "report up to ~7% less than GB x 1024 (L4: 23034 of 24576 MiB; B200: 183359 of 196608), so a generic "
        f"card can err large by that much: name the card when it is listed here. Sizes run from "
        f"{GENERIC_MIN_GB} to {GENERIC_MAX_GB} GB.",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
