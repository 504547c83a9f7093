"""DDP as accelerate builds it holds one flat copy of the trainable gradients beside `.grad`.

The oracle is torch's own `DistributedDataParallel` (a gloo group of one process) with the keyword arguments
accelerate passes by default: the floating-point tensors its constructor allocates and keeps are the buckets, one
per dtype here, covering exactly the parameters that require grad; after a backward each `.grad` is a tensor of
its own, outside them (`gradient_as_bucket_view` off)."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode


class _Empties(TorchDispatchMode):
    """Every floating-point tensor an `empty` creates."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "empty" and out.is_floating_point():
            self.made.append(weakref.ref(out))
        return out


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Two(torch.nn.Module):
    """An fp32 layer whose weight is frozen, then a bf16 layer: two buckets, one per dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 32)
        self.b = torch.nn.Linear(32, 8).to(torch.bfloat16)
        self.a.weight.requires_grad_(False)

    def forward(self, x):
        return self.b(self.a(x).to(torch.bfloat16))


def test_ddp_keeps_a_flat_copy_of_the_trainable_gradients(one_process_group):
    from accelerate.utils import DistributedDataParallelKwargs
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = _Two()
    # written out: a.bias 32 x 4 bytes (fp32); b.weight 8 x 32 and b.bias 8, x 2 bytes (bf16); a.weight frozen
    rec = _Empties()
    with rec:
        ddp = DistributedDataParallel(model, **DistributedDataParallelKwargs().to_kwargs())
    buckets = [t for r in rec.made if (t := r()) is not None]  # still referenced: held by the reducer
    assert sorted((str(t.dtype), t.numel()) for t in buckets) == [
        ("torch.bfloat16", 264),
        ("torch.float32", 32),
    ]
    assert sum(t.untyped_storage().nbytes() for t in buckets) == 32 * 4 + (8 * 32 + 8) * 2

    ddp(torch.randn(4, 64)).float().sum().backward()
    spans = [(b.data_ptr(), b.data_ptr() + b.untyped_storage().nbytes()) for b in buckets]
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert len(grads) == 3 and all(g is not None for g in grads)
    assert not any(
        lo <= g.data_ptr() < hi for g in grads for lo, hi in spans
    )  # each `.grad` is its own tensor
