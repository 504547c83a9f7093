"""`vram-estimate`: how much GPU memory a TRL 1.16 GRPO run needs, what to change to make it fit.

Exit codes: 0 fits (or no --gpu given), 1 does not fit on --gpu (or --solve finds nothing), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from estimator.architecture import Arch, ConfigError
from estimator.config import (
    ATTN_IMPLEMENTATIONS,
    DEFAULT,
    DEVICES,
    LOGPROB_HEADS,
    OPTIMIZERS,
    VLLM_MODES,
    RunConfig,
)

PROG = "vram-estimate"
DTYPE_CHOICES = ("float32", "bfloat16", "float16", "auto")


class UsageError(ValueError):
    """Bad input: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line and lets main() choose the exit code."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def _d(name: str) -> str:
    """'(TRL default: X)' taken from RunConfig."""
    return f"(default: {getattr(DEFAULT, name)})"


def _dtype(value: str) -> str:
    from estimator.configfile import normalize_dtype

    v = normalize_dtype(value)
    if v not in DTYPE_CHOICES:
        raise argparse.ArgumentTypeError(f"invalid dtype {value!r}; accepted: {', '.join(DTYPE_CHOICES)}")
    return v


def _targets(values: list[str]) -> tuple[str, ...]:
    """['q_proj,k_proj', 'v_proj'] -> ('q_proj', 'k_proj', 'v_proj')."""
    return tuple(t for v in values for t in v.split(",") if t)


def build_parser() -> argparse.ArgumentParser:
    """Flags with TRL 1.16's names; run settings default to 'not given' so --config values can show through."""
    p = _Parser(
        prog=PROG,
        description="Estimate the GPU memory of one GRPO step with TRL 1.16's GRPOTrainer (every number is estimated).",
        epilog="Exit codes: 0 fits (or no --gpu), 1 does not fit on --gpu / --solve finds nothing, 2 bad input. "
        + _band_help(),
        argument_default=argparse.SUPPRESS,
    )
    bool_flag = argparse.BooleanOptionalAction
    m = p.add_argument_group("model")
    m.add_argument(
        "--model",
        help="size (0.5B 1.5B 3B 7B 14B 32B 72B = Qwen2.5-Instruct), catalog name or HF id (e.g. qwen3-8b, "
        f"meta-llama/Llama-3.1-8B-Instruct), a config.json (or its folder), or an HF id in the local HF cache {_d('model')}",
    )
    m.add_argument(
        "--dtype",
        type=_dtype,
        metavar="{" + ",".join(DTYPE_CHOICES) + "}",
        help=f"weight dtype the model loads in (auto = config's) {_d('dtype')}",
    )
    m.add_argument("--attn-implementation", choices=ATTN_IMPLEMENTATIONS, help=_d("attn_implementation"))
    m.add_argument("--use-peft", "--lora", action=bool_flag, help=f"LoRA via PEFT {_d('use_peft')}")
    m.add_argument("--lora-r", type=int, metavar="N", help=_d("lora_r"))
    m.add_argument(
        "--lora-target-modules",
        nargs="+",
        metavar="MODULE",
        help="module names (space or comma separated) or all-linear (default: PEFT's default for the model)",
    )
    m.add_argument("--load-in-4bit", action=bool_flag, help=f"bitsandbytes NF4 base {_d('load_in_4bit')}")
    m.add_argument("--qlora", action="store_true", help="= --use-peft --load-in-4bit")
    g = p.add_argument_group("GRPOConfig")
    g.add_argument("--num-generations", "--gens", type=int, metavar="N", help=_d("num_generations"))
    g.add_argument(
        "--per-device-train-batch-size", type=int, metavar="N", help=_d("per_device_train_batch_size")
    )
    g.add_argument(
        "--gradient-accumulation-steps", type=int, metavar="N", help=_d("gradient_accumulation_steps")
    )
    g.add_argument("--max-completion-length", type=int, metavar="N", help=_d("max_completion_length"))
    g.add_argument(
        "--max-prompt-length",
        type=int,
        metavar="N",
        help="the prompt length you expect: TRL 1.16 has no such option and never truncates prompts "
        f"{_d('max_prompt_length')}",
    )
    g.add_argument(
        "--steps-per-generation", type=int, metavar="N", help="(default: gradient_accumulation_steps)"
    )
    g.add_argument(
        "--generation-batch-size",
        type=int,
        metavar="N",
        help="(default: per_device_train_batch_size x GPUs x steps)",
    )
    g.add_argument("--num-iterations", type=int, metavar="N", help=_d("num_iterations"))
    g.add_argument(
        "--beta", type=float, metavar="X", help=f"KL weight; > 0 adds a reference model {_d('beta')}"
    )
    g.add_argument("--gradient-checkpointing", action=bool_flag, help=_d("gradient_checkpointing"))
    g.add_argument("--bf16", action=bool_flag, help=f"bf16 autocast {_d('bf16')}")
    g.add_argument("--optim", choices=OPTIMIZERS, help=_d("optim"))
    g.add_argument("--cast-lm-head-to-fp32", action=bool_flag, help=_d("cast_lm_head_to_fp32"))
    g.add_argument("--use-vllm", action=bool_flag, help=_d("use_vllm"))
    g.add_argument("--vllm-mode", choices=VLLM_MODES, help=_d("vllm_mode"))
    g.add_argument(
        "--vllm-gpu-memory-utilization", type=float, metavar="X", help=_d("vllm_gpu_memory_utilization")
    )
    g.add_argument("--vllm-enable-sleep-mode", action=bool_flag, help=_d("vllm_enable_sleep_mode"))
    h = p.add_argument_group("hardware and estimator")
    h.add_argument(
        "--logprob-head",
        choices=LOGPROB_HEADS,
        help=f"TRL's fused chunked head or full logits {_d('logprob_head')}",
    )
    h.add_argument("--device", choices=DEVICES, help=_d("device"))
    h.add_argument("--gpus", type=int, metavar="N", help="number of GPUs (processes) (default: 1)")
    h.add_argument("--zero", type=int, choices=(2, 3), help="DeepSpeed ZeRO stage over --gpus")
    h.add_argument("--fsdp", action="store_true", help="FSDP full shard over --gpus")
    h.add_argument(
        "--gpu", metavar="NAME", help="check one GPU (e.g. H100, A100-40, 4090): exit 0 fits, 1 not"
    )
    o = p.add_argument_group("output")
    o.add_argument("--config", metavar="FILE", help="TRL GRPOConfig YAML/JSON; flags override it")
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


FLAG_FIELDS = {
    "gpus": "num_gpus",
}


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


def to_fields(ns: argparse.Namespace) -> dict:
    """RunConfig field values given on the command line (only those given)."""
    given = vars(ns).copy()
    for key in ("config", "json", "advice", "solve", "trace", "gpu"):
        given.pop(key, None)
    out: dict = {}
    if given.pop("qlora", False):
        out.update(use_peft=True, load_in_4bit=True)
    zero, fsdp = given.pop("zero", None), given.pop("fsdp", False)
    if zero and fsdp:
        raise UsageError("--zero and --fsdp are alternatives; give one")
    if zero:
        out["sharding"] = f"zero{zero}"
    elif fsdp:
        out["sharding"] = "fsdp"
    if "lora_target_modules" in given:
        given["lora_target_modules"] = _targets(given["lora_target_modules"])
    for k, v in given.items():
        out[FLAG_FIELDS.get(k, k)] = v
    return out


def resolve_dtype(values: dict, arch: Arch) -> None:
    """dtype 'auto' = the checkpoint's torch_dtype/dtype (transformers 'auto'), float32 if the config has none."""
    if values.get("dtype") != "auto":
        return
    from estimator.configfile import normalize_dtype

    cfg = (arch.extra or {}).get("config", {})
    values["dtype"] = normalize_dtype(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def parse(argv: list[str]) -> Request:
    """argv -> Request; UsageError (one line) for anything bad."""
    from estimator import catalog, gpus
    from estimator.configfile import ConfigFileError, read_config_file
    from estimator.validate import InvalidConfig, validate

    ns = build_parser().parse_args(argv)
    values: dict = {}
    notes: list[str] = []
    if getattr(ns, "config", None):
        try:
            settings = read_config_file(ns.config)
        except ConfigFileError as e:
            raise UsageError(str(e)) from None
        values.update(settings.values)
        notes += settings.notes
    cli_values = to_fields(ns)
    if cli_values.get("use_peft") is False and cli_values.get("load_in_4bit"):
        raise UsageError("--qlora/--load-in-4bit needs PEFT; drop --no-use-peft")
    values.update(cli_values)
    model = values.get("model", DEFAULT.model)
    try:
        arch = catalog.resolve_model(model)
    except (catalog.UnknownModel, ConfigError) as e:
        raise UsageError(str(e)) from None
    resolve_dtype(values, arch)
    gpu = None
    if getattr(ns, "gpu", None):
        try:
            gpu = gpus.lookup(ns.gpu)
        except gpus.UnknownGPU as e:
            raise UsageError(str(e)) from None
        values.setdefault("gpu_memory_gib", gpu.memory_gib)
    try:
        cfg = RunConfig.from_dict({"model": model, **values})
        validate(cfg, arch)
    except InvalidConfig as e:
        raise UsageError(str(e)) from None
    except TypeError as e:
        raise UsageError(f"bad setting: {e}") from None
    solve = getattr(ns, "solve", None)
    if solve and gpu is None:
        raise UsageError("--solve needs --gpu NAME (the memory to fit in)")
    if gpu is not None and cfg.device == "cpu":
        raise UsageError("--gpu checks a GPU; drop it with --device cpu")
    return Request(cfg, arch, gpu, ns.json, ns.advice, solve, ns.trace, notes)


def run_trace(cfg: RunConfig) -> dict:
    """Trace real GRPO steps under fake tensors with the sweep extra (`sweeps.trace.cli.make_row`), lazily."""
    import importlib.util

    need = "--trace needs the sweep extra (torch, transformers, trl): pip install 'grpo-vram[sweep]'"
    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "trl")):
        raise UsageError(need)
    try:
        from sweeps.trace.cli import make_row
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
    from estimator import band, gpus, report
    from estimator.estimate import estimate
    from estimator.solve import solve

    def est_fn(c: RunConfig, arch: Arch):
        return estimate(c, arch)

    est = estimate(req.cfg, req.arch)
    fits = [] if req.cfg.device == "cpu" else [report.check_fit(est, g) for g in gpus.GPUS]
    target = report.check_fit(est, req.gpu) if req.gpu is not None else None
    budget = band.usable_bytes(req.gpu.memory_bytes) if req.gpu is not None else None  # safe side of the band
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
        d["band"] = {**band.band(), "margin": band.margin()}
        if traced is not None:
            d["trace"] = traced
        return json.dumps(d, indent=2), code
    parts = [report.render(est, fits, target), band.describe()]
    if advice is not None:
        parts.append(report.render_advice(advice))
    if solution is not None:
        parts.append(report.render_solution(solution))
    if traced is not None:
        parts.append(render_trace(traced))
    return "\n".join(parts), code


def _band_help() -> str:
    from estimator.band import describe

    return describe()


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
