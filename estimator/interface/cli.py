"""`vram-estimate`: how much GPU memory a TRL 1.16 GRPO run needs, what to change to make it fit.

With reward / reference / value models or vLLM it also lays the run out per GPU and per role (estimator/plan/layout.py)
and checks vLLM's start-up the way vLLM does. Exit codes: 0 fits (or no --gpu given), 1 does not fit on --gpu
(the policy's step, a GPU of the layout or vLLM's start-up; or --solve finds nothing), 2 bad input, 3 the answer
could not be written (stdout closed or full).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import textwrap
from dataclasses import dataclass

from estimator.hardware import gpus
from estimator.interface import report
from estimator.interface.flags import TRL_SPELLING_HELP, FlagError, add_run_flags, one_line_error, resolve_run
from estimator.interface.trace_progress import traced_with_progress
from estimator.model import catalog
from estimator.model.architecture import Arch
from estimator.model.catalog import catalog_id
from estimator.plan import advice as adv
from estimator.plan.changes import kernel_runs_on
from estimator.plan.fixes import layout_fixes, own_gpu_fixes, role_moves
from estimator.plan.layout import VllmSettings, failure_on, others_fit_on, plan, starts_on, with_roles
from estimator.plan.solve import SOLVABLE, solve
from estimator.settings import versions
from estimator.settings.config import RunConfig
from estimator.settings.role_spec import config_roles
from estimator.step import band
from estimator.step.band import MIN_MARGIN_LOW, regime_band
from estimator.step.estimate import estimate
from estimator.step.offload import host_ram_short_bytes
from estimator.text import printable
from estimator.units import GIB, gib

PROG = "vram-estimate"
FORMATS = ("text", "markdown", "json")
MAX_LINE = 2000  # the longest note or error line written: each is escaped (one line) and cut past this


class UsageError(ValueError):
    """Bad input: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line and lets main() choose the exit code."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(one_line_error(self, message))


def build_parser() -> argparse.ArgumentParser:
    """The run settings' flags (from the schema, shared with the tracer) and this command's output flags."""
    p = _Parser(
        prog=PROG,
        description="Estimate the GPU memory of one GRPO step with TRL 1.16's GRPOTrainer (every number is estimated).",
        epilog="Exit codes: 0 fits (or no --gpu), 1 does not fit on --gpu / --solve finds nothing, 2 bad input, "
        "3 the answer could not be written (stdout closed or full). "
        + TRL_SPELLING_HELP
        + ". "
        + _band_help(),
        argument_default=argparse.SUPPRESS,
    )
    add_run_flags(p)
    o = p.add_argument_group("output")
    o.add_argument(
        "--gpu", metavar="NAME", help="check one GPU (e.g. H100, A100-40, 4090): exit 0 fits, 1 not"
    )
    o.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="text (default: the answer first, within 80 columns), markdown, or json (the whole breakdown; "
        "schema: docs/estimate.schema.json)",
    )
    o.add_argument("--json", action="store_true", default=False, help="short for --format json")
    o.add_argument(
        "--detail",
        action="store_true",
        default=False,
        help="the full report: every phase, the memory layers from tensor bytes to what the card holds, every "
        "source, the notes, the error band and the settings' files",
    )
    o.add_argument("--advice", action="store_true", default=False, help="show what to change even if it fits")
    o.add_argument(
        "--solve",
        choices=SOLVABLE,
        help="largest value of this setting that fits on --gpu",
    )
    o.add_argument(
        "--trace",
        action="store_true",
        default=False,
        help="also trace a real GRPO step under fake tensors (sweep extra; 30 s or more): the estimate prints "
        "first, progress goes to stderr, a failed trace exits 4",
    )
    o.add_argument(
        "--version",
        action="version",
        version=version_text(),
        help="print the tool's version and the upstream releases it models, then exit",
    )
    return p


def version_text() -> str:
    """`vram-estimate 0.1.0 (grpo-vram); models TRL 0.14-1.16; transformers 5.23-5.24; ...`."""
    from importlib import metadata

    try:
        tool = metadata.version("grpo-vram")
    except metadata.PackageNotFoundError:
        tool = "(not installed: run from a checkout)"
    return f"{PROG} {tool} (grpo-vram); models {versions.describe()}"


@dataclass
class Request:
    """A parsed command line: the run, the GPU to check and what to print."""

    cfg: RunConfig
    arch: Arch
    gpu: object | None
    fmt: str  # one of FORMATS
    advice: bool
    solve: str | None
    trace: bool
    notes: list[str]
    sources: dict = dataclasses.field(default_factory=dict)  # field -> the file / key / flags that set it
    detail: bool = False

    @property
    def as_json(self) -> bool:
        return self.fmt == "json"


def parse(argv: list[str]) -> Request:
    """argv -> Request; UsageError (one line) for anything bad."""
    argv, command = split_command(argv)
    ns = build_parser().parse_args(argv)
    if command is not None:
        if getattr(ns, "from_command", None) is not None:
            raise UsageError("give the command once: --from-command CMD or -- CMD ...")
        ns.from_command = command
    fmt = ns.format or ("json" if ns.json else "text")
    if ns.json and fmt != "json":
        raise UsageError(
            f"--json and --format {fmt} disagree; accepted: one of them (--json = --format json)"
        )
    return request_from(ns, fmt)


def request_from(ns: argparse.Namespace, fmt: str = "text") -> Request:
    """Parsed flags (or the Python API's settings, as a Namespace of RunConfig field names) -> Request."""
    gpu, gpu_note = None, None
    if getattr(ns, "gpu", None) is not None:
        try:
            gpu, gpu_note = gpus.resolve(ns.gpu)  # an ambiguous name: the smaller card, and a note saying so
        except gpus.UnknownGPU as e:
            raise UsageError(str(e)) from None
    try:
        defaults = {"gpu_memory_gib": gpu.memory_gib} if gpu is not None else None
        sources: dict = {}
        cfg, arch, notes = resolve_run(ns, defaults, sources)
    except FlagError as e:
        raise UsageError(str(e)) from None
    if gpu is not None and cfg.gpu_memory_gib is not None:
        check_gpu_memory(gpu, cfg.gpu_memory_gib, sources.get("gpu_memory_gib", "--gpu-memory-gib"))
        cfg = cfg.with_(
            gpu_memory_gib=gpu.memory_gib
        )  # the card checked is the card vLLM sizes its share from
    if gpu is None and getattr(ns, "gpu_memory_gib", None) is not None:  # --gpu-memory-gib N: a card of N GiB
        try:
            gpu = gpus.for_memory_gib(cfg.gpu_memory_gib)
        except gpus.UnknownGPU as e:
            raise UsageError(str(e)) from None
    if gpu_note:
        notes.append(gpu_note)
    if gpu is not None and gpu.overheads_note:
        notes.append(f"{gpu.name}: {gpu.overheads_note}")
    solve = getattr(ns, "solve", None)
    if solve and gpu is None:
        raise UsageError("--solve needs --gpu NAME (the memory to fit in)")
    if solve == "vllm_gpu_memory_utilization" and not (cfg.use_vllm and cfg.vllm_mode == "colocate"):
        raise UsageError("--solve vllm_gpu_memory_utilization needs --use-vllm with --vllm-mode colocate")
    if gpu is not None and cfg.device == "cpu":
        if getattr(ns, "gpu", None) is not None:
            raise UsageError("--gpu checks a GPU, and --device cpu runs without one; drop one of them")
        given = sources.get("gpu_memory_gib", "--gpu-memory-gib")
        raise UsageError(f"{given} sizes a GPU, and --device cpu runs without one; drop one of them")
    return Request(
        cfg,
        arch,
        gpu,
        fmt,
        getattr(ns, "advice", False),
        solve,
        getattr(ns, "trace", False),
        notes,
        sources,
        getattr(ns, "detail", False),
    )


GPU_MEMORY_SLACK_GIB = (
    1.0  # `--gpu H100 --gpu-memory-gib 80`: the marketed size typed for the card's 79.6 GiB
)


def check_gpu_memory(gpu, given_gib: float, where: str) -> None:
    """--gpu names a card and --gpu-memory-gib (or a file's key) its size: they must agree within
    GPU_MEMORY_SLACK_GIB, else vLLM's colocated share would be sized from one card and the fit judged on another."""
    if abs(given_gib - gpu.memory_gib) <= GPU_MEMORY_SLACK_GIB:
        return
    raise UsageError(
        f"--gpu {gpu.name} has {gpu.memory_gib:.1f} GiB but {where} is {given_gib:g}; accepted: one of them "
        f"(--gpu alone checks that card, --gpu-memory-gib alone a card of that many GiB), or sizes within "
        f"{GPU_MEMORY_SLACK_GIB:g} GiB"
    )


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`vram-estimate [flags] -- accelerate launch ...`: the words after the first `--` are a launch command."""
    if "--" not in argv:
        return argv, None
    i = argv.index("--")
    if i + 1 >= len(argv):
        raise UsageError(
            "nothing after '--'; accepted: -- followed by a launch command (accelerate launch ...)"
        )
    return argv[:i], argv[i + 1 :]


SOURCE_FILE = re.compile(r"^(.*?\.(?:ya?ml|json))(?: (.*))?$", re.IGNORECASE)


def render_sources(cfg: RunConfig, sources: dict) -> str | None:
    """Which file (or the command) set which setting, wrapped at 80 columns; None when only flags set any."""
    by: dict[str, list[str]] = {}
    for name, label in sources.items():
        m = SOURCE_FILE.match(label)  # a file's name may hold spaces: split after it, else at the first space
        origin, key = (m.group(1), m.group(2) or "") if m else label.partition(" ")[::2]
        value = getattr(cfg, name, None)
        value = ",".join(value) if isinstance(value, tuple) else value
        by.setdefault(origin, []).append(f"{name}={value}" + (f" ({key})" if key and key != name else ""))
    if not [o for o in by if o != "flags"]:
        return None
    lines = ["settings read from:"]
    for origin, items in by.items():
        lines += textwrap.wrap(
            ", ".join(printable(item, 120) for item in items),
            80,
            initial_indent=f"  {printable(origin, 60)}: ",
            subsequent_indent="      ",
            break_long_words=True,
            break_on_hyphens=False,
        )
    lines.append("  every other setting: TRL's default (--json lists the whole config)")
    return "\n".join(lines)


# entry points: callables (RunConfig, sweep=str[, need=bool]) -> result row
TRACER_GROUP = "grpo_vram.tracers"
TRACE_FAILED = 4  # --trace ran and failed: the estimate above it stands, the traced check does not
REFERENCE_GPU = "RTX 4090"  # the card the short answer checks when no --gpu is given: the one most people own


TRACE_NEEDS = "--trace needs the sweep extra (torch, transformers, trl): pip install 'grpo-vram[sweep]'"


def check_tracer() -> None:
    """Before any output: the tracer's entry point and its modules are installed (found, not imported: importing
    torch is the slow part of a trace); UsageError (one line) where the sweep extra is missing."""
    import importlib.util
    from importlib.metadata import entry_points

    found = list(entry_points(group=TRACER_GROUP))
    if not found:
        raise UsageError(TRACE_NEEDS)
    for module in (found[0].module, "torch", "transformers", "trl"):
        try:
            if importlib.util.find_spec(module) is None:
                raise UsageError(TRACE_NEEDS)
        except (ImportError, ValueError):
            raise UsageError(TRACE_NEEDS) from None


def load_tracer():
    """The sweep extra's tracer (found by entry point); UsageError (one line) where the extra is missing."""
    from importlib.metadata import entry_points

    check_tracer()
    found = list(entry_points(group=TRACER_GROUP))
    try:
        return found[0].load()
    except ImportError:
        raise UsageError(TRACE_NEEDS) from None


def run_trace(cfg: RunConfig, make_row=None) -> dict:
    """Trace real GRPO steps under fake tensors with a tracer found by entry point (the sweep extra's)."""
    make_row = make_row or load_tracer()
    named = catalog_id(cfg.model)  # every size --model accepts, as the catalog id the tracer reads
    import inspect  # here: --trace only, off the estimate's 0.1 s path

    target = cfg.with_(model=named) if named else cfg
    if "need" in inspect.signature(make_row).parameters:  # a tracer that can replay its stream's need
        row = make_row(target, sweep="vram-estimate", need=True)
    else:
        row = make_row(target, sweep="vram-estimate")
    if row.get("status") != "ok":
        return {"source": "traced", "status": row.get("status"), "error": row.get("error")}
    obs = row["observed"]
    out = {"source": "traced", "status": "ok", **{k: obs[k] for k in ("peak_bytes", "peak_phase", "phases")}}
    if obs.get("need"):
        out["need_bytes"] = obs["need"]["min_limit_bytes"]
    return out


def traced_card_bytes(traced: dict, est) -> int | None:
    """What the card must hold by the trace: the smallest allocator limit its stream runs under (traced,
    simulated) + what the estimate puts beside the tensors (the workspaces inside the allocator, the CUDA context
    outside it: estimated); None without a simulated need."""
    need = traced.get("need_bytes")
    if need is None or est is None:
        return None
    return need + est.in_reserved_bytes + est.outside_allocator_bytes


def render_trace(traced: dict, est=None, target=None) -> str:
    """Traced per-phase peaks (fake tensors through TRL's real GRPO step), labelled `traced`, and how far the
    estimated tensor peak is from the traced one; with the traced card figure, how far the estimate is above it and,
    for a `--gpu` target (a `report.Fit`), whether the run fits that card by the trace. The exit code stays the
    estimate's verdict, the side that errs high."""
    if traced.get("status") != "ok":
        return f"trace failed: {traced.get('error')}"
    lines = ["traced (TRL GRPO step under fake tensors, tensor bytes):"]
    lines += [f"  {ph:<10}{gib(b):8.2f} GiB  traced" for ph, b in traced["phases"].items()]
    lines.append(f"  {'peak':<10}{gib(traced['peak_bytes']):8.2f} GiB  traced, in {traced['peak_phase']}")
    if est is not None and traced["peak_bytes"]:
        off = (est.peak_allocated_bytes - traced["peak_bytes"]) / traced["peak_bytes"] * 100
        lines.append(
            f"  the estimated tensor peak ({gib(est.peak_allocated_bytes):.2f} GiB) is {off:+.1f}% off it"
        )
    card = traced_card_bytes(traced, est)
    if card is not None:
        above = (est.fit_bytes - card) / card * 100
        lines += [
            f"  {'need':<10}{gib(traced['need_bytes']):8.2f} GiB  traced, simulated (smallest allocator limit)",
            f"  {'card':<10}{gib(card):8.2f} GiB  + workspaces, CUDA context (estimated)",
            f"  the estimate ({gib(est.fit_bytes):.2f} GiB) is {above:+.1f}% off the traced card",
        ]
        if target is not None and not target.blocked:
            free = target.free_bytes + est.fit_bytes - card  # the estimate's fit there, its excess given back
            verdict = f"fits, {gib(free):.2f} GiB spare" if free >= 0 else f"{gib(-free):.2f} GiB short"
            lines.append(f"  by the trace: {target.gpu.name} {verdict} (traced, simulated)")
    return "\n".join(lines)


@dataclass
class Answer:
    """Everything one request computed; `render` writes it as text or markdown, `to_json` as the JSON answer.

    `reference` / `reference_advice`: without --gpu, the fit on REFERENCE_GPU and (where it does not fit and the
    run has no other roles or vLLM) the smallest change that makes it fit: shown in the short answer only."""

    req: Request
    est: object  # estimator.step.estimate.Estimate
    fits: list
    target: object | None
    advice: object | None
    solution: object | None
    layout: object | None
    fixes: list[str]
    code: int
    reference: object | None = None
    traced: dict | None = None
    advise_for: object = (
        None  # budget bytes -> Advice (the run's own estimate function), for reference_advice
    )
    _reference_advice: object = None

    @property
    def reference_advice(self):
        """Without --gpu: the smallest change that makes the run fit REFERENCE_GPU where it does not and the run
        has no other roles or vLLM (computed when the short answer first asks for it)."""
        ref = self.reference
        if ref is None or ref.fits or self.layout is not None or self.advise_for is None:
            return None
        if self._reference_advice is None:
            self._reference_advice = self.advise_for(ref.gpu.usable_bytes)
        return self._reference_advice


def compute(req: Request) -> Answer:
    """Estimate, lay out every role and vLLM per GPU, check fits, advise / solve.

    Models beside the policy (reward / reference / value) placed on the training GPUs are part of the estimate
    that the fit checks, advice and --solve see (`layout.with_roles`); the layout (present with roles or vLLM)
    adds the per-GPU, per-role bytes, the GPU count and vLLM's own start-up checks.
    """

    def policy_fn(c: RunConfig, arch: Arch):
        return estimate(c, arch)

    cfg = req.cfg
    roles = config_roles(cfg)
    # Advice and --solve size every role for each candidate change: resolve each role's model once per answer.
    arch_of = functools.lru_cache(maxsize=None)(catalog.resolve_model)
    est_fn = with_roles(policy_fn, roles, arch_of) if roles else policy_fn
    est = est_fn(cfg, req.arch)

    def layout_on(c: RunConfig, total: int):
        return plan(estimate(c, req.arch), roles, VllmSettings.of(c), arch_of, total, policy_fn)

    host_short = host_ram_short_bytes(cfg, req.arch)  # a second verdict: offload and loading need host RAM
    host_blocked = (
        f"host RAM ({gib(host_short):.1f} GiB short of --host-ram {cfg.host_ram_gib:g})" if host_short else ""
    )

    def host_fits(c: RunConfig, arch: Arch) -> bool:
        return host_ram_short_bytes(c, arch) == 0

    def fit_on(g):
        """The step on card `g` (a colocated vLLM takes its share of that card), blocked if the layout fails."""
        c, e = cfg, est
        if cfg.use_vllm and cfg.vllm_mode == "colocate" and cfg.gpu_memory_gib != g.memory_gib:
            c = cfg.with_(gpu_memory_gib=g.memory_gib)
            e = est_fn(c, req.arch)
        fit = report.check_fit(e, g)
        if roles or cfg.use_vllm:  # the training GPU's bytes are the step's own, already in free_bytes
            why = [
                b for b in layout_on(c, g.usable_bytes).blockers if b != "training GPU" or fit.free_bytes >= 0
            ]
            fit = dataclasses.replace(fit, blocked=", ".join(why))
        if host_blocked:
            fit = dataclasses.replace(fit, blocked=", ".join(filter(None, (fit.blocked, host_blocked))))
        return fit

    fits = [] if cfg.device == "cpu" else [fit_on(g) for g in gpus.GPUS]
    target = fit_on(req.gpu) if req.gpu is not None else None
    # what torch can use (report.FIT_BASIS); candidates are compared by Estimate.fit_bytes (band included)
    budget = req.gpu.usable_bytes if req.gpu is not None else None
    layout, fixes, starts_fn, others_fn = None, [], None, None
    if roles or cfg.use_vllm:
        total = req.gpu.usable_bytes if req.gpu is not None else int((cfg.gpu_memory_gib or 80.0) * GIB)
        layout = layout_on(cfg, total)
        failure = failure_on(roles, arch_of, total)
        fixes = (
            layout_fixes(layout, cfg, lambda c: failure(c, req.arch))
            + role_moves(layout)
            + own_gpu_fixes(layout)
        )
        starts_fn = starts_on(roles, arch_of, total) if cfg.use_vllm else None
        others_fn = others_fit_on(roles, arch_of, total)
        if not layout.fits:
            budget = total
    fails = (target is not None and not target.fits) or (layout is not None and not layout.fits)
    host_fn = host_fits if cfg.host_ram_gib else None
    advice = None
    if req.advice or fails:  # a change fits only if the whole layout then does: vLLM starts, every GPU holds,
        # and the host holds what it offloads and loads (--host-ram)
        kernel_fn = kernel_runs_on(req.gpu.sm if req.gpu is not None else None, cfg)
        held = _both(_both(others_fn, host_fn), kernel_fn)
        advice = adv.advise(cfg, req.arch, est_fn, budget, starts=starts_fn, others_fit=held)
    solution = (
        solve(cfg, req.arch, req.solve, budget, est_fn, starts_fn, others_fn, host_fits=host_fn)
        if req.solve
        else None
    )
    code = 1 if req.gpu is not None and fails else 0
    if solution is not None:
        code = 0 if solution.value is not None else 1
    reference = None
    if req.gpu is None and fits:
        reference = next((f for f in fits if f.gpu.name == REFERENCE_GPU), None)
    return Answer(
        req,
        est,
        fits,
        target,
        advice,
        solution,
        layout,
        fixes,
        code,
        reference,
        advise_for=lambda budget: adv.advise(cfg, req.arch, est_fn, budget),
    )


def _both(a, b):
    """The check `a(c, arch) and b(c, arch)` of two optional checks (None: not checked)."""
    if a is None or b is None:
        return a or b
    return lambda c, arch: a(c, arch) and b(c, arch)


def to_json(ans: Answer) -> dict:
    """The JSON answer (docs/json-output.md; schema docs/estimate.schema.json, version SCHEMA_VERSION)."""
    d = {
        "schema_version": report.SCHEMA_VERSION,
        "verdict": report.verdict(ans.est, ans.fits, ans.target, ans.reference),
    }
    d.update(report.to_json(ans.est, ans.fits, ans.target, ans.advice, ans.solution, ans.layout, ans.fixes))
    d["band"] = band.to_json(ans.req.cfg)
    if ans.req.sources:
        d["settings_from"] = ans.req.sources
    if ans.traced is not None:
        d["trace"] = dict(ans.traced)
        card = traced_card_bytes(ans.traced, ans.est)
        if card is not None:
            d["trace"]["card_bytes"] = card
    return d


def detail_text(ans: Answer) -> str:
    """The full report (--detail): every phase, the memory layers, every source, notes, band, layout, advice."""
    req, cfg = ans.req, ans.req.cfg
    parts = [report.render(ans.est, ans.fits, ans.target), band.describe(cfg)]
    if (block := render_sources(cfg, req.sources)) is not None:
        parts.append(block)
    if ans.layout is not None:
        parts.append(report.render_layout(ans.layout, ans.fixes))
    if ans.advice is not None:
        if ans.advice.baseline_starts is False:
            parts.append(
                "(vLLM fails before the first step: a change fits only if vLLM then starts too, by its own "
                "checks; each change says whether it does)"
            )
        parts.append(report.render_advice(ans.advice))
    if ans.solution is not None:
        parts.append(report.render_solution(ans.solution))
    return report.wrap_long("\n".join(parts))


def short_text(ans: Answer, markdown: bool = False) -> str:
    """The answer a person reads first (report.short): verdict, the change that makes it fit, where it goes."""
    files = sorted({label.partition(" ")[0] for label in ans.req.sources.values()} - {"flags"})
    return report.short(
        ans.est,
        ans.fits,
        target=ans.target,
        reference=ans.reference,
        advice=ans.advice,
        reference_advice=ans.reference_advice,
        show_all_advice=ans.req.advice,
        solution=ans.solution,
        layout=ans.layout,
        fixes=ans.fixes,
        files=files,
        markdown=markdown,
    )


def render(ans: Answer) -> str:
    """The answer in the request's format (text or markdown; --detail for the full report)."""
    fmt, detail = ans.req.fmt, ans.req.detail
    if fmt == "json":
        return json.dumps(to_json(ans), indent=2)
    if detail:
        text = detail_text(ans)
        return f"```\n{text}\n```" if fmt == "markdown" else text
    return short_text(ans, markdown=fmt == "markdown")


def execute(req: Request) -> tuple[str, int]:
    """compute + render, with the trace (if asked) run first: (stdout text, exit code). `main` prints the
    estimate before a trace instead."""
    ans = compute(req)
    if req.trace:
        ans.traced = run_trace(req.cfg)
    text = render(ans)
    if ans.traced is not None and req.fmt != "json":
        text += "\n" + render_trace(ans.traced, ans.est, ans.target)
    return text, ans.code


def _band_help() -> str:
    b = band.band()
    per = ", ".join(f"{name} {r['low'] * 100:+.1f}%" for name, r in b["regimes"].items())
    return (
        f" Error band: the worst under-prediction per regime on {regime_band()[1]['n']} off-grid traces "
        f"({b['source']}): {per}; --gpu, --solve, the advice and the fits list raise the estimated tensor "
        f"peak by the band of the config's regime, at least {-MIN_MARGIN_LOW * 100:.0f}% (estimator/step/band.py)."
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vram-estimate`; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    for stream in (sys.stdout, sys.stderr):  # a name the locale cannot encode (LANG=C) is escaped, not fatal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        req = parse(argv)
        if req.trace:  # bad input before any output
            check_tracer()
        for note in req.notes:  # escaped here too: a note may quote a user's file or environment
            say(f"{PROG}: note: {printable(note, MAX_LINE)}")
        ans = compute(req)
        if not req.trace:
            return write_answer(render(ans), ans.code)
        if req.fmt != "json":  # the estimate first: the trace takes half a minute or more
            code = write_answer(render(ans), ans.code)
            if code == NOT_WRITTEN:
                return code

        ans.traced = traced_with_progress(req.cfg, load_tracer, run_trace, sys.stderr)
    except UsageError as e:
        say(f"{PROG}: error: {printable(str(e), MAX_LINE)}")
        return 2
    failed = ans.traced.get("status") != "ok"
    text = render(ans) if req.fmt == "json" else render_trace(ans.traced, ans.est, ans.target)
    if failed and req.fmt != "json":
        text = None
    if text is not None:
        code = write_answer(text, ans.code)
        if code == NOT_WRITTEN:
            return code
    if failed:
        say(f"{PROG}: error: the trace failed: {ans.traced.get('error')}")
        return TRACE_FAILED
    return ans.code


def say(line: str) -> None:
    """One line on stderr; nothing when stderr itself cannot be written (closed, full): the exit code still says."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


NOT_WRITTEN = 3  # the answer could not be written: not a verdict, so neither 0 (fits) nor 1 (does not fit)


def write_answer(text: str, code: int) -> int:
    """Print the answer; `code`, or NOT_WRITTEN with one stderr line when stdout is closed or full. A reader that
    left (`| head -1`) took what it wanted: no message then (the Python docs' recipe, library/signal.html
    #note-on-sigpipe, pointing stdout at /dev/null so the interpreter's final flush is quiet)."""
    out = sys.stdout
    if out is None:  # started with stdout closed (`>&-`)
        say(f"{PROG}: error: stdout is closed; the answer was not written")
        return NOT_WRITTEN
    try:
        print(text, file=out)
        out.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return NOT_WRITTEN
    except (OSError, ValueError) as e:  # a full disk (ENOSPC), a closed descriptor (EBADF)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, ValueError):
            pass
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        say(f"{PROG}: error: could not write the answer to stdout ({reason})")
        return NOT_WRITTEN
    return code


if __name__ == "__main__":
    sys.exit(main())
