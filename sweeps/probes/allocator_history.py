"""The `history` probe: the real allocation stream of a run on a CUDA device, recorded by torch's own allocator
history and written in the project's stream format beside the traced ones.

At `start` (or earlier, `begin`, before the model is loaded) it calls `torch.cuda.memory._record_memory_history(
enabled="all", context=None, stacks="python", max_entries=...)`: every alloc / free / segment event, no stack
traces (the cheapest setting that still records each event; torch 2.11 to 2.15 take these keywords). It also
takes a snapshot then (the live blocks and reserved segments the history starts from). At each phase change it
reads the allocator's counters (`allocation.all.allocated`, `allocation.all.freed` of `torch.cuda.memory_stats`:
no snapshot mid-run). At `stop` it takes `torch.cuda.memory._snapshot()`, stops recording, converts the history on
the machine (`sweeps.probes.snapshot_stream.convert`; the pickle itself is never written: gigabytes) and writes
`<key>.gpu.txt.gz` (`estimator.hardware.allocator.dump_stream`, atomic) into `out_dir` (default
`results/streams/gpu/`) and one line per run into its `index.jsonl` (`sweeps.records.append_row`).

How big: a 2-step Qwen3-4B QLoRA run with 1,024-token prompts and 256-token completions allocates about
36 layers x 256 decode steps x ~85 tensors (bnb dequantize buffer, matmul output and the LoRA A / B / scale / add
per projection, norms, rotary, attention, the KV cache's cat) ~ 0.8 million times per generation, ~1.7 million
over two steps with the training passes: ~3.4 million stream lines, ~5 million trace entries (about 1 GB of
Python dicts while converting, which takes seconds; `max_entries` 20 million leaves room). Decoding repeats the
same sizes layer after layer and the ids are reused, so gzip packs a line into about 0.6 byte on a synthetic
decode-shaped stream (36 x 256 x 87 allocations: 1.6 million lines, 0.9 MB); allowing a real run 1.5 bytes a line,
2 to 5 MiB, under the 16 MiB a lease brings back. `min_bytes` (drop allocations below a size) makes a
longer run's file smaller at the cost of the small pool.

On a machine without CUDA the probe reports `{"available": false, "reason": ...}` and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sweeps.probes.snapshot_stream import PhaseMark, convert, count_actions, lost_entries, reserved_bytes

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "results" / "streams" / "gpu"
MAX_ENTRIES = 20_000_000
COUNTERS = ("allocation.all.allocated", "allocation.all.freed")
LOAD = "load"  # the label of what the stream holds before the trainer's first phase (model loading)


def cuda_problem() -> str | None:
    """Why the probe cannot record here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch.cuda is not available (torch {torch.__version__})"
    if not hasattr(torch.cuda.memory, "_record_memory_history"):
        return f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history"
    return None


def _counters(device: int) -> tuple[int, int]:
    import torch

    stats = torch.cuda.memory_stats(device)
    return int(stats.get(COUNTERS[0], 0)), int(stats.get(COUNTERS[1], 0))


@dataclass
class Recording:
    """History being recorded on `device`: the snapshot it starts from, the counters then, the phase marks."""

    device: int
    max_entries: int
    start: dict
    base: tuple[int, int]
    marks: list[PhaseMark] = field(default_factory=list)

    def mark(self, label: str) -> None:
        a, f = _counters(self.device)
        self.marks.append(PhaseMark(a - self.base[0], f - self.base[1], label))


_EARLY: Recording | None = None


def record(device: int = 0, max_entries: int = MAX_ENTRIES, label: str | None = None) -> Recording:
    """Snapshot the allocator, then start recording its history (CUDA only)."""
    import torch

    start = torch.cuda.memory._snapshot(device)
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=max_entries, device=device
    )
    rec = Recording(device, max_entries, start, _counters(device))
    if label:
        rec.mark(label)
    return rec


def begin(options: dict | None = None) -> str | None:
    """Start recording now, before the model is loaded, so the stream covers loading too (phase `load`); the
    probe made later takes it over. Returns why not (no CUDA), else None."""
    global _EARLY
    problem = cuda_problem()
    if problem is None and _EARLY is None:
        opts = options or {}
        _EARLY = record(int(opts.get("device", 0)), int(opts.get("max_entries", MAX_ENTRIES)), LOAD)
    return problem


@dataclass
class HistoryProbe:
    """Records the allocator's history between `start` and `stop`; `result()` says what was written."""

    key: str
    out_dir: Path = OUT_DIR
    max_entries: int = MAX_ENTRIES
    min_bytes: int = 0
    free_at: str = "completed"
    device: int = 0
    meta: dict = field(default_factory=dict)  # config / variant for the index line
    reason: str | None = None
    rec: Recording | None = None
    _result: dict | None = None

    @property
    def available(self) -> bool:
        return self.reason is None

    def start(self) -> HistoryProbe:
        global _EARLY
        if self.available and self.rec is None:
            self.rec, _EARLY = _EARLY or record(self.device, self.max_entries), None
        return self

    def set_phase(self, name: str) -> None:
        if self.rec is not None:
            self.rec.mark(name)

    def stop(self) -> None:
        if self.rec is None or self._result is not None:
            return
        import torch

        rec = self.rec
        totals = _counters(rec.device)
        snap = torch.cuda.memory._snapshot(rec.device)
        torch.cuda.memory._record_memory_history(enabled=None, device=rec.device)
        reserved_now = int(torch.cuda.memory_reserved(rec.device))
        self._result = write_stream(
            snap, rec, (totals[0] - rec.base[0], totals[1] - rec.base[1]), self, reserved_now
        )
        del snap

    def result(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason}
        if self._result is None:
            return {"available": False, "reason": "the probe was not stopped"}
        return self._result


def write_stream(
    snap: dict, rec: Recording, totals: tuple[int, int], probe: HistoryProbe, reserved_now: int
) -> dict:
    """Convert `snap`, write the stream and its index line; the probe's result."""
    from estimator.hardware.allocator import dump_stream
    from sweeps import records

    actions = count_actions(snap, rec.device)
    lost = lost_entries(totals, actions)
    conv = convert(snap, rec.marks, rec.start, rec.device, probe.free_at, probe.min_bytes, lost)
    out = Path(probe.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{probe.key}.gpu.txt.gz"
    dump_stream(conv.events, path)
    summary = conv.summary()
    result = {
        "available": True,
        "source": "measured-gpu",
        "path": str(path),
        "stream": path.name,
        "bytes": path.stat().st_size,
        **summary,
        "memory_reserved_at_stop_bytes": reserved_now,  # torch.cuda.memory_reserved: end_bytes should equal it
        "segments_reserved_at_stop_bytes": reserved_bytes(snap, rec.device),  # the stop snapshot's segments
        "trace_entries": sum(actions.values()),
        "max_entries": rec.max_entries,
        "lost": list(lost),
        "free_at": probe.free_at,
        "min_bytes": probe.min_bytes,
    }
    row = {"key": probe.key, "source": "measured-gpu", **probe.meta, **result}
    records.append_row(out / "index.jsonl", row)
    return result


OPTIONS = ("out_dir", "max_entries", "min_bytes", "free_at")


def option_problem(opts: dict) -> str | None:
    """What is wrong with the probe's options (`probe.history.*`), one line naming the value, or None."""
    from sweeps.probes.snapshot_stream import FREE_AT

    for k, v in opts.items():
        if k not in OPTIONS:
            return f"probe.history.{k}: unknown option; accepted options are {', '.join(OPTIONS)}"
        if k in ("max_entries", "min_bytes") and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return f"probe.history.{k}={v!r}: accepted values are integers >= 0"
        if k == "max_entries" and v == 0:
            return f"probe.history.{k}=0: accepted values are integers >= 1"
        if k == "free_at" and v not in FREE_AT:
            return f"probe.history.free_at={v!r}: accepted values are {', '.join(FREE_AT)}"
        if k == "out_dir" and v is not None and not (isinstance(v, str) and v.strip()):
            return f"probe.history.out_dir={v!r}: accepted values are folder paths"
    return None


def make_probe(spec: dict) -> HistoryProbe:
    """The probe for a run_one spec: key from its config and variant, options from `probe_options.history`
    (`out_dir`, `max_entries`, `min_bytes`, `free_at`), or an unavailable one that says why."""
    from sweeps import records

    opts = dict((spec.get("probe_options") or {}).get("history") or {})
    key = records.make_key(spec["config"], spec.get("variant", {}))
    return HistoryProbe(
        key=key,
        out_dir=Path(opts.get("out_dir") or OUT_DIR),
        max_entries=int(opts.get("max_entries", MAX_ENTRIES)),
        min_bytes=int(opts.get("min_bytes", 0)),
        free_at=str(opts.get("free_at", "completed")),
        meta={"config": spec["config"], "variant": spec.get("variant", {})},
        reason=cuda_problem() if spec["config"].get("device", "cuda") == "cuda" else "the run is on the CPU",
    )
