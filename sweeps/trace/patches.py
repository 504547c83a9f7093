"""Patches that let TRL 1.16's GRPO code run on FakeTensors and make it allocate what it allocates on a CUDA GPU.

`patched()` installs the process-wide ones for the duration of a block and restores the originals on exit;
`use_gpu_fused_head` changes one model instance only. What each follows upstream: `sweeps/trace/upstream.py`.

* `Module._apply` on FakeTensor parameters: torch 2.13 always swaps fake params (`swap_tensors`), which fails
  because FakeTensorMode holds a weakref to each; the patch assigns `param.data` instead (`model.to`, PEFT).
* transformers' SDPA mask skip (`_ignore_causal_mask_sdpa`) refuses to look at a FakeTensor padding mask and
  builds a 4-D mask, which sends SDPA to the math path; on a real GPU run the all-ones mask is seen and SDPA
  runs causal flash/efficient attention with no mask. Every traced batch is unpadded (prompts all
  `max_prompt_length`, completions forced to full length), so a fake padding mask is treated as all ones.
* `nn.functional.softmax(fp16, dtype=float32)`: CUDA's `half_to_float` kernel, not CPU's fp32 copy of the input
  (eager attention's scores in fp16 runs).
* autograd's `index_backward` (the backward of `x[idx]`, e.g. the MoE combine's `weighted_out[inv_perm]`): with a
  dispatch mode active or a tensor subclass, torch takes its out-of-place `index_put` on the fresh `new_zeros`
  (FunctionsManual.cpp `index_backward`: `areAnyTensorSubclassLike(...) ? zeros.index_put(...) :
  zeros.index_put_(...)`), one more gradient-sized tensor than a CUDA step, which writes in place.
  `CudaIndexBackward` turns that one pattern (an accumulating `index_put` on the `new_zeros` dispatched just
  before it) into the in-place op.
* `torch.is_autocast_enabled()` with no device: CUDA's autocast state. peft's bnb LoRA wrapper asks it whether
  to cast the adapter's input and output (`requires_conversion = not torch.is_autocast_enabled()`,
  https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/bnb.py#L543); a trace of a CUDA run
  autocasts on CPU tensors, so the bare call answers with the CPU autocast that stands for CUDA's (the bare
  call's CPU answer, False under bf16 autocast, would make the traced QLoRA layers cast where a GPU's do not).
* autograd's `_softmax_backward_data` (eager attention's softmax): CUDA's kernel first makes `tmp = grad * output`,
  a gradient-sized temporary the CPU and meta kernels do not; `CudaSoftmaxBackward`, entered inside the storage
  probe for the training phase of a CUDA run, makes and frees it after the result as CUDA does.
* TRL's metric-only `nanmin`/`nanmax` branch on data (`isnan(t).all()`): replaced by `min`/`max`.
* fused LM head, GPU path (`fused-gpu`): on CUDA with Triton, TRL scores only the completion positions
  (`hidden_states[mask]`, a compact `[N_valid, H]` copy, then `masked_scatter` back) and folds each
  `[<=4096, 32768]` tile in a Triton kernel with no temporaries, accumulating the gradient GEMMs with
  `addmm(out_dtype=fp32)` in place. Here the boolean-mask copy becomes a static slice of the last C positions (the
  same bytes: every completion is forced to full length, prompts are unpadded), the tile folds become no-ops (the
  kernels write only into preallocated per-row statistics and the tile itself), and `_addmm_fp32` a no-op (CUDA
  writes into `acc` with no fp32 copies of its operands). Values are garbage; shapes, dtypes and lifetimes are not.
"""

from __future__ import annotations

import contextlib
import functools
import types
import weakref
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

_ORIG_APPLY = torch.nn.Module._apply


def _apply(self: torch.nn.Module, fn, recurse: bool = True):
    """Module._apply that assigns `.data` for FakeTensor parameters instead of swapping them."""
    if recurse:
        for child in self.children():
            child._apply(fn)
    own = [t for t in (*self._parameters.values(), *self._buffers.values()) if t is not None]
    if not any(isinstance(t, FakeTensor) for t in own):
        return _ORIG_APPLY(self, fn, recurse=False)
    for p in self._parameters.values():
        if p is None:
            continue
        with torch.no_grad():
            new = fn(p)
        if new is not p:
            p.data = new
        if p.grad is not None:
            g = fn(p.grad)
            if g is not p.grad:
                p.grad.data = g
    for k, b in self._buffers.items():
        if b is not None:
            self._buffers[k] = fn(b)
    return self


def _ignore_mask_fake_as_ones(orig):
    """Wrap `_ignore_causal_mask_sdpa`: a FakeTensor padding mask (or offset) is read as all ones (unpadded)."""

    @functools.wraps(orig)
    def wrapper(padding_mask, q_length, kv_length, q_offset, kv_offset, *args, **kwargs):
        if isinstance(padding_mask, FakeTensor):
            padding_mask = None
        if isinstance(q_offset, FakeTensor):
            q_offset = kv_length - q_length
        return orig(padding_mask, q_length, kv_length, q_offset, kv_offset, *args, **kwargs)

    return wrapper


def _fused_dropout(orig):
    """CUDA runs training dropout as `native_dropout` (saves a bool mask); CPU tensors take `input * noise` (saves a
    noise tensor in the input dtype). Traces of CUDA runs use the fused op on their CPU tensors."""

    @functools.wraps(orig)
    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and not inplace:
            return torch.native_dropout(input, p, True)[0]
        return orig(input, p, training, inplace)

    return dropout


def _cuda_softmax(orig):
    """ATen's `softmax(input, dim, dtype)` (aten/src/ATen/native/SoftMax.cpp, `softmax`): on CUDA an fp16 input
    with `dtype=float32` runs `_softmax(input, dim, half_to_float=True)`, which reads fp16 and writes fp32 with no
    fp32 copy of the input; on CPU it converts first (`input.toType(dtype)`, a full fp32 copy). Eager attention
    calls `nn.functional.softmax(scores, dim=-1, dtype=torch.float32)`, so a trace of an fp16 CUDA run on CPU
    tensors held one fp32 [B, heads, L, L] copy too many. Traces of CUDA runs take the CUDA branch."""

    @functools.wraps(orig)
    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if dim is not None and dtype == torch.float32 and input.dtype == torch.float16:
            return torch._softmax(input, dim, True)
        return orig(input, dim, _stacklevel=_stacklevel, dtype=dtype)

    return softmax


def _autocast_of_traced_device(orig):
    """`torch.is_autocast_enabled()` with no device answers for CUDA; in a trace of a CUDA run on CPU tensors the
    ambient autocast is CPU's, so the bare call reports that. Calls naming a device are unchanged."""

    @functools.wraps(orig)
    def is_autocast_enabled(*args, **kwargs):
        if not args and not kwargs:
            return orig("cpu") or orig()
        return orig(*args, **kwargs)

    return is_autocast_enabled


def _noop(*args, **kwargs) -> None:
    return None


class _NoopKernel:
    """Stands in for a Triton kernel launcher `kernel[grid](...)`: writes in place, allocates nothing."""

    def __getitem__(self, grid):
        return _noop


def _min(t: torch.Tensor) -> torch.Tensor:
    return t.min()


def _max(t: torch.Tensor) -> torch.Tensor:
    return t.max()


class CudaIndexBackward(TorchDispatchMode):
    """Run autograd's `index_backward` in place, as a CUDA step without a dispatch mode does.

    torch 2.13 `index_backward` (torch/csrc/autograd/FunctionsManual.cpp) is `new_zeros` then `index_put` with
    `accumulate=True`; it writes into the zeros in place unless a tensor is subclass-like, which every tensor is
    while a TorchDispatchMode (the probe, FakeTensorMode) is active. Only an accumulating `index_put` whose target
    is the tensor the immediately preceding op, `new_zeros`, returned is rewritten: nothing else can hold that
    tensor yet, so writing it in place changes no value anyone reads.
    """

    def __init__(self) -> None:
        super().__init__()
        self._zeros: weakref.ref | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fresh, self._zeros = self._zeros, None
        if func is torch.ops.aten.index_put.default and fresh is not None and fresh() is args[0]:
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            if accumulate:
                return torch.ops.aten.index_put_.default(*args, **kwargs)
        out = func(*args, **kwargs)
        if func is torch.ops.aten.new_zeros.default:
            self._zeros = weakref.ref(out)
        return out


class CudaSoftmaxBackward(TorchDispatchMode):
    """Make the temporary CUDA's softmax backward makes: torch 2.13 `softmax_backward_cuda_out`
    (aten/src/ATen/native/cuda/SoftMax.cu) runs `Tensor tmp = grad * output;` after the structured op allocated
    the result and passes `tmp` to its kernel, which frees it on return; the CPU kernel and the meta kernel a
    FakeTensor trace runs allocate the result only. Eager attention's `softmax(dtype=float32)` backward is where
    it shows: one fp32 [B, heads, L, L] more at the layer's backward peak (the estimator's
    `activations.softmax_backward_cuda_tmp_bytes`).

    Entered above the storage probe (inside it), so the probe sees the result, then `tmp` made and freed, in the
    GPU's order. The values are the CPU kernel's; only the extra allocation is added."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._softmax_backward_data.default:
            tmp = torch.ops.aten.mul.Tensor(args[0], args[1])
            del tmp
        return out


def _replacements() -> list[tuple[object, str, object]]:
    """(owner, attribute, replacement) for every patch; imports transformers and TRL."""
    import transformers.masking_utils as mu
    import trl.trainer.grpo_trainer as gt
    from trl.kernels import chunked_logprob as ck

    return [
        (torch.nn.Module, "_apply", _apply),
        (torch.nn.functional, "dropout", _fused_dropout(torch.nn.functional.dropout)),
        (torch.nn.functional, "softmax", _cuda_softmax(torch.nn.functional.softmax)),
        (torch, "is_autocast_enabled", _autocast_of_traced_device(torch.is_autocast_enabled)),
        (mu, "_ignore_causal_mask_sdpa", _ignore_mask_fake_as_ones(mu._ignore_causal_mask_sdpa)),
        (gt, "nanmin", _min),
        (gt, "nanmax", _max),
        (ck, "_forward_tile", _noop),
        (ck, "_backward_tile", _noop),
        (ck, "_addmm_fp32", _noop),
        (ck, "_forward_kernel", _NoopKernel()),
        (ck, "_backward_kernel", _NoopKernel()),
    ]


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """The fake-tensor and fused-gpu patches, for the duration of the block only.

    Every patched attribute gets its original object back on exit, exceptions included (nesting is safe: an inner
    block restores what the outer one installed). A target missing from torch / transformers / TRL raises
    RuntimeError before anything is patched (see tests/contracts/test_tracer_upstream.py for what to re-read).
    """
    table = _replacements()
    saved = []
    for owner, name, _ in table:
        if name not in vars(owner):
            where = getattr(owner, "__name__", repr(owner))
            raise RuntimeError(f"{where}.{name} is gone: the tracer's patch target changed upstream")
        saved.append((owner, name, vars(owner)[name]))
    try:
        for owner, name, new in table:
            setattr(owner, name, new)
        yield
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)


def _fused_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """The (sub)module whose forward TRL replaced with `_fused_forward`."""
    for m in model.modules():
        fwd = m.__dict__.get("forward")
        if isinstance(fwd, types.MethodType) and fwd.__func__.__code__.co_name == "_fused_forward":
            return m
    return None


def use_gpu_fused_head(model: torch.nn.Module, completion_length: int) -> None:
    """Replace TRL's fused forward on `model` by its CUDA (compact) path with static completion slicing."""
    m = _fused_model(model)
    if m is None:
        raise RuntimeError("no TRL fused LM head found on the model")
    fwd = m.__dict__["forward"].__func__
    cells = dict(zip(fwd.__code__.co_freevars, (c.cell_contents for c in fwd.__closure__), strict=True))
    original_forward = cells["original_forward"]
    temperature, outputs = cells["temperature"], cells["outputs"]
    cast_fp32 = cells["cast_lm_head_to_fp32"]
    softcap, logit_scale = cells["final_logit_softcapping"], cells["logit_scale"]
    backbone_attr, text_config = cells["backbone_attr"], cells["text_config"]
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, FusedCausalLMOutput

    c = completion_length

    @functools.wraps(type(m).forward)
    def _fused_forward(self, *args, fused_lm_head=False, labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            if labels is not None:
                kwargs["labels"] = labels
            return original_forward(*args, **kwargs)
        kwargs["use_cache"] = False
        if getattr(text_config, "output_router_logits", False):
            kwargs.setdefault("output_router_logits", True)
        backbone_outputs = getattr(self, backbone_attr)(*args, **kwargs)
        hidden_states = backbone_outputs.last_hidden_state[:, :-1]
        labels = labels[:, 1:]
        lm_head = self.get_output_embeddings()
        mask = labels != -100
        ctx = torch.autocast(hidden_states.device.type, enabled=False) if cast_fp32 else None
        if cast_fp32:
            hidden_states = hidden_states.float()
        # compact path: hidden_states[mask] / labels[mask] -> the same-size copies of the completion positions
        h = hidden_states[:, -c:].reshape(-1, hidden_states.size(-1))
        if h._base is not None:  # reshape returned a view (contiguous slice): boolean indexing always copies
            h = h.clone()
        tgt = labels[:, -c:].reshape(-1).clone()
        if ctx is not None:
            ctx.__enter__()
        try:
            per_token = ChunkedLogProbFunction.apply(
                h,
                lm_head.weight,
                lm_head.bias,
                tgt,
                temperature,
                _CHUNKED_LOGPROB_CHUNK_SIZE,
                softcap,
                logit_scale,
                outputs,
            )
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        per_token = (
            None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x) for x in per_token
        )
        log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1 = per_token
        loss = -log_probs.sum() / (
            mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        )
        aux_loss = None
        if kwargs.get(
            "output_router_logits"
        ):  # MoE load-balancing loss, as TRL computes it (transformers >= 5.6)
            from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

            aux_loss = load_balancing_loss_func(
                backbone_outputs.router_logits,
                text_config.num_experts,
                text_config.num_experts_per_tok,
                kwargs.get("attention_mask"),
            )
            loss = loss + getattr(text_config, "router_aux_loss_coef", 0.0) * aux_loss
        return FusedCausalLMOutput(
            loss=loss,
            log_probs=log_probs,
            entropy=entropy,
            log_sum_sq_probs=log_sum_sq_probs,
            mean_logits=mean_logits,
            is_top1=is_top1,
            label_mask=mask,
            aux_loss=aux_loss,
        )

    m.forward = types.MethodType(_fused_forward, m)
