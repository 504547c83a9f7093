"""The tracer's patches of torch, transformers and TRL last only as long as `patches.patched()` and its env only as
long as `step.run`: every attribute of every module they touch is the original object again afterwards."""

from __future__ import annotations

import os

import pytest
import torch

# What sweeps/trace/patches.py's module docstring promises to patch, written out by hand (not read from the code).
EXPECTED = {
    ("torch.nn.modules.module.Module", "_apply"),
    ("torch.nn.functional", "dropout"),
    ("torch.nn.functional", "softmax"),
    ("torch", "is_autocast_enabled"),
    ("transformers.masking_utils", "_ignore_causal_mask_sdpa"),
    ("trl.trainer.grpo_trainer", "nanmin"),
    ("trl.trainer.grpo_trainer", "nanmax"),
    ("trl.kernels.chunked_logprob", "_forward_tile"),
    ("trl.kernels.chunked_logprob", "_backward_tile"),
    ("trl.kernels.chunked_logprob", "_addmm_fp32"),
    ("trl.kernels.chunked_logprob", "_forward_kernel"),
    ("trl.kernels.chunked_logprob", "_backward_kernel"),
}


def _owners() -> dict[str, object]:
    import transformers.masking_utils as mu
    import trl.trainer.grpo_trainer as gt
    import trl.trainer.utils as tu
    from trl.kernels import chunked_logprob as ck

    return {
        "torch.nn.modules.module.Module": torch.nn.Module,
        "torch.nn.functional": torch.nn.functional,
        "torch": torch,
        "transformers.masking_utils": mu,
        "trl.trainer.grpo_trainer": gt,
        "trl.trainer.utils": tu,
        "trl.kernels.chunked_logprob": ck,
    }


def _snapshot() -> dict[tuple[str, str], object]:
    """Every attribute (the object itself) of every module or class a patch could touch."""
    return {(name, k): v for name, owner in _owners().items() for k, v in list(vars(owner).items())}


def _changed(before: dict, after: dict) -> set[tuple[str, str]]:
    return {k for k, v in before.items() if k not in after or after[k] is not v}


def test_patched_replaces_exactly_the_documented_attributes_and_restores_them():
    from sweeps.trace import patches

    before = _snapshot()
    with patches.patched():
        inside = _snapshot()
    assert _changed(before, inside) == EXPECTED
    assert _changed(before, _snapshot()) == set()


def test_patches_are_restored_when_the_block_raises():
    from sweeps.trace import patches

    before = _snapshot()
    with pytest.raises(ZeroDivisionError), patches.patched():
        1 / 0  # noqa: B018
    assert _changed(before, _snapshot()) == set()


def test_nested_blocks_restore_the_originals():
    from sweeps.trace import patches

    before = _snapshot()
    with patches.patched():
        with patches.patched():
            pass
        assert _changed(before, _snapshot()) == EXPECTED  # the outer block's patches are still in place
    assert _changed(before, _snapshot()) == set()


def test_importing_the_tracer_and_report_sets_no_environment_or_backend():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import os, json; before = dict(os.environ); import matplotlib; b0 = matplotlib.rcParams._get_backend_or_none()\n"
        "import sweeps.trace.step, sweeps.trace.patches, sweeps.trace.generate, sweeps.trace.fake_model\n"
        "import sweeps.trace.optim8bit, sweeps.report.plots, sweeps.report.tables\n"
        "changed = {k: v for k, v in os.environ.items() if before.get(k) != v}\n"
        "print(json.dumps({'env': changed, 'backend': [b0, matplotlib.rcParams._get_backend_or_none()]}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"HF_HUB_OFFLINE", "MPLBACKEND"}}
    env["PYTHONPATH"] = str(repo)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["env"] == {}
    assert got["backend"][0] == got["backend"][1]  # no matplotlib.use() at import


def test_offline_env_is_scoped_and_keeps_the_callers_values(monkeypatch):
    from sweeps.trace import step

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    with step.offline_env():
        assert os.environ["HF_HUB_OFFLINE"] == "1"
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
    assert "HF_HUB_OFFLINE" not in os.environ
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"


def _ops(fn) -> list[str]:
    """aten ops `fn` dispatches, in order, under FakeTensorMode (CPU fake tensors, as the tracer uses)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), Log():
        fn()
    return seen


def test_fp16_softmax_to_fp32_takes_cudas_half_to_float_kernel_while_patched():
    """ATen SoftMax.cpp `softmax(input, dim, dtype)`: on CUDA, fp16 -> fp32 runs `_softmax(x, dim, true)` with no
    fp32 copy of the input; CPU tensors convert first. bf16 converts on both devices."""
    from sweeps.trace import patches

    def softmax(dtype):
        return lambda: torch.nn.functional.softmax(
            torch.empty(2, 3, 4, dtype=dtype), dim=-1, dtype=torch.float32
        )

    def kernels(dtype) -> list[str]:
        return [op for op in _ops(softmax(dtype)) if op in ("_to_copy", "_softmax")]

    assert kernels(torch.float16) == ["_to_copy", "_softmax"]  # CPU's path, unpatched
    with patches.patched():
        assert kernels(torch.float16) == ["_softmax"]
        assert kernels(torch.bfloat16) == ["_to_copy", "_softmax"]
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            out = torch.nn.functional.softmax(
                torch.empty(2, 4, dtype=torch.float16), dim=-1, dtype=torch.float32
            )
        assert out.dtype == torch.float32


def _index_backward_peak(rewrite: bool) -> int:
    """Peak live bytes (in [S, H] fp32 units) of `y = x[perm]` and its backward, under the probe, on FakeTensors."""
    from contextlib import nullcontext

    from torch._subclasses.fake_tensor import FakeTensorMode

    from sweeps.probes.tensors import LiveStorageMode
    from sweeps.trace.patches import CudaIndexBackward

    s, h = 512, 256
    with FakeTensorMode(), CudaIndexBackward() if rewrite else nullcontext():
        x = torch.empty(s, h, requires_grad=True)
        perm = torch.randperm(s)
        probe = LiveStorageMode()
        with probe:
            y = x[perm]  # 1
            g = torch.ones_like(y)  # 2
            (gx,) = torch.autograd.grad(y, x, g)  # 3: the gradient; a 4th if the zeros are copied
            del y, g, gx
    return probe.result()["peak_bytes"] // (s * h * 4)


def test_index_backward_runs_in_place_as_on_cuda():
    """Hand count: y, its incoming gradient and x's gradient are three [S, H] tensors; torch under a dispatch mode
    writes the gradient into a copy of its zeros (a fourth), which CudaIndexBackward undoes."""
    assert _index_backward_peak(rewrite=False) == 4  # the artifact; if torch stops copying, drop the patch
    assert _index_backward_peak(rewrite=True) == 3


def test_index_put_outside_index_backward_keeps_its_copy():
    """An out-of-place index_put on a tensor that was not just made by new_zeros still returns a new tensor."""
    from sweeps.trace.patches import CudaIndexBackward

    base = torch.zeros(4)
    with CudaIndexBackward():
        out = torch.ops.aten.index_put.default(base, [torch.tensor([1])], torch.tensor([5.0]), True)
        fresh = base.new_zeros(4)
        torch.ops.aten.add.Tensor(fresh, 1)
        later = torch.ops.aten.index_put.default(fresh, [torch.tensor([2])], torch.tensor([3.0]), True)
    assert base.tolist() == [0.0, 0.0, 0.0, 0.0] and out.tolist() == [0.0, 5.0, 0.0, 0.0]
    assert fresh.tolist() == [0.0, 0.0, 0.0, 0.0] and later.tolist() == [0.0, 0.0, 3.0, 0.0]


def _softmax_backward_peak(cuda: bool) -> tuple[int, list[tuple]]:
    """Peak live bytes (in [B, h, L, L] fp32 units) of eager attention's `softmax(scores, dtype=float32)` and its
    backward on bf16 scores, under the probe, on FakeTensors; and the probe's event stream."""
    from contextlib import nullcontext

    from torch._subclasses.fake_tensor import FakeTensorMode

    from sweeps.probes.tensors import LiveStorageMode
    from sweeps.trace.patches import CudaSoftmaxBackward

    b, h, n = 2, 4, 128
    with FakeTensorMode():
        scores = torch.empty(b, h, n, n, dtype=torch.bfloat16, requires_grad=True)
        probe = LiveStorageMode(record_events=True)
        with probe, CudaSoftmaxBackward() if cuda else nullcontext():
            p = torch.nn.functional.softmax(
                scores, dim=-1, dtype=torch.float32
            )  # fp32 copy 1 (freed), saved 1
            g = torch.ones_like(p)  # 1
            (gs,) = torch.autograd.grad(p, scores, g)  # result 1, CUDA's tmp 1, then the bf16 cast 1/2
            del p, g, gs
    return probe.result()["peak_bytes"] // (b * h * n * n * 4), probe.events


def test_softmax_backward_makes_cudas_grad_times_output_temporary():
    """Hand count, torch 2.13 aten/src/ATen/native/cuda/SoftMax.cu `softmax_backward_cuda_out`: at the kernel the
    saved fp32 output, the fp32 incoming gradient and the fp32 result are live (3 units); CUDA also holds
    `tmp = grad * output` (a 4th), made after the result and freed before the op returns. The CPU / meta kernel
    holds 3."""
    peak, _ = _softmax_backward_peak(cuda=False)
    assert peak == 3
    peak, events = _softmax_backward_peak(cuda=True)
    assert peak == 4
    unit = 2 * 4 * 128 * 128 * 4
    big = [e for e in events if e[0] == "a" and e[2] == unit]
    # the input's fp32 copy, the output, the gradient, the result, then tmp, freed before anything else happens
    assert len(big) == 5
    at = events.index(big[4])
    assert events[at - 1] == big[3] and events[at + 1] == ("f", big[4][1])
