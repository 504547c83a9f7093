"""The accelerate configs `trl grpo --accelerate_config NAME` names resolve from this package's copies of trl 1.16's,
and the copies are still what an installed trl ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from estimator.interface.command import TRL_ACCELERATE_CONFIGS, TRL_CONFIGS_DIR


def test_every_name_trl_accepts_has_its_copy():
    assert sorted(p.stem for p in TRL_CONFIGS_DIR.glob("*.yaml")) == sorted(TRL_ACCELERATE_CONFIGS)


def test_the_copies_are_the_installed_trls_files():
    resources = pytest.importorskip("importlib.resources")
    pytest.importorskip("trl", reason="the harness's trl (make install)")
    shipped = resources.files("trl.accelerate_configs")
    names = sorted(Path(str(p)).stem for p in shipped.iterdir() if str(p).endswith(".yaml"))
    assert names == sorted(TRL_ACCELERATE_CONFIGS)
    for name in names:
        assert (TRL_CONFIGS_DIR / f"{name}.yaml").read_bytes() == shipped.joinpath(
            f"{name}.yaml"
        ).read_bytes(), name
