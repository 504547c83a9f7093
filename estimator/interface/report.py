"""Render an Estimate (plus fit checks, advice and solve results) as a human table or a JSON-ready dict."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass

from estimator.hardware.gpus import GPU
from estimator.plan.advice import Advice, Option
from estimator.plan.layout import Layout
from estimator.plan.solve import Solution
from estimator.settings.config import RunConfig
from estimator.step.estimate import SOURCE, Estimate
from estimator.terms.allocator_reserve import DEEPSPEED_NOTE_PREFIX
from estimator.terms.phase_names import PHASE_HELP, PHASES
from estimator.terms.sharding import deepspeed_dtype_config
from estimator.terms.vllm import VERSION as VLLM_VERSION
from estimator.text import printable
from estimator.units import gib

LONG = 2000  # a note or fix escaped whole (`printable` cuts only past this)
FIT_BASIS = (
    "what the card must hold (allocated + the smallest allocator reserve the step passes with, the allocator "
    "freeing its cache and retrying before an OOM, + CUDA context, workspaces, NCCL) against the memory torch "
    "can use on the GPU (its total_memory, below the nvidia-smi total)"
)


@dataclass(frozen=True)
class Fit:
    """Whether the step fits one GPU, and by how much (bytes; negative = missing): what the card must hold
    (`Estimate.need_bytes`) against what torch can use on it (`GPU.usable_bytes`), see FIT_BASIS."""

    gpu: GPU
    free_bytes: int
    blocked: str = ""  # what fails whatever the bytes say: vLLM's start-up, a GPU of the layout (layout.py)

    @property
    def fits(self) -> bool:
        return self.free_bytes >= 0 and not self.blocked


def check_fit(est: Estimate, gpu: GPU) -> Fit:
    """Free (or missing) memory on `gpu`: what torch can use on it minus what the step must hold (FIT_BASIS),
    with the estimated tensor peak raised by the validated error band of this config's regime (estimator/step/band.py:
    fits are decided on the band's safe side). vLLM's reservation is a fixed share, not an estimate: not raised."""
    return Fit(gpu, gpu.usable_bytes - est.fit_bytes_on(gpu.sm, gpu.driver_mib * 2**20))


def _g(n: int | float) -> str:
    return f"{gib(n):.2f}"


def _count(n: int) -> str:
    """7615616512 -> '7.62 B', 5046272 -> '5.05 M'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


def table(est: Estimate) -> str:
    """Rows = components, columns = phases (GiB, 2 decimals), the peak phase marked with '*', a totals row."""
    peak = est.peak_phase
    heads = [p + ("*" if p == peak else "") for p in PHASES]
    width = max(12, *(len(c) for c in est.components), len("total (estimated)"))
    lines = [f"{'GiB':<{width}}" + "".join(f"{h:>11}" for h in heads)]
    for comp in est.components:
        cells = []
        for p in PHASES:
            v = est.phases.get(p, {}).get(comp)
            cells.append(f"{_g(v):>11}" if v else f"{'-':>11}")
        lines.append(f"{comp:<{width}}" + "".join(cells))
    totals = est.phase_totals
    tot = "".join(f"{_g(totals[p]):>11}" if p in totals else f"{'not run':>11}" for p in PHASES)
    lines.append(f"{'total (estimated)':<{width}}" + tot)
    return "\n".join(lines)


def settings_line(est: Estimate) -> str:
    """The settings that move memory most, in TRL's words."""
    c = est.config
    model = "QLoRA" if c.load_in_4bit else (f"LoRA r={c.lora_r}" if c.use_peft else "full fine-tune")
    parts = [
        f"dtype {c.dtype}" + (" + bf16 autocast" if c.bf16 else ""),
        model,
        f"gens {c.num_generations}",
        f"bs {c.per_device_train_batch_size}",
        f"GA {c.gradient_accumulation_steps}",
        f"generation batch {c.generation_sequences}/device",
        f"prompt {c.max_prompt_length} + completion {c.max_completion_length} tokens",
        f"grad ckpt {'on' if c.gradient_checkpointing else 'off'}",
        c.optim,
    ]
    if c.beta:
        parts.append(f"beta {c.beta}")
    if c.use_vllm:
        parts.append(vllm_words(c))
    if c.num_gpus > 1:
        sharding = {"none": "DDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP"}.get(
            c.sharding, c.sharding
        )
        parts.append(f"{c.num_gpus} {'processes' if c.device == 'cpu' else 'GPUs'} {sharding}")
    return "settings: " + ", ".join(parts)


def summary_lines(est: Estimate) -> list[str]:
    """The layers from tensor bytes to what the card holds, each with where its number came from: peak allocated,
    the allocator's reserve beyond it and the workspaces allocated through it (= peak reserved), then the items
    outside the allocator (= the nvidia-smi peak), then what the card must hold with release-and-retry. A source
    with a basis (a traced stream, an upstream file) is cited as `[n]` and listed under `sources:`, so every row
    stays within WIDTH columns."""
    width = 47
    refs: list[str] = []

    def cite(source: str, basis: str) -> str:
        if not basis:
            return source
        refs.append(basis)
        return f"{source} [{len(refs)}]"

    def row(label: str, v: int, source: str = SOURCE) -> str:
        return f"{label:<{width}}{_g(v):>8} GiB  {source}"

    settings = "" if est.allocator_variant == "default" else f", {est.allocator_variant}"
    out = [
        row("peak allocated (torch max_memory_allocated)", est.peak_allocated_bytes),
        row(
            f"+ allocator overhead (fragmentation{settings})",
            est.allocator_overhead_bytes,
            cite(est.reserve_source, est.reserve_basis),
        ),
    ]
    out += [
        row(f"+ {i.name} (in reserved)", i.bytes, cite(SOURCE, i.source))
        for i in est.non_tensor
        if i.in_reserved
    ]
    out.append(row("= peak reserved (torch max_memory_reserved)", est.peak_reserved_bytes))
    outside = [i for i in est.non_tensor if not i.in_reserved]
    out += [row(f"+ {i.name}", i.bytes, cite(SOURCE, i.source)) for i in outside]
    if not est.non_tensor and est.cuda_context_bytes:
        out.append(row("+ CUDA context", est.cuda_context_bytes))
    out.append(row('= "nvidia-smi" peak', est.peak_device_bytes))
    if est.config.device == "cuda" and est.need_extra_bytes is not None:
        out.append(row("card must hold (allocator frees cache, retries)", est.need_bytes, est.reserve_source))
        if est.need_margin_bytes >= SHOWN_MIN_BYTES:
            out.append(row("  of which reserve margin (safe side)", est.need_margin_bytes, "fitted"))
    if est.config.device == "cuda" and est.band_bytes:
        band_source = cite(
            "traced", "the validation rows' error band of this regime (estimator/step/band.py)"
        )
        out.append(row("+ validated error band (safe side)", est.band_bytes, band_source))
        out.append(row("= what the fit verdicts compare with each GPU", est.fit_bytes))
    out.append(f"peak phase: {est.peak_phase} ({PHASE_HELP[est.peak_phase]}), estimated")
    if refs:
        out.append("sources:")
        for n, basis in enumerate(refs, 1):
            out += _wrap(f"[{n}] {basis}", "      ", "  ")
    return out


def fits_line(fits: list[Fit]) -> str:
    """'fits on: ✓ A100 80GB (+12.3 GiB free) ✗ T4 (-3.1 GiB missing)'."""

    def cell(f: Fit) -> str:
        if f.fits:
            return f"✓ {f.gpu.name} (+{_g(f.free_bytes)})"
        why = ([f"-{_g(-f.free_bytes)}"] if f.free_bytes < 0 else []) + ([f.blocked] if f.blocked else [])
        return f"✗ {f.gpu.name} ({', '.join(why)})"

    cells = [cell(f) for f in sorted(fits, key=lambda f: f.gpu.memory_bytes)]
    lines = ["fits on (GiB free/missing of what torch can use per GPU, estimated):"]
    for c in cells:  # wrapped between cards, never inside one
        if len(lines) > 1 and len(lines[-1]) + 2 + len(c) <= WIDTH:
            lines[-1] += "  " + c
        else:
            lines.append("    " + c)
    return "\n".join(lines)


def render(est: Estimate, fits: list[Fit], target: Fit | None = None) -> str:
    """The whole human report."""
    out = [
        f"{est.arch.name}: {_count(est.arch.total_params)} params, "
        f"{_count(est.trainable_params)} trainable (estimated memory of one GRPO step, TRL {est.config.trl_version})",
        settings_line(est),
        "",
        table(est),
        "",
        *summary_lines(est),
    ]
    if est.notes:
        out.append("notes:")
        out += [f"  - {n}" for n in est.notes]
    if est.config.device == "cpu":
        out.append("device cpu: the peak is host RAM (no CUDA context, no allocator reserve), estimated")
    elif fits:
        out.append(fits_line(fits))
    if target is not None:
        verdict = "fits" if target.fits else "does NOT fit"
        amount = f"{_g(abs(target.free_bytes))} GiB {'free' if target.free_bytes >= 0 else 'missing'}"
        if target.blocked:
            step = "leaves " + amount if target.free_bytes >= 0 else "is " + amount
            see = "the host RAM line" if target.blocked.startswith("host RAM") else "the layout"
            amount = f"fails at {target.blocked} (see {see}); the step itself {step}"
        out.append(
            f"{target.gpu.name} ({gib(target.gpu.usable_bytes):.2f} GiB torch can use of "
            f"{target.gpu.memory_gib:.2f} GiB): {verdict}, {amount} (estimated)"
        )
        out.append(f"  verdict: {FIT_BASIS}")
    return "\n".join(out)


def render_advice(advice: Advice) -> str:
    """Single changes ranked by GiB saved, each with what it costs, then the smallest set that fits."""
    out = [
        "what to change (each re-estimated at this configuration; GiB saved -> GiB the card must hold, estimated):"
    ]
    for o in advice.singles:
        mark = "" if o.fits is None else ("✓ fits " if o.fits else "✗      ")
        start = _start_mark(advice, o)
        saves = "saves" if o.saved_bytes >= 0 else " adds"
        out.append(
            f"  {mark}{saves} {_g(abs(o.saved_bytes)):>6} GiB -> {_g(o.need_bytes):>6} GiB  {o.label}{start}"
        )
        if o.tradeoff:
            out.append(f"  {'':>7}cost: {o.tradeoff}")
    if not advice.singles:
        out.append("  no single change saves memory at this configuration")
    if advice.budget_bytes is not None and advice.baseline_fails:
        if advice.plan is not None and advice.plan.fits:
            out.append(f"smallest set that fits: {advice.plan.label} -> {_plan_tail(advice.plan)}")
        elif advice.plan is not None:
            out.append(f"nothing tried fits; closest: {advice.plan.label} -> {_plan_tail(advice.plan)}")
        else:
            out.append("nothing tried fits")
    return "\n".join(out)


def _start_mark(advice: Advice, o: Option) -> str:
    """' (vLLM starts)' after a change that makes a failing vLLM start, ' (vLLM still fails at start-up)' after
    one that does not; nothing where vLLM starts as given or is not checked."""
    if advice.baseline_starts is not False or o.starts is None:
        return ""
    return " (vLLM starts)" if o.starts else " (vLLM still fails at start-up)"


def render_layout(layout: Layout, fixes: list[str]) -> str:
    """Per-GPU, per-role GiB, the number of GPUs, vLLM's own budget, where the run fails (if it does) and the
    change that fixes that cause (all `estimated`)."""
    out = [f"layout: {layout.total_gpus} GPU(s), per GPU (GiB, estimated):"]
    for g in layout.groups:
        verdict = "fits" if g.fits else f"does NOT fit, {_g(g.held_bytes - g.total_bytes)} GiB missing"
        held = (
            f"peak {_g(g.peak_device_bytes)}"
            if g.need_bytes is None
            else f"must hold {_g(g.need_bytes)} (nvidia-smi peak {_g(g.peak_device_bytes)})"
        )
        out.append(f"  {printable(g.name, 60)} × {g.count}: {held} of {_g(g.total_bytes)} GiB ({verdict})")
        for r in g.roles:
            role = printable(r.role, 60)
            out.append(f"    {role:<36} resident {_g(r.resident):>7}  + working {_g(r.working):>7}")
    v = layout.vllm
    if v is not None:
        out.append(f"vLLM {v.mode} as {VLLM_VERSION} counts itself (per GPU, GiB, estimated):")
        out.append(
            f"  request {v.utilization} × total = {_g(v.requested)}: weights {_g(v.weights)}, profile activations "
            f"{_g(v.activation_peak)}, non-torch {_g(v.non_torch)}, CUDA graphs charged {_g(v.cuda_graphs)}, "
            f"KV cache {_g(v.kv_cache)} ({v.kv_tokens} tokens)" + _graphs_on_top(v)
        )
        out.append(
            f"  one max_model_len={v.max_model_len} request needs {_g(v.one_sequence)} GiB of KV cache"
        )
        if v.sleep_residue:
            host = f", {_g(v.host_bytes)} GiB of weights in pinned host RAM (level 1)" if v.host_bytes else ""
            out.append(
                f"  asleep between generations: {_g(v.sleep_residue)} GiB stays on the GPU (CUDA graphs, NCCL)"
                + host
            )
        if v.free_at_start is not None and v.mode == "colocate":
            out.append(f"  free when vLLM starts: {_g(v.free_at_start)} GiB")
        if v.smallest_utilization is not None or v.largest_safe_utilization is not None:
            lo = v.smallest_utilization if v.smallest_utilization is not None else "none"
            hi = v.largest_safe_utilization if v.largest_safe_utilization is not None else "none"
            knob, top = (
                ("trl vllm-serve --gpu_memory_utilization", "free at start-up and for the weight push")
                if v.mode == "server"
                else ("vllm_gpu_memory_utilization", "step fits")
            )
            out.append(f"  {knob} that works: from {lo} (one request fits) to {hi} ({top})")
        out.append(f"  verdict: {_vllm_outcome(layout, str)}")
    for n in layout.notes:
        out.append(f"  note: {printable(n, LONG)}")
    if fixes:
        out.append("what fixes the cause (estimated):")
        out += [f"  - {printable(f, LONG)}" for f in fixes]
    return "\n".join(out)


def layout_dict(layout: Layout, fixes: list[str]) -> dict:
    """The layout as JSON: every GPU group with its roles, vLLM's accounting, the GPU count, the fixes."""
    return {
        "source": SOURCE,
        "total_gpus": layout.total_gpus,
        "fits": layout.fits,
        **asdict(layout),
        "fixes": fixes,
    }


def _saves(o: Option) -> str:
    """'saves X GiB', or 'adds X GiB' for a change that needs more (one that lets vLLM start: a larger share)."""
    return f"{'saves' if o.saved_bytes >= 0 else 'adds'} {_g(abs(o.saved_bytes))} GiB"


def _plan_tail(o: Option) -> str:
    return f"{_g(o.need_bytes)} GiB, {_saves(o)} (estimated)"


def render_solution(sol: Solution) -> str:
    """One line: the largest value that fits, or that none does."""
    note = f"; {sol.note}" if sol.note else ""
    if sol.value is None and not sol.tried:
        return f"solve {sol.knob}: no value to try{note}"
    if sol.value is None:
        return (
            f"solve {sol.knob}: nothing fits in {_g(sol.budget_bytes)} GiB, even the smallest value (estimated)"
            f"{note}"
        )
    return (
        f"solve: largest {sol.knob} that fits = {sol.value} "
        f"(must hold {_g(sol.need_bytes or 0)} of the {_g(sol.budget_bytes)} GiB torch can use, estimated{note})"
    )


def _option_dict(o: Option) -> dict:
    return {
        "source": SOURCE,
        "changes": [{"key": c.key, "label": c.label} for c in o.changes],
        "peak_device_bytes": o.peak_device_bytes,
        "need_bytes": o.need_bytes,
        "saved_bytes": o.saved_bytes,
        "fits": o.fits,
        "cost": o.tradeoff,
        **({"starts": o.starts} if o.starts is not None else {}),
    }


def to_json(
    est: Estimate,
    fits: list[Fit],
    target: Fit | None = None,
    advice: Advice | None = None,
    solution: Solution | None = None,
    layout: Layout | None = None,
    fixes: list[str] | None = None,
) -> dict:
    """Estimate.to_dict() plus fit checks, advice and solve results; every number labelled `estimated`."""
    d = est.to_dict()

    def fit_dict(f: Fit) -> dict:
        return {
            "source": SOURCE,
            "gpu": f.gpu.name,
            "gpu_memory_bytes": f.gpu.memory_bytes,
            "gpu_memory_source": f.gpu.source,
            "usable_bytes": f.gpu.usable_bytes,
            "usable_source": f.gpu.torch_source,
            "compared": FIT_BASIS,
            "fits": f.fits,
            "fit_bytes": f.gpu.usable_bytes - f.free_bytes,
            "free_bytes": f.free_bytes,
            "blocked": f.blocked or None,
        }

    d["fits"] = [fit_dict(f) for f in fits]
    if target is not None:
        d["target"] = fit_dict(target)
    if advice is not None:
        d["advice"] = {
            "source": SOURCE,
            "baseline_bytes": advice.baseline_bytes,  # what the card must hold (need_bytes)
            "budget_bytes": advice.budget_bytes,
            "singles": [_option_dict(o) for o in advice.singles],
            "plan": _option_dict(advice.plan) if advice.plan else None,
            **({"baseline_starts": advice.baseline_starts} if advice.baseline_starts is not None else {}),
        }
    if solution is not None:
        d["solve"] = {
            "source": SOURCE,
            "knob": solution.knob,
            "value": solution.value,
            "peak_device_bytes": solution.peak_device_bytes,
            "need_bytes": solution.need_bytes,
            "budget_bytes": solution.budget_bytes,
            "note": solution.note,
        }
    if layout is not None:
        d["layout"] = layout_dict(layout, fixes or [])
    return d


# ---- the short answer (the default output): the verdict first, within WIDTH columns ----

SCHEMA_VERSION = "1.4"  # of the JSON answer: docs/estimate.schema.json, documented in docs/json-output.md
WIDTH = 80
SHOWN_MIN_BYTES = int(
    0.005 * 2**30
)  # less prints as 0.00 GiB: such a row is folded into its neighbour or left out
TOP_COMPONENTS = 4  # tensor components shown by name at the peak; the rest are summed as "other tensors"
COMPONENT_LABELS = {
    "vllm": "vLLM's share (colocated)",
    "roles": "other models (roles)",
    "ddp_gradient_buckets": "DDP gradient buckets",
    "vllm_weight_push": "weights packed for the vLLM server",
}
_REFERENCE = re.compile(r"\s*\([^()]*(?:#\d|\bPR\b|\.py\b|\.jsonl?\b|\.txt\b)[^()]*\)")


def plain(text: str) -> str:
    """`text` without parenthesized internal references (issue / PR numbers, file names): the short answer
    points to --detail for those."""
    return _REFERENCE.sub("", text)


def _wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
    """`text` in lines of at most WIDTH columns: the first starts with `first` (default `indent`), the others
    with `indent`."""
    first = indent if first is None else first
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False
    ) or [first]


def wrap_long(text: str) -> str:
    """Every line of `text` longer than WIDTH wrapped at WIDTH, continuation lines indented under it."""
    out = []
    for line in text.split("\n"):
        if len(line) <= WIDTH:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, WIDTH, subsequent_indent=lead + "    ", break_on_hyphens=False)
    return "\n".join(out)


def _g1(n: int | float) -> str:
    return f"{gib(n):.1f}"


def _the(gpu: GPU) -> str:
    return f"the {gpu.name}"


PHASE_SHORT = {
    "generate": "generation",
    "score": "log-prob passes",
    "train": "forward + backward",
    "optimizer": "optimizer step",
}


def _fits_summary(fits: list[Fit]) -> str:
    """'fits A100 40GB and larger' / 'fits A100 40GB, H100 80GB' / 'fits none of the 11 listed cards'."""
    ordered = sorted(fits, key=lambda f: f.gpu.memory_bytes)
    ok = [f for f in ordered if f.fits]
    if not ok:
        return f"fits none of the {len(ordered)} listed cards"
    first = ordered.index(ok[0])
    if all(f.fits for f in ordered[first:]):
        return f"fits {ok[0].gpu.name} and up" if first < len(ordered) - 1 else f"fits only {ok[0].gpu.name}"
    return "fits " + ", ".join(f.gpu.name for f in ok)


def _is_short(f: Fit, article: str = "") -> str:
    """'RTX 4090 is 12.2 GiB short' / 'A100 40GB fails at vLLM start-up'."""
    if f.blocked:
        return f"{article}{f.gpu.name} fails at {f.blocked}"
    return f"{article}{f.gpu.name} is {_g1(-f.free_bytes)} GiB short"


def verdict(est: Estimate, fits: list[Fit], target: Fit | None, reference: Fit | None) -> str:
    """The first line(s) of the short answer: what one GPU must hold and where that fits."""
    c = est.config
    if c.device == "cpu" and c.num_gpus > 1:
        return (
            f"Needs {_g1(est.need_bytes)} GiB of host RAM per process, {_g1(c.num_gpus * est.need_bytes)} GiB for "
            f"{c.num_gpus} DDP processes (device cpu: TRL's use_cpu, gloo, no GPU)."
        )
    if c.device == "cpu":
        return f"Needs {_g1(est.need_bytes)} GiB of host RAM (device cpu: TRL's use_cpu, no GPU)."
    head = f"Needs {_g1(est.fit_bytes)} GiB per GPU"
    if target is not None:
        if target.fits:
            return f"{head}: fits {_the(target.gpu)} with {_g1(target.free_bytes)} GiB to spare."
        tail = f"; {_fits_summary(fits)}" if fits else ""
        return f"{head}: {_is_short(target)}{tail}."
    out = f"{head}: {_fits_summary(fits)}"
    if reference is not None and not reference.fits:
        out += f"; {_is_short(reference, 'an ')}"
    return out + "."


def run_line(est: Estimate) -> str:
    """What was estimated, in a few words: model, weights, method, sequences x tokens, GPUs, vLLM."""
    c = est.config
    held = deepspeed_dtype_config(c).dtype  # DeepSpeed casts the module to bf16 under bf16 mixed precision
    weights = (
        "4-bit base"
        if c.load_in_4bit
        else {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(held, held)
        + " weights"
        + (" (cast by DeepSpeed)" if held != c.dtype else "")
    )
    method = (
        f"QLoRA r{c.lora_r}" if c.load_in_4bit else (f"LoRA r{c.lora_r}" if c.use_peft else "full fine-tune")
    )
    parts = [est.arch.name.rsplit("/", 1)[-1], weights, method]
    parts.append(f"{c.per_device_train_batch_size} x {c.max_prompt_length + c.max_completion_length} tokens")
    if c.num_generations != c.per_device_train_batch_size:
        parts.append(f"{c.num_generations} generations")
    if c.gradient_accumulation_steps > 1:
        parts.append(f"grad accumulation {c.gradient_accumulation_steps}")
    if not c.gradient_checkpointing:
        parts.append("no grad checkpointing")
    if c.num_gpus > 1:
        sharding = {"none": "DDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP"}.get(
            c.sharding, c.sharding
        )
        parts.append(f"{c.num_gpus} {'processes' if c.device == 'cpu' else 'GPUs'} {sharding}")
    if c.use_vllm:
        parts.append(vllm_words(c))
    return ", ".join(parts)


def vllm_words(c: RunConfig) -> str:
    """'vLLM colocate 0.3' (its share of the training GPU), or 'vLLM server 0.9 on 1 GPU of its own' (trl
    vllm-serve's utilization of its own GPUs)."""
    if c.vllm_mode == "server":
        gpus = f"{c.vllm_server_gpus} GPU{'s' if c.vllm_server_gpus > 1 else ''}"
        return f"vLLM server {c.vllm_server_utilization} on {gpus} of its own"
    return f"vLLM {c.vllm_mode} {c.vllm_gpu_memory_utilization}"


def _plan_lines(advice: Advice, gpu: GPU, host_short: bool = False) -> list[str]:
    plan = advice.plan
    start = advice.baseline_starts is False  # vLLM fails at start-up: the plan must fix that too
    none = f"No change tried {'lets vLLM start and fits' if start else 'makes it fit'} {_the(gpu)}"
    if host_short and (
        plan is None or not plan.fits
    ):  # the host's verdict, not the card's: a card-bytes plan
        return _wrap(f"{none} within --host-ram: the host RAM line below says what the host needs.")
    if plan is None:
        return _wrap(f"{none}.")
    if start and plan.starts is False:  # the closest set tried saves bytes, but vLLM still does not start
        return _wrap(f"No change tried lets vLLM start on {_the(gpu)}; the layout below says why.")
    if plan.fits:
        out = _wrap(
            f"To {'let vLLM start and ' if start else ''}fit {_the(gpu)}: {plain(plan.label)}", "  ", ""
        )
    else:
        out = _wrap(f"No change tried makes it fit {_the(gpu)}; closest: {plain(plan.label)}", "  ", "")
    cost = f"; cost: {plain(plan.tradeoff)}" if plan.tradeoff else ""
    out += _wrap(f"-> needs {_g1(plan.need_bytes)} GiB (estimated){cost}", "     ", "  ")
    return out


def _advice_lines(advice: Advice, limit: int = 6) -> list[str]:
    out = ["What to change (GiB needed after each change, estimated):"]
    for o in advice.singles[:limit]:
        mark = " " if o.fits is None else ("✓" if o.fits else "✗")
        out += _wrap(plain(o.label), " " * 11, f"  {mark} {_g1(o.need_bytes):>5}  ")
    if len(advice.singles) > limit:
        out.append(f"  ... {len(advice.singles) - limit} more, each with its cost: --detail")
    if not advice.singles:
        out.append("  no single change saves memory at this configuration")
    return out


def breakdown(est: Estimate) -> list[tuple[str, int, str]]:
    """(label, bytes, source) rows that add up to what the fit verdict compares with a GPU (`fit_bytes`):
    the largest tensor components at the peak phase, the rest of the tensors, the allocator's reserve (after it
    frees its cache and retries), the non-tensor items and the error band."""
    comps = sorted(est.phases[est.peak_phase].items(), key=lambda kv: -kv[1])
    comps = [(n, b) for n, b in comps if b > 0]
    rows = [(COMPONENT_LABELS.get(n, n.replace("_", " ")), b, SOURCE) for n, b in comps[:TOP_COMPONENTS]]
    rest = sum(b for _, b in comps[TOP_COMPONENTS:])
    if rest >= SHOWN_MIN_BYTES:  # left out of the short table (--detail has it)
        rows.append(("other tensors", rest, SOURCE))
    if est.config.device == "cpu":
        return rows
    reserve = est.need_bytes - est.peak_allocated_bytes - est.cuda_context_bytes
    margin = min(est.need_margin_bytes, reserve)
    if margin < SHOWN_MIN_BYTES:  # stays in the reserve's row
        margin = 0
    rows.append(("allocator reserve", reserve - margin, est.reserve_source))
    if margin:
        rows.append(("reserve margin (safe side)", margin, est.reserve_source))
    rows.append(("CUDA context, workspaces", est.cuda_context_bytes, SOURCE))
    if est.band_bytes:
        rows.append(("error band (safe side)", est.band_bytes, "traced"))
    return rows


def _breakdown_lines(est: Estimate, markdown: bool) -> list[str]:
    rows = breakdown(est)
    total = est.need_bytes if est.config.device == "cpu" else est.fit_bytes
    phase = est.peak_phase
    where = f"at the peak ({phase}: {PHASE_SHORT.get(phase, phase)})"
    if markdown:
        out = [f"| {where} | GiB | source |", "|---|---:|---|"]
        out += [f"| {label} | {_g(b)} | {src} |" for label, b, src in rows]
        out.append(f"| **total** | **{_g(total)}** | estimated |")
        return out
    out = [f"{'Where it goes, ' + where:<46}{'GiB':>5}  source"]
    out += [f"  {label:<42}{_g(b):>7}  {src}" for label, b, src in rows]
    out.append(f"  {'= total':<42}{_g(total):>7}  estimated")
    return out


def _nearest_cards(fits: list[Fit]) -> str | None:
    """The cards around the line: the largest that does not fit and the two smallest that do."""
    ordered = sorted(fits, key=lambda f: f.gpu.memory_bytes)
    ok = [i for i, f in enumerate(ordered) if f.fits]
    if not ordered:
        return None
    lo = (ok[0] if ok else len(ordered)) - 1
    picked = ordered[max(0, lo) : lo + 3] if lo >= 0 else ordered[:2]

    def cell(f: Fit) -> str:
        if f.blocked:
            return f"{f.gpu.name} fails ({f.blocked})"
        return f"{f.gpu.name} {'+' if f.free_bytes >= 0 else '-'}{_g1(abs(f.free_bytes))}"

    return "Cards (+GiB spare, -short): " + ", ".join(cell(f) for f in picked)


def _vllm_outcome(layout: Layout, text: Callable[[str], str]) -> str:
    """'starts and runs', 'fails at <failure>', or a server that starts and then runs out at the weight push."""
    v = layout.vllm
    if v is not None and v.failure is not None:
        return "fails at " + text(v.failure)
    if any(g.name == "vLLM server" and not g.fits for g in layout.groups):
        return "starts, then its GPU runs out when the trainer pushes weights"
    return "starts and runs"


def _layout_lines(layout: Layout, fixes: list[str]) -> list[str]:
    out = [f"Per GPU ({layout.total_gpus} in all, estimated):"]
    for g in layout.groups:
        verdict_ = "fits" if g.fits else f"{_g1(g.held_bytes - g.total_bytes)} GiB short"
        roles = ", ".join(printable(r.role, 60) for r in g.roles)
        out += _wrap(
            f"{printable(g.name, 60)} x {g.count}: {_g1(g.held_bytes)} of {_g1(g.total_bytes)} GiB, {verdict_}; holds {roles}",
            "    ",
            "  ",
        )
    v = layout.vllm
    if v is not None:
        out += _wrap(f"vLLM {v.mode} {_vllm_outcome(layout, plain)}", "    ", "  ")
    for f in fixes[:3]:
        out += _wrap(f"fix: {printable(plain(f), LONG)}", "    ", "  ")
    return out


def _graphs_on_top(v) -> str:
    """The CUDA graphs a vLLM before 0.21 captures beyond its request (layout.VllmCheck.graphs_on_top), said
    after vLLM's own sum: alone where the TRL release accepts only such vLLMs, counted both ways otherwise."""
    if not v.graphs_on_top:
        return ""
    if v.cuda_graphs:
        return (
            f"; the same {_g(v.graphs_on_top)} of CUDA graphs also counted beyond the request (this TRL release "
            "accepts vLLMs before and after 0.21, which charges them inside it)"
        )
    return f"; CUDA graphs {_g(v.graphs_on_top)} beyond the request (this TRL release's vLLM predates 0.21)"


def _margin_decides(est: Estimate, fit: Fit | None) -> list[str]:
    """Where the card checked falls short by less than the reserve margin (the fitted reserve's cover for its
    worst miss, not an expectation): one line saying so and that `--trace` replays this run's own allocations."""
    if fit is None or fit.fits or fit.blocked or est.need_margin_bytes < SHOWN_MIN_BYTES:
        return []
    if fit.free_bytes + est.need_margin_bytes < 0:
        return []
    return _wrap(
        f"The reserve margin ({_g1(est.need_margin_bytes)} GiB, fitted) decides this: the estimate without it fits the "
        f"{fit.gpu.name}. --trace replays this run's own allocations in its place (sweep extra; a minute or more).",
        "  ",
        "",
    )


def short(
    est: Estimate,
    fits: list[Fit],
    *,
    target: Fit | None = None,
    reference: Fit | None = None,
    advice: Advice | None = None,
    reference_advice: Advice | None = None,
    show_all_advice: bool = False,
    solution: Solution | None = None,
    layout: Layout | None = None,
    fixes: list[str] | None = None,
    files: list[str] | None = None,
    markdown: bool = False,
) -> str:
    """The default answer, within WIDTH columns and about 20 lines: the verdict (what one GPU must hold, where it
    fits), what was estimated, the smallest change that makes it fit the named card (or REFERENCE_GPU), where the
    memory goes at the peak, the layout with roles or vLLM, the solved value. No internal references: --detail
    and --json keep them."""
    first = verdict(est, fits, target, reference)
    out = [f"**{first}**", ""] if markdown else _wrap(first, "  ", "")
    out += _wrap(f"estimated for {run_line(est)}", "  ", "  ")
    if files:
        out += _wrap(f"settings from {', '.join(files)} and flags (--detail: which set what)", "  ", "  ")
    out.append("")
    failing = target if target is not None and not target.fits else None
    # the advice's fits cover the whole layout (vLLM's start-up, every GPU: cli.compute), so its plan answers a
    # card blocked by the layout too
    if failing is not None and advice is not None and advice.budget_bytes is not None:
        out += _plan_lines(advice, failing.gpu, "host RAM (" in failing.blocked)
    elif reference is not None and reference_advice is not None:
        out += _plan_lines(reference_advice, reference.gpu)
    if solution is not None:
        note = f"; {plain(solution.note)}" if solution.note else ""
        if solution.value is None and not solution.tried:
            out += _wrap(f"Solve {solution.knob}: no value to try{note}.")
        elif solution.value is None:
            out += _wrap(f"Solve {solution.knob}: nothing fits, even the smallest value (estimated{note}).")
        else:
            out += _wrap(
                f"Largest {solution.knob} that fits: {solution.value} (needs {_g1(solution.need_bytes or 0)} of "
                f"{_g1(solution.budget_bytes)} GiB, estimated{note})."
            )
    if show_all_advice and advice is not None:
        out += ([""] if markdown else []) + _advice_lines(advice)
    if out[-1] != "":
        out.append("")
    out += _breakdown_lines(est, markdown)
    if layout is not None:
        out += [""] + _layout_lines(layout, fixes or [])
    if fits and target is None and not markdown:
        near = _nearest_cards(fits)
        if near:
            out += _wrap(near, "  ", "")
    # host RAM is a second verdict (offload), and DeepSpeed's measured reserve qualifies the first: both stay
    for n in est.notes:
        if n.startswith(("host RAM", DEEPSPEED_NOTE_PREFIX)):
            out += _wrap(plain(n), "  ", "")
    out += _margin_decides(est, target if target is not None else reference)
    notes = f", {len(est.notes)} notes" if est.notes else ""
    more = f"More: --detail (every phase, memory layers, sources{notes}) or --json."
    out += ([""] if markdown else []) + _wrap(more)
    return "\n".join(out)
