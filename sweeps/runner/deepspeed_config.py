"""DeepSpeed ZeRO-2/3 (with CPU offload) for one runner process, as a TRL user enables it: a config dict passed as
GRPOConfig(deepspeed=...), which transformers' `HfTrainerDeepSpeedConfig` fills ("auto" values) and accelerate's
`DeepSpeedPlugin` hands to `deepspeed.initialize`; the torch.distributed variables one process needs; and the
checks of what the runner can apply.

Upstream paths read (transformers 5.x `integrations/deepspeed.py` `deepspeed_optim_sched`, accelerate
`utils/deepspeed.py` `DeepSpeedEngineWrapper.backward`, TRL 1.16 `GRPOTrainer.__init__` and
`models/utils.py` `_unwrap_model_for_generation`):
* an "optimizer" block makes DeepSpeed build its own optimizer; with `offload_optimizer` that is `DeepSpeedCPUAdam`
  (fp32 exp_avg / exp_avg_sq on the host, the state the estimator's offload terms size). Without offload the
  block is left out and the Trainer builds `optim` as usual.
* accelerate calls `engine.backward(loss)` then `engine.step()` inside `training_step`: the optimizer step runs in
  the training step, not between the Trainer's optimizer callbacks (`install_step_phase` labels it).
* under ZeRO-3, generation gathers every parameter on the GPU (`deepspeed.zero.GatheredParameters`) unless
  GRPOConfig.ds3_gather_for_generation (a run setting) is false; then each module is fetched as it runs.
"""

from __future__ import annotations

import functools
import os
import socket
from importlib.util import find_spec

from estimator.settings.config import RunConfig
from estimator.terms.phase_names import OPTIMIZER

STAGES = {"zero2": 2, "zero3": 3}
# optimizers DeepSpeed's "AdamW" block stands for (DeepSpeedCPUAdam in adamw mode on the host)
OFFLOAD_OPTIMS = ("adamw_torch", "adamw_torch_fused")
GATHER_KEY = "ds3_gather_for_generation"  # GRPOConfig's name; a ZeRO-3 row's variant records it too


def uses_deepspeed(sharding: str) -> bool:
    """True for the shardings this module runs (DeepSpeed ZeRO-2 / ZeRO-3)."""
    return sharding in STAGES


def deepspeed_installed() -> bool:
    """Whether the deepspeed package can be found here (not imported: its import probes the accelerator)."""
    return find_spec("deepspeed") is not None


def ds_config(cfg: RunConfig) -> dict | None:
    """The DeepSpeed config dict for `cfg` (None without ZeRO), with HF's recommended "auto" values."""
    if not uses_deepspeed(cfg.sharding):
        return None
    # the reduce bucket is the run's setting (`zero_reduce_bucket_size`): DeepSpeed's 5e8 elements by default, what
    # accelerate's own DeepSpeed config leaves it at, or "auto" (None), which transformers' trainer_config_finalize
    # sets to hidden²; overlap_comm is left at DeepSpeed's default (on at stage 3 only), as accelerate leaves it.
    # At ZeRO-3 the prefetch bucket and the persistence threshold are HF's "auto" (0.9 · hidden², 10 · hidden).
    bucket = "auto" if cfg.zero_reduce_bucket_size is None else cfg.zero_reduce_bucket_size
    zero: dict = {"stage": STAGES[cfg.sharding], "reduce_bucket_size": bucket}
    if cfg.zero_overlap_comm is not None:
        zero["overlap_comm"] = cfg.zero_overlap_comm
    if cfg.sharding == "zero3":
        zero["stage3_prefetch_bucket_size"] = "auto"
        zero["stage3_param_persistence_threshold"] = "auto"
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cfg.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    out: dict = {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }
    if cfg.offload_optimizer:
        out["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return out


def problem(settings: dict, installed: bool | None = None) -> str | None:
    """One line when the runner cannot apply these sharding settings (else None); `installed` fakes the package
    check in tests."""
    sharding = settings.get("sharding", "none")
    if sharding == "none":
        for key in ("offload_optimizer", "offload_param"):
            if settings.get(key):
                return (
                    f"trainer.{key}={settings[key]!r}: needs trainer.sharding=zero2 or zero3; accepted: false"
                )
        return None
    if not uses_deepspeed(sharding):
        return (
            f"trainer.sharding={sharding!r}: the runner measures one process; accepted: none, zero2, zero3 "
            "(estimate FSDP with vram-estimate --fsdp, trace it with grpo-vram-trace one --sharding fsdp)"
        )
    if settings.get("device", "cuda") != "cuda":
        return f"trainer.sharding={sharding!r}: accepted only with device=cuda (a CPU run is not sharded)"
    if sharding == "zero3" and settings.get("load_in_4bit"):
        return (
            "trainer.sharding='zero3' with load_in_4bit: the runner's 4-bit weights are uint8-packed, which ZeRO-3 "
            "cannot partition (bnb_4bit_quant_storage is not applied); accepted: zero2 for QLoRA"
        )
    optim = settings.get("optim", RunConfig().optim)
    if settings.get("offload_optimizer") and optim not in OFFLOAD_OPTIMS:
        return (
            f"trainer.optim={optim!r}: with offload_optimizer DeepSpeed steps its own CPU AdamW; "
            f"accepted: {', '.join(OFFLOAD_OPTIMS)}"
        )
    if not (deepspeed_installed() if installed is None else installed):
        return (
            f"trainer.sharding={sharding!r}: needs the deepspeed package, which is not installed here "
            "(pip install deepspeed); accepted without it: none"
        )
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (bound to 0, read, closed): each child its own rendezvous port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def distributed_env(port: int) -> dict[str, str]:
    """torch.distributed's variables for a world of one process (what `deepspeed` / `torchrun` would set)."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def prepare_process(config: dict, environ: os._Environ | dict | None = None) -> bool:
    """Set the distributed variables in this process when `config` (a RunConfig dict) runs under ZeRO; call before
    TRL or accelerate is imported. True when it did."""
    if not uses_deepspeed(config.get("sharding", "none")):
        return False
    env = os.environ if environ is None else environ
    env.update(distributed_env(free_port()))
    if config.get("device") == "cpu":  # a CPU rehearsal: DeepSpeed's CPU accelerator (gloo without oneCCL)
        env["DS_ACCELERATOR"] = "cpu"
    return True


def install_step_phase(trainer, tracker) -> None:
    """Label DeepSpeed's `engine.step()` (run by accelerate inside `training_step`) as the optimizer phase.

    The engine exists only after `Trainer.train` prepares the model, so a callback wraps `trainer.model_wrapped.step`
    on the instance at `on_train_begin`.
    """
    from transformers import TrainerCallback

    class EngineStepPhase(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            engine = getattr(trainer, "model_wrapped", None)
            step = getattr(engine, "step", None)
            if step is None or getattr(step, "_phase_wrapped", False):
                return

            @functools.wraps(step)
            def wrapped(*a, **k):
                with tracker.phase(OPTIMIZER):
                    return step(*a, **k)

            wrapped._phase_wrapped = True
            engine.step = wrapped

    trainer.add_callback(EngineStepPhase())
