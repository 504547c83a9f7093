"""One GRPO run in its own process: `python -m sweeps.runner.run_one <spec.json>` writes a result JSON.

Under torch's launcher (a config on several GPUs) every rank runs this and writes its own result
(`sweeps/runner/ranks.py`). The spec is {"config": RunConfig dict, "variant": {...}, "probes": [...], "result_path": str, "workdir": str,
"inject_failure": null|"raise"|"oom"|"kill"|"hang", "memory_limit_bytes": null|int,
"simulated_need_bytes": null|int (test double)}. The result holds status/error, model, observed, step_seconds,
lengths, versions and device, and `memory_limit` when the spec set one (`runner/memory_limit.py`); the sweep app
turns it into a row.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

PROBES = ("tensors", "torch_cuda", "nvml", "host", "history")
DEFAULT_PROBES = ("tensors", "torch_cuda", "nvml")  # `history` writes a stream file: only when asked for


def _set_offline_env(device: str) -> None:
    """No telemetry anywhere; no hub on CPU (models come from disk) — set before trl is imported."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _is_oom(exc: BaseException) -> bool:
    """CUDA OOM, or a host allocation failure."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc)
    return "out of memory" in msg.lower() or "can't allocate memory" in msg


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message` (at most 300 characters)."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}".strip()
    return text[:300]


def _inject(kind: str | None) -> None:
    """Fail on purpose (tests): raise, raise a CUDA-style OOM, kill this process, or hang."""
    if not kind:
        return
    if kind == "raise":
        raise RuntimeError("injected failure")
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. (injected)")
    if kind == "kill":
        os.kill(os.getpid(), 9)
    if kind == "hang":
        time.sleep(10**6)
    raise ValueError(f"inject_failure={kind!r}: accepted values are raise, oom, kill, hang")


def _make_probes(names: list[str], device: str, spec: dict | None = None) -> dict:
    """Probe objects by name; probes that cannot apply on this device are skipped (nvml reports why)."""
    probes: dict = {}
    for name in names:
        if name == "tensors":
            from sweeps.probes.tensors import LiveStorageMode

            probes[name] = LiveStorageMode(round_to=512 if device == "cuda" else 1, record_events=True)
        elif name == "torch_cuda":
            from sweeps.probes.torch_cuda import TorchCudaProbe

            probes[name] = TorchCudaProbe()
        elif name == "nvml":
            from sweeps.probes.nvml import make_probe

            probes[name] = make_probe(interval=0.01)
        elif name == "history":
            from sweeps.probes.allocator_history import make_probe as history_probe

            probes[name] = history_probe(spec or {"config": {}})
        elif name == "host":
            from sweeps.probes.host import make_probe as make_host_probe

            probes[name] = make_host_probe(device, interval=0.01)
        else:
            raise ValueError(f"probe {name!r}: accepted values are {', '.join(PROBES)}")
    return probes


def _history_begin(spec: dict, device: str):
    """Where the `history` probe is asked for on CUDA: its start, run before the model is loaded (else None)."""
    if "history" not in spec.get("probes", ()) or device != "cuda":
        return None
    from sweeps.probes.allocator_history import begin

    return functools.partial(begin, (spec.get("probe_options") or {}).get("history"))


class _StepLabel:
    """Forwards the training step number to probes that keep per-step peaks."""

    def __init__(self, probes):
        self.probes = [p for p in probes if hasattr(p, "set_step")]

    def __call__(self, step: int) -> None:
        for p in self.probes:
            p.set_step(step)


def _observed(cfg_device: str, results: dict, phase_names: tuple[str, ...]) -> dict:
    """observed = {source, peak_bytes, peak_phase, phases, probes}, from the probe that defines the peak."""
    source = "measured-gpu" if cfg_device == "cuda" else "measured-cpu"
    main = None
    if cfg_device == "cuda" and results.get("torch_cuda", {}).get("available"):
        tc = results["torch_cuda"]
        main = {"peak_bytes": tc["peak_allocated_bytes"], "phases": tc["phases"]}
    elif "tensors" in results:
        main = {"peak_bytes": results["tensors"]["peak_bytes"], "phases": results["tensors"]["phases"]}
    obs = {"source": source, "peak_bytes": None, "peak_phase": None, "phases": {}, "probes": results}
    if main is not None:
        phases = {p: int(main["phases"][p]) for p in phase_names if p in main["phases"]}
        obs["peak_bytes"] = int(main["peak_bytes"])
        allp = main["phases"]
        obs["peak_phase"] = max(allp, key=lambda p: allp[p]) if allp else None
        obs["phases"] = phases
    return obs


def _lengths(log_history: list[dict]) -> dict:
    """Completion lengths the trainer logged per step (mean / max / clipped ratio)."""
    keys = (
        "completions/mean_length",
        "completions/max_length",
        "completions/min_length",
        "completions/clipped_ratio",
    )
    out: dict[str, list] = {}
    for entry in log_history:
        for k in keys:
            if k in entry:
                out.setdefault(k.split("/")[1], []).append(entry[k])
    return out


def execute(spec: dict) -> dict:
    """Build the trainer, run the steps under the probes, return the result dict (raises on failure)."""
    _inject(spec.get("inject_failure"))
    from estimator.settings.config import RunConfig
    from estimator.settings.versions import default_transformers
    from sweeps.probes import phases as phase_hooks
    from sweeps.records import environment_info
    from sweeps.runner import deepspeed_config, grpo_setup, memory_limit

    # a spec that names no transformers release measures the installed one
    cfg = RunConfig.from_dict({"transformers_version": default_transformers(), **spec["config"]})
    variant = {**grpo_setup.VARIANT_DEFAULTS, **spec.get("variant", {})}
    env = environment_info(cfg.device)
    workdir = Path(spec.get("workdir") or tempfile.mkdtemp(prefix="grpo-vram-run-"))
    limit_seen = memory_limit.apply(spec, cfg.device)  # before the model touches the GPU
    built = grpo_setup.build(cfg, variant, workdir, after_context=_history_begin(spec, cfg.device))
    trainer = built.trainer
    base_params, trainable = grpo_setup.count_params(trainer.model)
    loaded = None
    if cfg.device == "cuda":  # before any probe resets the peaks: what loading and the trainer's set-up left
        from sweeps.probes.torch_cuda import after_build

        loaded = after_build()

    probes = _make_probes(list(spec.get("probes", DEFAULT_PROBES)), cfg.device, spec)
    tracker = phase_hooks.PhaseTracker(list(probes.values()))
    step_seconds: list[float] = []
    phase_hooks.install(trainer, tracker, step_seconds)
    if deepspeed_config.uses_deepspeed(cfg.sharding):
        deepspeed_config.install_step_phase(trainer, tracker)
    shapes: list[dict] = []
    original = trainer._generate_and_score_completions

    def record_shapes(*args, **kwargs):
        out = original(*args, **kwargs)
        shapes.append(
            {"prompt": list(out["prompt_ids"].shape), "completion": list(out["completion_ids"].shape)}
        )
        return out

    trainer._generate_and_score_completions = record_shapes
    step_label = _StepLabel(probes.values())
    from transformers import TrainerCallback

    class StepCallback(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            step_label(state.global_step + 1)

    trainer.add_callback(StepCallback())

    tensors = probes.get("tensors")
    if tensors is not None:
        tensors.register(trainer.model)
        if getattr(trainer, "ref_model", None) is not None:
            tensors.register(trainer.ref_model)
    for name, p in probes.items():
        if name != "tensors":
            p.start()
    t0 = time.perf_counter()
    try:
        if tensors is not None:
            with tensors:
                trainer.train()
        else:
            trainer.train()
    finally:
        for name, p in probes.items():
            if name != "tensors":
                p.stop()
    train_seconds = time.perf_counter() - t0

    results = {name: p.result() for name, p in probes.items()}
    if "tensors" in results:
        results["tensors"].pop("phase_at_peak", None)
        from estimator.hardware.allocator import simulate

        # the caching allocator's reserve for the stream the probe saw (simulated)
        results["tensors"]["allocator"] = simulate(tensors.events).to_dict()
    obs = _observed(cfg.device, results, phase_hooks.PHASES)
    obs["shapes"] = shapes
    obs["phases_seen"] = tracker.seen
    obs["cuda_context"] = built.info.get("cuda_context")
    obs["after_build"] = loaded
    return {
        "status": "ok",
        "error": None,
        "model": {
            "name": cfg.model,
            "params": base_params,
            "trainable_params": trainable,
            "config": built.hf_config,
        },
        "observed": obs,
        "step_seconds": step_seconds,
        "train_seconds": round(train_seconds, 3),
        "lengths": _lengths(trainer.state.log_history),
        **({"memory_limit": limit_seen} if limit_seen["limit_bytes"] is not None else {}),
        **env,
    }


def _abandon(spec: dict) -> None:
    """The sweep that started this run is gone: remove the work dir (unless kept) and end this process group."""
    if spec.get("remove_workdir_if_orphaned") and spec.get("workdir"):
        shutil.rmtree(spec["workdir"], ignore_errors=True)
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # this run and anything it started (its own session)
    finally:
        os._exit(1)


def die_with_parent(spec: dict, interval: float = 0.5) -> None:
    """Never outlive the sweep: on its parent-death SIGTERM (Linux prctl, set by the sweep) or when a watchdog
    thread sees the parent pid change (any OS), clean up and exit. No-op when the spec names no parent."""
    parent = spec.get("parent_pid")
    if not parent:
        return

    def on_term(*_):
        _abandon(spec)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        _abandon(spec)

    threading.Thread(target=watch, name="grpo-vram-parent-watchdog", daemon=True).start()
    if os.getppid() != parent:
        _abandon(spec)


def write_json(path: str | os.PathLike, obj: dict) -> None:
    """Write JSON atomically (temp file in the same directory, then os.replace)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, default=str))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the spec given as a path (or inline JSON); write the result; exit 0 when a result was written."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m sweeps.runner.run_one <spec.json>", file=sys.stderr)
        return 2
    arg = argv[0]
    spec = json.loads(arg) if arg.lstrip().startswith("{") else json.loads(Path(arg).read_text())
    die_with_parent(spec)
    from sweeps.runner import ranks

    ranks.narrow_to_local_rank(os.environ, spec["config"].get("device", "cuda"))  # before torch is imported
    _set_offline_env(spec["config"].get("device", "cuda"))
    from sweeps.runner.deepspeed_config import prepare_process

    prepare_process(spec["config"])  # ZeRO: a world of one process, before TRL / accelerate are imported
    if (spec.get("variant") or {}).get("weights") == "random":  # built from the catalog: never the hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = execute(spec)
    except BaseException as exc:  # one run's failure is its outcome, never a crash of the sweep
        if isinstance(exc, KeyboardInterrupt):
            raise
        traceback.print_exc(file=sys.stderr)
        result = {"status": "oom" if _is_oom(exc) else "error", "error": one_line(exc)}
        if spec.get("memory_limit_bytes") is not None:
            from sweeps.runner.memory_limit import peaks_at_failure

            device = spec["config"].get("device", "cuda")
            result["memory_limit"] = {"limit_bytes": spec["memory_limit_bytes"], **peaks_at_failure(device)}
    write_json(ranks.result_path(spec["result_path"]), result)  # one file per rank under torch's launcher
    return 0


if __name__ == "__main__":
    sys.exit(main())
