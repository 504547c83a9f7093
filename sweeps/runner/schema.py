"""The sweep's Hydra schema, derived from the one run-settings schema (`estimator.settings.config.RunConfig`).

`register()` stores a structured config built field by field from `estimator.settings.config.schema()` as the
`trainer/default` node, so the composed `trainer` group has RunConfig's defaults (the installed TRL and
transformers releases for the release settings) and types (OmegaConf refuses
`trainer.gradient_checkpointing=maybe` before any run starts). `model` and `device` come from their own
groups; the `method` group's files only switch `use_peft` / `load_in_4bit` (they are placed in `trainer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, make_dataclass
from typing import Any, Optional

from estimator.settings.config import schema
from estimator.settings.trl_versions import default_version, fmt
from estimator.settings.versions import default_transformers

FROM_OTHER_GROUPS = ("model", "device")  # set by conf/model/*.yaml and conf/device/*.yaml
# a run measures the releases installed where it runs: these settings default to them, not to the newest modelled
INSTALLED_DEFAULTS: dict[str, Callable[[], str]] = {
    "trl_version": lambda: fmt(default_version()),
    "transformers_version": default_transformers,
}
_TYPES: dict[str, Any] = {"bool": bool, "int": int, "float": float, "str": str, "strs": list[str]}


def trainer_node() -> type:
    """A dataclass with one typed field per run setting (those the trainer group holds), RunConfig's defaults."""
    specs = []
    for f in schema():
        if f.name in FROM_OTHER_GROUPS:
            continue
        typ = _TYPES[f.kind]
        if f.nullable:
            typ = Optional[typ]  # noqa: UP045 (OmegaConf reads typing.Optional)
        if isinstance(f.default, tuple):
            spec = field(default_factory=lambda d=f.default: list(d))
        elif f.name in INSTALLED_DEFAULTS:
            spec = field(default=INSTALLED_DEFAULTS[f.name]())
        else:
            spec = field(default=f.default)
        specs.append((f.name, typ, spec))
    return make_dataclass("TrainerSettings", specs)


def register() -> None:
    """Store the trainer schema as `trainer/default` in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="trainer", name="default", node=trainer_node())
