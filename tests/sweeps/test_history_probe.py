"""The `history` probe (sweeps/probes/allocator_history.py): unavailable on CPU, accepted by the sweep, real on CUDA."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize

from estimator.hardware.allocator import load_stream
from sweeps import records
from sweeps.probes import allocator_history
from sweeps.runner import run_one, schema
from sweeps.runner.job import BadInput, to_job

SPEC = {"config": {"model": "tiny-2M", "device": "cuda"}, "variant": {"steps": 2}}


def _compose(*overrides):
    schema.register()
    with initialize(config_path="../../sweeps/runner/conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_probe_on_cpu_is_unavailable_with_a_reason_and_writes_nothing(tmp_path):
    spec = {**SPEC, "probe_options": {"history": {"out_dir": str(tmp_path / "gpu")}}}
    probes = run_one._make_probes(["history"], "cuda", spec)
    probe = probes["history"]
    probe.start()
    probe.set_phase("generate")
    probe.stop()
    result = probe.result()
    assert result["available"] is False
    assert "torch.cuda is not available" in result["reason"]
    assert not (tmp_path / "gpu").exists()
    assert allocator_history.begin() == result["reason"]  # the early start does nothing either


def test_probe_of_a_cpu_run_says_so():
    probe = allocator_history.make_probe({**SPEC, "config": {"model": "tiny-2M", "device": "cpu"}})
    assert probe.result() == {"available": False, "reason": "the run is on the CPU"}


def test_probe_key_is_the_rows_key():
    probe = allocator_history.make_probe(SPEC)
    assert probe.key == records.make_key(SPEC["config"], SPEC["variant"])
    assert probe.out_dir == allocator_history.OUT_DIR


def test_history_is_not_a_default_probe():
    assert "history" in run_one.PROBES and "history" not in run_one.DEFAULT_PROBES


def test_job_accepts_probe_history_with_its_options():
    job = to_job(_compose("probe=history", "device=cuda", "probe.history.min_bytes=4096"))
    assert job.probes == ["torch_cuda", "nvml", "host", "history"]
    assert job.probe_options == {
        "history": {"out_dir": None, "max_entries": 20_000_000, "min_bytes": 4096, "free_at": "completed"}
    }


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "probe.history.free_at=late",
            "probe.history.free_at='late': accepted values are completed, requested",
        ),
        ("probe.history.min_bytes=-1", "probe.history.min_bytes=-1: accepted values are integers >= 0"),
        ("probe.history.max_entries=0", "probe.history.max_entries=0: accepted values are integers >= 1"),
        ("+probe.history.colour=red", "probe.history.colour: unknown option"),
    ],
)
def test_job_refuses_bad_history_options(override, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        to_job(_compose("probe=history", override))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="records torch's own allocator history: needs CUDA")
def test_recorded_stream_replays_to_torchs_reserved(tmp_path):
    from estimator.hardware.allocator import simulate

    torch.cuda.empty_cache()  # cached segments would serve these requests
    probe = allocator_history.make_probe({**SPEC, "probe_options": {"history": {"out_dir": str(tmp_path)}}})
    probe.start()
    probe.set_phase("generate")
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (100, 3_000_000, 30 * 2**20)]
    temp = torch.empty(5 * 2**20, dtype=torch.uint8, device="cuda")
    del temp
    probe.set_phase("train")
    keep.append(torch.empty(40 * 2**20, dtype=torch.uint8, device="cuda"))
    del keep
    probe.stop()
    r = probe.result()
    assert r["available"] and r["actions"]["alloc"] == 5
    # the reserved curve walked from the segment events ends where torch.cuda.memory_reserved says
    assert r["torch_reserved"]["end_bytes"] == r["memory_reserved_at_stop_bytes"]
    events = load_stream(tmp_path / f"{probe.key}.gpu.txt.gz")
    assert [e[1] for e in events if e[0] == "m"] == ["generate", "train"]
    assert sorted(e[2] for e in events if e[0] == "a")[-1] == 40 * 2**20
    # by hand, from an empty cache: 100 B -> a 2 MiB small segment; 3,000,000 B -> a 20 MiB segment, which the
    # 5 MiB request splits; 30 MiB and 40 MiB -> segments of their own: 92 MiB
    if r["initial_blocks"] == 0:  # no tensor of an earlier test still live: the stream is these five alone
        assert simulate(events).peak_reserved == 92 * 2**20
    if r["torch_reserved"]["start_bytes"] == 0:  # nothing cached by earlier tests in this process
        assert r["torch_reserved"]["peak_bytes"] == 92 * 2**20
    else:
        assert r["torch_reserved"]["peak_bytes"] - r["torch_reserved"]["start_bytes"] <= 92 * 2**20
    assert (tmp_path / "index.jsonl").exists()


class FakeCuda:
    """torch.cuda's allocator calls as the probe makes them, answered from a hand-written history."""

    def __init__(self, trace: list[dict], counters: list[tuple[int, int]]):
        self.trace, self.counters, self.calls = trace, list(counters), []

    def record(self, enabled="all", **kw):
        self.calls.append(("record", enabled, kw))

    def snapshot(self, device=None):
        self.calls.append(("snapshot", device))
        recording = any(c[0] == "record" and c[1] == "all" for c in self.calls)
        return {"segments": [], "device_traces": [self.trace if recording else []]}

    def memory_stats(self, device=None):
        a, f = self.counters.pop(0)
        return {"allocation.all.allocated": a, "allocation.all.freed": f}


def test_probe_records_converts_and_writes_with_torchs_calls_faked(tmp_path, monkeypatch):
    mib = 2**20
    trace = [
        {"action": "segment_alloc", "addr": 0x1000, "size": 2 * mib, "stream": 0},
        {"action": "alloc", "addr": 0x1000, "size": 1000, "stream": 0},
        {"action": "segment_alloc", "addr": 0x9000000, "size": 20 * mib, "stream": 0},
        {"action": "alloc", "addr": 0x9000000, "size": 5 * mib, "stream": 0},
        {"action": "free_requested", "addr": 0x1000, "size": 1000, "stream": 0},
        {"action": "free_completed", "addr": 0x1000, "size": 1000, "stream": 0},
    ]
    # the counters when recording begins (base 10, 4), at "load", at "generate" (one allocation later), at stop
    fake = FakeCuda(trace, [(10, 4), (10, 4), (11, 4), (12, 5)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.snapshot)
    monkeypatch.setattr(torch.cuda, "memory_stats", fake.memory_stats)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 22 * mib)
    spec = {**SPEC, "probe_options": {"history": {"out_dir": str(tmp_path), "max_entries": 1000}}}
    assert allocator_history.begin(spec["probe_options"]["history"]) is None  # before the model loads
    probe = allocator_history.make_probe(spec).start()
    probe.set_phase("generate")
    probe.stop()
    assert fake.calls[1] == (
        "record",
        "all",
        {"context": None, "stacks": "python", "max_entries": 1000, "device": 0},
    )
    assert fake.calls[-1] == ("record", None, {"device": 0})
    r = probe.result()
    assert r["source"] == "measured-gpu" and r["stream"] == f"{probe.key}.gpu.txt.gz"
    assert load_stream(tmp_path / r["stream"]) == [
        ("m", "load"),
        ("a", 1, 1000, 0),
        ("m", "generate"),
        ("a", 2, 5 * mib, 0),
        ("f", 1),
    ]
    assert r["torch_reserved"]["peak_bytes"] == 22 * mib and r["torch_reserved"]["peak_phase"] == "generate"
    assert r["torch_reserved"]["phases"] == {"load": 2 * mib, "generate": 22 * mib}
    assert r["lost"] == [0, 0] and not r["truncated"]
    assert r["torch_reserved"]["end_bytes"] == r["memory_reserved_at_stop_bytes"] == 22 * mib
    (row,) = [json.loads(line) for line in (tmp_path / "index.jsonl").read_text().splitlines()]
    assert row["key"] == probe.key and row["config"] == SPEC["config"] and row["events"] == 5
