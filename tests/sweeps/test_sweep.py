"""The sweep app: real GRPOTrainer steps on a tiny model, failures recorded as rows, resume without duplicates."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize

from sweeps import records
from sweeps.runner import data, grpo_setup, measure, schema, tiny
from sweeps.runner.job import BadInput, to_job
from sweeps.runner.predict import predict

REPO = Path(__file__).resolve().parents[2]
TINY_ARGS = [
    "model=tiny-2M",
    "trainer.per_device_train_batch_size=4",
    "trainer.num_generations=4",
    "trainer.max_prompt_length=8",
    "trainer.max_completion_length=8",
    "sweep.name=t",
]


def _sweep(tmp_path, *overrides):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "sweeps.runner.app",
        "--multirun",
        *TINY_ARGS,
        f"sweep.results_dir={tmp_path / 'res'}",
        f"hydra.sweep.dir={tmp_path / 'hydra'}",
        *overrides,
    ]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _compose(*overrides):
    schema.register()
    with initialize(config_path="../../sweeps/runner/conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.slow
def test_sweep_runs_records_failures_and_resumes(tmp_path):
    proc = _sweep(tmp_path, "run.inject_failure=raise,kill,null")
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = tmp_path / "res" / "t.jsonl"
    rows = records.load_rows(path)
    assert [r["status"] for r in rows] == ["error", "error", "ok"]
    assert rows[0]["error"] == "RuntimeError: injected failure"
    assert "SIGKILL" in rows[1]["error"]

    ok = rows[2]
    assert ok["key"] == records.make_key(ok["config"], ok["variant"])
    assert ok["source"] == "measured-cpu" and ok["config"]["device"] == "cpu"
    assert ok["versions"]["trl"].startswith("1.16") and ok["device"]["type"] == "cpu"
    obs = ok["observed"]
    assert obs["source"] == "measured-cpu"
    params = ok["model"]["params"]
    assert params == 2_002_048 == ok["model"]["trainable_params"]
    weights = 4 * params  # fp32
    phases = obs["phases"]
    assert set(phases) == {"generate", "score", "train", "optimizer"}
    # tiny-2M by hand: H 128, I 512, 6 layers, 4 heads / 2 KV heads of 32, vocab 2048, untied: 75 parameter
    # tensors (12 per layer + embedding, final norm, lm_head). Resident from step 2: weights + two fp32 AdamW
    # states (3 × weights) + one fp32 `step` per tensor (300 B).
    resident = 3 * weights + 75 * 4
    # Generate (step 2) adds autocast's cached bf16 copies of the trainable fp32 Linear weights, per layer
    # 128·128 (q, o) + 128·64 (k, v) + 3·128·512 (MLP) = 245,760 × 6 + lm_head 2048·128 = 1,736,704 × 2 B =
    # 3,473,408, and the fp32 KV cache of 15 positions, 2 · 6 layers · 4 seqs · 64 · 15 · 4 B = 184,320; the
    # rest are [4, 2048] logits copies and one decode step's activations (under 256 KiB).
    gen = resident + 3_473_408 + 184_320
    assert gen <= phases["generate"] <= gen + 256 * 1024
    # Optimizer (step 2): + full fp32 gradients (weights), the rollout batch (int64 ids and masks [4, 8] × 4 =
    # 1,024 + fp32 advantages 16), rotary inv_freq buffers (2 × 16 fp32 = 128) and clip_grad_norm_'s 75
    # per-tensor norms and their stack (2 × 300); a few scalars on top.
    opt = resident + weights + 1_040 + 128 + 600
    assert opt <= phases["optimizer"] <= opt + 256
    # Train (step 2) peaks in backward's first op, the fused head's backward: resident + the lm_head's fp32
    # gradient [2048, 128] (1,048,576) + the CPU tile buffer mm_buf [60, 32768] bf16 (3,932,160; N = 4 sequences
    # × 15 scored positions, CK:347) are live together. The rest is the estimator's model, within its 5 % bound.
    assert resident + 1_048_576 + 3_932_160 <= phases["train"]
    estimated, _ = predict(ok["config"], ok["model"].get("config"))
    assert phases["train"] == pytest.approx(estimated["phase_totals"]["train"], rel=0.05)
    tensors = obs["probes"]["tensors"]
    assert obs["peak_bytes"] == sum(tensors["at_peak_by_label"].values())  # the tensors live at the peak
    assert obs["peak_phase"] == "train"
    assert obs["shapes"] == [{"prompt": [4, 8], "completion": [4, 8]}] * 2
    assert len(ok["step_seconds"]) == 2 and all(s > 0 for s in ok["step_seconds"])
    assert ok["lengths"]["max_length"] == [8.0, 8.0]
    assert obs["probes"]["nvml"]["available"] is False and obs["probes"]["nvml"]["reason"]
    assert (
        "prediction" not in ok
    )  # the estimate is recomputed where it is compared (sweeps/report/accuracy.py)

    again = _sweep(tmp_path, "run.inject_failure=raise,kill,null")
    assert again.returncode == 0, again.stderr[-2000:]
    # the ok row is kept; the two error rows never make a rerun skip their configs
    assert sum(line.startswith("skip ") for line in again.stdout.splitlines()) == 1
    keys = [r["key"] for r in rows]
    assert [r["key"] for r in records.load_rows(path)] == [*keys, keys[0], keys[1]]


def test_timeout_kills_child_and_is_an_error(tmp_path):
    spec = {
        "config": {"model": "tiny-2M", "device": "cpu"},
        "variant": {},
        "inject_failure": "hang",
        "result_path": str(tmp_path / "result.json"),
        "workdir": str(tmp_path),
    }
    result = measure.run_child(spec, timeout_s=3, log_path=tmp_path / "run.log")
    assert result == {"status": "error", "error": "timeout: run killed after 3 s"}


def test_bad_input_is_one_line_on_stderr(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "sweeps.runner.app", "trainer.dtype=fp8", f"sweep.results_dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["grpo-vram-sweep: trainer.dtype=fp8: accepted: float32, bfloat16, float16"]
    assert not list(tmp_path.glob("*.jsonl"))


def test_to_job_maps_config_and_variant(tmp_path):
    job = to_job(_compose("+experiment=smoke", "method=qlora", f"sweep.results_dir={tmp_path}"))
    c = job.config
    assert (c.model, c.device, c.use_peft, c.load_in_4bit) == ("tiny-2M", "cpu", True, True)
    assert (c.per_device_train_batch_size, c.num_generations, c.max_completion_length) == (4, 4, 32)
    assert job.variant["tiny_model"]["hidden_size"] == 128
    assert "inject_failure" not in job.variant
    assert job.results_path == tmp_path / "smoke.jsonl"
    assert job.source == "measured-cpu"
    assert c.lora_dropout == 0.05  # TRL's ModelConfig default, an estimator field (not a variant)
    assert grpo_setup.peft_config(c, job.variant).lora_dropout == 0.05


def test_runs_the_runner_cannot_do_are_bad_input():
    with pytest.raises(BadInput, match="trainer.sharding='zero3'"):
        to_job(_compose("trainer.sharding=zero3"))
    with pytest.raises(BadInput, match="run.bogus"):
        to_job(_compose("+run.bogus=1"))


def test_h100_preset_resolves_accumulation_for_16_generations():
    job = to_job(_compose("+experiment=h100", "trainer.num_generations=16", "model=qwen2.5-7b"))
    assert job.config.model == "Qwen/Qwen2.5-7B-Instruct"
    assert (job.config.gradient_accumulation_steps, job.config.generation_sequences) == (2, 16)
    assert job.config.dtype == "bfloat16" and job.source == "measured-gpu"
    job4 = to_job(_compose("+experiment=h100", "trainer.num_generations=4"))
    assert job4.config.gradient_accumulation_steps == 1


def test_indivisible_generation_batch_is_bad_input():
    with pytest.raises(BadInput, match=r"must be divisible by num_generations \(3\)"):
        to_job(_compose("trainer.num_generations=3"))


def test_skip_keys_error_rows_are_rerun(tmp_path):
    path = tmp_path / "r.jsonl"
    v = records.package_versions()
    records.append_row(path, {"schema": 1, "key": "e", "status": "error", "versions": v})
    records.append_row(path, {"schema": 1, "key": "o", "status": "ok", "versions": v})
    records.append_row(path, {"schema": 1, "key": "m", "status": "oom", "versions": v})
    records.append_row(path, {"schema": 1, "key": ["not", "a", "key"], "status": "ok", "versions": v})
    assert measure.skip_keys(path, v) == {"o", "m"}


def test_synthetic_prompts_have_exact_token_length():
    tok = tiny.build_tokenizer(2048)
    rows = data.synthetic(tok, 37, n=5)
    assert [len(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows] == [37] * 5
    assert json.dumps(rows)  # plain data


def test_gsm8k_is_shipped():
    rows = data.gsm8k("train", 3)
    assert rows[0]["answer"] == "72" and rows[0]["prompt"].startswith("Natalia")


def test_sizes_trl_rejects_are_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    for override, expected in (
        ("trainer.num_generations=0", "trainer.num_generations=0: must be an integer >= 2"),
        ("trainer.num_generations=3", "divisible by num_generations (3)"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "sweeps.runner.app", override, f"hydra.run.dir={tmp_path}"],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0]


def test_composed_hydra_defaults_equal_runconfig_defaults():
    """The trainer group is derived from the schema: composing with no overrides gives RunConfig() exactly, but
    for the release settings, which default to the releases installed here (what the run measures)."""
    from dataclasses import replace

    from estimator.settings.config import RunConfig
    from estimator.settings.trl_versions import default_version, fmt
    from estimator.settings.versions import default_transformers

    job = to_job(_compose())
    here = {"trl_version": fmt(default_version()), "transformers_version": default_transformers()}
    # model and device come from their own groups
    assert job.config == replace(RunConfig(), model="tiny-2M", device="cpu", **here)


def test_methods_switch_only_peft_and_4bit():
    lora, qlora = to_job(_compose("method=lora")).config, to_job(_compose("method=qlora")).config
    assert (lora.use_peft, lora.load_in_4bit) == (True, False)
    assert (qlora.use_peft, qlora.load_in_4bit) == (True, True)
    assert lora.lora_r == qlora.lora_r == 16 and lora.lora_dropout == 0.05  # TRL ModelConfig defaults


def test_structured_schema_refuses_a_non_boolean_before_running():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="gradient_checkpointing=maybe"):
        _compose("trainer.gradient_checkpointing=maybe")


def test_a_trl_release_this_environment_does_not_run_is_refused_before_any_run():
    with pytest.raises(BadInput, match="trl_version=0.14: this environment runs TRL 1.16"):
        to_job(_compose("trainer.trl_version=0.14"))


def test_every_grpo_config_setting_reaches_trl(tmp_path):
    """The runner passes the schema's GRPOConfig settings through by name: a changed value arrives in TRL's
    GRPOConfig (torch_empty_cache_steps was accepted by the sweep and silently dropped before)."""
    from estimator.settings.config import RunConfig

    cfg = RunConfig(model="tiny-2M", device="cpu", torch_empty_cache_steps=3, num_iterations=2, beta=0.04)
    args = grpo_setup.grpo_args(cfg, {**grpo_setup.VARIANT_DEFAULTS, "steps": 2}, tmp_path)
    assert (args.torch_empty_cache_steps, args.num_iterations, args.beta) == (3, 2, 0.04)
    assert args.per_device_train_batch_size == 8 and args.num_generations == 8 and not args.use_vllm


def test_a_setting_the_runner_cannot_apply_is_refused_not_silently_dropped():
    with pytest.raises(BadInput, match="trainer.vllm_sleep_level=1: the runner measures one TRL process"):
        to_job(_compose("trainer.vllm_sleep_level=1"))
    with pytest.raises(BadInput, match="trainer.offload_optimizer=True"):
        to_job(_compose("trainer.offload_optimizer=true"))
    assert to_job(_compose("trainer.torch_empty_cache_steps=2")).config.torch_empty_cache_steps == 2


@pytest.mark.slow
def test_ddp_ranks_run_under_torchs_launcher_and_hold_one_more_copy_of_the_gradients(tmp_path):
    """Two gloo ranks on CPU against one process, the same config: every phase of each rank holds the trainable
    parameters' fp32 gradients once more (DDP's buckets), measured, not estimated."""
    args = ("model=tiny-2M", "method=full", "trainer.dtype=float32", "probe=tensors", "run.weights=random")
    for n in (1, 2):
        (tmp_path / f"n{n}").mkdir()
        proc = _sweep(tmp_path / f"n{n}", *args, f"trainer.num_gpus={n}")
        assert proc.returncode == 0, proc.stderr[-2000:]
    one, two = (records.load_rows(tmp_path / f"n{n}" / "res" / "t.jsonl")[0] for n in (1, 2))
    assert (one["status"], two["status"]) == ("ok", "ok")
    assert [r["rank"] for r in two["observed"]["ranks"]] == [0, 1]
    buckets = two["model"]["trainable_params"] * 4
    for phase, b in one["observed"]["phases"].items():
        assert 0 <= two["observed"]["phases"][phase] - b - buckets < 4096  # + DDP's few small index tensors


def test_several_gpus_run_as_ddp_ranks_only():
    with pytest.raises(BadInput, match="trainer.num_gpus=2 with trainer.sharding=fsdp"):
        to_job(_compose("trainer.num_gpus=2", "trainer.sharding=fsdp"))
    with pytest.raises(BadInput, match=r"sweep.gpus=\[0\]: trainer.num_gpus=2"):
        to_job(_compose("trainer.num_gpus=2", "sweep.gpus=[0]"))
    with pytest.raises(BadInput, match="probe history with trainer.num_gpus=2"):
        to_job(_compose("trainer.num_gpus=2", "probe=history"))
    assert to_job(_compose("trainer.num_gpus=2")).config.num_gpus == 2


@pytest.mark.parametrize("experiment,model", [("ddp", "qwen2.5-1.5b"), ("ddp-cpu", "tiny-2M")])
def test_the_ddp_experiments_compose_to_two_ranks(experiment, model):
    job = to_job(_compose(f"+experiment={experiment}", f"model={model}", "method=full"))
    assert (job.config.num_gpus, job.config.sharding, job.sweep) == (2, "none", experiment)
