"""What to change to make a run fit: single changes (changes.py) re-estimated and ranked, then the smallest set
that fits.

Every change is re-estimated at this configuration: only changes that save memory are listed (a change that adds
memory, e.g. ZeRO-3's gathers on a small model, is dropped), each with what it costs in throughput or quality.
With vLLM, a configuration fits only if vLLM's own start-up checks pass too.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from estimator.model.architecture import Arch
from estimator.plan.changes import CONFLICTS, Change, FitsFn, apply_keys, single_changes
from estimator.plan.solve import EstimateFn, PeakCache
from estimator.settings.config import RunConfig

# vLLM's own settings: where vLLM fails at start-up they are tried even when they save nothing alone
VLLM_START_KEYS = frozenset({"vllm_len", "vllm_share", "vllm_server_share"})
# settings more than one change sets (batch geometry, vLLM's length and share): the last one's value stands
SHARED_FLAG = (
    r"--(?:per-device-train-batch-size|gradient-accumulation-steps|steps-per-generation|vllm-max-model-length"
    r"|vllm-gpu-memory-utilization)(?= )"
)
MIN_SAVED_FRACTION = (
    0.001  # a change saving less than 0.1 % of the peak is not worth listing (or rounds to 0.00 GiB)
)


@dataclass
class Option:
    """A set of changes with its re-estimated nvidia-smi peak, what the card must hold and the bytes it saves."""

    changes: tuple[Change, ...]
    peak_device_bytes: int  # the estimated nvidia-smi peak
    saved_bytes: int  # on what the card must hold (`need_bytes`)
    fits: bool | None  # None when there is no budget
    need_bytes: int = 0  # what the card must hold (Estimate.need_bytes): what `fits` compares with the budget
    starts: bool | None = (
        None  # vLLM's own start-up checks pass (layout.start_failure); None when not checked
    )

    @property
    def label(self) -> str:
        """The changes' labels joined by ' + ', a setting that a later change sets again said only there (micro-
        batches then fewer generations: one --gradient-accumulation-steps, the last)."""
        labels, later = [], set()
        for change in reversed(self.changes):
            label, here = change.label, set(re.findall(SHARED_FLAG, change.label))
            for flag in here & later:
                label = re.sub(rf" ?{re.escape(flag)} \S+", "", label).strip()
            later |= here
            labels.append(label)
        return " + ".join(label for label in reversed(labels) if label)

    @property
    def config(self) -> RunConfig:
        return self.changes[-1].config

    @property
    def tradeoff(self) -> str:
        return "; ".join(c.tradeoff for c in self.changes if c.tradeoff)


@dataclass
class Advice:
    """Single changes ranked by bytes saved, and the smallest set of changes that fits (if one was found)."""

    baseline_bytes: int
    budget_bytes: int | None
    singles: list[Option] = field(default_factory=list)
    plan: Option | None = None
    baseline_starts: bool | None = None  # vLLM starts at the run as given; None when not checked
    # the GPUs beside the training ones (roles on their own) hold what they are given; None when not checked
    baseline_others_fit: bool | None = None

    @property
    def baseline_fails(self) -> bool:
        """The run as given does not fit the budget, its vLLM does not start, or a GPU of its own is over."""
        over = self.budget_bytes is not None and self.baseline_bytes > self.budget_bytes
        return over or self.baseline_starts is False or self.baseline_others_fit is False


def advise(
    cfg: RunConfig,
    arch: Arch,
    estimate_fn: EstimateFn,
    budget_bytes: int | None = None,
    max_set: int = 2,
    starts: Callable[[RunConfig, Arch], bool] | None = None,
    others_fit: Callable[[RunConfig, Arch], bool] | None = None,
) -> Advice:
    """Rank single changes by bytes saved; with a budget, find the smallest set that fits (exhaustive up to
    `max_set` changes, then greedy). With `starts` (layout.starts_on: vLLM's own start-up checks), a config fits
    only if vLLM also starts, and a change that makes a failing vLLM start is listed even if it saves no bytes
    (those that do come first); with `others_fit` (layout.others_fit_on), only if the GPUs of roles placed on
    their own hold them too."""
    peak = PeakCache(arch, estimate_fn)
    memo: dict[tuple[str, RunConfig], bool] = {}

    def check(name: str, fn: Callable[[RunConfig, Arch], bool] | None, c: RunConfig) -> bool | None:
        if fn is None:
            return None
        if (name, c) not in memo:
            memo[name, c] = fn(c, arch)
        return memo[name, c]

    def starts_(c: RunConfig) -> bool | None:
        return check("starts", starts, c)

    def fits_(c: RunConfig) -> bool:
        return (
            peak(c) <= budget_bytes
            and starts_(c) is not False
            and check("others", others_fit, c) is not False
        )

    fits: FitsFn | None = fits_ if budget_bytes is not None else None
    base = peak(cfg)
    base_starts = starts_(cfg)

    def option(changes: tuple[Change, ...]) -> Option:
        c = changes[-1].config
        p = peak(c)
        fit = fits(c) if fits is not None else None
        return Option(changes, peak.estimate(c).peak_device_bytes, base - p, fit, p, starts_(c))

    def helps(o: Option) -> bool:
        """Saves memory, or (where vLLM fails at start-up) makes it start or is one of vLLM's own settings,
        which may make it start beside another change, or (where a role's own GPU is over) makes it hold."""
        start_fix = o.starts is True or o.changes[0].key in VLLM_START_KEYS
        others_fix = others is False and check("others", others_fit, o.config) is True
        return o.saved_bytes >= floor or (base_starts is False and start_fix) or others_fix

    others = check("others", others_fit, cfg)
    tried = (option((ch,)) for ch in single_changes(cfg, fits))
    floor = max(1, int(MIN_SAVED_FRACTION * base))
    # where vLLM fails at start-up, the changes that let it start come first
    singles = sorted((o for o in tried if helps(o)), key=lambda o: (o.starts is False, -o.saved_bytes))
    advice = Advice(base, budget_bytes, singles, baseline_starts=base_starts, baseline_others_fit=others)
    if fits is None or fits(cfg):
        return advice
    keys = [o.changes[0].key for o in singles]
    for size in range(1, max_set + 1):
        found = []
        for combo in itertools.combinations(keys, size):
            if any(pair <= set(combo) for pair in CONFLICTS):
                continue
            changes = apply_keys(cfg, combo, fits)
            if changes is not None and fits(changes[-1].config):
                o = option(changes)
                if o.saved_bytes > 0 or base_starts is False or others is False:
                    found.append(o)
        if found:
            advice.plan = min(found, key=lambda o: (sum(c.cost for c in o.changes), o.peak_device_bytes))
            return advice
    advice.plan = _greedy(cfg, fits, option, base_starts)
    return advice


def _greedy(
    cfg: RunConfig,
    fits: FitsFn,
    option: Callable[[tuple[Change, ...]], Option],
    baseline_starts: bool | None = None,
) -> Option | None:
    """Add the change that does most until the run fits or nothing applies; the last set tried. Most: makes vLLM
    start (where it is checked and fails at `cfg`), then saves the most bytes."""
    chosen: tuple[str, ...] = ()
    best: Option | None = None

    def rank(o: Option) -> tuple[bool, int]:
        return o.starts is not False, o.saved_bytes

    while True:
        tried = []
        for ch in single_changes(best.config if best else cfg, fits):
            keys = chosen + (ch.key,)
            if ch.key in chosen or any(pair <= set(keys) for pair in CONFLICTS):
                continue
            changes = apply_keys(cfg, keys, fits)
            if changes is not None and rank(o := option(changes)) > (baseline_starts is not False, 0):
                tried.append(o)
        if not tried:
            return best
        pick = max(tried, key=rank)
        if best is not None and rank(pick) <= rank(best):
            return best
        best, chosen = pick, tuple(c.key for c in pick.changes)
        if best.fits:
            return best
