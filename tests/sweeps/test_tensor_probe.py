"""LiveStorageMode counts a known allocation pattern exactly, on real and on fake tensors."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from sweeps.probes.tensors import LiveStorageMode


def nb(numel: int, dtype: torch.dtype) -> int:
    """Bytes of a dense storage, computed from first principles."""
    return numel * torch.empty((), dtype=dtype).element_size()


def modes():
    return [("real", contextlib.nullcontext), ("fake", FakeTensorMode)]


@pytest.mark.parametrize("kind,ctx", modes())
def test_views_frees_resize_and_phases(kind, ctx):
    with ctx():
        w = torch.empty(1000, dtype=torch.float32)
        probe = LiveStorageMode()
        assert probe.register(w, "param") == nb(1000, torch.float32)
        with probe:
            with probe.phase("a"):
                x = torch.empty(256, dtype=torch.float32)
                views = [x.view(16, 16), x[3:], x.t() if x.dim() == 2 else x.unsqueeze(0)]
                y = x * 2
                del y
                z = torch.empty(10, dtype=torch.bfloat16)
            assert probe.current_bytes == nb(1000, torch.float32) + nb(256, torch.float32) + nb(
                10, torch.bfloat16
            )
            with probe.phase("b"):
                z.resize_(1000)
                del z
                del x, views
        assert probe.current_bytes == nb(1000, torch.float32)
    w_b, x_b = nb(1000, torch.float32), nb(256, torch.float32)
    peak_a = w_b + 2 * x_b  # x and y live together; views add nothing
    peak_b = w_b + x_b + nb(1000, torch.bfloat16)
    r = probe.result()
    assert r["phases"] == {"a": peak_a, "b": peak_b}
    assert r["peak_bytes"] == peak_b and r["peak_phase"] == "b"
    at_peak = {(e["op"], e["dtype"], tuple(e["shape"])): e["bytes"] for e in r["at_peak"]}
    assert at_peak == {
        ("param", "float32", (1000,)): w_b,
        ("aten.empty", "float32", (256,)): x_b,
        ("aten.empty", "bfloat16", (1000,)): nb(1000, torch.bfloat16),
    }
    assert sum(e["bytes"] for e in r["phase_at_peak"]["a"]) == peak_a
    assert r["phase_at_peak_by_label"]["a"]["aten.mul"] == x_b


@pytest.mark.parametrize("kind,ctx", modes())
def test_autograd_step_counts_grads_and_optimizer_state(kind, ctx):
    with ctx():
        lin = torch.nn.Linear(64, 32, bias=False)
        probe = LiveStorageMode()
        probe.register(lin)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
        with probe:
            x = torch.ones(8, 64)
            with probe.phase("train"):
                lin(x).sum().backward()
            with probe.phase("optimizer"):
                opt.step()
        probe.register(opt)  # momentum buffer was created under the mode: relabelled, not re-added
    w = nb(64 * 32, torch.float32)
    r = probe.result()
    assert probe.current_bytes == w + w + w + nb(8 * 64, torch.float32)  # weight, grad, momentum, x
    assert r["at_peak_by_label"]["optimizer_state"] == w
    # backward's peak: weight, its gradient (mm), x (saved by the linear), the scalar loss and its ones_like
    # seed; the [8, 32] output is gone (sum's backward keeps no input)
    assert r["phases"]["train"] == w + w + nb(8 * 64, torch.float32) + 2 * nb(1, torch.float32)
    assert r["phases"]["optimizer"] == 3 * w + nb(8 * 64, torch.float32)


def test_rounding_to_cuda_blocks():
    probe = LiveStorageMode(round_to=512)
    with probe:
        a = torch.empty(3, dtype=torch.uint8)
        b = torch.empty(513, dtype=torch.uint8)
        assert probe.current_bytes == 512 + 1024
        assert probe.current_raw == 3 + 513
        del a, b
    r = probe.result()
    assert (r["peak_bytes"], r["peak_bytes_unrounded"]) == (1536, 516)


def test_register_module_counts_params_and_buffers_once():
    m = torch.nn.BatchNorm1d(10)
    probe = LiveStorageMode()
    # weight, bias, running_mean, running_var: 4 × 10 fp32 = 160; num_batches_tracked: one int64 = 8
    assert probe.register(m) == 168
    assert probe.register(m) == 0


def test_per_step_peaks_and_top_grouping():
    probe = LiveStorageMode(top=1)
    with probe:
        for step in (1, 2):
            probe.set_step(step)
            with probe.phase("gen"):
                xs = [torch.empty(100 * step) for _ in range(3)]
                small = torch.empty(1)
            del xs, small
    r = probe.result()
    assert r["steps"] == {"1": {"gen": 3 * 400 + 4}, "2": {"gen": 3 * 800 + 4}}
    assert r["at_peak"][0] == {
        "bytes": 2400,
        "count": 3,
        "op": "aten.empty",
        "dtype": "float32",
        "shape": [200],
    }
    assert r["at_peak"][1]["op"] == "(other)" and r["at_peak"][1]["bytes"] == 4
