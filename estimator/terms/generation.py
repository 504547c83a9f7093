"""Generation: the KV cache of the whole generation batch and last-token logits (vLLM's budget: terms/vllm.py).

Line references (`GT:N-M`, `CK:N`, ...) are upstream files at pinned versions: estimator/terms/SOURCES.md.
"""

from __future__ import annotations

from estimator.architecture import Arch
from estimator.config import RunConfig
from estimator.terms.activations import residual_bytes


def kv_cache(cfg: RunConfig, arch: Arch, seq_len: int | None = None) -> int:
    """2 (K, V) × layers × sequences × kv_heads × head_dim × (P + C) × r bytes.

    The cache takes the residual dtype, not autocast's: rotary promotes K to the dtype of cos/sin (the hidden
    states'), and DynamicCache's first `torch.cat` onto an empty tensor of K's dtype promotes V too (seen in traces).
    """
    length = cfg.sequence_length if seq_len is None else seq_len
    return 2 * arch.num_layers * cfg.generation_sequences * arch.kv_dim * length * residual_bytes(cfg)


def kv_concat_transient(cfg: RunConfig, arch: Arch) -> int:
    """DynamicCache concatenates per step: one layer's K and V are briefly held twice."""
    return kv_cache(cfg, arch) // arch.num_layers


def generation_logits(cfg: RunConfig, arch: Arch) -> int:
    """Last-token logits [G, V]: the compute-dtype output, its fp32 copy, processed scores and probs (transformers generate)."""
    return cfg.generation_sequences * arch.vocab_size * (2 + 3 * 4)


def rollout_buffers(cfg: RunConfig) -> int:
    """Buffered generation batch: int64 ids + masks [G, L] and fp32 per-token log-probs/advantages [G, C] × 3 (GT:2898-2936)."""
    g = cfg.generation_sequences
    return g * cfg.sequence_length * (8 + 8) + g * cfg.max_completion_length * 4 * 3
