"""Which upstream releases the numbers model, and which ones are installed here.

Every term follows an upstream code path at a pinned release; the releases are part of the number. TRL's GRPO
semantics are keyed by release in `estimator/settings/trl_versions.py`. transformers' are keyed here (`TRANSFORMERS`):
each row holds, as data, what its releases change about memory, and cites the upstream change. PEFT, torch,
bitsandbytes and vLLM have no release-dependent term: `CHECKED` names the releases their terms were read from
and held to (op-by-op tests, traces, measured-gpu rows).

Installed versions come from package metadata (`importlib.metadata`), so nothing heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from estimator.settings.trl_versions import NEWEST as TRL_NEWEST
from estimator.settings.trl_versions import OLDEST as TRL_OLDEST
from estimator.settings.version_text import Version, fmt, parse_version, span


@dataclass(frozen=True)
class TransformersProfile:
    """What transformers releases first..last (minor versions, inclusive) do that sets GRPO's memory."""

    first: Version
    last: Version
    # DynamicLayer creates its value cache in the values' own dtype (True) or the keys' (False). Under bf16
    # autocast with an fp32 load, rotary promotes K to fp32 while v_proj returns bf16: False makes the first
    # `torch.cat` promote V to fp32 too.
    cache_values_own_dtype: bool
    changes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return span(self.first, self.last)


TRANSFORMERS: tuple[TransformersProfile, ...] = (
    TransformersProfile(
        first=(5, 23),
        last=(5, 23),
        cache_values_own_dtype=False,
        changes=(
            "DynamicLayer.lazy_initialization: `self.values = torch.tensor([], dtype=self.dtype)` with the keys' "
            "dtype (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/cache_utils.py"
            "#L113-L117)",
        ),
    ),
    TransformersProfile(
        first=(5, 24),
        last=(5, 24),
        cache_values_own_dtype=True,
        changes=(
            "DynamicLayer.lazy_initialization creates the value cache with `value_states.dtype` "
            "(https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/cache_utils.py#L113-L117): "
            "V stays in v_proj's dtype (bf16 under autocast) instead of K's",
            "`past_key_values` renamed `cache` in every decoder (deprecate_kwarg until 5.40): no memory change",
            "rotary embedding forward no longer under @torch.no_grad(): its inputs never require grad, so "
            "no memory change",
        ),
    ),
)
MODELLED_TRANSFORMERS: tuple[str, ...] = tuple(
    f"{row.first[0]}.{m}" for row in TRANSFORMERS for m in range(row.first[1], row.last[1] + 1)
)
NEWEST_TRANSFORMERS = MODELLED_TRANSFORMERS[-1]
# Records (result rows) made before `transformers_version` was a setting were all made under 5.23.
RECORDS_TRANSFORMERS = "5.23"


def transformers_profile(version: str | Version) -> TransformersProfile:
    """The row modelling one transformers release; ValueError naming the modelled ones for any other."""
    v = parse_version(version) if isinstance(version, str) else version
    for row in TRANSFORMERS:
        if row.first <= v <= row.last:
            return row
    raise ValueError(f"transformers {fmt(v)} is not modelled; accepted: {', '.join(MODELLED_TRANSFORMERS)}")


@dataclass(frozen=True)
class Checked:
    """An upstream package the terms were read from, and the releases they were checked against."""

    package: str  # its distribution name
    label: str  # how the output names it
    first: Version
    last: Version
    what: str  # what the numbers take from it

    @property
    def range(self) -> str:
        return span(self.first, self.last)


CHECKED: tuple[Checked, ...] = (
    Checked(
        "trl",
        "TRL",
        TRL_OLDEST,
        TRL_NEWEST,
        "GRPOTrainer's phases, defaults and log-prob head (trl_versions.py)",
    ),
    Checked(
        "transformers",
        "transformers",
        TRANSFORMERS[0].first,
        TRANSFORMERS[-1].last,
        "decoder layers' saved tensors, attention kernels, the KV cache",
    ),
    Checked("peft", "PEFT", (0, 21), (0, 21), "LoRA layers' forward and backward"),
    Checked("torch", "torch", (2, 11), (2, 15), "autocast, autograd's saved tensors, the caching allocator"),
    Checked("bitsandbytes", "bitsandbytes", (0, 50), (0, 50), "4-bit layers and 8-bit optimizers"),
    Checked("vllm", "vLLM", (0, 22), (0, 31), "vLLM's start-up accounting and KV pool (terms/vllm.py)"),
)


def installed(package: str) -> str | None:
    """The installed distribution's version string from its metadata (nothing imported), None if absent."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def default_transformers() -> str:
    """The installed transformers when it is modelled, else the newest modelled release."""
    text = installed("transformers")
    if text is not None:
        try:
            v = fmt(parse_version(text))
        except ValueError:
            return NEWEST_TRANSFORMERS
        if v in MODELLED_TRANSFORMERS:
            return v
    return NEWEST_TRANSFORMERS


def modelled_beside_trl(transformers: str, vllm: bool = False) -> str:
    """`transformers 5.24, PEFT 0.21, torch 2.11-2.15, bitsandbytes 0.50[, vLLM 0.22-0.31]`: what an estimate models
    beside its TRL release."""
    parts = [f"transformers {transformers}"]
    parts += [
        f"{c.label} {c.range}"
        for c in CHECKED
        if c.package not in ("trl", "transformers") and (c.package != "vllm" or vllm)
    ]
    return ", ".join(parts)


def installed_notes(trl: str, transformers: str, vllm: bool = False) -> list[str]:
    """One line per installed package whose release differs from what this estimate models."""
    chosen = {"trl": trl, "transformers": transformers}
    out = []
    for c in CHECKED:
        if c.package == "vllm" and not vllm:
            continue
        text = installed(c.package)
        if text is None:
            continue
        try:
            v = parse_version(text)
        except ValueError:
            continue
        if c.package in chosen:
            want = parse_version(chosen[c.package])
            if v == want:
                continue
            if c.first <= v <= c.last:
                out.append(
                    f"{c.label} {text} is installed; this estimate models {fmt(want)}, as the flags or files set"
                )
                continue
        elif c.first <= v <= c.last:
            continue
        side = "newer" if v > c.last else "older"
        out.append(
            f"{c.label} {text} is installed, {side} than the releases modelled ({c.range}): its changes to "
            f"{c.what} are not in these numbers, which may err either way (`make upstream-check` measures it)"
        )
    return out


def describe() -> str:
    """The modelled range of every upstream package, for `--version`."""
    return "; ".join(f"{c.label} {c.range}" for c in CHECKED)
