"""The fit verdict against GRPO runs people reported in public, with the settings their reports give.

Each case is a report a reader can open: the run's settings as written there (what a report leaves out takes the
default of the TRL release of its date, said in `assumed`), and what happened: it ran out of memory on that card,
or it ran. The test holds the verdict on that card to the outcome, so these fail if a change makes the estimate
say "fits" where a real run ran out of memory, or "does not fit" where a documented run ran. None of them gives a
figure the estimate could be held to within a band (measured-gpu rows do that: tests/accuracy/test_measured_gpu.py).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_json import run

FILES = Path(__file__).resolve().parents[1] / "data" / "config_files" / "open-r1"


@dataclass(frozen=True)
class Report:
    source: str  # where the outcome is reported
    argv: tuple[str, ...]
    fits: bool  # the reported outcome on the --gpu card: ran (True) or out of memory (False)
    assumed: str = ""  # what the report does not say, and the default taken for it
    peak_phase: str | None = None  # where the report's traceback put the OOM, when it gives one
    # torch's OOM message: "... GiB is allocated by PyTorch" + "Tried to allocate ... GiB": tensors the run needed
    # at that moment, a lower bound on its allocated peak
    oom_needed_gib: float | None = None


# open-r1's README command at the time of open-r1#100: DeepSeek-R1-Distill-Qwen-7B (Qwen2.5-7B's shapes), ZeRO-3
# over 8 GPUs, TRL 0.14
OPEN_R1_100 = (
    "--model", "Qwen/Qwen2.5-7B-Instruct", "--trl-version", "0.14", "--bf16", "--per-device-train-batch-size", "1",
    "--gradient-accumulation-steps", "16", "--max-prompt-length", "256", "--max-completion-length", "256",
    "--gpus", "8", "--zero", "3",
)  # fmt: skip

REPORTS = (
    Report(
        "https://github.com/huggingface/trl/issues/2972",
        (
            "--model", "Qwen/Qwen2.5-7B-Instruct", "--trl-version", "0.15", "--dtype", "bfloat16",
            "--per-device-train-batch-size", "1", "--num-generations", "2", "--max-prompt-length", "256",
            "--max-completion-length", "512", "--gpus", "4", "--gpu", "H20",
        ),
        fits=False,
        assumed="bf16 weights (the model is passed loaded; 40 GB per GPU in step 1 fits bf16, not fp32); TRL 0.15, "
        "the release of the report's date, with transformers' optimizer of that time (adamw_torch, foreach)",
        peak_phase="optimizer",  # out of memory at step 2, once AdamW's state and foreach's sqrt(v) exist
    ),
    Report(
        "https://github.com/huggingface/trl/pull/2776 (a comment with the traceback: OOM in _foreach_sqrt)",
        (
            "--model", "Qwen/Qwen2.5-7B-Instruct", "--trl-version", "0.15", "--dtype", "bfloat16",
            "--per-device-train-batch-size", "2", "--num-generations", "6", "--max-prompt-length", "256",
            "--max-completion-length", "512", "--gpus", "3", "--gpu", "H20",
        ),
        fits=False,
        assumed="the same user's lengths and dtype as in trl#2972; per_device_train_batch_size counted in "
        "completions (0.15), the smaller of the two readings of that time",
        peak_phase="optimizer",
        oom_needed_gib=92.43 + 0.13,
    ),
    Report(
        "https://github.com/huggingface/trl/issues/3678",
        (
            "--model", "Qwen/Qwen3-0.6B", "--trl-version", "0.19", "--max-prompt-length", "168",
            "--max-completion-length", "256", "--gpu-memory-gib", "20",
        ),
        fits=False,
        assumed="the reporter's 20 GB card, every other setting TRL 0.19's default (8 x 8 completions, fp32 "
        "weights as TRL loads a model given by name)",
    ),
    Report(
        "https://github.com/huggingface/open-r1/issues/100 (A100 40GB)",
        (*OPEN_R1_100, "--gpu", "A100-40"),
        fits=False,
        assumed="DeepSeek-R1-Distill-Qwen-7B sized as Qwen2.5-7B-Instruct (the same shapes); open-r1's README "
        "command of that time (ZeRO-3 over 8 GPUs, TRL 0.14)",
    ),
    Report(
        "https://github.com/huggingface/open-r1/issues/100 (8 x H100: running)",
        (*OPEN_R1_100, "--gpu", "H100"),
        fits=True,
        assumed="as above",
    ),
    Report(
        "https://github.com/huggingface/trl/pull/5759 (TRL's quickstart: about 32 GB on an A100 80GB)",
        (
            "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--trl-version", "1.4", "--max-prompt-length", "512",
            "--max-completion-length", "1024", "--gpu", "A100-80",
        ),
        fits=True,
        assumed="prompts of at most 512 tokens; every other setting TRL 1.4's default",
    ),
    Report(
        "https://github.com/modelscope/ms-swift/issues/3848 (a maintainer's run: about 12 GB on an A800 40GB)",
        (
            "--model", "Qwen/Qwen2.5-3B-Instruct", "--trl-version", "0.16", "--dtype", "bfloat16", "--lora",
            "--lora-r", "64", "--lora-target-modules", "all-linear", "--attn-implementation",
            "flash_attention_2", "--per-device-train-batch-size", "1", "--num-generations", "7",
            "--gradient-accumulation-steps", "6", "--max-prompt-length", "300", "--max-completion-length",
            "1024", "--gradient-checkpointing", "--beta", "0.04", "--gpus", "7", "--gpu", "A100-40",
        ),
        fits=True,
        assumed="ms-swift's GRPO trainer (TRL 0.16's) with generation on other GPUs; prompts of about 300 tokens",
    ),
    Report(
        "https://github.com/huggingface/trl/blob/66d976c00f6fd78f4663446c734ecec13e1a99ec/examples/notebooks/"
        "openenv_sudoku_grpo.ipynb (TRL's own notebook, run 2026-01-02: vLLM started, steps logged)",
        (
            "--model", "Qwen/Qwen3-1.7B", "--trl-version", "0.26", "--dtype", "float32",
            "--per-device-train-batch-size", "1", "--gradient-accumulation-steps", "8", "--num-generations", "8",
            "--max-prompt-length", "1000", "--max-completion-length", "8", "--use-vllm", "--vllm-mode",
            "colocate", "--vllm-gpu-memory-utilization", "0.1", "--vllm-max-model-length", "2560",
            "--gpu", "A100-40",
        ),
        fits=True,
        assumed="TRL 0.26.2 (PyPI on the run's date) with its vLLM 0.10.2-0.11, which captures CUDA graphs beyond "
        "gpu_memory_utilization; prompts of about 1,000 tokens",
    ),
)  # fmt: skip


def _answer(argv, capsys) -> tuple[int, dict, str]:
    code, out, err = run([*argv, "--json"], capsys)
    return code, json.loads(out), err


@pytest.mark.parametrize("report", REPORTS, ids=[r.source.split("/")[-1][:40] for r in REPORTS])
def test_verdict_matches_the_reported_outcome(report, capsys):
    code, d, err = _answer(report.argv, capsys)
    assert code in (0, 1), err
    assert d["target"]["fits"] is report.fits, (
        report.source,
        d["fit_bytes"] / 2**30,
        d["target"]["usable_bytes"],
    )
    if report.peak_phase:
        assert d["peak_phase"] == report.peak_phase
    if report.oom_needed_gib is not None:
        assert d["peak_allocated_bytes"] >= report.oom_needed_gib * 2**30


# open-r1's README (https://github.com/huggingface/open-r1/blob/1416fa0cf21595d2083b399a2a0bbddd7f6e9563/README.md
# L220-225 and L307-316): "The training commands below are configured for a node of 8 x H100s (80GB)"
OPEN_R1_COMMANDS = (
    (
        "ACCELERATE_LOG_LEVEL=info accelerate launch --config_file recipes/accelerate_configs/zero3.yaml \\\n"
        "    src/open_r1/grpo.py --config recipes/DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml \\\n"
        "    --vllm_mode colocate"
    ),
    (
        "CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 ACCELERATE_LOG_LEVEL=info \\\n"
        "    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml --num_processes=7 \\\n"
        "    src/open_r1/grpo.py --config recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml"
    ),
)


@pytest.fixture
def open_r1(tmp_path, monkeypatch):
    """open-r1's recipes where its README's commands look for them (copies: tests/data/config_files/README.md)."""
    for name, there in (
        ("zero2.yaml", "recipes/accelerate_configs/zero2.yaml"),
        ("zero3.yaml", "recipes/accelerate_configs/zero3.yaml"),
        (
            "r1-distill-qwen-1.5b_config_demo.yaml",
            "recipes/DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml",
        ),
        ("config_demo_code.yaml", "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml"),
    ):
        (tmp_path / there).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FILES / name, tmp_path / there)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command", OPEN_R1_COMMANDS, ids=["r1-distill-zero3-colocate", "code-zero2-server"])
def test_open_r1_readme_commands_fit_the_h100_they_are_written_for(open_r1, command, capsys):
    code, d, err = _answer(["--gpu", "H100", "--from-command", command], capsys)
    assert code == 0, err
    assert d["target"]["fits"] is True
    # read as open-r1 runs them: the TRL it pins, DeepSpeed over the processes the command starts
    assert d["config"]["trl_version"] == "0.18"
    assert d["config"]["sharding"] in ("zero2", "zero3") and d["config"]["num_gpus"] in (7, 8)
