"""What older TRL releases add to a step's phases (estimator/settings/trl_versions.py says which release does what).

- Generation per micro-batch (TRL 0.14-0.16, `generation_unit == "micro_batch"`): every micro-batch after the
  first generates and scores with the gradients of the earlier ones resident (0.14 grpo_trainer.py L370-428
  generates inside compute_loss; 0.15-0.16 in _prepare_inputs, once per training_step).
- Gradient accumulation in any release: from the second micro-batch on, the full .grad buffers are resident
  through its forward and backward (transformers Trainer zeroes them only after optimizer.step).
- TRL 0.14 computes the reference log-probs inside compute_loss, after the policy forward and before backward
  (grpo_trainer.py L443-451): the reference forward runs on top of everything the policy saved, including the
  row-wise log_softmax outputs.
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.settings.trl_versions import TrlProfile
from estimator.terms import activations as act
from estimator.terms import logprob_head as head
from estimator.terms import optimizer as opt
from estimator.terms.phase_names import GENERATE, SCORE
from estimator.terms.sharding import shard


def release_of(cfg: RunConfig) -> TrlProfile:
    """The TRL release `cfg` models (`trl_version`)."""
    return cfg.release


def resident_gradients(cfg: RunConfig, arch: Arch) -> int:
    """Full .grad buffers (sharded as the run shards them): P_trainable × bytes(trainable dtype)."""
    return shard(cfg, "gradients", opt.gradients(cfg, arch))


def _with_gradients(comps: dict[str, int], grads: int) -> dict[str, int]:
    out = dict(comps)
    out["gradients"] = max(out.get("gradients", 0), grads)
    return out


def phases(cfg: RunConfig, arch: Arch, specific: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Generate / score with gradients resident when each micro-batch generates; 0.14's score moves into train."""
    rel = release_of(cfg)
    out = dict(specific)
    if rel.reference_pass_in_train:
        out[SCORE] = {"rollout_buffers": specific[SCORE].get("rollout_buffers", 0)}
    if rel.generation_unit == "micro_batch" and cfg.gradient_accumulation_steps > 1:
        grads = resident_gradients(cfg, arch)
        out[GENERATE] = _with_gradients(out[GENERATE], grads)
        if cfg.runs_reference_pass or cfg.runs_old_logprob_pass:
            out[SCORE] = _with_gradients(out[SCORE], grads)
    return out


def reference_in_train(cfg: RunConfig, arch: Arch, policy_saved: int) -> dict[str, int]:
    """0.14: policy activations and its saved log_softmax rows + the reference's no-grad forward (the larger of its largest layer and its head)."""
    b, seq = cfg.per_device_train_batch_size, cfg.sequence_length
    c, v = cfg.max_completion_length, arch.vocab_size
    policy_rows = b * c * v * head.logsoftmax_bytes(cfg)  # saved by the policy's row-wise log_softmax
    ref = max(
        act.nograd_forward_peak(cfg, arch, b, seq),
        act.hidden_states(cfg, arch, b * seq) + head.nograd_head(cfg, arch, b),
    )
    return {
        "activations": policy_saved + ref,
        "logprob_head": policy_rows,
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=True),
    }


def train_instants(
    cfg: RunConfig, arch: Arch, instants: dict[str, dict[str, int]], policy_saved: int
) -> dict[str, dict[str, int]]:
    """Add 0.14's reference-forward instant; with gradient accumulation every instant holds the full gradients."""
    rel = release_of(cfg)
    out = dict(instants)
    if rel.reference_pass_in_train and cfg.runs_reference_pass:
        ref = reference_in_train(cfg, arch, policy_saved)
        ref["rollout_buffers"] = instants["head_forward"].get("rollout_buffers", 0)
        out["reference_forward"] = ref
    if cfg.gradient_accumulation_steps > 1:
        grads = resident_gradients(cfg, arch)
        out = {k: _with_gradients(v, grads) for k, v in out.items()}
    return out
