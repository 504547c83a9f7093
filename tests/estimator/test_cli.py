"""vram-estimate end to end: output, JSON, exit codes, --config merging and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from estimator.hardware.gpus import GPUS
from estimator.interface.cli import main
from estimator.settings.config import RunConfig
from estimator.step import band

# Qwen2.5-7B: hand count in test_architecture.py. LoRA r=16 on PEFT's qwen2 default (q_proj, v_proj):
# per layer 16×(3584 + 3584) + 16×(3584 + 512) = 180,224; × 28 layers.
QWEN7B_PARAMS = 7_615_616_512
QWEN7B_LORA16 = 28 * (16 * (3584 + 3584) + 16 * (3584 + 512))
TRACED_7B_LORA = 35_127_664_128  # traced peak of `--model 7B --lora` (results/traced/tuned/default.jsonl)


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv, capsys) -> tuple[int, dict]:
    code, out, _ = run([*argv, "--json"], capsys)
    return code, json.loads(out)


def test_human_report(capsys):
    # transformers 5.23: the release this config's allocation stream was traced under
    argv = ["--model", "7B", "--lora", "--gens", "8", "--transformers-version", "5.23"]
    code, out, _ = run([*argv, "--detail"], capsys)
    assert code == 0
    assert "Qwen/Qwen2.5-7B-Instruct: 7.62 B params, 5.05 M trainable" in out
    for label in ("peak allocated", "allocator overhead", "CUDA context", '"nvidia-smi" peak', "peak phase"):
        line = next(ln for ln in out.splitlines() if ln.lstrip("+= ").startswith(label))
        # this config's allocation stream was traced: its reserve is the simulator's replay of it
        assert ("simulated [" if label == "allocator overhead" else "estimated") in line
    assert "simulated (traced stream" in out  # the reserve's basis, listed under "sources:"
    assert "total (estimated)" in out
    assert "fits on" in out and "✓" in out
    # the short answer (the default) says the same in its first line: what the card must hold, where it fits
    code, short, _ = run(argv, capsys)
    fit_gib = next(ln for ln in out.splitlines() if ln.startswith("= what the fit verdicts compare")).split()[
        -3
    ]
    assert code == 0 and short.startswith(f"Needs {float(fit_gib):.1f} GiB per GPU: fits ")
    assert "peak allocated" not in short and "c12c87f2df5952d9" not in short


def test_json_breakdown(capsys):
    code, d = run_json(["--model", "7B", "--lora", "--transformers-version", "5.23"], capsys)
    assert code == 0
    assert d["source"] == "estimated"
    assert d["model"]["params"] == QWEN7B_PARAMS
    assert d["model"]["trainable_params"] == QWEN7B_LORA16
    # The same config (TRL defaults: fp32 load, GC on) traced at real size: results/traced/tuned/default.jsonl peaks at
    # 35,127,664,128 B in train. Within the estimator's 5 % bound of it:
    assert d["peak_phase"] == "train"
    assert d["peak_allocated_bytes"] == pytest.approx(TRACED_7B_LORA, rel=0.05)
    # + the non-tensor items on an H100 (estimator/terms/overhead.py's sources): 426 MiB bare context +
    # 666,632,192 - 287,047,680 B lazily loaded modules + 32 MiB cuBLAS + 32 MiB cuBLASLt workspaces
    assert d["cuda_context_bytes"] == 446_693_376 + 379_584_512 + 2 * 33_554_432 == 893_386_752
    # + the allocator's reserve: this very config's traced stream (c12c87f2df5952d9) replayed through the
    # simulator reserves 1,280,467,456 B beyond its 35,277,086,208 B allocated peak (allocator_streams.json)
    device = TRACED_7B_LORA * (1 + 1_280_467_456 / 35_277_086_208) + 893_386_752  # 37.3e9 B
    assert d["peak_device_bytes"] == pytest.approx(device, rel=0.05)
    assert len(d["fits"]) == len(GPUS)
    assert all(f["source"] == "estimated" for f in d["fits"])
    # the verdict: what the card must hold with release-and-retry (the smallest allocator limit the simulated
    # stream passes: 36,237,436,800 B for its 35,277,086,208 B peak) + the 893,386,752 B of non-tensor items,
    # against what torch can use on each card (its total_memory, gpus.py)
    need = d["peak_allocated_bytes"] * 36_237_436_800 / 35_277_086_208 + 893_386_752
    assert d["need_bytes"] == pytest.approx(need, abs=2)
    h100 = next(f for f in d["fits"] if f["gpu"] == "H100 80GB")
    # fits are decided on the safe side of the validated error band (estimator/step/band.py): the tensor peak is
    # raised by the band's margin for this config's regime (sdpa with fp32 weights) on top of the need
    m = band.margin(RunConfig(model="7B", use_peft=True))
    need += int(m * d["peak_allocated_bytes"])
    assert h100["usable_bytes"] == 81082 * 2**20 and h100["free_bytes"] == pytest.approx(
        81082 * 2**20 - need, abs=2
    )
    for f in d["fits"]:
        assert f["fits"] == (f["usable_bytes"] > need), f["gpu"]


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--model", "0.5B", "--qlora", "--gpu", "B200"], 0),
        (["--model", "72B", "--gpu", "t4"], 1),  # 72.7B params × 16 B (fp32 AdamW) alone is ~1 TiB
    ],
)
def test_gpu_exit_codes(argv, code, capsys):
    got, out, _ = run([*argv, "--detail"], capsys)
    assert got == code
    assert ("does NOT fit" in out) == (code == 1)
    got, short, _ = run(argv, capsys)
    assert got == code and (" GiB short" in short.splitlines()[0]) == (code == 1)


def test_not_fitting_shows_advice(capsys):
    code, out, _ = run(["--model", "7B", "--gpu", "A100-80", "--detail"], capsys)
    assert code == 1
    assert "what to change" in out and "saves" in out
    # the short answer names the smallest set of changes that fits, with what it costs
    plan = next(ln for ln in out.splitlines() if ln.startswith("smallest set that fits: "))
    code, short, _ = run(["--model", "7B", "--gpu", "A100-80"], capsys)
    lines = short.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("To fit the A100 80GB: "))
    label = plan.removeprefix("smallest set that fits: ").split(" -> ")[0]
    assert code == 1 and label.startswith(lines[i].removeprefix("To fit the A100 80GB: "))
    assert "cost: " in lines[i + 1]


def test_solve(capsys):
    code, d = run_json(
        ["--model", "0.5B", "--qlora", "--gpu", "H100", "--solve", "max_completion_length"], capsys
    )
    assert code == 0
    sol = d["solve"]
    assert sol["value"] >= 1 and sol["peak_device_bytes"] <= sol["budget_bytes"]
    assert sol["source"] == "estimated"


def test_flags_and_aliases(capsys):
    _, d = run_json(["--model", "qwen3-8b", "--qlora", "--gpus", "2", "--zero", "3", "--lora-r", "8"], capsys)
    c = d["config"]
    assert (c["use_peft"], c["load_in_4bit"], c["num_gpus"], c["sharding"], c["lora_r"]) == (
        True,
        True,
        2,
        "zero3",
        8,
    )
    _, d = run_json(["--lora-target-modules", "q_proj,k_proj", "v_proj", "--lora"], capsys)
    assert d["config"]["lora_target_modules"] == ["q_proj", "k_proj", "v_proj"]


def test_dtype_auto_reads_the_checkpoint(capsys):
    _, d = run_json(["--model", "7B", "--dtype", "auto"], capsys)
    assert d["config"]["dtype"] == "bfloat16"  # Qwen2.5-7B-Instruct config.json: torch_dtype bfloat16


def test_config_file_then_flags_override(tmp_path, capsys):
    p = tmp_path / "grpo.yaml"
    p.write_text(
        "model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\nnum_generations: 16\nper_device_train_batch_size: 16\n"
        "model_init_kwargs: {dtype: bfloat16}\nlearning_rate: 1.0e-6\n"
    )
    code, out, err = run(["--config", str(p), "--gens", "8", "--json"], capsys)
    d = json.loads(out)
    assert code == 0
    assert d["model"]["name"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert (d["config"]["num_generations"], d["config"]["per_device_train_batch_size"]) == (8, 16)
    assert d["config"]["dtype"] == "bfloat16"
    assert err.count("\n") == 1 and "learning_rate" in err


BAD = [
    ["--model", "9B"],
    ["--model", "qwen3-8bx"],
    ["--gens", "3"],
    ["--gens", "1", "--per-device-train-batch-size", "1"],
    ["--gens", "0"],
    ["--gens", "x"],
    ["--per-device-train-batch-size", "-1"],
    ["--generation-batch-size", "12"],
    ["--steps-per-generation", "2", "--generation-batch-size", "16"],
    ["--gpu", "X100"],
    ["--optim", "adam"],
    ["--dtype", "int4"],
    ["--load-in-4bit"],
    ["--qlora", "--no-use-peft"],
    ["--lora", "--lora-r", "0"],
    ["--lora", "--lora-target-modules", "foo_proj"],
    ["--lora", "--lora-target-modules", "lm_head"],
    ["--solve", "num_generations"],
    ["--solve", "beta", "--gpu", "H100"],
    ["--zero", "3", "--fsdp"],
    ["--zero", "1"],
    ["--gpus", "0"],
    ["--vllm-gpu-memory-utilization", "1.5"],
    ["--device", "cpu", "--gpu", "H100"],
    ["--device", "cpu", "--use-vllm"],
    ["--config", "/nonexistent/grpo.yaml"],
    ["--bogus"],
    ["--model", "/"],
]


@pytest.mark.parametrize("argv", BAD, ids=[" ".join(a) for a in BAD])
def test_bad_input_one_line_exit_2(argv, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("vram-estimate: error: ") and err.count("\n") == 1


def test_bad_config_file_types(tmp_path, capsys):
    p = tmp_path / "grpo.yaml"
    p.write_text("num_generations: [8]\n")
    code, _, err = run(["--config", str(p)], capsys)
    assert code == 2 and "num_generations must be an integer" in err and err.count("\n") == 1


def test_trace_without_helper_is_one_line(capsys, monkeypatch):
    # as if the sweep extra were missing, even where another test imported the tracer's modules
    for name in {
        "sweeps.trace",
        "sweeps.trace.rows",
        *(m for m in sys.modules if m.startswith("sweeps.trace.")),
    }:
        monkeypatch.setitem(sys.modules, name, None)
    code, _, err = run(["--trace"], capsys)
    assert code == 2 and "sweep" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, code", [(["--help"], 0), (["--model", "0.5B", "--gpu", "B200"], 0), (["--gens", "3"], 2)]
)
def test_subprocess_exit_codes(argv, code):
    r = subprocess.run(
        [sys.executable, "-m", "estimator.interface.cli", *argv], capture_output=True, text=True
    )
    assert r.returncode == code
    if code == 2:
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_the_short_answers_rows_add_up_and_show_the_reserve_models_margin_apart():
    # the rows of "Where it goes" sum to what the fit verdict compares (less tensors under 0.005 GiB, which the
    # short table leaves out). A fitted reserve shows the
    # models' safety margin on a row of its own: on a generation-peaked eager run it is most of the reserve (the
    # generation model's worst leave-one-out miss, 27 points of generation's total); a config whose own stream was
    # simulated has no margin
    from estimator.interface.report import breakdown
    from estimator.step.estimate import estimate

    gen = RunConfig(
        model="Qwen/Qwen3-4B", dtype="bfloat16", use_peft=True, attn_implementation="eager",
        per_device_train_batch_size=16, num_generations=16, steps_per_generation=5,
        max_prompt_length=740, max_completion_length=284,
    )  # fmt: skip
    est = estimate(gen)
    rows = dict((label, b) for label, b, _ in breakdown(est))
    assert 0 <= est.fit_bytes - sum(rows.values()) < 0.005 * 2**30
    assert rows["reserve margin (safe side)"] > rows["allocator reserve"] > 0
    kept = estimate(RunConfig(model="7B", use_peft=True, dtype="bfloat16"))
    assert kept.reserve_source in ("simulated", "fitted")
    labels = [label for label, _, _ in breakdown(kept)]
    assert ("reserve margin (safe side)" in labels) == (kept.reserve_source == "fitted")
    assert 0 <= kept.fit_bytes - sum(b for _, b, _ in breakdown(kept)) < 0.005 * 2**30


@pytest.mark.parametrize("gpu", ["A100-40", "24GB", "H100"])
def test_the_short_answer_says_when_the_reserve_margin_decides_the_verdict(gpu, capsys):
    # the r08 shape (results/MINCARD.md: 38.3 GiB measured, 44.6 estimated with 8.5 GiB of margin): on a card
    # between the two the margin decides, and the answer says so and names --trace; on a card it fits, or one
    # short by more than the margin, it says nothing of it
    argv = ["--model", "Qwen/Qwen3-4B", "--lora", "--dtype", "bfloat16", "--attn-implementation", "eager",
            "--per-device-train-batch-size", "16", "--num-generations", "16", "--steps-per-generation", "5",
            "--max-prompt-length", "740", "--max-completion-length", "284", "--gpu", gpu]  # fmt: skip
    main([*argv, "--json"])
    d = json.loads(capsys.readouterr().out)
    margin, usable = d["layers"]["need"]["allocator_margin_bytes"], d["target"]["usable_bytes"]
    decides = d["fit_bytes"] > usable >= d["fit_bytes"] - margin
    main(argv)
    text = " ".join(capsys.readouterr().out.split())
    assert ("The reserve margin" in text and "--trace" in text) == decides
    assert decides == (gpu == "A100-40")


def test_a_change_to_flash_attention_never_fits_a_card_older_than_ampere(capsys):
    # flash-attn 2 needs compute capability 8.0+: on a T4 (7.5) the change to it is listed as not fitting and the
    # plan takes another; on an L4 (8.9), an unknown card, or a run that chose it itself, nothing is checked
    from estimator.hardware.gpus import lookup
    from estimator.plan.changes import kernel_runs_on

    eager = RunConfig(model="google/gemma-2-2b-it", attn_implementation="eager")
    fa2 = eager.with_(attn_implementation="flash_attention_2")
    check = kernel_runs_on(lookup("T4").sm, eager)
    assert check(fa2, None) is False and check(eager, None) is True
    assert kernel_runs_on(lookup("L4").sm, eager) is None and kernel_runs_on(lookup("T4").sm, fa2) is None
    assert kernel_runs_on(None, eager) is None and kernel_runs_on((0, 0), eager) is None
    argv = ["--model", "google/gemma-2-2b-it", "--attn-implementation", "eager", "--dtype", "bfloat16", "--lora",
            "--max-prompt-length", "1024", "--num-generations", "16", "--per-device-train-batch-size", "16"]  # fmt: skip
    main([*argv, "--gpu", "T4", "--detail"])
    out = capsys.readouterr().out
    assert (
        "To fit the T4" not in out or "flash_attention_2" not in out.split("To fit the T4")[1].splitlines()[0]
    )
    (line,) = [ln for ln in out.splitlines() if "--attn-implementation flash_attention_2" in ln]
    assert "✗" in line


def test_detail_names_a_file_whose_name_holds_a_space(tmp_path, capsys):
    f = tmp_path / "my run.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nnum_generations: 4\n")
    main(["--config", str(f), "--detail"])
    text = capsys.readouterr().out
    block = text[text.index("settings read from:") :]
    assert "  my run.yaml: model=Qwen/Qwen2.5-0.5B-Instruct (model_name_or_path)" in block
    assert "num_generations=4" in block
