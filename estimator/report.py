"""Render an Estimate (plus fit checks, advice and solve results) as a human table or a JSON-ready dict."""

from __future__ import annotations

from dataclasses import dataclass

from estimator.advice import Advice, Option
from estimator.estimate import PHASE_HELP, PHASES, SOURCE, Estimate
from estimator.gpus import GPU
from estimator.solve import Solution
from estimator.units import gib


@dataclass(frozen=True)
class Fit:
    """Whether the estimated nvidia-smi peak fits one GPU, and by how much (bytes; negative = missing)."""

    gpu: GPU
    free_bytes: int

    @property
    def fits(self) -> bool:
        return self.free_bytes >= 0


def check_fit(est: Estimate, gpu: GPU) -> Fit:
    """Free (or missing) memory on `gpu` at the estimated nvidia-smi peak."""
    from estimator.band import usable_bytes  # fits decided on the safe side of the validated band

    return Fit(gpu, usable_bytes(gpu.memory_bytes) - est.peak_device_bytes)


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
    """Peak allocated, allocator overhead, CUDA context, nvidia-smi peak and the peak phase, all `estimated`."""
    rows = [
        ("peak allocated (torch max_memory_allocated)", est.peak_allocated_bytes),
        ("allocator overhead (reserved - allocated)", est.allocator_overhead_bytes),
        ("peak reserved (torch max_memory_reserved)", est.peak_reserved_bytes),
        ("CUDA context", est.cuda_context_bytes),
        ('"nvidia-smi" peak', est.peak_device_bytes),
    ]
    out = [f"{label:<46}{_g(v):>8} GiB  estimated" for label, v in rows]
    out.append(f"peak phase: {est.peak_phase} ({PHASE_HELP[est.peak_phase]}), estimated")
    return out


def fits_line(fits: list[Fit]) -> str:
    """'fits on: ✓ A100 80GB (+12.3 GiB free) ✗ T4 (-3.1 GiB missing)'."""
    cells = [
        f"✓ {f.gpu.name} (+{_g(f.free_bytes)})" if f.fits else f"✗ {f.gpu.name} (-{_g(-f.free_bytes)})"
        for f in sorted(fits, key=lambda f: f.gpu.memory_bytes)
    ]
    return "fits on (GiB free/missing per GPU, estimated): " + "  ".join(cells)


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
        amount = f"{_g(abs(target.free_bytes))} GiB {'free' if target.fits else 'missing'}"
        out.append(f"{target.gpu.name} ({target.gpu.memory_gib:.2f} GiB): {verdict}, {amount} (estimated)")
    return "\n".join(out)


def render_advice(advice: Advice) -> str:
    """Single changes ranked by GiB saved, then the smallest set that fits."""
    out = ["what to change (each re-estimated; GiB saved, estimated):"]
    for o in advice.singles:
        mark = "" if o.fits is None else ("✓ fits " if o.fits else "✗      ")
        out.append(f"  {mark}saves {_g(o.saved_bytes):>6} GiB -> {_g(o.peak_device_bytes):>6} GiB  {o.label}")
    if advice.budget_bytes is not None and advice.baseline_bytes > advice.budget_bytes:
        if advice.plan is not None and advice.plan.fits:
            out.append(f"smallest set that fits: {advice.plan.label} -> {_plan_tail(advice.plan)}")
        elif advice.plan is not None:
            out.append(f"nothing tried fits; closest: {advice.plan.label} -> {_plan_tail(advice.plan)}")
        else:
            out.append("nothing tried fits")
    return "\n".join(out)


def _plan_tail(o: Option) -> str:
    return f"{_g(o.peak_device_bytes)} GiB, saves {_g(o.saved_bytes)} GiB (estimated)"


def render_solution(sol: Solution) -> str:
    """One line: the largest value that fits, or that none does."""
    if sol.value is None:
        return f"solve {sol.knob}: nothing fits in {_g(sol.budget_bytes)} GiB, even the smallest value (estimated)"
    note = f"; {sol.note}" if sol.note else ""
    return (
        f"solve: largest {sol.knob} that fits = {sol.value} "
        f"({_g(sol.peak_device_bytes or 0)} of {_g(sol.budget_bytes)} GiB, estimated{note})"
    )


def _option_dict(o: Option) -> dict:
    return {
        "source": SOURCE,
        "changes": [{"key": c.key, "label": c.label} for c in o.changes],
        "peak_device_bytes": o.peak_device_bytes,
        "saved_bytes": o.saved_bytes,
        "fits": o.fits,
    }


def to_json(
    est: Estimate,
    fits: list[Fit],
    target: Fit | None = None,
    advice: Advice | None = None,
    solution: Solution | None = None,
) -> dict:
    """Estimate.to_dict() plus fit checks, advice and solve results; every number labelled `estimated`."""
    d = est.to_dict()

    def fit_dict(f: Fit) -> dict:
        return {
            "source": SOURCE,
            "gpu": f.gpu.name,
            "gpu_memory_bytes": f.gpu.memory_bytes,
            "gpu_memory_source": f.gpu.source,
            "fits": f.fits,
            "free_bytes": f.free_bytes,
        }

    d["fits"] = [fit_dict(f) for f in fits]
    if target is not None:
        d["target"] = fit_dict(target)
    if advice is not None:
        d["advice"] = {
            "source": SOURCE,
            "baseline_bytes": advice.baseline_bytes,
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
            "budget_bytes": solution.budget_bytes,
            "note": solution.note,
        }
    return d
