"""Two GRPO steps of TRL 1.16's `GRPOTrainer`, phase by phase, under LiveStorageMode (fake tensors at real size).

Per step, as `GRPOTrainer` runs them with the transformers generation backend:

* `generate`: `sweeps.trace.generate` (the `_sample` loop, fast-forwarded) on the policy, no_grad, autocast.
* `score`: the no-grad log-prob passes through the trainer's own `_get_per_token_logps_and_entropies`, chunked by
  `per_device_train_batch_size`, with checkpointing disabled: old policy when `cfg.runs_old_logprob_pass`,
  reference when beta > 0 (a separate fake reference model for full FT, adapters disabled for PEFT).
* `train`: the buffered batch is shuffled and split into `steps_per_generation` micro-batches as
  `_prepare_inputs` does; per micro-batch the real `trainer.compute_loss`, then `accelerator.backward`.
* `optimizer`: the optimizer `trainer.create_optimizer()` builds, `.step()`, `zero_grad(set_to_none=True)`.

The trainer is a real `GRPOTrainer` built around the model (beta is set after `__init__`, because the full-FT
reference model would be re-loaded from disk there; the fake one is attached instead, prepared as TRL prepares it).
Gradient checkpointing is enabled as `Trainer.train` enables it. The policy's fused LM head is switched to its
CUDA path (`patches.use_gpu_fused_head`). `adamw_bnb_8bit` runs bitsandbytes' own optimizer on real tensors; on
FakeTensors its state is emulated by `sweeps.trace.optim8bit`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from estimator.hardware.allocator import simulate
from estimator.settings.config import RunConfig
from sweeps.probes.tensors import LiveStorageMode
from sweeps.runner import tiny

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BNB_8BIT = ("adamw_bnb_8bit", "paged_adamw_8bit")
CUDA_BLOCK = 512  # caching-allocator minimum block: storages are rounded up to it for device=cuda traces
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_VERBOSITY": "error"}


@contextlib.contextmanager
def offline_env() -> Iterator[None]:
    """OFFLINE_ENV for the variables the caller left unset, for the duration of the block (a trace needs no hub).

    huggingface_hub and transformers read them when first imported, so they act where `run` is the first to import
    them (the `--one` subprocess of a grid); an entry point that wants them in any case sets them itself first.
    """
    added = [k for k in OFFLINE_ENV if k not in os.environ]
    os.environ.update({k: OFFLINE_ENV[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Python's, NumPy's and torch's CPU random states as they were, on exit (`build` seeds them all)."""
    import random

    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


@dataclass
class TraceResult:
    """What one traced (or real CPU) run observed."""

    observed: dict
    step_seconds: list[float]
    setup_seconds: float
    params: int
    trainable_params: int
    variant: dict = field(default_factory=dict)
    events: list = field(
        default_factory=list
    )  # ordered alloc/free/phase events (estimator.hardware.allocator format)


def _reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer_settings(cfg: RunConfig, out_dir: str):
    """The sweep's GRPOConfig and LoraConfig for `cfg`, as a TRL user builds them, on (fake) CPU tensors.

    beta is 0 here and set after __init__ (see the module docstring); lengths are fixed by the decode loop.
    """
    from sweeps.runner import grpo_setup

    variant = {**grpo_setup.VARIANT_DEFAULTS, "force_length": False, "lora_alpha": 2 * cfg.lora_r}
    traced = cfg.with_(device="cpu", beta=0.0, use_vllm=False)
    return grpo_setup.grpo_args(traced, variant, Path(out_dir)), grpo_setup.peft_config(cfg, variant)


def build(cfg: RunConfig, conf, out_dir: str, fake: bool = True):
    """Policy (+ reference) model, GRPOTrainer and optimizer in the currently active tensor mode.

    `out_dir` is the trainer's output_dir (nothing is saved there), a folder the caller creates and removes."""
    from accelerate.utils import set_seed
    from datasets import Dataset
    from trl import GRPOTrainer

    from sweeps.trace import fake_model, patches

    set_seed(0)
    dtype = DTYPES[cfg.dtype]
    model = fake_model.build_model(conf, dtype)
    if cfg.load_in_4bit:
        fake_model.emulate_4bit(model, dtype, nested=cfg.use_bnb_nested_quant)
    args, lora = _trainer_settings(cfg, out_dir)
    ds = Dataset.from_dict({"prompt": ["a b"] * max(16, cfg.generation_sequences)})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=_reward,
        args=args,
        train_dataset=ds,
        processing_class=tiny.build_tokenizer(64),  # ids are never decoded: the trace builds token tensors
        peft_config=lora,
    )
    trainer.current_gradient_accumulation_steps = cfg.gradient_accumulation_steps
    trainer.beta = cfg.beta
    if cfg.has_reference_model:
        from trl.trainer.utils import add_fused_lm_head

        ref = fake_model.build_model(conf, dtype)
        if cfg.load_in_4bit:
            fake_model.emulate_4bit(ref, dtype, nested=cfg.use_bnb_nested_quant)
        ref.eval()
        ref.requires_grad_(False)
        if (
            cfg.cast_lm_head_to_fp32
        ):  # as GRPOTrainer.__init__ casts the reference's head (grpo_trainer.py:1045-1047)
            ref.lm_head.float()
        add_fused_lm_head(ref, temperature=trainer.temperature, cast_lm_head_to_fp32=cfg.cast_lm_head_to_fp32)
        patches.use_gpu_fused_head(ref, cfg.max_completion_length)
        trainer.ref_model = ref
    policy = trainer.model
    patches.use_gpu_fused_head(policy, cfg.max_completion_length)
    if cfg.gradient_checkpointing:
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs=None)
    policy.train()
    if fake and cfg.optim in BNB_8BIT:  # bnb's constructor builds its quantile maps with data-dependent ops
        from sweeps.trace.optim8bit import Emulated8bitAdamW

        return trainer, Emulated8bitAdamW.for_model(policy)
    optimizer = trainer.create_optimizer()
    if fake and cfg.device == "cuda":
        use_cuda_optimizer_defaults(optimizer)
    return trainer, optimizer


def use_cuda_optimizer_defaults(optimizer: torch.optim.Optimizer) -> None:
    """torch picks foreach for CUDA tensors when neither foreach nor fused is set (`_default_to_fused_or_foreach`),
    the single-tensor loop for CPU ones: a fake-CUDA trace on CPU tensors must choose as CUDA would."""
    for group in optimizer.param_groups:
        if "foreach" in group and group.get("foreach") is None and not group.get("fused"):
            group["foreach"] = True


def _score(trainer, cfg: RunConfig, ids: torch.Tensor, max_chunks: int | None = None) -> dict:
    """Post-generation batch as `_generate_and_score_completions` leaves it, with the no-grad passes it runs.

    `max_chunks`: score only the first `max_chunks` chunks of `per_device_train_batch_size` sequences and place
    them in a zero `[G, C]` result. Every chunk has the same shapes, so the pass's peak is the same; the result
    tensor is the size TRL's `torch.cat` of all chunks gives (a time cap, recorded in the row's variant).
    """
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    p, c, b = cfg.max_prompt_length, cfg.max_completion_length, ids.shape[0]
    prompt_ids, completion_ids = ids[:, :p].clone(), ids[:, p:].clone()
    prompt_mask = torch.ones_like(prompt_ids)
    completion_mask = torch.ones_like(completion_ids)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    bs = cfg.per_device_train_batch_size
    out = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.zeros(b, dtype=torch.float32, device=ids.device),
        "num_items_in_batch": completion_mask.sum(),
    }
    model = trainer.model
    scored_ids, scored_mask = input_ids, attention_mask
    if max_chunks is not None and b > max_chunks * bs:
        scored_ids, scored_mask = input_ids[: max_chunks * bs], attention_mask[: max_chunks * bs]

    def full(logps: torch.Tensor) -> torch.Tensor:
        if logps.shape[0] == b:
            return logps
        out = logps.new_zeros((b, *logps.shape[1:]))
        out[: logps.shape[0]] = logps
        return out

    with torch.no_grad(), disable_gradient_checkpointing(model, trainer.args.gradient_checkpointing_kwargs):
        if cfg.runs_old_logprob_pass:
            out["old_per_token_logps"] = full(
                trainer._get_per_token_logps_and_entropies(model, scored_ids, scored_mask, c, batch_size=bs)[
                    0
                ]
            )
        if cfg.runs_reference_pass:
            if trainer.ref_model is not None:
                ref = trainer._get_per_token_logps_and_entropies(
                    trainer.ref_model, scored_ids, scored_mask, c, batch_size=bs
                )[0]
            else:
                with use_adapter(model, adapter_name=None):
                    ref = trainer._get_per_token_logps_and_entropies(
                        model, scored_ids, scored_mask, c, batch_size=bs
                    )[0]
            out["ref_per_token_logps"] = full(ref)
    del input_ids, attention_mask, scored_ids, scored_mask
    return out


def _micro_batches(inputs: dict, n: int) -> list[dict]:
    """`_prepare_inputs`: shuffle the buffered batch, split it into `steps_per_generation` slices."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    return split_tensor_dict(shuffle_sequence_dict(inputs), n)


@offline_env()
@preserved_rng()
def run(
    cfg: RunConfig,
    fake: bool = True,
    steps: int = 2,
    decode_k: int = 2,
    max_micro: int | None = None,
    num_layers: int | None = None,
) -> TraceResult:
    """Trace (or, with fake=False, really run on CPU) `steps` GRPO steps of `cfg`; returns the probe result.

    `max_micro` (a time cap): at most that many score chunks and training micro-batches per step. From the
    second micro-batch on, every one has the same shapes and finds the previous ones' gradients resident in
    `.grad`, so 2 reach the same peak as GA of them; the variant records the cap. `num_layers` (a time cap):
    trace only the first decoder layers (`fake_model.truncated_config_dict`); the row carries that config.
    The trainer's output_dir is a temporary folder removed afterwards (none is left in /tmp)."""
    with tempfile.TemporaryDirectory(prefix="grpo-vram-trace-") as out_dir:
        return _run(cfg, fake, steps, decode_k, out_dir, max_micro, num_layers)


def _run(
    cfg: RunConfig,
    fake: bool,
    steps: int,
    decode_k: int,
    out_dir: str,
    max_micro: int | None = None,
    num_layers: int | None = None,
) -> TraceResult:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from sweeps.trace import fake_model, patches

    spec = fake_model.truncated_config_dict(cfg.model, num_layers) if num_layers else cfg.model
    conf = fake_model.hf_config(spec, cfg.attn_implementation)
    t0 = time.perf_counter()
    mode = FakeTensorMode(shape_env=ShapeEnv()) if fake else nullcontext()
    with patches.patched(), mode, patches.CudaIndexBackward():
        trainer, opt = build(cfg, conf, out_dir, fake)
        policy = trainer.model
        probe = LiveStorageMode(round_to=CUDA_BLOCK if cfg.device == "cuda" else 1, record_events=True)
        probe.register(policy)
        if trainer.ref_model is not None:
            probe.register(trainer.ref_model, "ref_param")
        setup = time.perf_counter() - t0
        with probe:
            step_seconds = run_steps(cfg, trainer, opt, probe, steps, decode_k, max_micro)
        observed = probe.result()
        for d in (observed["phases"], *observed["steps"].values(), observed["phase_at_peak"]):
            d.pop("(between steps)", None)
        observed["phase_at_peak_by_label"].pop("(between steps)", None)
        params = sum(p.numel() for p in policy.parameters())
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    variant = {"decode": "fast-forward", "k": decode_k} if decode_k < cfg.max_completion_length else {}
    variant.update({"head": "fused-gpu", "steps": steps, "tensors": "fake" if fake else "real-cpu"})
    if max_micro is not None:
        variant["max_micro"] = max_micro
    if num_layers is not None:
        variant["layers"] = num_layers
    observed["allocator"] = simulate(
        probe.events
    ).to_dict()  # the caching allocator's reserve for this stream
    return TraceResult(observed, step_seconds, setup, params, trainable, variant, probe.events)


def run_steps(
    cfg: RunConfig,
    trainer,
    opt,
    probe: LiveStorageMode,
    steps: int,
    decode_k: int,
    max_micro: int | None = None,
) -> list[float]:
    """Run `steps` GRPO steps (generate, score, train, optimizer) inside an active `probe`; seconds per step.

    Shared by the single-process trace and `sweeps.trace.distributed` (which wraps the policy in FSDP2 first).
    """
    from trl.models.utils import unwrap_model_for_generation

    from sweeps.trace import generate, patches

    policy = trainer.model
    n_micro = cfg.resolved_steps_per_generation
    step_seconds: list[float] = []
    buffered = None
    for step in range(1, steps + 1):
        ts = time.perf_counter()
        probe.set_step(step)
        with (
            probe.phase("generate"),
            unwrap_model_for_generation(
                policy,
                trainer.accelerator,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as gen_model,
        ):
            ids = generate.generate(
                gen_model,
                cfg.generation_sequences,
                cfg.max_prompt_length,
                cfg.max_completion_length,
                cfg.bf16,
                decode_k,
                cfg.generation_use_cache,
            )
        with probe.phase("score"):
            buffered = None
            buffered = _micro_batches(_score(trainer, cfg, ids, max_micro), n_micro)
            del ids
        # a CUDA run's softmax backward makes a temporary the CPU kernels do not: made inside the probe, so it counts
        softmax_tmp = patches.CudaSoftmaxBackward() if cfg.device == "cuda" else nullcontext()
        with probe.phase("train"), softmax_tmp:
            trained = cfg.gradient_accumulation_steps
            if max_micro is not None:
                trained = min(trained, max_micro)
            for mb in buffered[:trained]:
                loss = trainer.compute_loss(policy, mb)
                if probe.events is not None:  # where Trainer.training_step may empty_cache
                    probe.events.append(("x", "loss"))
                trainer.accelerator.backward(loss)
                del loss
            probe.register([p.grad for p in policy.parameters() if p.grad is not None], "grad")
        with probe.phase("optimizer"):
            opt.step()
            probe.register(opt)
            opt.zero_grad(set_to_none=True)
        probe.set_phase("(between steps)")
        step_seconds.append(time.perf_counter() - ts)
    return step_seconds
