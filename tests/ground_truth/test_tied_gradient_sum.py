"""Where a tied head's gradient meets the embedding's: summed in place on real tensors, out of place on fake ones.

With tied embeddings the head's [V, H] gradient (TRL's fused head returns `grad_weight.to(weight.dtype)`, a fresh
tensor) waits in the AccumulateGrad node's input buffer until the embedding's own arrives. torch's
`InputBuffer::accumulate` (torch/csrc/autograd/input_buffer.cpp, `can_accumulate_inplace`) adds the new gradient
into the waiting one in place when that one is a plain tensor holding its last reference: two [V, H] live at the
meeting. A FakeTensor is a tensor subclass, so a trace sums out of place: three. `optimizer.tied_gradient_buffer`'s
`backward_end` instant (estimator/step/single.py) counts three, as the traces do; on the GPU the 0.5B full fine-tune
of the min-card lineup peaked below what three need (docs/ACCURACY.md), but the same rows sit above the other
training instants by more than the difference, so the term waits for a GPU allocator stream before it changes.
This pins the upstream fact the change rests on. The op log comes from torch's profiler, which holds no reference
to the tensors (a Python dispatch mode does, and so turns the real sum out of place too). The head's first
backward imports `trl.trainer.utils`; under pytest a failed optional import logged there keeps that backward's frame,
and the fp32 gradient it returns, alive in the log capture, so the real run is made once before it is counted.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

chunked = pytest.importorskip("trl.kernels.chunked_logprob")
V, H, T = 1000, 32, 16


def _sums_at_the_meeting() -> list[str]:
    """The [V, H] additions the backward of a tied embedding and fused head runs."""
    emb, proj = torch.nn.Embedding(V, H), torch.nn.Linear(H, H)
    ids = torch.randint(0, V, (T,))
    out = chunked.ChunkedLogProbFunction.apply(proj(emb(ids)), emb.weight, None, ids, 1.0, 512)
    loss = out[0].sum()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()
    return [
        e.name
        for e in prof.events()
        if e.name in ("aten::add", "aten::add_") and e.input_shapes and list(e.input_shapes[0]) == [V, H]
    ]


def test_real_tensors_sum_the_tied_gradients_in_place():
    _sums_at_the_meeting()  # the lazy import inside the first backward
    assert _sums_at_the_meeting() == ["aten::add_"]


def test_fake_tensors_sum_them_out_of_place():
    with FakeTensorMode():
        sums = _sums_at_the_meeting()
    assert sums and set(sums) == {"aten::add"}
