"""A dispatch mode that counts the bytes of the storages written while it is active, for tests that measure a
module's forward or backward op by op against a memory term."""

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
