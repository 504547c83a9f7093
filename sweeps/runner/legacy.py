"""Real GRPO steps under an old TRL release, on CPU, with the tensor probe: `make sweep-legacy`.

Run with a release's own virtual environment (sweeps/legacy/envs.sh builds .venvs/trl-X.Y) and this repo on
PYTHONPATH: `python -m sweeps.runner.legacy --out results/raw/legacy.jsonl`. The installed TRL decides the
release; the grid is a few tiny-2M configurations in that release's own terms (its defaults for beta, bf16 and
gradient checkpointing; in 0.14 per_device_train_batch_size counts prompts). Each configuration runs 2 steps in
a fresh subprocess (`--one SPEC`); the parent appends one row per configuration atomically (records.append_row)
and skips keys already in the file, so a rerun resumes. The row's config is the estimator's RunConfig for
that release (it carries `trl_version`), so `make accuracy` holds the estimator with the matching profile to it.

Version-tolerant: it imports only the standard library, torch, and what every release since 0.14 has
(GRPOConfig, GRPOTrainer, transformers' Trainer callbacks, PEFT's LoraConfig); GRPOConfig keywords a release
lacks are left out, and completions are forced to full length through `generation_kwargs` where it exists,
else through the trainer's GenerationConfig.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import fields
from importlib import metadata
from pathlib import Path

from sweeps import records
from sweeps.oneline import OneLineParser

STEPS = 2
MODEL = "tiny-2M"
VARIANT = {"steps": STEPS, "prompts": "synthetic", "force_length": True, "seed": 0, "runner": "legacy"}


def installed_trl() -> str:
    """MAJOR.MINOR of the TRL in this environment (package metadata; trl is not imported)."""
    major, minor = metadata.version("trl").split(".")[:2]
    return f"{major}.{minor}"


def grid(version: str) -> dict[str, dict]:
    """name -> settings in the release's own terms (per_device_train_batch_size: prompts in 0.14, else completions)."""
    from estimator.settings.trl_versions import profile

    per_device = 1 if profile(version).batch_unit == "prompts" else 4
    base = {
        "model": MODEL,
        "device": "cpu",
        "per_device_train_batch_size": per_device,
        "num_generations": 4,
        "max_prompt_length": 32,
        "max_completion_length": 32,
        "gradient_accumulation_steps": 1,
        "optim": "adamw_torch",
    }
    out = {"defaults": base, "lora": {**base, "use_peft": True}}
    if profile(version).generation_unit == "micro_batch":  # gradients resident while generating
        out["ga2"] = {**base, "gradient_accumulation_steps": 2}
    return out


def configs(version: str) -> list[tuple[str, dict]]:
    """(name, RunConfig dict with trl_version) per grid point."""
    from estimator.settings.release_config import for_release

    return [(name, for_release(version, given).to_dict()) for name, given in grid(version).items()]


# ---------------------------------------------------------------- one run (in its own process)


def _grpo_config(cfg: dict, outdir: str):
    """GRPOConfig with the settings this release knows (per_device_train_batch_size in its own unit)."""
    from trl import GRPOConfig

    known = {f.name for f in fields(GRPOConfig)}
    per_device = cfg["per_device_train_batch_size"]
    if cfg["trl_version"] == "0.14":  # back to prompts: the config stores completions
        per_device //= cfg["num_generations"]
    kwargs = {
        "output_dir": outdir,
        "use_cpu": True,
        "bf16": cfg["bf16"],
        "fp16": False,
        "report_to": "none",
        "max_steps": STEPS,
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "learning_rate": 1e-5,
        "seed": 0,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": cfg["gradient_accumulation_steps"],
        "num_generations": cfg["num_generations"],
        "max_prompt_length": cfg["max_prompt_length"],
        "max_completion_length": cfg["max_completion_length"],
        "beta": cfg["beta"],
        "gradient_checkpointing": cfg["gradient_checkpointing"],
        "optim": cfg["optim"],
        "num_iterations": cfg["num_iterations"],
        "generation_kwargs": {"min_new_tokens": cfg["max_completion_length"]},
    }
    return GRPOConfig(**{k: v for k, v in kwargs.items() if k in known})


def _force_length(trainer, length: int) -> None:
    """Releases without generation_kwargs: set min_new_tokens on the GenerationConfig the trainer passes."""
    gc = getattr(trainer, "generation_config", None)
    if gc is not None and getattr(gc, "min_new_tokens", None) is None:
        gc.min_new_tokens = length


def _install_phases(trainer, tracker, step_seconds) -> None:
    """Label generate / score / train / optimizer on whatever methods this release has."""
    from sweeps.probes import phases as ph

    ph._wrap(trainer, "training_step", lambda *a, **k: "train", tracker)
    ph._wrap(trainer, "compute_loss", lambda *a, **k: "train", tracker)
    for name in ("_generate_and_score_completions", "_prepare_inputs"):
        if hasattr(trainer, name):
            ph._wrap(trainer, name, lambda *a, **k: "score", tracker)
    for name in ("_get_per_token_logps", "_get_per_token_logps_and_entropies"):
        if hasattr(trainer, name):
            ph._wrap(trainer, name, ph._logps_label, tracker)
    if hasattr(trainer, "_generate"):
        ph._wrap(trainer, "_generate", lambda *a, **k: "generate", tracker)
    ph._wrap(trainer.model, "generate", lambda *a, **k: "generate", tracker)
    trainer.add_callback(ph.make_callback(tracker, step_seconds))


def execute(spec: dict) -> dict:
    """Build the release's GRPOTrainer on a tiny model saved to disk, run 2 steps under the tensor probe."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from sweeps.probes import phases as ph
    from sweeps.probes.tensors import LiveStorageMode
    from sweeps.runner import data, tiny
    from sweeps.runner.grpo_setup import correctness_reward
    from sweeps.runner.run_one import _lengths, _observed

    cfg = spec["config"]
    work = Path(spec["workdir"])
    model_path = tiny.save_tiny(cfg["model"], str(work / "model"))
    tokenizer = tiny.build_tokenizer(tiny.TINY_MODELS[cfg["model"]].vocab_size)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # 0.14 passes the encoding to generate()
    rows = data.synthetic(tokenizer, cfg["max_prompt_length"], 64)
    peft_config = None
    if cfg["use_peft"]:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg["lora_r"], lora_alpha=32, lora_dropout=cfg["lora_dropout"], task_type="CAUSAL_LM"
        )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=correctness_reward,
        args=_grpo_config(cfg, str(work / "out")),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    _force_length(trainer, cfg["max_completion_length"])
    probe = LiveStorageMode(round_to=1)
    tracker = ph.PhaseTracker([probe])
    step_seconds: list[float] = []
    _install_phases(trainer, tracker, step_seconds)
    probe.register(trainer.model)
    if getattr(trainer, "ref_model", None) is not None:
        probe.register(trainer.ref_model)
    t0 = time.perf_counter()
    with probe:
        trainer.train()
    result = {"tensors": probe.result()}
    result["tensors"].pop("phase_at_peak", None)
    obs = _observed("cpu", result, ph.PHASES)
    obs["phases_seen"] = tracker.seen
    params = sum(p.numel() for n, p in trainer.model.named_parameters() if "lora_" not in n)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {
        "status": "ok",
        "error": None,
        "model": {
            "name": cfg["model"],
            "params": params,
            "trainable_params": trainable,
            "config": tiny.hf_config(cfg["model"]),
        },
        "observed": obs,
        "step_seconds": step_seconds,
        "train_seconds": round(time.perf_counter() - t0, 3),
        "lengths": _lengths(trainer.state.log_history),
        **records.environment_info("cpu"),
    }


def run_one(spec_path: str) -> int:
    """Child: run one spec, write its result JSON atomically (an error or OOM is a result, not a crash)."""
    from sweeps.runner.run_one import _set_offline_env, one_line, write_json

    spec = json.loads(Path(spec_path).read_text())
    _set_offline_env("cpu")
    try:
        result = execute(spec)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result = {"status": "error", "error": one_line(exc)}
    write_json(spec["result_path"], result)
    return 0


# ---------------------------------------------------------------- the grid (parent)


def _append(out: Path, row: dict) -> bool:
    """Append the row; when that fails, keep it (records.save_unsaved) and say where in one stderr line."""
    try:
        records.append_row(out, row)
        return True
    except OSError as exc:
        kept = records.save_unsaved(out, row)
        print(
            f"sweeps.runner.legacy: could not append the row of {row['key']} to {out} ({exc.strerror or exc}); "
            + (f"kept it in {kept} (the next run appends it)" if kept else "it could be kept nowhere"),
            file=sys.stderr,
        )
        return False


def run_grid(out: Path, timeout: int) -> int:
    """Every grid point of the installed release not yet in `out`: one subprocess each, one row each."""
    problem = records.writable_problem(out)
    if problem:
        print(f"sweeps.runner.legacy: --out {out}: cannot write results there ({problem})", file=sys.stderr)
        return 2
    records.recover_unsaved(out)
    version = installed_trl()
    done = records.finished_keys(records.load_rows(out)) if out.exists() else set()
    for name, config in configs(version):
        key = records.make_key(config, VARIANT)
        if key in done:
            print(f"legacy TRL {version} {name}: done ({key})")
            continue
        with tempfile.TemporaryDirectory(prefix="grpo-vram-legacy-") as work:
            spec = {"config": config, "workdir": work, "result_path": f"{work}/result.json"}
            Path(f"{work}/spec.json").write_text(json.dumps(spec))
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "sweeps.runner.legacy", "--one", f"{work}/spec.json"],
                    timeout=timeout,
                    capture_output=True,
                    text=True,
                )
                tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
                result = (
                    json.loads(Path(spec["result_path"]).read_text())
                    if Path(spec["result_path"]).exists()
                    else {"status": "error", "error": f"no result: {tail[0][:300]}"}
                )
            except subprocess.TimeoutExpired:
                result = {"status": "error", "error": f"timeout after {timeout} s"}
        row = records.base_row(
            key=key,
            source="measured-cpu",
            sweep=f"legacy-trl-{version}",
            config=config,
            variant=VARIANT,
            status=result.get("status", "error"),
            error=result.get("error"),
        )
        for k in ("model", "observed", "step_seconds", "versions", "device", "lengths", "train_seconds"):
            if k in result:
                row[k] = result[k]
        row["git_commit"] = records.git_commit()
        if not _append(out, row):
            return 1
        print(
            f"legacy TRL {version} {name}: {row['status']} {row['error'] or ''} ({time.perf_counter() - t0:.0f} s)"
        )
    return 0


def record_unrunnable(out: Path, version: str, reason: str) -> int:
    """A row saying a release could not run here and why (status 'error', no measurement)."""
    config = {"trl_version": version, "model": MODEL, "device": "cpu"}
    key = records.make_key(config, VARIANT)
    row = records.base_row(
        key=key, source="measured-cpu", sweep=f"legacy-trl-{version}", config=config, variant=VARIANT,
        status="error", error=reason[:300],
    )  # fmt: skip
    row["git_commit"] = records.git_commit()
    return 0 if _append(out, row) else 1


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="sweeps.runner.legacy", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/raw/legacy.jsonl", help="JSONL file rows are appended to")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument(
        "--unrunnable", nargs=2, metavar=("VERSION", "REASON"), help="record why a release cannot run"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one:
        return run_one(args.one)
    if args.unrunnable:
        return record_unrunnable(Path(args.out), *args.unrunnable)
    return run_grid(Path(args.out), args.timeout)


if __name__ == "__main__":
    sys.exit(main())
