"""The op-by-op ground-truth harness: a dispatch mode that counts the bytes of the storages written while it is
active, and tiny causal LMs built from a catalog family's transformers config (nothing downloaded, random
weights), for tests that measure a real module's forward or backward against a memory term."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LivePeak(TorchDispatchMode):
    """Peak bytes of the storages written while the mode is active (freed ones leave the count). Storages of the
    `existing` tensors (weights, inputs, which views such as `t()` share) are not counted."""

    def __init__(self, existing: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live: dict[int, int] = {id(t.untyped_storage()): 0 for t in existing}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self.live:
                storage = t.untyped_storage()
                key = id(storage)
                self.live[key] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
                weakref.finalize(storage, self._free, key)
        return out

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)


class BackwardBorn(LivePeak):
    """LivePeak that, once `backward` is set, logs after each op (op, bytes of live storages the backward wrote,
    bytes of forward storages released since). Storages are told apart when written, not by a snapshot of ids
    (CPython reuses a freed storage's id)."""

    def __init__(self, existing) -> None:
        super().__init__(existing)
        self.backward = False
        self.born: set[int] = set()
        self.released = 0
        self.log: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = set(self.live)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.backward:
            self.born |= set(self.live) - before
            born = sum(self.live[k] for k in self.born if k in self.live)
            self.log.append((func.overloadpacket.__name__, born, self.released))
        return out

    def _free(self, key: int) -> None:
        if self.backward and key not in self.born:
            self.released += self.live.get(key, 0)
        self.born.discard(key)
        super()._free(key)


H = 64
TINY_TWO_LAYER = {
    "hidden_size": H,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "vocab_size": 50,
    "pad_token_id": 0,
}
INTER = TINY_TWO_LAYER["intermediate_size"]
TINY_ONE_LAYER = {**TINY_TWO_LAYER, "num_hidden_layers": 1}  # for a single decoder layer or MLP


def attn_implementation(model_type: str) -> str:
    """sdpa, except Gemma2/3, which transformers runs eagerly here (Gemma2 refuses sdpa)."""
    return "eager" if model_type.startswith("gemma") else "sdpa"


def tiny_causal_lm(model_type: str, dtype: str) -> torch.nn.Module:
    """`TINY_TWO_LAYER` as a `model_type` causal LM in `dtype` (seeded), in train mode is left to the caller."""
    import transformers

    conf = transformers.AutoConfig.for_model(model_type, **TINY_TWO_LAYER)
    conf._attn_implementation = attn_implementation(model_type)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(conf).to(getattr(torch, dtype))


def cuda_dropout(x, p=0.5, training=True, inplace=False):
    """`F.dropout` as CUDA runs it: `at::dropout` takes the fused `native_dropout` (an output and a bool mask;
    ATen Dropout.cpp `is_fused_kernel_acceptable`), where CPU decomposes it into a noise tensor instead."""
    return torch.ops.aten.native_dropout(x, p, training)[0] if training and p > 0 else x
