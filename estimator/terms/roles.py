"""The other models of an RL step: reward models, a reference model and a PPO value model (critic).

Each role is a model of its own architecture with the policy run's dtype and batch geometry:
- reward model: TRL 1.16 loads a model id with `AutoModelForSequenceClassification.from_pretrained(id,
  num_labels=1, **model_init_kwargs)` and scores ALL local completions of the generation batch in one
  no-grad forward (`grpo_trainer.py:544-560, 1603-1618`): the backbone plus a [1, H] score head, no lm_head.
- reference model: the policy architecture, frozen, one no-grad log-prob pass per micro-batch.
- value model (critic, OpenRLHF / Open-Reasoner-Zero PPO): backbone + [1, H] value head, trained in full with its
  own gradients, AdamW state and (under DeepSpeed) fp32 master weights; no vocabulary head, so no [B, L, V] logits.
"""

from __future__ import annotations

from dataclasses import replace

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms import activations as act
from estimator.terms import logprob_head as head
from estimator.terms import optimizer as opt
from estimator.terms.quantized import arch_quant_spec, packed_base_weights
from estimator.units import nbytes


def scalar_head_params(arch: Arch, num_labels: int = 1) -> int:
    """Backbone (embedding, layers, final norm; no lm_head) + a [num_labels, H] head without bias."""
    return arch.total_params - arch.lm_head_params + num_labels * arch.hidden_size


def scalar_head_arch(arch: Arch) -> Arch:
    """The Arch sized as a backbone with a scalar head: lm_head removed (tied), the [1, H] head added as a norm-sized
    extra on the final norm so `total_params` counts it (shapes of the layers are unchanged)."""
    return replace(
        arch, tie_word_embeddings=True, final_norm_params=arch.final_norm_params + arch.hidden_size
    )


def frozen_weights(cfg: RunConfig, arch: Arch) -> int:
    """A frozen model in the run's load dtype (a GPTQ/AWQ checkpoint stays packed): P × bytes(dtype)."""
    spec = arch_quant_spec(arch)
    if spec is not None:
        return packed_base_weights(arch, spec, nbytes(cfg.dtype))
    return arch.total_params * nbytes(cfg.dtype)


def reward_weights(cfg: RunConfig, arch: Arch) -> int:
    """A sequence-classification reward model: (backbone + [1, H]) × bytes(dtype)."""
    return frozen_weights(cfg, scalar_head_arch(arch))


def reward_forward_peak(cfg: RunConfig, arch: Arch) -> int:
    """All local completions in one no-grad forward (G = generation_sequences, L = prompt + completion): the largest
    layer's transient plus the final hidden states [G, L, H]; the [G, L, 1] scores are negligible."""
    g, seq = cfg.generation_sequences, cfg.sequence_length
    return act.nograd_forward_peak(cfg, arch, g, seq) + act.hidden_states(cfg, arch, g * seq)


def reference_forward_peak(cfg: RunConfig, arch: Arch) -> int:
    """One micro-batch's no-grad log-prob pass: the larger of a layer's transient and the head's forward."""
    b, seq = cfg.per_device_train_batch_size, cfg.sequence_length
    at_head = act.hidden_states(cfg, arch, b * seq) + head.head_forward(cfg, arch, b)
    return max(act.nograd_forward_peak(cfg, arch, b, seq), at_head)


def critic_config(cfg: RunConfig) -> RunConfig:
    """The critic trains in full (no PEFT, no 4-bit base) with the policy's dtype, optimizer and geometry."""
    return cfg.with_(use_peft=False, load_in_4bit=False, beta=0.0)


def critic_states(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Weights, gradients, optimizer state and master weights of a full fine-tune of backbone + value head."""
    c, a = critic_config(cfg), scalar_head_arch(arch)
    return {
        "weights": a.total_params * nbytes(c.dtype),
        "gradients": opt.gradients(c, a),
        "optimizer_state": opt.optimizer_state(c, a),
        "master_weights": opt.master_weights(c, a),
    }


def critic_train_peak(cfg: RunConfig, arch: Arch) -> int:
    """Training forward + backward of one micro-batch without a vocabulary head: saved activations (or checkpoint
    inputs + one recomputed layer with GC) + the layer's backward transient + the residual gradients."""
    c, a = critic_config(cfg), scalar_head_arch(arch)
    b, seq = c.per_device_train_batch_size, c.sequence_length
    tokens = b * seq
    return (
        act.saved_activations(c, a, b, seq)
        + act.recompute_layer(c, a, b, seq)
        + tokens * act.layer_backward_transient_per_token(c, a)
        + act.residual_gradients(c, a, tokens)
    )
