"""Live tensor-storage bytes: a TorchDispatchMode that counts every storage alive, its peaks, and what was live there.

How it counts (works the same on real tensors and on FakeTensors):

* every tensor an op returns is looked up by its storage's identity (torch keeps one Python object per storage),
  so views share their base's entry and are never double-counted; a new storage gets a weakref whose finalizer
  subtracts its bytes when the storage dies;
* arguments an op mutates (``resize_``, ``out=`` variants, ``set_``) are re-checked after the op for a size change;
* tensors that existed before the mode started (parameters, buffers, optimizer state) are added with ``register``;
* ``round_to`` (512 for a CUDA-equivalent count, as the caching allocator's smallest block) rounds each storage up;
  the raw (unrounded) total is tracked next to it;
* with ``record_events=True`` the ordered allocations and frees (raw bytes, default stream) and the phase labels
  are kept in ``events`` in the format of ``estimator.hardware.allocator`` (replayed there through the caching-allocator
  model); an in-place resize is an alloc of the new size then a free of the old, as ``resize_`` does;
* peaks are kept globally and per phase label (``set_phase`` / ``with probe.phase(name)``) and per step
  (``set_step``); the set of storages live at each peak is captured lazily — at the first decrease after the
  peak, when the live set still equals the peak set — so capturing costs one dict copy, not a walk per op.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NO_PHASE = "(none)"


@dataclass
class _Entry:
    """One live storage: its (rounded) bytes, raw bytes, and what made it."""

    nbytes: int
    raw: int
    shape: tuple
    dtype: str
    op: str


def _shape(t: torch.Tensor) -> tuple:
    """Static shape as ints (symbolic sizes as strings)."""
    return tuple(int(s) if isinstance(s, int) else str(s) for s in t.shape)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _tensors(obj) -> Iterator[torch.Tensor]:
    """Tensors in an op's output (a tensor, or nested tuples/lists of them)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)


class LiveStorageMode(TorchDispatchMode):
    """Counts live tensor-storage bytes; records the global peak, per-phase/per-step peaks and what was live there."""

    def __init__(self, round_to: int = 1, top: int = 25, record_events: bool = False) -> None:
        super().__init__()
        self.events: list[tuple] | None = [] if record_events else None
        self._sid: dict[int, int] = {}  # storage key -> event id (record_events only)
        self._next_sid = 0
        self.round_to = max(1, int(round_to))
        self.top = top
        self._live: dict[int, _Entry] = {}
        self._refs: dict[int, weakref.ref] = {}
        self._mutable_args: dict[object, tuple[tuple[int, str], ...]] = {}
        self._op_names: dict[object, str] = {}
        self.current_bytes = 0
        self.current_raw = 0
        self.peak_bytes = 0
        self.peak_raw = 0
        self.peak_phase: str = NO_PHASE
        self.peak_step: int | None = None
        self.phase_peaks: dict[str, int] = {}
        self.step_phase_peaks: dict[int, dict[str, int]] = {}
        self._phase = NO_PHASE
        self._step: int | None = None
        self._peak_snap: dict[int, _Entry] = {}
        self._phase_snaps: dict[str, dict[int, _Entry]] = {}
        self._pending_global = False
        self._pending_phase: str | None = None

    # ---- phases -------------------------------------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        """Label everything from now on as phase `name` (its peak starts at what is live now)."""
        self._flush()
        self._phase = name
        if self.events is not None:
            self.events.append(("m", name))
        self._bump_phase()

    @contextmanager
    def phase(self, name: str) -> Iterator[LiveStorageMode]:
        """Context manager: phase `name` inside, the previous label restored after."""
        prev = self._phase
        self.set_phase(name)
        try:
            yield self
        finally:
            self.set_phase(prev)

    def set_step(self, step: int | None) -> None:
        """Label the following phases as belonging to training step `step` (for per-step peaks)."""
        self._flush()
        self._step = step
        self._bump_phase()

    # ---- registration -------------------------------------------------------------------------------------
    def register(self, obj, label: str | None = None) -> int:
        """Count pre-existing tensors (module params/buffers, optimizer state, tensors); relabel known ones.

        Returns the bytes newly added. Labels default to `param`, `buffer`, `optimizer_state` or `tensor`.
        """
        before = self.current_bytes
        for t, lab in self._labelled(obj, label):
            self._track(t, lab, relabel=True)
        return self.current_bytes - before

    def _labelled(self, obj, label: str | None) -> Iterator[tuple[torch.Tensor, str]]:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                yield p, label or "param"
            for b in obj.buffers():
                yield b, label or "buffer"
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        yield v, label or "optimizer_state"
        elif isinstance(obj, torch.Tensor):
            yield obj, label or "tensor"
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from self._labelled(v, label)
        elif isinstance(obj, Iterable):
            for v in obj:
                yield from self._labelled(v, label)

    # ---- dispatch -----------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = self._op_names.get(func)
        if name is None:
            name = self._op_names[func] = str(func.overloadpacket)
        for t in _tensors(out):
            self._track(t, name)
        mut = self._mutable_args.get(func)
        if mut is None:
            mut = self._mutable_args[func] = self._mutated(func)
        for i, kw in mut:
            a = args[i] if i < len(args) else kwargs.get(kw)
            for t in _tensors(a):
                self._track(t, name)
        return out

    @staticmethod
    def _mutated(func) -> tuple[tuple[int, str], ...]:
        """(position, name) of the arguments `func` writes to."""
        found = []
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                found.append((i, a.name))
        return tuple(found)

    # ---- accounting ---------------------------------------------------------------------------------------
    def _round(self, n: int) -> int:
        r = self.round_to
        return -(-n // r) * r if r > 1 else n

    def _track(self, t: torch.Tensor, op: str, relabel: bool = False) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return  # sparse / nested / functional wrappers: no plain storage
        key = id(st)
        e = self._live.get(key)
        if e is None:
            raw = st.nbytes()
            e = _Entry(self._round(raw), raw, _shape(t), _dtype(t), op)
            self._live[key] = e
            self._refs[key] = weakref.ref(st, partial(self._on_free, key))
            self._record(key, raw)
            self._add(e.nbytes, e.raw)
            return
        if relabel:
            e.op = op
        raw = st.nbytes()
        if raw != e.raw:  # resized in place: replace the entry so earlier snapshots keep their sizes
            new = _Entry(self._round(raw), raw, _shape(t), e.dtype, e.op)
            if new.nbytes < e.nbytes:
                self._before_decrease()
            self._live[key] = new
            self._record(key, raw)
            self._add(new.nbytes - e.nbytes, new.raw - e.raw)

    def _on_free(self, key: int, _ref: weakref.ref) -> None:
        e = self._live.get(key)
        if e is not None and e.nbytes:
            self._before_decrease()
        self._live.pop(key, None)
        self._refs.pop(key, None)
        if self.events is not None and key in self._sid:
            self.events.append(("f", self._sid.pop(key)))
        if e is not None:
            self._add(-e.nbytes, -e.raw)

    def _record(self, key: int, raw: int) -> None:
        """Event stream: alloc `raw` bytes for storage `key` (then free the storage's previous block, if any)."""
        if self.events is None:
            return
        old = self._sid.pop(key, None)
        if raw > 0:  # the caching allocator hands out no block for 0 bytes
            self._next_sid += 1
            self._sid[key] = self._next_sid
            self.events.append(("a", self._next_sid, raw, 0))
        if old is not None:
            self.events.append(("f", old))

    def _add(self, n: int, raw: int) -> None:
        self.current_bytes += n
        self.current_raw += raw
        if raw > 0 and self.current_raw > self.peak_raw:
            self.peak_raw = self.current_raw
        if n > 0:
            if self.current_bytes > self.peak_bytes:
                self.peak_bytes = self.current_bytes
                self.peak_phase = self._phase
                self.peak_step = self._step
                self._pending_global = True
            self._bump_phase()

    def _bump_phase(self) -> None:
        cur, ph = self.current_bytes, self._phase
        if cur > self.phase_peaks.get(ph, -1):
            self.phase_peaks[ph] = cur
            self._pending_phase = ph
        if self._step is not None:
            sp = self.step_phase_peaks.setdefault(self._step, {})
            if cur > sp.get(ph, -1):
                sp[ph] = cur

    def _before_decrease(self) -> None:
        if self._pending_global or self._pending_phase is not None:
            self._flush()

    def _flush(self) -> None:
        """Capture the live set if a peak was reached since the last capture (it is still the peak set)."""
        if not (self._pending_global or self._pending_phase is not None):
            return
        snap = dict(self._live)
        if self._pending_global:
            self._peak_snap = snap
        if self._pending_phase is not None:
            self._phase_snaps[self._pending_phase] = snap
        self._pending_global = False
        self._pending_phase = None

    # ---- results ------------------------------------------------------------------------------------------
    def breakdown(self, snap: dict[int, _Entry] | None = None, top: int | None = None) -> list[dict]:
        """Live storages grouped by (op/label, dtype, shape), largest first; the tail summed as `(other)`."""
        snap = self._live if snap is None else snap
        top = self.top if top is None else top
        groups: dict[tuple, list[int]] = {}
        for e in snap.values():
            g = groups.setdefault((e.op, e.dtype, e.shape), [0, 0])
            g[0] += e.nbytes
            g[1] += 1
        rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
        out = [
            {"bytes": b, "count": c, "op": op, "dtype": dt, "shape": list(sh)}
            for (op, dt, sh), (b, c) in rows[:top]
        ]
        rest = rows[top:]
        if rest:
            out.append(
                {
                    "bytes": sum(v[0] for _, v in rest),
                    "count": sum(v[1] for _, v in rest),
                    "op": "(other)",
                    "dtype": None,
                    "shape": None,
                }
            )
        return out

    def result(self) -> dict:
        """Peaks, per-phase (and per-step) peaks, and the grouped live set at the global and each phase's peak."""
        self._flush()
        phases = {k: v for k, v in self.phase_peaks.items() if k != NO_PHASE or len(self.phase_peaks) == 1}
        return {
            "probe": "tensors",
            "peak_bytes": self.peak_bytes,
            "peak_bytes_unrounded": self.peak_raw,
            "round_to": self.round_to,
            "peak_phase": self.peak_phase,
            "peak_step": self.peak_step,
            "phases": phases,
            "steps": {
                str(s): {k: v for k, v in p.items() if k != NO_PHASE or len(p) == 1}
                for s, p in self.step_phase_peaks.items()
            },
            "at_peak": self.breakdown(self._peak_snap),
            "at_peak_by_label": _by_label(self._peak_snap),
            "phase_at_peak": {k: self.breakdown(v) for k, v in self._phase_snaps.items() if k in phases},
            "phase_at_peak_by_label": {k: _by_label(v) for k, v in self._phase_snaps.items() if k in phases},
        }


def _by_label(snap: dict[int, _Entry]) -> dict[str, int]:
    """Bytes per creating op / label, largest first."""
    acc: dict[str, int] = {}
    for e in snap.values():
        acc[e.op] = acc.get(e.op, 0) + e.nbytes
    return dict(sorted(acc.items(), key=lambda kv: -kv[1]))
