"""Where a tied head's gradient meets the embedding's: summed in place on real tensors, out of place on fake ones.

With tied embeddings the head's [V, H] gradient (TRL's fused head returns `grad_weight.to(weight.dtype)`, a fresh
tensor) waits in the AccumulateGrad node's input buffer until the embedding's own arrives. torch's
`InputBuffer::accumulate` (torch/csrc/autograd/input_buffer.cpp, `can_accumulate_inplace`) adds the new gradient
into the waiting one in place when that one is a plain tensor holding its last reference: two [V, H] live at the
meeting. Through the model's own head (`F.linear` with the tied weight) real tensors sum out of place, and a
FakeTensor is a tensor subclass, so a trace sums out of place too: three. `optimizer.tied_gradients_at_meeting`
counts each case; tests/accuracy/test_gpu_allocated_replay.py shows the in-place sum in the H100's own counters.
The op log comes from torch's profiler, which holds no reference to the tensors (a Python dispatch mode does, and
so turns the real sum out of place too). The head's first backward imports `trl.trainer.utils`; under pytest a failed optional import logged there keeps that backward's frame,
and the fp32 gradient it returns, alive in the log capture, so the real run is made once before it is counted.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

chunked = pytest.importorskip("trl.kernels.chunked_logprob")
V, H, T = 1000, 32, 16


def _sums_at_the_meeting(fused: bool = True) -> list[str]:
    """The [V, H] additions the backward of a tied embedding and its head runs: TRL's fused head, or the logits
    through `F.linear` with the tied weight (the model's own lm_head: the full, rowwise and selective heads)."""
    emb, proj = torch.nn.Embedding(V, H), torch.nn.Linear(H, H)
    ids = torch.randint(0, V, (T,))
    hidden = proj(emb(ids))
    if fused:
        loss = chunked.ChunkedLogProbFunction.apply(hidden, emb.weight, None, ids, 1.0, 512)[0].sum()
    else:
        loss = (
            torch.log_softmax(torch.nn.functional.linear(hidden, emb.weight), -1)
            .gather(1, ids[:, None])
            .sum()
        )
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


def test_real_tensors_through_the_model_head_sum_them_out_of_place():
    _sums_at_the_meeting()  # the lazy import inside the first backward
    assert _sums_at_the_meeting(fused=False) == ["aten::add"]


def test_fake_tensors_sum_them_out_of_place():
    with FakeTensorMode():
        sums = _sums_at_the_meeting()
    assert sums and set(sums) == {"aten::add"}
