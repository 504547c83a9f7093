"""Generation: the KV cache of the whole generation batch and last-token logits (vLLM's budget: terms/vllm.py).

Line references (`GT:N-M`, `CK:N`, ...) are upstream files at pinned versions: estimator/terms/SOURCES.md.
"""

from __future__ import annotations

import math

from estimator.hardware.allocator import (
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    AllocatorSettings,
    allocation_size,
    round_size,
)
from estimator.model.architecture import Arch, layer_kinds, layer_windows
from estimator.settings.config import RunConfig
from estimator.terms import activations as act
from estimator.terms.activations import residual_bytes
from estimator.units import nbytes


def key_cache_dtype(cfg: RunConfig, arch: Arch | None = None) -> str:
    """The key cache's dtype: the residual's. Rotary promotes K to the dtype of cos/sin (the hidden states',
    `LlamaRotaryEmbedding.forward` returns `cos.to(x.dtype)`), so an fp32 load keeps fp32 keys under autocast.
    OLMo-2 (`rotary_fp32`) casts K back to k_norm's output dtype, the linear's (`k_embed.to(k_type)`,
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L172-L177):
    bf16 keys under autocast with an fp32 load."""
    if arch is not None and arch.family.rotary_fp32:
        return act.linear_output_dtype(cfg)
    return cfg.dtype


def value_cache_dtype(cfg: RunConfig, arch: Arch | None = None) -> str:
    """The value cache's dtype. transformers 5.23's `DynamicLayer` starts it as an empty tensor of the keys' dtype
    (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/cache_utils.py#L113-L117), so the
    first `torch.cat` promotes V to K's dtype; 5.24 starts it in `value_states.dtype`
    (https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/cache_utils.py#L113-L117), so V
    keeps v_proj's output dtype: bf16 under autocast with an fp32 load (Phi-3's fused qkv too: V is a view of it).
    """
    if cfg.transformers.cache_values_own_dtype:
        return act.linear_output_dtype(cfg)
    return key_cache_dtype(cfg, arch)


def _kv_bytes(cfg: RunConfig, arch: Arch | None = None) -> tuple[int, int]:
    """(bytes per key element, bytes per value element) in the cache."""
    return nbytes(key_cache_dtype(cfg, arch)), nbytes(value_cache_dtype(cfg, arch))


def kv_cache(
    cfg: RunConfig, arch: Arch, seq_len: int | None = None, prefill: bool = False, layers: int | None = None
) -> int:
    """sequences × kv_heads × head_dim × (k + v bytes) × Σ_layers kept length: P + C, or window − 1 on a sliding
    layer (k, v: `key_cache_dtype`, `value_cache_dtype`).

    A sliding-window layer (`DynamicSlidingWindowLayer.update`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/cache_utils.py#L244-L247) keeps the last
    `sliding_window − 1` positions. It keeps them as a slice of the full concatenation
    (`self.keys = full_key_states[:, :, -self.sliding_window + 1 :, :]`, a view), so after the prefill every
    sliding layer still holds the whole prompt's storage until its first decode step replaces it: `prefill=True`
    counts every layer at full length; `layers` counts only the first that many (a prefill's earlier layers).
    """
    length = cfg.sequence_length if seq_len is None else seq_len
    per_position = cfg.generation_sequences * arch.kv_dim * sum(_kv_bytes(cfg, arch))
    if prefill:
        n = arch.num_layers if layers is None else layers
        return per_position * length * n
    return per_position * sum(_kept(length, w) for w in layer_windows(arch))


def kv_concat_transient(cfg: RunConfig, arch: Arch) -> int:
    """Cache tensors held twice for a moment during a decode step's update, on the layer where that is largest.

    transformers 5.23 `DynamicLayer.update` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/cache_utils.py#L136-L137)
    runs `self.keys = torch.cat([self.keys, key_states], -2)` and then the same for the values: the old keys are
    released when `self.keys` is rebound, before the values' `cat` starts, so one [G, kv_heads, L, d] tensor is
    doubled, the larger of K and V. `DynamicSlidingWindowLayer.update` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/cache_utils.py#L242-L249)
    concatenates both K and V before rebinding either, so a sliding layer doubles both (5.24: the same code).
    """
    k, v = _kv_bytes(cfg, arch)
    per_position = cfg.generation_sequences * arch.kv_dim
    return max(
        (max(k, v) if w is None else k + v) * _kept(cfg.sequence_length, w) * per_position
        for w in layer_windows(arch)
    )


def decode_attention_copies(cfg: RunConfig, arch: Arch) -> int:
    """What one decode step's attention holds beside the cache, on the longest layer: K/V repeated to every head,
    autocast's casts of them, and the step's scores.

    Eager (transformers 5.23 `eager_attention_forward`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L168-L201)
    runs `repeat_kv` on K and V, which copies both to [G, heads, L, d] when kv_heads > 1 (the `expand` then
    `reshape`); with one KV head the reshape is a view and `matmul` copies the expanded operand for its `bmm`, one
    at a time. The scores [G, heads, 1, L] take `eager_nograd_bytes` per element. sdpa on an unpadded decode step
    gets no mask and runs native GQA (`use_gqa_in_sdpa`), so it repeats nothing (`kv_heads_in_attention`).

    When autocast's dtype differs from a cache tensor's (an fp32 load under bf16 autocast: K, and V too under
    transformers 5.23, `value_cache_dtype`), `matmul` and `scaled_dot_product_attention` cast those operands first (both on autocast's lower-precision list,
    https://docs.pytorch.org/docs/2.9/amp.html#cuda-ops-that-can-autocast-to-float16): eager's matmul casts one
    [G, heads, L, d] operand at a time (the repeated K, then the repeated V, which the cast replaces as `bmm`'s
    copy of an expanded one-head view; when only K is cast, its copy is gone before softmax's copies exist), sdpa casts K and V together at the width it gets them (kv_heads natively,
    heads after a masked call's `repeat_kv`): a bytes each, for each of K and V that needs it. flash_attention_2 casts the same two: transformers'
    `fa_peft_integration_check` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/modeling_flash_attention_utils.py#L583-L598)
    casts q, k and v to the target dtype when q is fp32, as rotary's promotion leaves it (`act.query_bytes`).
    """
    eager = cfg.attn_implementation == "eager"
    width = act.kv_heads_in_attention(cfg, arch, masked=False) * arch.head_dim
    repeats = width != arch.kv_dim and arch.num_kv_heads > 1  # one KV head: `repeat_kv` is a view
    compute = act.compute_dtype(cfg)
    cast_k, cast_v = key_cache_dtype(cfg, arch) != compute, value_cache_dtype(cfg, arch) != compute
    k, v = _kv_bytes(cfg, arch)
    repeated = 0
    if repeats:  # the repeated K and V, each in its cache dtype
        repeated = _longest_layer_tensor(cfg, arch, arch.num_heads * arch.head_dim, k + v)
    elif eager and arch.num_kv_heads == 1 and not (cast_k or cast_v):  # bmm's copy, one operand at a time
        repeated = _longest_layer_tensor(cfg, arch, arch.num_heads * arch.head_dim, max(k, v))
    cast = 0
    if cast_k or cast_v:
        per_cast = _longest_layer_tensor(cfg, arch, width, act.compute_bytes(cfg))
        cast = per_cast if eager else (cast_k + cast_v) * per_cast
    if not eager:
        return repeated + cast
    score_elements = cfg.generation_sequences * arch.num_heads * _longest_kept(cfg, arch)
    scores = score_elements * act.eager_nograd_bytes(cfg, arch)
    if cast_k and not cast_v:  # K's cast lives through the first matmul only, beside its output
        return repeated + max(cast + score_elements * act.compute_bytes(cfg), scores)
    return repeated + cast + scores  # V's cast meets the probabilities at the second matmul


def _kept(length: int, window: int | None) -> int:
    return length if window is None else min(length, window - 1)


def _longest_kept(cfg: RunConfig, arch: Arch) -> int:
    """Positions the longest cache layer keeps at the end of generation."""
    return max(_kept(cfg.sequence_length, w) for w in layer_windows(arch))


def _longest_layer_tensor(cfg: RunConfig, arch: Arch, width: int, bytes_per: int) -> int:
    """[G, heads, L, d] at `bytes_per` bytes an element, L the longest layer's kept length; `width` = heads × d."""
    return cfg.generation_sequences * width * _longest_kept(cfg, arch) * bytes_per


def generation_logits(cfg: RunConfig, arch: Arch) -> int:
    """Last-token logits [G, V]: the compute-dtype output, its fp32 copy, processed scores and probs (transformers generate)."""
    return cfg.generation_sequences * arch.vocab_size * (2 + 3 * 4)


def generation_token_ids(cfg: RunConfig, length: int) -> int:
    """int64 token ids and masks while generating a step over `length` positions without a cache: the grown
    `input_ids` and `attention_mask` [G, L], the model's clone of the ids, and the prompt's own mask and position
    ids [G, P] (transformers 5.24 `_sample`, `prepare_inputs_for_generation`): (3·L + 2·P)·G·8."""
    return (3 * length + 2 * cfg.max_prompt_length) * cfg.generation_sequences * 8


def uncached_generation_segments(cfg: RunConfig, arch: Arch) -> int:
    """Segments the caching allocator cuts, and keeps cached, while a dense model generates without a KV cache
    (default allocator settings): those of the step's largest growing tensors, the MLP's (`uncached_mlp_segments`)
    or, under eager attention, the scores' (`uncached_score_segments`), whichever sum is larger.

    Every step is one position longer than the last, so its tensors outgrow their 2 MiB-rounded segments. A
    request of 10 MiB or more gets a segment of its own (`get_allocation_size`, estimator.hardware.allocator), and
    a cached block serves only a request no larger than itself: the step's largest tensors get new segments and
    the outgrown ones stay cached, where the step's smaller tensors fit. The allocator simulation of the traced
    no-cache streams cuts exactly those: three MLP segments at every 2 MiB size under sdpa, two fp32 score
    segments at every step under eager (results/streams/mincard/index.jsonl, docs/ACCURACY.md). Under a limit the
    allocator frees them before it fails, so they move what torch reserves on a card with room, not what the
    card must hold; a smaller card fills and frees them as it needs to."""
    if cfg.generation_use_cache or cfg.use_vllm:
        return 0
    return max(uncached_mlp_segments(cfg, arch), uncached_score_segments(cfg, arch))


def uncached_mlp_segments(cfg: RunConfig, arch: Arch) -> int:
    """The no-grad MLP's three live [G, L, I] tensors (act, up, their product, `act.nograd_forward_peak`), one
    position longer each step: 3 × Σ round_up(G·I·a·L, 2 MiB) over the distinct sizes of 10 MiB or more for
    L = P ... P + C - 1 (a: the linears' output bytes)."""
    a = cfg.generation_sequences * arch.intermediate_size * nbytes(act.linear_output_dtype(cfg))
    return 3 * _distinct_segments(a, 1, cfg.max_prompt_length, cfg.sequence_length - 1)


def uncached_score_segments(cfg: RunConfig, arch: Arch) -> int:
    """Eager attention's fp32 [G, heads, L, L] scores, new sizes every step: n × Σ round_up(G·heads·L²·4, 2 MiB)
    for L = P ... P + C - 1. transformers 5.24 `eager_attention_forward` runs `softmax(dtype=float32)`, whose
    fp32 copy of lower-precision scores and fp32 output are live together (n = 2; fp32 scores: the masked
    scores and the softmax, n = 2), except an fp16 model's CUDA `half_to_float` softmax, which copies nothing
    (n = 1; `act.eager_nograd_bytes`). 0 under sdpa and flash attention, which hold no scores."""
    if cfg.attn_implementation != "eager":
        return 0
    n = 1 if act.softmax_half_to_float(cfg) else 2
    per_square = cfg.generation_sequences * arch.num_heads * 4
    return n * _distinct_segments(per_square, 2, cfg.max_prompt_length, cfg.sequence_length - 1)


def _distinct_segments(a: int, power: int, first: int, last: int) -> int:
    """Σ over the distinct values of round_up(a·L^power, 2 MiB), L = first ... last, of those of 10 MiB or more.

    While the size grows by at most 2 MiB a position every rounded size between appears, an arithmetic sum; past
    that each position has a size of its own: their sum, or for more than 4096 positions a bound high by under
    2 MiB a position."""
    least = -(-K_MIN_LARGE_ALLOC // a)  # L**power from which a request takes a segment of its own
    first = max(first, least if power == 1 else math.isqrt(least - 1) + 1)
    if first > last:
        return 0
    # the last position reached by steps of at most 2 MiB: a ≤ 2 MiB (linear), a·(2L + 1) ≤ 2 MiB (square)
    if power == 1:
        calm = last if a <= K_ROUND_LARGE else first - 1
    else:
        calm = min(last, max(first - 1, (K_ROUND_LARGE // a - 1) // 2 + 1))
    total = 0
    if calm >= first:
        k0, k1 = -(-a * first**power // K_ROUND_LARGE), -(-a * calm**power // K_ROUND_LARGE)
        total = K_ROUND_LARGE * (k0 + k1) * (k1 - k0 + 1) // 2
    lo = max(first, calm + 1)
    if lo > last:
        return total
    if last - lo < 4096:
        s = AllocatorSettings()
        return total + sum(allocation_size(round_size(a * n**power, s), s) for n in range(lo, last + 1))
    n = last - lo + 1
    squares = (last * (last + 1) * (2 * last + 1) - (lo - 1) * lo * (2 * lo - 1)) // 6
    return total + (a * (lo + last) * n // 2 if power == 1 else a * squares) + K_ROUND_LARGE * n


def rollout_buffers(cfg: RunConfig) -> int:
    """Buffered generation batch: int64 ids + masks [G, L] and fp32 per-token log-probs/advantages [G, C] × 3 (GT:2898-2936)."""
    g = cfg.generation_sequences
    return g * cfg.sequence_length * (8 + 8) + g * cfg.max_completion_length * 4 * 3


def rotary_tables(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """The rotary cos/sin of a prefill, held through the model's whole forward: [B, L, head_dim] each in the
    residual dtype, because `generate` passes batch-shaped position_ids (from the left-padded attention mask).

    transformers 5.23 `LlamaRotaryEmbedding.forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L108-L116)
    returns `cos.to(x.dtype), sin.to(x.dtype)`, bound to `position_embeddings` in the model's forward (:389);
    Gemma3 builds one pair per layer type (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/modeling_gemma3.py#L548-L550). Training and scoring pass
    no position_ids, so there the tables are [1, L, head_dim]: negligible. OLMo-2's `Olmo2RotaryEmbedding.forward`
    (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L108-L113)
    returns them in fp32.
    """
    pairs = layer_kinds(arch) if arch.family.rotary_per_layer_kind else 1
    per = 4 if arch.family.rotary_fp32 else residual_bytes(cfg)
    return pairs * 2 * batch * seq_len * arch.head_dim * per
