"""Phase labelling of a GRPOTrainer by wrapping methods on the instance and a callback (TRL is not edited)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

from estimator.terms.phase_names import GENERATE, OPTIMIZER, PHASES, SCORE, TRAIN  # noqa: F401 (PHASES re-exported)

IDLE = "other"  # outside the four phases (setup, logging, zero_grad between steps)


class PhaseTracker:
    """A stack of phase labels; every change is forwarded to the listeners' `set_phase(name)`."""

    def __init__(self, listeners: list | None = None):
        self.listeners = list(listeners or [])
        self.stack: list[str] = [IDLE]
        self.seen: list[str] = []

    @property
    def current(self) -> str:
        return self.stack[-1]

    def _notify(self) -> None:
        name = self.current
        if name not in self.seen:
            self.seen.append(name)
        for listener in self.listeners:
            listener.set_phase(name)

    def push(self, name: str) -> None:
        self.stack.append(name)
        self._notify()

    def pop(self) -> None:
        if len(self.stack) > 1:
            self.stack.pop()
        self._notify()

    def replace(self, name: str) -> None:
        """Set the label of the innermost level (used by begin/end callbacks that cannot nest)."""
        self.stack[-1] = name
        self._notify()

    @contextlib.contextmanager
    def phase(self, name: str):
        self.push(name)
        try:
            yield
        finally:
            self.pop()


def _wrap(obj, attr: str, label: Callable[..., str | None], tracker: PhaseTracker) -> None:
    """Replace obj.attr by a wrapper running it under the phase `label(*args)` (None = keep the current one)."""
    original = getattr(obj, attr)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        name = label(*args, **kwargs)
        if name is None:
            return original(*args, **kwargs)
        with tracker.phase(name):
            return original(*args, **kwargs)

    setattr(obj, attr, wrapper)


def _logps_label(*args, **kwargs) -> str | None:
    """No-grad log-prob passes (old policy / reference) are `score`; with grad they belong to `train`."""
    import torch

    return None if torch.is_grad_enabled() else SCORE


def make_callback(tracker: PhaseTracker, step_seconds: list[float]):
    """A TrainerCallback labelling the optimizer step and timing each training step."""
    from transformers import TrainerCallback

    class PhaseCallback(TrainerCallback):
        """optimizer phase between on_pre_optimizer_step and on_optimizer_step; wall time per step."""

        _t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            tracker.push(OPTIMIZER)

        def on_optimizer_step(self, args, state, control, **kwargs):
            tracker.pop()

        def on_step_end(self, args, state, control, **kwargs):
            step_seconds.append(round(time.perf_counter() - self._t0, 4))

    return PhaseCallback()


def install(trainer, tracker: PhaseTracker, step_seconds: list[float]) -> None:
    """Hook a GRPOTrainer instance: generate / score / train / optimizer phases, plus step timing."""
    _wrap(trainer, "training_step", lambda *a, **k: TRAIN, tracker)
    _wrap(trainer, "_generate_and_score_completions", lambda *a, **k: SCORE, tracker)
    _wrap(trainer, "_generate", lambda *a, **k: GENERATE, tracker)
    _wrap(trainer, "_get_per_token_logps_and_entropies", _logps_label, tracker)
    _wrap(trainer, "compute_loss", lambda *a, **k: TRAIN, tracker)
    if hasattr(trainer, "_clip_grad_norm"):
        _wrap(trainer, "_clip_grad_norm", lambda *a, **k: OPTIMIZER, tracker)
    trainer.add_callback(make_callback(tracker, step_seconds))
