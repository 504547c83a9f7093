"""`vram-estimate --from-command "<launch command>"` and `vram-estimate -- <command>`."""

from __future__ import annotations

import json

import pytest
from cli_json import estimate, run

Z3 = """compute_environment: LOCAL_MACHINE
deepspeed_config:
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero_stage: 3
distributed_type: DEEPSPEED
mixed_precision: bf16
num_processes: 8
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zero3.yaml").write_text(Z3)
    (tmp_path / "grpo.yaml").write_text(
        "num_generations: 8\nmax_completion_length: 1024\nlearning_rate: 1.0e-6\n"
    )
    return tmp_path


FLAGS = [
    *(
        "--model",
        "Qwen/Qwen2.5-7B-Instruct",
        "--per-device-train-batch-size",
        "4",
        "--gpus",
        "8",
        "--zero",
        "3",
    ),
    *(
        "--no-offload-optimizer",
        "--no-offload-param",
        "--num-generations",
        "8",
        "--max-completion-length",
        "1024",
    ),
]
ARGS = "--config grpo.yaml --model_name_or_path Qwen/Qwen2.5-7B-Instruct --per_device_train_batch_size 4"


@pytest.mark.parametrize(
    "command",
    [
        f"accelerate launch --config_file zero3.yaml trl grpo {ARGS}",
        f"accelerate launch --config-file=zero3.yaml -m trl.scripts.grpo {ARGS}",
        f"trl grpo {ARGS} --accelerate_config zero3.yaml",
        f"CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 accelerate launch --config_file zero3.yaml trl/scripts/grpo.py {ARGS}",
    ],
)
def test_accelerate_commands_equal_flags(files, capsys, command):
    got = estimate(["--from-command", command], capsys)
    want = estimate(FLAGS, capsys)
    assert got["peak_allocated_bytes"] == want["peak_allocated_bytes"]
    assert got["phase_totals"] == want["phase_totals"] and got["config"] == want["config"]
    assert got["settings_from"]["per_device_train_batch_size"] == "command --per_device_train_batch_size"


def test_double_dash_form(files, capsys):
    code, out, err = run(
        ["--json", "--", *f"accelerate launch --config_file zero3.yaml trl grpo {ARGS}".split()], capsys
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["config"]["num_gpus"] == 8 and got["config"]["sharding"] == "zero3"


def test_launch_options_override_the_yaml(files, capsys):
    d = estimate(
        ["--from-command", f"accelerate launch --config_file zero3.yaml --num_processes 4 trl grpo {ARGS}"],
        capsys,
    )
    assert d["config"]["num_gpus"] == 4


@pytest.mark.parametrize(
    ("command", "gpus"),
    [
        (f"torchrun --nproc_per_node 4 -m trl.scripts.grpo {ARGS}", 4),
        (f"torchrun --nproc-per-node=2 --nnodes 2 trl/scripts/grpo.py {ARGS}", 4),
        (f"python -m trl.scripts.grpo {ARGS}", 1),
        (f"python3 -u trl/scripts/grpo.py {ARGS}", 1),
        (f"deepspeed --num_gpus 2 trl/scripts/grpo.py {ARGS}", 2),
        # DeepSpeed's NODE_SPEC (launcher/runner.py parse_resource_filter): NAME:SLOT,SLOT, hosts joined by @
        (f"deepspeed --include localhost:2,3 trl/scripts/grpo.py {ARGS}", 2),
        (f"deepspeed --include a:0,1,2@b:0 trl/scripts/grpo.py {ARGS}", 4),
        (f"deepspeed --include localhost:0,0@localhost:0 trl/scripts/grpo.py {ARGS}", 1),  # a set per host
        (f"deepspeed -i localhost:2,3 trl/scripts/grpo.py {ARGS}", 2),
        (f"deepspeed --num_accelerators 2 trl/scripts/grpo.py {ARGS}", 2),
        # the runner turns CUDA_VISIBLE_DEVICES into --include localhost:<those ids>
        (f"CUDA_VISIBLE_DEVICES=0,1,2 deepspeed trl/scripts/grpo.py {ARGS}", 3),
        # accelerate sets CUDA_VISIBLE_DEVICES from --gpu_ids itself
        (
            f"CUDA_VISIBLE_DEVICES=0 accelerate launch --num_processes 2 --gpu_ids 0,1 trl/scripts/grpo.py {ARGS}",
            2,
        ),
    ],
)
def test_other_launchers(files, capsys, command, gpus):
    d = estimate(["--from-command", command + " --num_generations 4"], capsys)
    assert d["config"]["num_gpus"] == gpus and d["config"]["per_device_train_batch_size"] == 4


def test_script_arguments_hf_style(files, capsys):
    d = estimate(
        [
            "--from-command",
            "python -m trl.scripts.grpo --model_name_or_path 0.5B --use_peft --lora_r 8 --lora_target_modules q_proj "
            "v_proj --gradient_checkpointing false --no_bf16 --num_generations 4 --per_device_train_batch_size 4 "
            '--model_init_kwargs \'{"dtype": "bfloat16"}\' --output_dir out --report_to none',
        ],
        capsys,
    )
    c = d["config"]
    assert (c["use_peft"], c["lora_r"], c["lora_target_modules"]) == (True, 8, ["q_proj", "v_proj"])
    assert (c["gradient_checkpointing"], c["bf16"], c["dtype"]) == (False, False, "bfloat16")


def test_trl_args_override_the_trl_file_and_flags_override_both(files, capsys):
    cmd = "python -m trl.scripts.grpo --config grpo.yaml --model_name_or_path 0.5B --num_generations 4"
    assert estimate(["--from-command", cmd], capsys)["config"]["num_generations"] == 4
    assert estimate(["--from-command", cmd, "--gens", "2"], capsys)["config"]["num_generations"] == 2


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        ("accelerate launch --config_file nope.yaml trl grpo", "nope.yaml"),
        ("accelerate launch --num_proceses 2 trl grpo", "did you mean --num_processes"),
        (
            "torchrun --nproc_per_node gpu trl/scripts/grpo.py",
            "--nproc_per_node gpu: one process per visible GPU",
        ),
        ("torchrun --nproc_per_node two trl/scripts/grpo.py", "--nproc_per_node 'two'"),
        # each process takes the GPU of its local rank: more processes than visible GPUs cannot start
        ("CUDA_VISIBLE_DEVICES=4,7 torchrun --nproc_per_node 4 trl/scripts/grpo.py", "local ranks 2 and up"),
        ("CUDA_VISIBLE_DEVICES=0 accelerate launch --num_processes 2 trl grpo", "shows 1 GPU(s)"),
        ("deepspeed --include localhost:0,1 --num_gpus 4 trl/scripts/grpo.py", "which DeepSpeed refuses"),
        ("deepspeed --include localhost:0-3 trl/scripts/grpo.py", "is not a GPU index"),
        ("bash run.sh", "not a launcher"),
        ("python -m trl.scripts.grpo --num_generation 4", "did you mean num_generations"),
        ("python -m trl.scripts.grpo --per_device_train_batch_size four", "must be an integer"),
        ("python -m trl.scripts.grpo --beta 1e400", "--beta '1e400': not a finite number"),
        # TRL's own documented command quotes each name and separates them with ", ": the comma stays in the word
        (
            'python -m trl.scripts.grpo --use_peft --lora_target_modules "q_proj", "v_proj"',
            "a name ends in a comma",
        ),
        ("accelerate launch 'unterminated", "shell quoting"),
        ("accelerate launch trl grpo --model_name_or_path 0.5B", "--num_processes"),
        ("", "names no command"),
    ],
)
def test_bad_commands_are_one_line(files, capsys, command, needle):
    code, out, err = run(["--from-command", command], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_nothing_after_double_dash(capsys):
    code, _, err = run(["--model", "0.5B", "--"], capsys)
    assert code == 2 and err.count("\n") == 1
