"""`vram-estimate --trace` runs like a long job: the estimate prints at once, the trace reports what it is doing
and the time elapsed on stderr, library output stays out of the terminal, and a failed trace exits 4 with one
line (the estimate above it still printed)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from estimator.interface import cli

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "--model",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "--gens",
    "2",
    "--per-device-train-batch-size",
    "2",
]
SMALL += ["--max-prompt-length", "32", "--max-completion-length", "32"]


def stub_tracer(monkeypatch, make_row) -> None:
    """Replace the sweep extra's tracer with `make_row` (fast; the first test runs the real one)."""
    monkeypatch.setattr(cli, "check_tracer", lambda: None)
    monkeypatch.setattr(cli, "load_tracer", lambda: make_row)


def test_a_real_trace_prints_the_estimate_first_and_progress_on_stderr():
    """The real tracer (torch, transformers, TRL under fake tensors), as a user runs it."""
    pytest.importorskip("trl")
    r = subprocess.run(
        [sys.executable, "-m", "estimator.interface.cli", *SMALL, "--trace"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("Needs ")  # the answer first ...
    start = out.index("traced (TRL GRPO step under fake tensors, tensor bytes):")  # ... then the trace
    assert start > 10 and all(ln.endswith("traced") for ln in out[start + 1 : start + 5])
    err = r.stderr.splitlines()
    assert err[0].startswith("trace: loading the tracer")
    assert any(
        ln.startswith("trace: tracing one GRPO step of HuggingFaceTB/SmolLM2-135M-Instruct") for ln in err
    )
    assert err[-1].startswith("trace: done (") and err[-1].endswith(" s)")
    # nothing from the libraries (deprecation warnings, logs) reaches the terminal
    assert all(ln.startswith(("trace: ", "vram-estimate: note: ")) for ln in err), r.stderr
    # the traced tensor peak and the estimate agree within the validated band for this small config (1 GiB+)
    peak = float(next(ln for ln in out[start:] if ln.strip().startswith("peak")).split()[1])
    assert peak > 1.0
    # no allocator runs a stream under less than its allocated peak: the traced one, less the [V, H] fp32 gradient
    # that real tensors sum in place for this tied full fine-tune (49,152 x 576 x 4 B = 0.105 GiB); the card holds
    # the context too
    need = float(next(ln for ln in out[start:] if ln.strip().startswith("need")).split()[1])
    card = float(next(ln for ln in out[start:] if ln.strip().startswith("card")).split()[1])
    assert peak - 0.11 <= need < 1.5 * peak and card > need


def test_the_estimate_is_written_before_the_trace_starts(monkeypatch, capsys):
    seen = []

    def make_row(cfg, sweep, need=False):
        seen.append(capsys.readouterr().out)  # what the user had on screen when the trace began
        phases = {"generate": 2**30, "score": 2**30, "train": 3 * 2**30, "optimizer": 2**30}
        return {
            "status": "ok",
            "observed": {"peak_bytes": 3 * 2**30, "peak_phase": "train", "phases": phases},
        }

    stub_tracer(monkeypatch, make_row)
    assert cli.main(["--model", "0.5B", "--trace"]) == 0
    out, err = capsys.readouterr()
    assert seen[0].startswith("Needs ") and "traced (TRL" not in seen[0]
    assert out.startswith("traced (TRL GRPO step") and "  train         3.00 GiB  traced" in out
    assert "trace: done" in err


def test_a_size_alias_is_traced_as_the_catalog_model(monkeypatch, capsys):
    models = []

    def make_row(cfg, sweep, need=False):
        models.append(cfg.model)
        return {"status": "error", "error": "stop"}

    stub_tracer(monkeypatch, make_row)
    cli.main(["--model", "135M", "--trace"])
    capsys.readouterr()
    assert models == ["HuggingFaceTB/SmolLM2-135M-Instruct"]


@pytest.mark.parametrize("how", ["error row", "exception"])
def test_a_failed_trace_exits_4_with_one_line(how, monkeypatch, capsys):
    def make_row(cfg, sweep, need=False):
        print("some library chatter", file=sys.stderr)
        warnings.warn("a deprecation nobody can act on", DeprecationWarning, stacklevel=1)
        if how == "exception":
            raise RuntimeError("fake tensors met a data-dependent op\nsecond line")
        return {"status": "error", "error": "RuntimeError: fake tensors met a data-dependent op"}

    stub_tracer(monkeypatch, make_row)
    code = cli.main(["--model", "0.5B", "--trace"])
    out, err = capsys.readouterr()
    assert code == cli.TRACE_FAILED == 4
    assert out.startswith("Needs ")  # the estimate stands
    errors = [ln for ln in err.splitlines() if not ln.startswith(("trace: ", "vram-estimate: note: "))]
    assert len(errors) == 1 and errors[0].startswith(
        "vram-estimate: error: the trace failed: RuntimeError: fake"
    )
    assert "second line" not in err and "chatter" not in err and "deprecation" not in err
    assert "trace: failed" in err
    log = errors[0].split("(library output: ")[1].rstrip(")")
    assert "some library chatter" in Path(log).read_text()  # kept for whoever needs it
    Path(log).unlink()


def test_json_waits_for_the_trace_and_carries_it(monkeypatch, capsys):
    def make_row(cfg, sweep, need=False):
        return {"status": "error", "error": "RuntimeError: no"}

    stub_tracer(monkeypatch, make_row)
    code = cli.main(["--model", "0.5B", "--trace", "--json"])
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert code == 4 and d["trace"] == {"source": "traced", "status": "error", "error": "RuntimeError: no"}
    assert err.splitlines()[-1] == "vram-estimate: error: the trace failed: RuntimeError: no"


def test_missing_extra_is_one_line_before_any_output(monkeypatch, capsys):
    # as if the sweep extra were missing, even where another test imported the tracer's modules
    for name in {
        "sweeps.trace",
        "sweeps.trace.rows",
        *(m for m in sys.modules if m.startswith("sweeps.trace.")),
    }:
        monkeypatch.setitem(sys.modules, name, None)
    code = cli.main(["--model", "0.5B", "--trace"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "pip install 'grpo-vram[sweep]'" in err


def test_the_progress_line_redraws_on_a_terminal():
    import io

    from estimator.interface.trace_progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = Tty()
    with Progress(s) as p:
        p.stage("tracing")
        p.done("done")
    assert s.getvalue().startswith("\r\033[Ktrace: tracing (0 s)") and s.getvalue().endswith(
        "trace: done (0 s)\n"
    )


def test_the_traced_card_figure_is_the_simulated_need_plus_what_sits_beside_the_tensors(monkeypatch, capsys):
    def make_row(cfg, sweep, need=False):
        assert need  # the CLI asks the tracer for the simulated need
        phases = {"generate": 2**30, "score": 2**30, "train": 3 * 2**30, "optimizer": 2**30}
        obs = {"peak_bytes": 3 * 2**30, "peak_phase": "train", "phases": phases}
        obs["need"] = {"source": "traced, simulated", "min_limit_bytes": 3 * 2**30 + 2**28}
        return {"status": "ok", "observed": obs}

    stub_tracer(monkeypatch, make_row)
    assert cli.main(["--model", "0.5B", "--trace", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    layers = d["layers"]  # the workspaces inside torch's allocator and the context outside it, item by item
    beside = sum(i["bytes"] for i in layers["in_reserved"] + layers["outside_allocator"])
    assert d["trace"]["need_bytes"] == 3 * 2**30 + 2**28
    assert d["trace"]["card_bytes"] == 3 * 2**30 + 2**28 + beside
    assert cli.main(["--model", "0.5B", "--trace"]) == 0
    out = capsys.readouterr().out
    assert "  need          3.25 GiB  traced, simulated" in out
    fit = d["fit_bytes"] / 2**30
    card = d["trace"]["card_bytes"] / 2**30
    assert f"the estimate ({fit:.2f} GiB) is {(fit - card) / card * 100:+.1f}% off the traced card" in out


def test_with_a_gpu_the_trace_gives_its_own_fit_while_the_exit_code_stays_the_estimates(monkeypatch, capsys):
    gib = 2**30

    def make_row(cfg, sweep, need=False):
        phases = {"generate": gib, "score": gib, "train": 3 * gib, "optimizer": gib}
        obs = {"peak_bytes": 3 * gib, "peak_phase": "train", "phases": phases}
        obs["need"] = {"source": "traced, simulated", "min_limit_bytes": 3 * gib}
        return {"status": "ok", "observed": obs}

    stub_tracer(monkeypatch, make_row)
    argv = ["--model", "0.5B", "--gpu", "RTX 3080 10GB", "--trace"]
    assert (
        cli.main([*argv, "--json"]) == 1
    )  # a 0.5B full fine-tune in fp32 does not fit 10 GB by the estimate
    d = json.loads(capsys.readouterr().out)
    target = d["target"]
    assert target["gpu"] == "RTX 3080 10GB" and target["free_bytes"] < 0
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("  by the trace: RTX 3080 10GB "))
    # the trace's card on that GPU: the estimate's card there, less the estimate's excess over the trace's need
    traced_card_there = target["fit_bytes"] - (d["fit_bytes"] - d["trace"]["card_bytes"])
    spare = target["usable_bytes"] - traced_card_there
    assert spare > 0 and f"fits, {spare / gib:.2f} GiB spare (traced, simulated)" in line
