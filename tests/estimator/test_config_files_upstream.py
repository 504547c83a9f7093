"""A TRL user's own files, read as accelerate / transformers / TRL read them, give the same estimate as
the same run given as flags. Upstream files are verbatim copies (tests/data/config_files/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_json import estimate, run

DATA = Path(__file__).resolve().parents[1] / "data" / "config_files"
TRL = DATA / "trl"


def same_estimate(a: dict, b: dict) -> None:
    assert a["peak_allocated_bytes"] == b["peak_allocated_bytes"]
    assert a["phase_totals"] == b["phase_totals"]
    assert a["config"] == b["config"]


def write(tmp_path, name, text) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


Z3_OFFLOAD = {
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    "bf16": {"enabled": True},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}
# what `accelerate config` writes for DeepSpeed with a config file: no mixed_precision key
# (accelerate/commands/config/cluster.py: mixed_precision = None; BaseConfig.to_dict drops None)
ACCEL_DS_FILE = """compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  deepspeed_config_file: z3.json
  zero3_init_flag: true
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def test_accelerate_deepspeed_file_keeps_bf16(tmp_path, capsys, monkeypatch):
    """An accelerate DeepSpeed YAML without mixed_precision keeps bf16 on: the same 15.58 GiB as the flags."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "z3.json", json.dumps(Z3_OFFLOAD))
    write(tmp_path, "acc.yaml", ACCEL_DS_FILE)
    files = estimate(["--model", "7B", "--config", "acc.yaml"], capsys)
    flags = estimate(["--model", "7B", "--gpus", "4", "--zero", "3", "--offload-optimizer"], capsys)
    same_estimate(files, flags)
    assert files["config"]["bf16"] is True
    assert files["settings_from"]["bf16"] == "z3.json bf16.enabled"
    assert files["settings_from"]["num_gpus"] == "acc.yaml num_processes"


def test_mixed_precision_null_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "z3.json", json.dumps(Z3_OFFLOAD))
    write(tmp_path, "acc.yaml", ACCEL_DS_FILE + "mixed_precision: null\n")
    files = estimate(["--model", "7B", "--config", "acc.yaml"], capsys)
    flags = estimate(["--model", "7B", "--gpus", "4", "--zero", "3", "--offload-optimizer"], capsys)
    same_estimate(files, flags)


def test_deepspeed_file_beside_mixed_precision_is_refused_as_accelerate_does(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "z3.json", json.dumps(Z3_OFFLOAD))
    write(tmp_path, "acc.yaml", ACCEL_DS_FILE + "mixed_precision: bf16\n")
    code, out, err = run(["--model", "7B", "--config", "acc.yaml"], capsys)
    assert (
        code == 2
        and out == ""
        and err.count("\n") == 1
        and "mixed_precision beside deepspeed_config_file" in err
    )


def test_deepspeed_json_bf16_false_against_trl_true_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "z3.json", json.dumps({**Z3_OFFLOAD, "bf16": {"enabled": False}}))
    write(tmp_path, "grpo.yaml", "bf16: true\n")
    code, _, err = run(
        ["--model", "7B", "--gpus", "4", "--config", "z3.json", "--config", "grpo.yaml"], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "mismatch" in err and "bf16" in err


def test_deepspeed_json_file_from_the_yaml_directory(tmp_path, capsys, monkeypatch):
    """deepspeed_config_file relative to the YAML when the working directory has no such file (with a note)."""
    sub = tmp_path / "cfg"
    sub.mkdir()
    write(sub, "z3.json", json.dumps(Z3_OFFLOAD))
    write(sub, "acc.yaml", ACCEL_DS_FILE)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["--model", "7B", "--config", "cfg/acc.yaml", "--json"], capsys)
    assert code == 0 and "beside the YAML" in err
    assert json.loads(out)["config"]["sharding"] == "zero3"


# ---- every file of TRL's examples/accelerate_configs, against the same run as flags

TRL_AS_FLAGS = {
    "deepspeed_zero2.yaml": ["--gpus", "8", "--zero", "2", "--no-offload-optimizer", "--no-offload-param"],
    "deepspeed_zero3.yaml": ["--gpus", "8", "--zero", "3", "--no-offload-optimizer", "--no-offload-param"],
    "fsdp1.yaml": ["--gpus", "8", "--fsdp", "--fsdp-sharding-strategy", "FULL_SHARD", "--no-offload-param"],
    "fsdp2.yaml": ["--gpus", "8", "--fsdp", "--fsdp-sharding-strategy", "FULL_SHARD", "--no-offload-param"],
    "multi_gpu.yaml": ["--gpus", "8", "--sharding", "none"],
    "single_gpu.yaml": ["--gpus", "1", "--sharding", "none"],
    "single_gpu_ef209e3.yaml": ["--gpus", "1", "--sharding", "none"],  # distributed_type NO, num_processes 8
}


@pytest.mark.parametrize("name", sorted(TRL_AS_FLAGS))
def test_trl_accelerate_configs_equal_flags(name, capsys):
    files = estimate(["--model", "1.5B", "--config", str(TRL / name)], capsys)
    flags = estimate(["--model", "1.5B", *TRL_AS_FLAGS[name]], capsys)
    same_estimate(files, flags)


def test_single_gpu_with_num_processes_8_is_one_process(capsys):
    code, out, err = run(
        ["--model", "1.5B", "--config", str(TRL / "single_gpu_ef209e3.yaml"), "--json"], capsys
    )
    assert code == 0 and json.loads(out)["config"]["num_gpus"] == 1
    assert "distributed_type NO runs one process" in err


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("deepspeed_zero1.yaml", "zero_stage 1"),
        ("alst_ulysses_4gpu.yaml", "parallelism_config_sp_size 2"),
        ("context_parallel_2gpu.yaml", "parallelism_config_cp_size 2"),
    ],
)
def test_trl_accelerate_configs_not_modelled_are_one_line(name, needle, capsys):
    code, out, err = run(["--model", "1.5B", "--config", str(TRL / name)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


# ---- `accelerate config` output shapes

SHAPES = {
    "deepspeed_inline": (
        "compute_environment: LOCAL_MACHINE\ndeepspeed_config:\n  offload_optimizer_device: cpu\n"
        "  offload_param_device: cpu\n  zero3_init_flag: true\n  zero_stage: 3\ndistributed_type: DEEPSPEED\n"
        "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 2\nuse_cpu: false\n",
        ["--gpus", "2", "--zero", "3", "--offload-optimizer", "--offload-param"],
    ),
    "fsdp": (
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: false\n"
        "  fsdp_reshard_after_forward: false\n  fsdp_version: 2\nmixed_precision: 'no'\nnum_processes: 4\n",
        ["--gpus", "4", "--fsdp", "--fsdp-sharding-strategy", "SHARD_GRAD_OP"],
    ),
    "multi_gpu": (
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\ngpu_ids: all\nmixed_precision: fp16\n"
        "num_machines: 1\nnum_processes: 2\n",
        ["--gpus", "2"],
    ),
    "no": (
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: 'no'\nnum_processes: 1\n",
        [],
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_accelerate_config_shapes_equal_flags(shape, tmp_path, capsys):
    """mixed_precision 'no' / fp16 leaves GRPOConfig's bf16 (TRL's default true) in charge, as TrainingArguments
    does; so every shape is the flags' run with bf16 on."""
    text, flags = SHAPES[shape]
    path = write(tmp_path, f"{shape}.yaml", text)
    same_estimate(
        estimate(["--model", "1.5B", "--config", path], capsys), estimate(["--model", "1.5B", *flags], capsys)
    )


def test_accelerate_mixed_precision_applies_when_grpo_bf16_is_false(tmp_path, capsys):
    acc = write(tmp_path, "acc.yaml", SHAPES["multi_gpu"][0].replace("fp16", "bf16"))
    grpo = write(tmp_path, "grpo.yaml", "bf16: false\n")
    code, out, err = run(["--model", "1.5B", "--config", acc, "--config", grpo, "--json"], capsys)
    assert code == 0 and json.loads(out)["config"]["bf16"] is True and "mixed_precision bf16 applies" in err


def test_accelerate_without_num_processes_needs_gpus(tmp_path, capsys):
    acc = write(tmp_path, "acc.yaml", "distributed_type: MULTI_GPU\nmixed_precision: bf16\n")
    code, _, err = run(["--model", "1.5B", "--config", acc], capsys)
    assert code == 2 and "no num_processes" in err and err.count("\n") == 1
    assert estimate(["--model", "1.5B", "--config", acc, "--gpus", "2"], capsys)["config"]["num_gpus"] == 2


def test_open_r1_recipe_with_its_accelerate_config(capsys):
    files = estimate(
        [
            "--config",
            str(DATA / "open-r1" / "config_demo.yaml"),
            "--config",
            str(DATA / "open-r1" / "zero3.yaml"),
        ],
        capsys,
    )
    flags = estimate(
        [
            *("--model", "Qwen/Qwen2.5-1.5B-Instruct", "--dtype", "bfloat16", "--attn-implementation"),
            *("flash_attention_2", "--bf16", "--use-vllm", "--gradient-accumulation-steps", "4"),
            *("--gradient-checkpointing", "--max-prompt-length", "512", "--max-completion-length", "1024"),
            *("--num-generations", "16", "--per-device-train-batch-size", "16", "--gpus", "8", "--zero", "3"),
            *("--no-offload-optimizer", "--no-offload-param"),
            *("--trl-version", "0.18"),  # the TRL open-r1 installs (setup.py: trl[vllm]==0.18.0)
        ],
        capsys,
    )
    same_estimate(files, flags)
