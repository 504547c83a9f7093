"""Hermetic tests: the accelerate config `accelerate launch` falls back on (this machine's
~/.cache/huggingface/accelerate/default_config.yaml) is never read from the machine running the tests; the tests
that exercise that fallback point it at a file of their own."""

import pytest

from estimator.interface import command


@pytest.fixture(autouse=True)
def _no_machine_accelerate_default(monkeypatch):
    monkeypatch.setattr(command, "default_accelerate_config", lambda: None)
