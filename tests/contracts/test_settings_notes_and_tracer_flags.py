"""Silent caps and ignored settings get a note; the tracer's own flags fail before any trace; traces are quiet
and leave no temp dir."""

import logging
import os
import tempfile
import warnings

import pytest

from estimator.interface import cli
from estimator.model.catalog import resolve_model
from estimator.plan import solve
from estimator.settings.config import RunConfig
from estimator.settings.validate import notes
from sweeps.trace import cli as trace_cli
from sweeps.trace import rows, step


def _run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--zero", "3"], "--sharding zero3 over one GPU shards nothing; give --gpus N"),
        (["--fsdp"], "--sharding fsdp over one GPU shards nothing"),
        (["--lora-r", "8"], "--lora-r has no effect without --lora (ignored)"),
        (["--lora-dropout", "0.1"], "--lora-dropout has no effect without --lora"),
        (["--bnb-4bit-quant-type", "fp4"], "--bnb-4bit-quant-type has no effect without --load-in-4bit"),
        (["--vllm-mode", "server"], "--vllm-mode has no effect without --use-vllm"),
        (
            ["--fsdp-sharding-strategy", "SHARD_GRAD_OP"],
            "--fsdp-sharding-strategy has no effect without FSDP",
        ),
        (
            ["--use-vllm", "--vllm-mode", "server", "--vllm-enable-sleep-mode"],
            "--vllm-enable-sleep-mode applies to colocate mode",
        ),
        (["--gpus", "2", "--fsdp", "--no-ds3-gather-for-generation"], "has no effect without ZeRO-3"),
        # Qwen2.5-7B's config.json: max_position_embeddings 32768; 256 + 40000 tokens are past it
        (["--max-completion-length", "40000"], "40256 tokens is past Qwen/Qwen2.5-7B-Instruct's context"),
    ],
)
def test_ignored_or_suspicious_settings_get_a_note(capsys, argv, expected):
    code, err = _run(capsys, *argv)
    assert code in (0, 1)
    assert any(line.startswith("vram-estimate: note: ") and expected in line for line in err), err


@pytest.mark.parametrize(
    "argv",
    [["--zero", "3", "--gpus", "4"], ["--lora", "--lora-r", "8"], ["--max-completion-length", "32000"], []],
)
def test_no_note_when_the_setting_takes_effect(capsys, argv):
    code, err = _run(capsys, *argv)
    assert code in (0, 1) and not [line for line in err if "note:" in line and "weights load" not in line], (
        err
    )


def test_notes_only_name_settings_that_were_given():
    arch = resolve_model("7B")
    assert notes(RunConfig(), arch, given=()) == []
    assert notes(RunConfig(lora_r=16), arch, given=("lora_r",)) == [
        "--lora-r has no effect without --lora (ignored)"
    ]


def test_empty_gpu_name_is_an_error(capsys):
    code, err = _run(capsys, "--gpu", "")
    assert code == 2 and len(err) == 1 and "--gpu is empty" in err[0]


def test_solve_says_when_the_generations_search_is_capped():
    arch = resolve_model("0.5B")
    cfg = RunConfig(model="0.5B")
    always = solve.solve(cfg, arch, "num_generations", 10**30, lambda c, a: _Peak(1))
    assert always.value == solve.MAX_GENERATIONS
    assert f"capped at {solve.MAX_GENERATIONS}" in always.note
    bounded = solve.solve(cfg, arch, "num_generations", 100, lambda c, a: _Peak(c.num_generations * 10))
    assert bounded.value == 10 and "capped" not in bounded.note  # 10 x 10 <= 100 < 11 x 10


class _Peak:
    """An estimate whose nvidia-smi peak, what the card must hold and what fits compare (band included) are `n`."""

    def __init__(self, n):
        self.peak_device_bytes = self.need_bytes = self.fit_bytes = n


def _trace_main(capsys, *argv):
    code = trace_cli.main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture
def no_trace(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a trace ran before the flags were checked")

    monkeypatch.setattr(trace_cli, "make_row", boom)
    monkeypatch.setattr(trace_cli, "run_grid", boom)
    monkeypatch.setattr(trace_cli.retrace, "run", boom)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["one", "--gens", "0"], "--num-generations 0: must be an integer >= 2"),
        (["one", "--out", "/proc/x/y.jsonl"], "--out /proc/x/y.jsonl: cannot write 64 KiB in /proc/x"),
        (["one", "--out", "{tmp}"], "is a directory; give a .jsonl file"),
        (["grid", "smoke", "--out", "{tmp}"], "is a directory; give a .jsonl file"),
        (["grid", "smoke", "--timeout", "-1"], "--timeout -1: accepted values are seconds > 0"),
        (["grid", "smoke", "--timeout", "nan"], "--timeout nan"),
        (["grid", "smoke", "--limit", "0"], "--limit 0: accepted values are integers >= 1"),
        (["grid", "bogus"], "'bogus'"),
        (["retrace", "--tag", "t", "{tmp}/nope.jsonl"], "no such traced file"),
        (["--model", "7B"], "'--model' is not a command; accepted: one, grid, retrace"),
    ],
)
def test_tracer_flags_fail_before_any_trace(capsys, no_trace, tmp_path, argv, expected):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, err = _trace_main(capsys, *argv)
    assert code == 2 and len(err) == 1 and expected in err[0], err


def test_quiet_libraries_silences_and_restores():
    before = logging.getLogger("trl").level
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with rows.quiet_libraries():
            warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
            assert logging.getLogger("trl").level == logging.ERROR
        warnings.warn("after", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["after"]
    assert logging.getLogger("trl").level == before


def test_trace_output_dir_is_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    used = []

    def fake_run(cfg, fake, steps, decode_k, out_dir, *caps):
        assert os.path.isdir(out_dir)
        used.append(out_dir)
        return "result"

    monkeypatch.setattr(step, "_run", fake_run)
    assert step.run(RunConfig(model="0.5B")) == "result"
    assert used and not os.path.exists(used[0]) and os.listdir(tmp_path) == []


def test_generation_without_a_cache_is_noted_and_so_is_a_config_json_that_may_ask_for_it(tmp_path):
    import json

    arch = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    (note,) = notes(RunConfig(generation_use_cache=False), arch)
    assert "without a KV cache" in note and "nvidia-smi" in note
    assert notes(RunConfig(generation_use_cache=False, use_vllm=True), arch) == []  # vLLM has its own cache
    # a config.json of the user's saying use_cache false: the checkpoint may generate without one
    conf = json.loads(json.dumps(arch.extra["config"])) | {"use_cache": False}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    theirs = resolve_model(str(tmp_path / "config.json"))
    (note,) = notes(RunConfig(model=str(tmp_path / "config.json")), theirs)
    assert "use_cache: false" in note and "--no-generation-use-cache" in note
    # the catalog's own copy (Qwen3-4B's says false) is not the user's file: no note
    assert notes(RunConfig(model="Qwen/Qwen3-4B"), resolve_model("Qwen/Qwen3-4B")) == []


def test_a_checkpoint_folder_says_whether_it_generates_with_a_cache(tmp_path):
    """As from_pretrained resolves it (tests/ground_truth/test_generation_without_cache.py): a generation_config.json
    decides; a folder without one falls back to config.json's use_cache."""
    import json

    conf = dict(resolve_model("Qwen/Qwen2.5-0.5B-Instruct").extra["config"])

    def note_for(config_use_cache: bool, generation: dict | None) -> list[str]:
        folder = tmp_path / f"ckpt-{config_use_cache}-{generation}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(conf | {"use_cache": config_use_cache}))
        if generation is not None:
            (folder / "generation_config.json").write_text(json.dumps(generation))
        return notes(RunConfig(model=str(folder)), resolve_model(str(folder)))

    (note,) = note_for(False, None)  # no generation config: config.json decides
    assert "says use_cache: false, so transformers generates without a KV cache" in note
    assert note_for(False, {"temperature": 0.6}) == []  # a silent generation config keeps the cache
    (note,) = note_for(True, {"use_cache": False})  # the generation config decides
    assert "without a KV cache" in note
    assert note_for(True, None) == []
