"""bitsandbytes 8-bit AdamW's resident state, for FakeTensor traces (its kernels cannot run on FakeTensors).

What `bnb.optim.AdamW(optim_bits=8)` (0.50, blockwise) keeps per parameter, created at the first step: `state1`
and `state2` uint8 with the parameter's shape, `absmax1`/`absmax2` fp32 with one entry per 256-element block,
and two 256-entry fp32 `qmap`s (shared, once); a parameter with fewer than 4096 elements, and every
`nn.Embedding` weight (transformers registers `optim_bits=32` for them), keeps fp32 `exp_avg`/`exp_avg_sq`-sized
`state1`/`state2` instead. The update runs in place (one fused kernel per parameter), so `step()` allocates
nothing else.
"""

from __future__ import annotations

import math

import torch

MIN_8BIT_SIZE = 4096
BLOCK = 256


class Emulated8bitAdamW:
    """Creates bnb 8-bit AdamW's state tensors at the first step; `step` is otherwise a no-op in memory."""

    def __init__(self, params: list[torch.nn.Parameter], fp32_params: set[int]) -> None:
        self.params = params
        self.fp32_params = fp32_params
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.qmaps: list[torch.Tensor] = []

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> Emulated8bitAdamW:
        """The trainable parameters (what Trainer.create_optimizer passes); embedding weights kept 32-bit."""
        params = [p for p in model.parameters() if p.requires_grad]
        emb = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        return cls(params, emb)

    def step(self) -> None:
        for p in self.params:
            if p.grad is None or p in self.state:
                continue
            if not self.qmaps:
                self.qmaps = [torch.empty(256, dtype=torch.float32, device=p.device) for _ in range(2)]
            if p.numel() < MIN_8BIT_SIZE or id(p) in self.fp32_params:
                st = {k: torch.zeros_like(p, dtype=torch.float32) for k in ("state1", "state2")}
            else:
                blocks = math.ceil(p.numel() / BLOCK)
                st = {k: torch.zeros_like(p, dtype=torch.uint8) for k in ("state1", "state2")}
                for k in ("absmax1", "absmax2"):
                    st[k] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
            self.state[p] = st

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
