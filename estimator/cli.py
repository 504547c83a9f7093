"""`vram-estimate`: how much GPU memory a TRL 1.16 GRPO run needs, what to change to make it fit.

Exit codes: 0 fits (or no --gpu given), 1 does not fit on --gpu (or --solve finds nothing), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from estimator.architecture import Arch
from estimator.config import RunConfig
from estimator.flags import FlagError, add_run_flags, resolve_run

PROG = "vram-estimate"


class UsageError(ValueError):
    """Bad input: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line and lets main() choose the exit code."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The run settings' flags (from the schema, shared with the tracer) and this command's output flags."""
    p = _Parser(
        prog=PROG,
        description="Estimate the GPU memory of one GRPO step with TRL 1.16's GRPOTrainer (every number is estimated).",
        epilog="Exit codes: 0 fits (or no --gpu), 1 does not fit on --gpu / --solve finds nothing, 2 bad input.",
        argument_default=argparse.SUPPRESS,
    )
    add_run_flags(p)
    o = p.add_argument_group("output")
    o.add_argument(
        "--gpu", metavar="NAME", help="check one GPU (e.g. H100, A100-40, 4090): exit 0 fits, 1 not"
    )
    o.add_argument("--json", action="store_true", default=False, help="the whole breakdown as JSON")
    o.add_argument("--advice", action="store_true", default=False, help="show what to change even if it fits")
    o.add_argument(
        "--solve",
        choices=("num_generations", "max_completion_length", "per_device_train_batch_size"),
        help="largest value of this setting that fits on --gpu",
    )
    o.add_argument(
        "--trace", action="store_true", default=False, help="also trace real GRPO steps (sweep extra)"
    )
    return p


@dataclass
class Request:
    """A parsed command line: the run, the GPU to check and what to print."""

    cfg: RunConfig
    arch: Arch
    gpu: object | None
    as_json: bool
    advice: bool
    solve: str | None
    trace: bool
    notes: list[str]


def parse(argv: list[str]) -> Request:
    """argv -> Request; UsageError (one line) for anything bad."""
    from estimator import gpus

    ns = build_parser().parse_args(argv)
    gpu = None
    if getattr(ns, "gpu", None) is not None:
        try:
            gpu = gpus.lookup(ns.gpu)
        except gpus.UnknownGPU as e:
            raise UsageError(str(e)) from None
    try:
        defaults = {"gpu_memory_gib": gpu.memory_gib} if gpu is not None else None
        cfg, arch, notes = resolve_run(ns, defaults)
    except FlagError as e:
        raise UsageError(str(e)) from None
    solve = getattr(ns, "solve", None)
    if solve and gpu is None:
        raise UsageError("--solve needs --gpu NAME (the memory to fit in)")
    if gpu is not None and cfg.device == "cpu":
        raise UsageError("--gpu checks a GPU; drop it with --device cpu")
    return Request(cfg, arch, gpu, ns.json, ns.advice, solve, ns.trace, notes)


TRACER_GROUP = "grpo_vram.tracers"  # entry points: callables (RunConfig, sweep=str) -> result row


def run_trace(cfg: RunConfig) -> dict:
    """Trace real GRPO steps under fake tensors with a tracer found by entry point (the sweep extra's)."""
    from importlib.metadata import entry_points

    need = "--trace needs the sweep extra (torch, transformers, trl): pip install 'grpo-vram[sweep]'"
    found = list(entry_points(group=TRACER_GROUP))
    if not found:
        raise UsageError(need)
    try:
        make_row = found[0].load()
    except ImportError:
        raise UsageError(need) from None
    row = make_row(cfg, sweep="vram-estimate")
    if row.get("status") != "ok":
        return {"source": "traced", "status": row.get("status"), "error": row.get("error")}
    obs = row["observed"]
    return {"source": "traced", "status": "ok", **{k: obs[k] for k in ("peak_bytes", "peak_phase", "phases")}}


def render_trace(traced: dict) -> str:
    """Traced per-phase peaks (fake tensors through TRL's real GRPO step), labelled `traced`."""
    from estimator.units import gib

    if traced.get("status") != "ok":
        return f"trace failed: {traced.get('error')}"
    lines = ["traced (TRL GRPO step under fake tensors, tensor bytes):"]
    lines += [f"  {ph:<10}{gib(b):8.2f} GiB  traced" for ph, b in traced["phases"].items()]
    lines.append(f"  {'peak':<10}{gib(traced['peak_bytes']):8.2f} GiB  traced, in {traced['peak_phase']}")
    return "\n".join(lines)


def execute(req: Request) -> tuple[str, int]:
    """Estimate, check fits, advise / solve; returns (stdout text, exit code)."""
    from estimator import advice as adv
    from estimator import gpus, report
    from estimator.estimate import estimate
    from estimator.solve import solve

    def est_fn(c: RunConfig, arch: Arch):
        return estimate(c, arch)

    est = estimate(req.cfg, req.arch)
    fits = [] if req.cfg.device == "cpu" else [report.check_fit(est, g) for g in gpus.GPUS]
    target = report.check_fit(est, req.gpu) if req.gpu is not None else None
    budget = req.gpu.memory_bytes if req.gpu is not None else None
    advice = None
    if req.advice or (target is not None and not target.fits):
        advice = adv.advise(req.cfg, req.arch, est_fn, budget)
    solution = solve(req.cfg, req.arch, req.solve, budget, est_fn) if req.solve else None
    traced = run_trace(req.cfg) if req.trace else None
    code = 0
    if target is not None and not target.fits:
        code = 1
    if solution is not None:
        code = 0 if solution.value is not None else 1
    if req.as_json:
        d = report.to_json(est, fits, target, advice, solution)
        if traced is not None:
            d["trace"] = traced
        return json.dumps(d, indent=2), code
    parts = [report.render(est, fits, target)]
    if advice is not None:
        parts.append(report.render_advice(advice))
    if solution is not None:
        parts.append(report.render_solution(solution))
    if traced is not None:
        parts.append(render_trace(traced))
    return "\n".join(parts), code


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vram-estimate`; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        req = parse(argv)
        for note in req.notes:
            print(f"{PROG}: note: {note}", file=sys.stderr)
        text, code = execute(req)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
