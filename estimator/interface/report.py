"""Render an Estimate (plus fit checks, advice and solve results) as a human table or a JSON-ready dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from estimator.hardware.gpus import GPU
from estimator.plan.advice import Advice, Option
from estimator.plan.layout import Layout
from estimator.plan.solve import Solution
from estimator.step.estimate import SOURCE, Estimate
from estimator.terms.phase_names import PHASE_HELP, PHASES
from estimator.terms.vllm import VERSION as VLLM_VERSION
from estimator.units import gib

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
    return Fit(gpu, gpu.usable_bytes - est.fit_bytes)


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
        parts.append(f"vLLM {c.vllm_mode} {c.vllm_gpu_memory_utilization}")
    if c.num_gpus > 1:
        parts.append(f"{c.num_gpus} GPUs {c.sharding}")
    return "settings: " + ", ".join(parts)


def summary_lines(est: Estimate) -> list[str]:
    """The layers from tensor bytes to what the card holds, each with where its number came from: peak allocated,
    the allocator's reserve beyond it and the workspaces allocated through it (= peak reserved), then the items
    outside the allocator (= the nvidia-smi peak), then what the card must hold with release-and-retry."""
    width = 58

    def row(label: str, v: int, source: str = SOURCE) -> str:
        return f"{label:<{width}}{_g(v):>8} GiB  {source}"

    frag_source = est.reserve_source
    if est.reserve_basis:
        frag_source = est.reserve_basis
    settings = "" if est.allocator_variant == "default" else f", {est.allocator_variant}"
    out = [
        row("peak allocated (tensor bytes, torch max_memory_allocated)", est.peak_allocated_bytes),
        row(f"+ allocator overhead (fragmentation{settings})", est.allocator_overhead_bytes, frag_source),
    ]
    out += [
        row(f"+ {i.name} (in reserved)", i.bytes, f"{SOURCE} ({i.source})")
        for i in est.non_tensor
        if i.in_reserved
    ]
    out.append(row("= peak reserved (torch max_memory_reserved)", est.peak_reserved_bytes))
    outside = [i for i in est.non_tensor if not i.in_reserved]
    out += [row(f"+ {i.name}", i.bytes, f"{SOURCE} ({i.source})") for i in outside]
    if not est.non_tensor and est.cuda_context_bytes:
        out.append(row("+ CUDA context", est.cuda_context_bytes))
    out.append(row('= "nvidia-smi" peak', est.peak_device_bytes))
    if est.config.device == "cuda" and est.need_extra_bytes is not None:
        out.append(
            row("card must hold (allocator frees its cache and retries)", est.need_bytes, est.reserve_source)
        )
    if est.config.device == "cuda" and est.band_bytes:
        out.append(
            row(
                "+ validated error band on the tensor peak (safe side)",
                est.band_bytes,
                "traced (validation rows, estimator/step/band.py)",
            )
        )
        out.append(row("= what the fit verdicts compare with each GPU", est.fit_bytes))
    out.append(f"peak phase: {est.peak_phase} ({PHASE_HELP[est.peak_phase]}), estimated")
    return out


def fits_line(fits: list[Fit]) -> str:
    """'fits on: ✓ A100 80GB (+12.3 GiB free) ✗ T4 (-3.1 GiB missing)'."""

    def cell(f: Fit) -> str:
        if f.fits:
            return f"✓ {f.gpu.name} (+{_g(f.free_bytes)})"
        why = ([f"-{_g(-f.free_bytes)}"] if f.free_bytes < 0 else []) + ([f.blocked] if f.blocked else [])
        return f"✗ {f.gpu.name} ({', '.join(why)})"

    cells = [cell(f) for f in sorted(fits, key=lambda f: f.gpu.memory_bytes)]
    return "fits on (GiB free/missing of what torch can use per GPU, estimated): " + "  ".join(cells)


def render(est: Estimate, fits: list[Fit], target: Fit | None = None) -> str:
    """The whole human report."""
    out = [
        f"{est.arch.name}: {_count(est.arch.total_params)} params, "
        f"{_count(est.trainable_params)} trainable (estimated memory of one GRPO step, TRL 1.16)",
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
            amount = f"fails at {target.blocked} (see the layout); the step itself {step}"
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
        out.append(f"  {mark}saves {_g(o.saved_bytes):>6} GiB -> {_g(o.need_bytes):>6} GiB  {o.label}")
        if o.tradeoff:
            out.append(f"  {'':>7}cost: {o.tradeoff}")
    if not advice.singles:
        out.append("  no single change saves memory at this configuration")
    if advice.budget_bytes is not None and advice.baseline_bytes > advice.budget_bytes:
        if advice.plan is not None and advice.plan.fits:
            out.append(f"smallest set that fits: {advice.plan.label} -> {_plan_tail(advice.plan)}")
        elif advice.plan is not None:
            out.append(f"nothing tried fits; closest: {advice.plan.label} -> {_plan_tail(advice.plan)}")
        else:
            out.append("nothing tried fits")
    return "\n".join(out)


def render_layout(layout: Layout, fixes: list[str]) -> str:
    """Per-GPU, per-role GiB, the number of GPUs, vLLM's own budget, where the run fails (if it does) and the
    change that fixes that cause (all `estimated`)."""
    out = [f"layout: {layout.total_gpus} GPU(s), per GPU (GiB, estimated):"]
    for g in layout.groups:
        verdict = "fits" if g.fits else f"does NOT fit, {_g(g.peak_device_bytes - g.total_bytes)} GiB missing"
        out.append(
            f"  {g.name} × {g.count}: peak {_g(g.peak_device_bytes)} of {_g(g.total_bytes)} GiB ({verdict})"
        )
        for r in g.roles:
            out.append(f"    {r.role:<44} resident {_g(r.resident):>7}  + working {_g(r.working):>7}")
    v = layout.vllm
    if v is not None:
        out.append(f"vLLM {v.mode} as {VLLM_VERSION} counts itself (per GPU, GiB, estimated):")
        out.append(
            f"  request {v.utilization} × total = {_g(v.requested)}: weights {_g(v.weights)}, profile activations "
            f"{_g(v.activation_peak)}, non-torch {_g(v.non_torch)}, CUDA graphs {_g(v.cuda_graphs)}, "
            f"KV cache {_g(v.kv_cache)} ({v.kv_tokens} tokens)"
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
            out.append(
                f"  vllm_gpu_memory_utilization that works: from {lo} (one request fits) to {hi} (step fits)"
            )
        out.append(f"  verdict: {'runs' if v.failure is None else 'fails at ' + v.failure}")
    for n in layout.notes:
        out.append(f"  note: {n}")
    if fixes:
        out.append("what fixes the cause (estimated):")
        out += [f"  - {f}" for f in fixes]
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


def _plan_tail(o: Option) -> str:
    return f"{_g(o.need_bytes)} GiB, saves {_g(o.saved_bytes)} GiB (estimated)"


def render_solution(sol: Solution) -> str:
    """One line: the largest value that fits, or that none does."""
    if sol.value is None:
        return f"solve {sol.knob}: nothing fits in {_g(sol.budget_bytes)} GiB, even the smallest value (estimated)"
    note = f"; {sol.note}" if sol.note else ""
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
