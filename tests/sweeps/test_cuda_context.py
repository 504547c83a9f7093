"""The bare-CUDA-context probe with torch.cuda and NVML scripted (no GPU needed)."""

import torch

from sweeps.probes import nvml, torch_cuda

MIB = 2**20


class FakeNvml:
    """Device 'used' rises by the context when mem_get_info creates it; NVML lists this process with it."""

    def __init__(self, state):
        self.state = state

    def used_bytes(self):
        return 900 * MIB + (self.state["context"] if self.state["created"] else 0)

    def process_bytes(self, pid):
        return self.state["context"] if self.state["created"] else None


def test_context_is_what_nvml_lists_for_this_process_before_any_allocation(monkeypatch):
    state = {"created": False, "context": 518 * MIB}

    def mem_get_info(device=None):
        state["created"] = True
        return 79_000 * MIB, 81_000 * MIB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(nvml, "open_cuda_device", lambda i: (FakeNvml(state), None))
    got = torch_cuda.context_baseline()
    assert got["context_bytes"] == got["process_bytes"] == 518 * MIB
    assert got["device_used_after_bytes"] - got["device_used_before_bytes"] == 518 * MIB
    assert got["mem_get_info_total_bytes"] == 81_000 * MIB and got["torch_allocated_bytes"] == 0


def test_without_nvml_the_context_is_unknown_but_the_total_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1, 2))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(nvml, "open_cuda_device", lambda i: (None, "NVMLError_LibraryNotFound"))
    got = torch_cuda.context_baseline()
    assert got["context_bytes"] is None and got["nvml_reason"] == "NVMLError_LibraryNotFound"
    assert got["mem_get_info_total_bytes"] == 2


def test_on_a_machine_without_cuda_it_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_cuda.context_baseline() == {"available": False, "reason": "torch.cuda is not available"}
    assert torch_cuda.after_build() == {"available": False, "reason": "torch.cuda is not available"}


def test_after_build_keeps_what_loading_left_cached(monkeypatch):
    counters = {"memory_allocated": 2 * MIB, "memory_reserved": 9 * MIB, "max_memory_allocated": 5 * MIB}
    counters["max_memory_reserved"] = 9 * MIB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, value in counters.items():
        monkeypatch.setattr(torch.cuda, name, lambda device=None, v=value: v)
    got = torch_cuda.after_build()
    assert got["reserved_bytes"] - got["allocated_bytes"] == 7 * MIB  # cached free blocks
    assert (got["max_allocated_bytes"], got["max_reserved_bytes"]) == (5 * MIB, 9 * MIB)
