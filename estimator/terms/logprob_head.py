"""The log-prob head: TRL 1.16's fused chunked LM head, or the classic full-logits path of older TRL.

Fused head: trl/kernels/chunked_logprob.py (CK) and trl/trainer/utils.py `_fused_forward` (TU:1598-1696).
Tiles of TOKEN_CHUNK = 4096 tokens × VOCAB_CHUNK = 32768 vocabulary entries; on CUDA (Triton) only the
N = batch × completion positions are scored and the tile fold has no temporaries; on CPU every
batch × (L − 1) position is scored and each tile is folded with fp32 torch temporaries.

Line references (`GT:N-M`, `CK:N`, ...) are upstream files at pinned versions: estimator/terms/SOURCES.md.
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms.activations import compute_bytes, residual_bytes
from estimator.terms.sharding import is_deepspeed
from estimator.units import nbytes

TOKEN_CHUNK = 4096  # CK:31
VOCAB_CHUNK = 32768  # TU:1506
STAT_VECTORS = (
    7  # running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit (CK:340-346)
)


def scored_tokens(cfg: RunConfig, batch: int) -> int:
    """N = batch × C on CUDA (compact: completion positions only); batch × (L − 1) on CPU (every position)."""
    if cfg.device == "cuda":
        return batch * cfg.max_completion_length
    return batch * (cfg.sequence_length - 1)


def head_weight_bytes(cfg: RunConfig) -> int:
    """bytes of lm_head.weight: the load dtype (fp32 with cast_lm_head_to_fp32)."""
    return 4 if cfg.cast_lm_head_to_fp32 else nbytes(cfg.dtype)


def tile_bytes(cfg: RunConfig, arch: Arch, n: int) -> int:
    """mm_buf [min(N, 4096), 32768] in the compute dtype (CK:347) — 32768 wide even for a smaller vocabulary."""
    a = 4 if cfg.cast_lm_head_to_fp32 else compute_bytes(cfg)
    return min(n, TOKEN_CHUNK) * VOCAB_CHUNK * a


def tile_casts(cfg: RunConfig, arch: Arch, n: int) -> int:
    """Per-tile dtype casts: hidden chunk [≤4096, H] and weight chunk [≤32768, H] to the compute dtype when they differ."""
    a = 4 if cfg.cast_lm_head_to_fp32 else compute_bytes(cfg)
    out = 0
    if residual_bytes(cfg) != a:
        out += min(n, TOKEN_CHUNK) * arch.hidden_size * a
    if head_weight_bytes(cfg) != a:
        out += min(arch.vocab_size, VOCAB_CHUNK) * arch.hidden_size * a
    return out


def weight_cast_rebinding(cfg: RunConfig, arch: Arch, n: int) -> int:
    """The backward's previous weight-chunk cast, still bound to `w_chunk` while the next one is made (CK:421-425:
    `w_chunk = weight[start:end].to(compute_dtype)` in the vocabulary loop), when the head's weight is cast: the
    second tile beside the first, or, past one token chunk, the last tile beside the next chunk's first.
    0 when the weight is already in the compute dtype (`.to` returns it) or the vocabulary is one tile read once.
    """
    a = 4 if cfg.cast_lm_head_to_fp32 else compute_bytes(cfg)
    if head_weight_bytes(cfg) == a:
        return 0
    v, c = arch.vocab_size, min(arch.vocab_size, VOCAB_CHUNK)
    tiles = -(-v // c)
    last = v - c * (tiles - 1)
    second = min(c, v - c) if tiles > 1 else 0
    after_chunk = last if n > TOKEN_CHUNK else 0
    return max(second, after_chunk) * arch.hidden_size * a


def cpu_fold_temporaries(cfg: RunConfig, arch: Arch, n: int, backward: bool) -> int:
    """CPU fallback (CK:211-296), fp32 [rows, cols] tiles live at once: forward z, z − max, exp (3); backward y, z, log_p, p, grad, (target mask − p), its product (7; the float mask dies inside the expression) + the bool mask; +1 for tile.float() when the tile is 16-bit; or, if larger, _addmm_fp32's tile.float() + the fp32 weight chunk."""
    if cfg.device == "cuda":
        return 0
    rows = min(n, TOKEN_CHUNK)
    cols = min(arch.vocab_size, VOCAB_CHUNK)
    tile = rows * cols
    upcast = 1 if (4 if cfg.cast_lm_head_to_fp32 else compute_bytes(cfg)) != 4 else 0
    if not backward:
        return (3 + upcast) * tile * 4
    fold = (7 + upcast) * tile * 4 + tile
    addmm = tile * 4 + cols * arch.hidden_size * 4
    return max(fold, addmm)


def head_forward(cfg: RunConfig, arch: Arch, batch: int) -> int:
    """Forward transient: hidden[mask] copy [N, H] + 7 fp32 [N] stats + tile + casts (+ CPU fold temporaries)."""
    n = scored_tokens(cfg, batch)
    return (
        n * arch.hidden_size * residual_bytes(cfg)
        + STAT_VECTORS * n * 4
        + tile_bytes(cfg, arch, n)
        + tile_casts(cfg, arch, n)
        + cpu_fold_temporaries(cfg, arch, n, backward=False)
    )


def head_saved(cfg: RunConfig, arch: Arch, batch: int) -> int:
    """Saved for backward: hidden [N, H] (r bytes) + log_z and entropy fp32 [N] (CK:386)."""
    n = scored_tokens(cfg, batch)
    return n * arch.hidden_size * residual_bytes(cfg) + 2 * n * 4


def head_backward(cfg: RunConfig, arch: Arch, batch: int, lm_head_trainable: bool) -> int:
    """Backward transient: grad_hidden fp32 [N, H] (+ its cast) + grad_weight fp32 [V, H] (+ its cast) when trainable + tile
    + casts; the CPU fold's temporaries or, between tiles, the previous weight chunk's cast (`weight_cast_rebinding`)."""
    n = scored_tokens(cfg, batch)
    h, v = arch.hidden_size, arch.vocab_size
    r = residual_bytes(cfg)
    out = n * h * 4 + (n * h * r if r != 4 else 0)
    if lm_head_trainable:
        w = head_weight_bytes(cfg)
        out += v * h * 4 + (v * h * w if w != 4 else 0)
    return (
        out
        + tile_bytes(cfg, arch, n)
        + tile_casts(cfg, arch, n)
        + max(cpu_fold_temporaries(cfg, arch, n, backward=True), weight_cast_rebinding(cfg, arch, n))
    )


def full_logits(cfg: RunConfig, arch: Arch, batch: int) -> int:
    """Classic path (TRL < 1.x): logits [B, C, V] in the compute dtype + fp32 log-softmax copy + fp32 gather/grad."""
    n = batch * cfg.max_completion_length
    return n * arch.vocab_size * (compute_bytes(cfg) + 4 + 4)


# ---- materialized-logits paths of older TRL releases (estimator/settings/trl_versions.py: rowwise, selective) ----
# Both run lm_head on the last C + 1 positions (`logits_to_keep = C + 1`) and keep a [B, C + 1, V] logits
# tensor; `logits[:, :-1]` is a view. TRL 0.16-0.29 and 1.10-1.13 divide by the temperature out of place
# (`logits = logits / T`: a second [B, C, V] tensor, after which the first is freed); 1.0-1.9 divide in place.


def outputs_to_fp32(cfg: RunConfig) -> bool:
    """Whether accelerate wraps the prepared model's forward in autocast + `convert_outputs_to_fp32`: under bf16
    mixed precision, except with DeepSpeed, where `Accelerator.native_amp` stays False and the engine runs the
    module it cast to bf16 itself (accelerate 1.15 accelerator.py L564-593, prepare_model L1824-1835)."""
    return cfg.bf16 and not is_deepspeed(cfg)


def logits_bytes(cfg: RunConfig) -> int:
    """Bytes of the logits the trainer sees: fp32 where accelerate converts the outputs (`outputs_to_fp32`; the
    TRL 0.19 run, results/raw/legacy.jsonl, holds fp32 [B, C, V] logits under CPU bf16 autocast); else the
    compute dtype's (bf16 under DeepSpeed's bf16)."""
    return 4 if outputs_to_fp32(cfg) else compute_bytes(cfg)


def logsoftmax_bytes(cfg: RunConfig) -> int:
    """Bytes of a log_softmax output: the logits' own (fp32 whenever mixed precision is on)."""
    return logits_bytes(cfg)


def _to_fp32_copy(cfg: RunConfig, n1: int, v: int) -> int:
    """convert_outputs_to_fp32: the a-byte logits [B, C+1, V] and their fp32 copy meet once."""
    return n1 * v * (compute_bytes(cfg) + 4) if outputs_to_fp32(cfg) and compute_bytes(cfg) != 4 else 0


def _release(cfg: RunConfig):
    return cfg.release


def _keeps_logits(cfg: RunConfig) -> bool:
    """selective_log_softmax's fp32/fp64 branch: gather + row-wise logsumexp, which saves its input (the logits) for backward (TU 0.15.2 L1672-1676)."""
    return cfg.logprob_head == "selective" and logits_bytes(cfg) == 4


def materialized_train(cfg: RunConfig, arch: Arch, batch: int) -> tuple[int, int]:
    """(forward transient, backward transient) of the rowwise / selective paths with grad; both include what is saved for backward.

    Forward: logits [B, C+1, V] (a bytes); with an out-of-place temperature the copy [B, C, V] meets them. The
    row loop then keeps every row's log_softmax output (lf bytes, saved for its backward) while the logits live
    (0.14 grpo_trainer.py L430-441; TU 0.15.2 L1677-1684); the fp32 branch saves the logits themselves through
    logsumexp and holds one row's exp temporary [C, V]. With TRL 0.20+'s entropy, a chunk's no-grad
    log_softmax, exp and product (lf) join them: one sequence [C, V] in 0.20-0.22 (entropy_from_logits,
    TU 0.20.0 L1482-1489), 128 flattened token rows [128, V] from 0.23 (TU 0.23.1 L1480).
    Backward (16-bit rows): the saved outputs + one row's gather/log_softmax/cast grads [C, V] (4 + lf + a), or
    UnbindBackward's B row grads + their stack (2·B·C·V·a), or the stack + the zero-padded slice grad
    [B, C+1, V]; fp32 branch: saved logits + the stacked row grads + gather's backward, a new_zeros and its
    scatter_add (4 bytes each; measured under TRL 0.17, results/raw/legacy.jsonl).
    """
    c, v, n, n1, a, lf, held, division = _materialized(cfg, arch, batch)
    # lm_head's autocast weight cast [V, H] (a bytes) is saved for its backward until the head's backward runs
    cast_w = (
        v * arch.hidden_size * compute_bytes(cfg)
        if cfg.bf16 and residual_bytes(cfg) != compute_bytes(cfg)
        else 0
    )
    rel = _release(cfg)
    rows = min(rel.entropy_chunk, n) if rel.entropy_chunk else c
    entropy = 3 * rows * v * lf if rel.entropy_pass else 0  # a chunk's log_softmax, exp and product
    if _keeps_logits(cfg):
        saved = held
        fwd = max(division, held + c * v * 4, held + entropy)
        bwd = saved + 3 * n * v * 4  # + stacked row grads + gather's backward (new_zeros, then scatter_add)
        return fwd + cast_w, bwd + cast_w
    cast = c * v * 4 if lf != a else 0  # CUDA autocast's fp32 copy of one row's input
    saved = n * v * lf
    fwd = max(division, held + saved + cast, held + saved + entropy)
    bwd = max(saved + c * v * (4 + lf + a), 2 * n * v * a, n * v * a + n1 * v * a)
    return fwd + cast_w, bwd + cast_w


def _materialized(cfg: RunConfig, arch: Arch, batch: int) -> tuple[int, ...]:
    """Shared sizes of the materialized-logits heads: C, V, B·C and B·(C+1) rows, logits and log_softmax bytes,
    the logits held after the temperature division, and the division's own peak (its copy or the fp32 cast)."""
    rel = _release(cfg)
    c, v = cfg.max_completion_length, arch.vocab_size
    n, n1 = batch * c, batch * (c + 1)
    a, lf = logits_bytes(cfg), logsoftmax_bytes(cfg)
    held = (n if rel.temperature_copy else n1) * v * a
    division = max((n1 + n) * v * a if rel.temperature_copy else 0, _to_fp32_copy(cfg, n1, v))
    return c, v, n, n1, a, lf, held, division


def materialized_nograd(cfg: RunConfig, arch: Arch, batch: int) -> int:
    """No-grad reference / old-policy pass: logits [B, C+1, V] (+ the temperature copy) + one row's log_softmax (lf) or logsumexp temporary, and its fp32 input cast on CUDA."""
    c, v, n, n1, a, lf, held, division = _materialized(cfg, arch, batch)
    row = c * v * (4 if _keeps_logits(cfg) else lf + (4 if lf != a else 0))
    return max(division, held + row)


def train_head(cfg: RunConfig, arch: Arch, batch: int) -> tuple[int, int, int]:
    """(forward transient, saved for backward, backward transient) of the training forward's log-prob head, by path."""
    if cfg.logprob_head in ("rowwise", "selective"):
        fwd, bwd = materialized_train(cfg, arch, batch)
        return fwd, 0, bwd
    if cfg.logprob_head == "full":
        return full_logits(cfg, arch, batch), 0, full_logits(cfg, arch, batch)
    return (
        head_forward(cfg, arch, batch),
        head_saved(cfg, arch, batch),
        head_backward(cfg, arch, batch, lm_head_trainable=not cfg.use_peft),
    )


def nograd_head(cfg: RunConfig, arch: Arch, batch: int) -> int:
    """Transient of a no-grad log-prob pass's head (reference / old policy), by path."""
    if cfg.logprob_head in ("rowwise", "selective"):
        return materialized_nograd(cfg, arch, batch)
    return head_forward(cfg, arch, batch)
