"""NVML's GPU index for torch's CUDA device is matched by UUID (CUDA_VISIBLE_DEVICES renumbers torch's devices)."""

import sys
import types

import torch

from sweeps.probes import nvml


def test_cuda_device_maps_to_nvml_index_by_uuid(monkeypatch):
    # CUDA_VISIBLE_DEVICES=3: torch's device 0 is the card NVML numbers 3
    handles = {"GPU-aaaa": 0, "GPU-dddd": 3}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: handles[uuid],
        nvmlDeviceGetIndex=lambda handle: handle,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="dddd"))
    assert nvml.nvml_index(0) == 3


def test_falls_back_to_the_cuda_index_when_torch_cannot_tell(monkeypatch):
    def no_cuda(i):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_cuda)
    assert nvml.nvml_index(2) == 2
