"""The Python API: the answer `vram-estimate` prints, as an object (`from estimator import estimate`).

    from estimator import estimate
    r = estimate(model="Qwen/Qwen2.5-7B-Instruct", use_peft=True, dtype="bfloat16")
    print(r)                # the short answer vram-estimate prints
    r.need_gib              # what one GPU must hold, GiB (the error band included): 18.8
    r.fits("RTX 4090")      # True: the same check as `vram-estimate ... --gpu 4090`

Settings are `RunConfig`'s fields, with TRL's names and defaults (`per_device_train_batch_size`,
`num_generations`, `use_peft`, `load_in_4bit`, ...; `estimator/settings/config.py` lists them all), plus the CLI's
shortcuts `qlora=True`, `zero=2|3` and `fsdp=True`. They go through the same reading and validation as the
command's flags, so a setting TRL would refuse raises `InvalidInput` (a ValueError) with the same one-line
message the command prints. Stdlib only: no torch import.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from estimator.interface import cli
from estimator.settings.config import RunConfig

SHORTCUTS = ("qlora", "zero", "fsdp")


class InvalidInput(ValueError):
    """A setting, a GPU name or a file the estimator refuses; the message names the value and what is accepted."""


def _namespace(config, gpu, config_files, from_command, solve, advice, settings) -> argparse.Namespace:
    names = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(settings) - names - set(SHORTCUTS))
    if unknown:
        raise InvalidInput(
            f"unknown setting {unknown[0]!r}; accepted: RunConfig's fields (TRL's names, estimator/settings/config.py) "
            f"and the shortcuts {', '.join(SHORTCUTS)}"
        )
    values: dict = {}
    if config is not None:
        if not isinstance(config, RunConfig):
            raise InvalidInput(f"config must be a RunConfig, not {type(config).__name__}")
        default = RunConfig()
        values = {n: getattr(config, n) for n in names if getattr(config, n) != getattr(default, n)}
    values.update(settings)
    if isinstance(values.get("lora_target_modules"), str):
        values["lora_target_modules"] = [values["lora_target_modules"]]
    ns = argparse.Namespace(**values)
    if gpu is not None:
        ns.gpu = gpu if isinstance(gpu, str) else getattr(gpu, "name", str(gpu))
    if config_files:
        ns.config = [str(p) for p in ([config_files] if isinstance(config_files, str) else config_files)]
    if from_command is not None:
        ns.from_command = from_command
    if solve is not None:
        ns.solve = solve
    ns.advice = advice
    return ns


def estimate(
    config=None,
    /,
    *,
    gpu: str | None = None,
    config_files=(),
    from_command: str | None = None,
    solve: str | None = None,
    advice: bool = False,
    **settings,
) -> Result:
    """Estimate the GPU memory of one GRPO step, as `vram-estimate` does; returns a `Result`.

    config: a `RunConfig` (optional); `settings` (RunConfig field names, TRL's spelling) override it.
    gpu: a card to check and to advise for (`"H100"`, `"4090"`, `"24GB"`; `GPUS` lists the known ones).
    config_files: paths of the files `--config` reads (GRPOConfig YAML, accelerate YAML, DeepSpeed JSON).
    from_command: a launch command to read the settings from (`--from-command`).
    solve: a setting to maximize on `gpu` (`num_generations`, `per_device_train_batch_size`, ...).
    advice: rank every single change by what it saves, even when the run fits.

    Raises `InvalidInput` (a ValueError) for anything the command would refuse with exit code 2.
    """
    ns = _namespace(config, gpu, config_files, from_command, solve, advice, settings)
    try:
        req = cli.request_from(ns)
        if solve is not None and solve not in cli.SOLVABLE:
            raise cli.UsageError(f"solve={solve!r} is not solvable; accepted: {', '.join(cli.SOLVABLE)}")
        return Result(cli.compute(req), ns)
    except cli.UsageError as e:
        raise InvalidInput(str(e)) from None


class Result:
    """One estimate: what one GPU must hold, where it fits, where the memory goes, what to change.

    Every number is `estimated` (the error band's share is derived from traced validation rows); `to_dict()` is
    the `--json` answer, with every source (docs/json-output.md)."""

    def __init__(self, answer, ns: argparse.Namespace):
        self._answer = answer
        self._ns = ns

    @property
    def breakdown(self):
        """The policy's `Estimate`: bytes per component per phase, the allocator layers (estimator/step/estimate.py)."""
        return self._answer.est

    @property
    def config(self):
        """The `RunConfig` estimated (after files, flags, TRL's defaults and validation)."""
        return self._answer.req.cfg

    @property
    def notes(self) -> list[str]:
        """What the command prints as `note:` lines on stderr (a size alias resolved, an inert setting, ...)."""
        return list(self._answer.req.notes) + list(self._answer.est.notes)

    @property
    def need_bytes(self) -> int:
        """What one GPU must hold (bytes): the fit verdicts compare this with what torch can use on a card."""
        est = self._answer.est
        return est.need_bytes if est.config.device == "cpu" else est.fit_bytes

    @property
    def need_gib(self) -> float:
        """`need_bytes` in GiB, rounded to 0.1 as the short answer prints it."""
        return round(self.need_bytes / 2**30, 1)

    @property
    def peak_phase(self) -> str:
        """The phase of the step where the tensor peak falls: generate, score, train or optimizer."""
        return self._answer.est.peak_phase

    @property
    def components(self) -> dict[str, int]:
        """Tensor bytes per component at the peak phase (weights, activations, optimizer_state, ...)."""
        return dict(self._answer.est.phases[self.peak_phase])

    @property
    def exit_code(self) -> int:
        """The command's exit code for the same request: 0 fits (or no gpu), 1 does not fit / nothing solved."""
        return self._answer.code

    def fit(self, gpu: str | None = None):
        """The fit on one card (`report.Fit`: `.fits`, `.free_bytes`, negative when short, `.blocked`); the
        card given to `estimate` when `gpu` is None."""
        if gpu is None:
            if self._answer.target is None:
                raise InvalidInput("no gpu: give fit(NAME), or estimate(..., gpu=NAME)")
            return self._answer.target
        ns = argparse.Namespace(**{**vars(self._ns), "gpu": gpu, "advice": False})
        ns.__dict__.pop("solve", None)

        try:
            return cli.compute(cli.request_from(ns)).target
        except cli.UsageError as e:
            raise InvalidInput(str(e)) from None

    def fits(self, gpu: str | None = None) -> bool:
        """True when the step fits `gpu` (a name as `--gpu` takes it), as `vram-estimate --gpu` decides it."""
        return self.fit(gpu).fits

    def gpus_that_fit(self) -> list[str]:
        """Names of the listed cards (`GPUS`) the step fits, smallest first."""
        ok = [f for f in self._answer.fits if f.fits]
        return [f.gpu.name for f in sorted(ok, key=lambda f: f.gpu.memory_bytes)]

    def to_dict(self) -> dict:
        """The `--json` answer (`schema_version`; docs/estimate.schema.json)."""
        return cli.to_json(self._answer)

    def text(self, detail: bool = False, markdown: bool = False) -> str:
        """The answer as the command prints it: short (default), `detail=True` the full report."""
        if detail:
            return cli.detail_text(self._answer)
        return cli.short_text(self._answer, markdown=markdown)

    def __str__(self) -> str:
        return self.text()

    def _repr_markdown_(self) -> str:  # a notebook shows the markdown answer
        return self.text(markdown=True)

    def __repr__(self) -> str:
        return f"<estimate: {self.text().splitlines()[0]}>"
