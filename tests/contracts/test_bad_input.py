"""Generated bad-input suite, driven by the one run-settings schema (`estimator.settings.config.schema()`).

For every setting, invalid values (zero, negative, non-integer, NaN, infinity, huge, wrong type, empty, unknown
choice, ...) go through every command that reads run settings, in-process:

- `vram-estimate` flags (`estimator.interface.cli.main`) and its `--config` GRPOConfig file,
- the sweep's command-line values (`app.check_overrides`) and config mapping (`to_job`),
- the tracer's parser (`sweeps.trace.cli.main`, with the trace itself stubbed out).

Each case must end in one clean line on stderr (exit 2) or a valid result: never a traceback, never NaN or
infinity in the JSON, never negative or zero bytes, and never a config that breaks the schema's own bounds
(what TRL / transformers / PEFT accept) going on to an estimate, a sweep row or a trace.
"""

from __future__ import annotations

import json
import math

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from estimator.interface import cli
from estimator.settings.config import RunConfig, check_value, schema
from sweeps.runner import app
from sweeps.runner.job import BadInput, to_job
from sweeps.trace import cli as trace_cli

FIELDS = schema()
NAN, INF = float("nan"), float("inf")
VALUES = [  # (label, value): applied to every setting; some are valid for some settings (then: a valid result)
    ("zero", 0),
    ("negative", -1),
    ("non-integer", 1.5),
    ("nan", NAN),
    ("infinity", INF),
    ("-infinity", -INF),
    ("huge", 10**30),
    ("wrong type", "abc"),
    ("empty", ""),
    ("bool for a number", True),
    ("list", [1]),
    ("unknown choice", "bogus"),
]


def _cases():
    return [pytest.param(f, v, id=f"{f.name}-{label}") for f in FIELDS for label, v in VALUES]


def _text(v) -> str:
    """The value as a user types it on a command line."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, list):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v)


def _strict_json(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def _assert_sane_config(cfg: RunConfig) -> None:
    for f in FIELDS:
        value = getattr(cfg, f.name)
        assert check_value(f, value) is None, f"{f.name}={value!r} got through"


def _assert_clean_error(err: list[str], prog: str) -> None:
    assert len(err) == 1, err
    assert err[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err[0]


# ---------------------------------------------------------------- vram-estimate


@pytest.mark.parametrize("f, value", _cases())
def test_vram_estimate_flag(capsys, f, value):
    code = cli.main([f"{f.flag}={_text(value)}", "--json"])
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    if code == 2:
        _assert_clean_error(err, "vram-estimate")
        names = (f.flag, *f.meta.aliases, repr(_text(value)))
        assert any(n in err[0] for n in names), f"the error names neither the flag nor the value: {err[0]}"
        return
    assert code in (0, 1), (code, err)
    assert all(line.startswith("vram-estimate: note: ") for line in err), err
    est = _strict_json(out)
    assert est["peak_allocated_bytes"] > 0 and est["peak_device_bytes"] >= est["peak_allocated_bytes"]
    assert all(v >= 0 for v in est["phase_totals"].values())
    _assert_sane_config(RunConfig.from_dict(est["config"]))


def _yaml_scalar(v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return ".nan"
    if isinstance(v, float) and math.isinf(v):
        return ".inf" if v > 0 else "-.inf"
    if v == "":
        return "''"
    return json.dumps(v)


@pytest.mark.parametrize("f, value", _cases())
def test_vram_estimate_config_file(tmp_path, capsys, f, value):
    key = f.file_keys[0]
    if "." in key:  # nested, e.g. model_init_kwargs.dtype
        outer, inner = key.split(".", 1)
        text = f"{outer}:\n  {inner}: {_yaml_scalar(value)}\n"
    else:
        text = f"{key}: {_yaml_scalar(value)}\n"
    path = tmp_path / "grpo.yaml"
    path.write_text(text)
    code = cli.main(["--config", str(path), "--json"])
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    if code == 2:
        _assert_clean_error(err, "vram-estimate")
        return
    assert code in (0, 1), (code, err)
    est = _strict_json(out)
    assert est["peak_allocated_bytes"] > 0
    assert all(v >= 0 for v in est["phase_totals"].values())
    _assert_sane_config(RunConfig.from_dict(est["config"]))


# ---------------------------------------------------------------- the sweep

SWEEP_FIELDS = [f for f in FIELDS if f.name not in ("model", "device")]  # set by their own config groups


def _parsed(override: str):
    """The value Hydra gives a `key=value` override."""
    return OverridesParser.create().parse_override(override).value()


def _hydra_text(v) -> str:
    return "''" if v == "" else _text(v)


@pytest.mark.parametrize(
    "f, value", [pytest.param(f, v, id=f"{f.name}-{label}") for f in SWEEP_FIELDS for label, v in VALUES]
)
def test_sweep_command_line_and_config_mapping(f, value):
    override = f"trainer.{f.name}={_hydra_text(value)}"
    try:
        app.check_overrides([override])
    except BadInput as exc:
        assert "\n" not in str(exc) and f"trainer.{f.name}" in str(exc)
        return
    cfg = app.default_config().copy()
    OmegaConf.update(cfg, f"trainer.{f.name}", _parsed(override), merge=True)
    try:
        job = to_job(cfg)
    except BadInput as exc:
        assert "\n" not in str(exc)
        return
    _assert_sane_config(job.config)  # what a row would store


@pytest.mark.parametrize(
    "override",
    [
        "sweep.timeout_s=-1",
        "sweep.timeout_s=0",
        "sweep.timeout_s=nan",
        "sweep.timeout_s=inf",
        "sweep.timeout_s=abc",
        "sweep.name=''",
        "sweep.name=a/b",
        "sweep.keep_workdir=maybe",
        "sweep.gpus=[-1]",
        "sweep.gpus=abc",
        "sweep.results_dir=''",
        "run.steps=1",
        "run.steps=abc",
        "run.steps=2.5",
        "run.num_prompts=0",
        "run.learning_rate=nan",
        "run.learning_rate=-1",
        "run.lora_alpha=0",
        "run.seed=-1",
        "run.force_length=maybe",
        "run.prompts=bogus",
        "run.inject_failure=bogus",
    ],
)
def test_sweep_and_run_settings(override):
    key = override.partition("=")[0]
    cfg = app.default_config().copy()
    try:
        app.check_overrides([override])
        OmegaConf.update(cfg, key, _parsed(override), merge=True)
        to_job(cfg)
    except BadInput as exc:
        assert "\n" not in str(exc) and key.split(".")[-1] in str(exc)
        return
    raise AssertionError(f"{override} was accepted")


# ---------------------------------------------------------------- the tracer


@pytest.fixture
def stub_trace(monkeypatch):
    traced: list[RunConfig] = []

    def make_row(cfg, sweep):
        traced.append(cfg)
        return {"status": "ok", "config": cfg.to_dict()}

    monkeypatch.setattr(trace_cli, "make_row", make_row)
    monkeypatch.setattr(trace_cli, "_print_row", lambda row: None)
    return traced


@pytest.mark.parametrize("f, value", _cases())
def test_tracer_parser(capsys, stub_trace, f, value):
    code = trace_cli.main(["one", f"{f.flag}={_text(value)}"])
    err = capsys.readouterr().err.strip().splitlines()
    if code == 2:
        _assert_clean_error(err, "grpo-vram-trace")
        assert stub_trace == []
        return
    assert code == 0, (code, err)
    (cfg,) = stub_trace
    _assert_sane_config(cfg)


def test_the_suite_is_large_enough():
    n = 3 * len(FIELDS) * len(VALUES) + len(SWEEP_FIELDS) * len(VALUES)
    assert n >= 200, n
