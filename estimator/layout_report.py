"""Render a Layout: each GPU group with its roles, vLLM's own accounting and the verdict (all `estimated`)."""

from __future__ import annotations

from estimator.layout import Layout
from estimator.terms.vllm import VERSION
from estimator.units import gib


def _g(n: int) -> str:
    return f"{gib(n):.2f}"


def render(layout: Layout) -> str:
    """Per-GPU, per-role GiB, the number of GPUs, vLLM's budget and where the run fails (if it does)."""
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
        out.append(f"vLLM {v.mode} as {VERSION} counts itself (per GPU, GiB, estimated):")
        out.append(
            f"  request {v.utilization} × total = {_g(v.requested)}: weights {_g(v.weights)}, profile activations "
            f"{_g(v.activation_peak)}, non-torch {_g(v.non_torch)}, CUDA graphs {_g(v.cuda_graphs)}, "
            f"KV cache {_g(v.kv_cache)} ({v.kv_tokens} tokens)"
        )
        out.append(
            f"  one max_model_len={v.max_model_len} request needs {_g(v.one_sequence)} GiB of KV cache"
        )
        if v.sleep_residue:
            out.append(
                f"  asleep between generations: {_g(v.sleep_residue)} GiB stays on the GPU (CUDA graphs, NCCL)"
                + (
                    f", {_g(v.host_bytes)} GiB of weights in pinned host RAM (level 1)"
                    if v.host_bytes
                    else ""
                )
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
    return "\n".join(out)


def render_advice(advice) -> str:
    """Single changes ranked by GiB saved, each with its cost, then the smallest set that fits (report.render_advice
    plus the trade-off column; the lead may fold it into report.py)."""
    out = ["what to change (each re-estimated at this configuration; GiB saved, estimated):"]
    for o in advice.singles:
        mark = "" if o.fits is None else ("✓ fits " if o.fits else "✗      ")
        out.append(f"  {mark}saves {_g(o.saved_bytes):>6} GiB -> {_g(o.peak_device_bytes):>6} GiB  {o.label}")
        if o.tradeoff:
            out.append(f"  {'':>7}cost: {o.tradeoff}")
    if not advice.singles:
        out.append("  no single change saves memory at this configuration")
    if advice.budget_bytes is not None and advice.baseline_bytes > advice.budget_bytes:
        p = advice.plan
        if p is not None:
            head = "smallest set that fits" if p.fits else "nothing tried fits; closest"
            out.append(f"{head}: {p.label} -> {_g(p.peak_device_bytes)} GiB, saves {_g(p.saved_bytes)} GiB")
        else:
            out.append("nothing tried fits")
    return "\n".join(out)
