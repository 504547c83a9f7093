"""Keys of a user's files whose meaning upstream decides against their name: each file gives the estimate of the
run transformers / accelerate / TRL would start, checked against the same run given as flags."""

from __future__ import annotations

import pytest
from cli_json import estimate, run

FSDP = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_version: {version}
{extra}mixed_precision: bf16
num_machines: 1
num_processes: 4
"""


def write(tmp_path, name, text) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def fsdp_file(tmp_path, version: int, extra: str) -> str:
    return write(tmp_path, "acc.yaml", FSDP.format(version=version, extra=extra))


def strategy(got: dict) -> str:
    return got["config"].get("fsdp_sharding_strategy", "FULL_SHARD")  # the JSON leaves a default out


def notes(argv, capsys) -> str:
    code, _, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    return err


def flags_run(capsys, *more: str) -> dict:
    return estimate(["--model", "7B", "--gpus", "4", "--fsdp", *more], capsys)


def test_fsdp1_runs_its_sharding_strategy_not_reshard_after_forward(tmp_path, capsys):
    # accelerate launch exports FSDP_SHARDING_STRATEGY (default FULL_SHARD) and FSDP1 wraps with it
    # (accelerate 1.15 dataclasses.py FSDP1 branch; accelerator.py `sharding_strategy or reshard_after_forward`)
    path = fsdp_file(tmp_path, 1, "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n")
    got = estimate(["--model", "7B", "--config", path], capsys)
    assert strategy(got) == "FULL_SHARD"
    assert got["peak_allocated_bytes"] == flags_run(capsys)["peak_allocated_bytes"]
    err = notes(["--model", "7B", "--config", path], capsys)
    assert "fsdp_reshard_after_forward 'SHARD_GRAD_OP' is not read" in err
    both = fsdp_file(
        tmp_path, 1, "  fsdp_reshard_after_forward: FULL_SHARD\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
    )
    got = estimate(["--model", "7B", "--config", both], capsys)
    shard_grad_op = flags_run(capsys, "--fsdp-sharding-strategy", "SHARD_GRAD_OP")
    assert strategy(got) == "SHARD_GRAD_OP"
    assert got["peak_allocated_bytes"] == shard_grad_op["peak_allocated_bytes"]


def test_fsdp2_runs_reshard_after_forward_and_refuses_a_strategy_name_there(tmp_path, capsys):
    path = fsdp_file(tmp_path, 2, "  fsdp_sharding_strategy: NO_SHARD\n")
    got = estimate(["--model", "7B", "--config", path], capsys)
    assert got["config"]["sharding"] == "fsdp" and strategy(got) == "FULL_SHARD"
    off = fsdp_file(tmp_path, 2, "  fsdp_reshard_after_forward: false\n")
    assert strategy(estimate(["--model", "7B", "--config", off], capsys)) == "SHARD_GRAD_OP"
    named = fsdp_file(tmp_path, 2, "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n")
    code, out, err = run(["--model", "7B", "--config", named], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "fsdp_version 2" in err


def test_fsdp_activation_checkpointing_is_checkpointing_and_refused_beside_trls(tmp_path, capsys):
    acc = fsdp_file(tmp_path, 2, "  fsdp_activation_checkpointing: true\n")
    trl = write(tmp_path, "grpo.yaml", "gradient_checkpointing: false\n")
    got = estimate(["--model", "7B", "--config", acc, "--config", trl], capsys)
    assert got["config"]["gradient_checkpointing"] is True
    assert "fsdp_activation_checkpointing" in got["settings_from"]["gradient_checkpointing"]
    assert (
        got["peak_allocated_bytes"] == flags_run(capsys, "--gradient-checkpointing")["peak_allocated_bytes"]
    )
    # transformers' Trainer stops when FSDP's and the training argument's checkpointing are both on; TRL's
    # GRPOConfig turns the latter on by default
    code, out, err = run(["--model", "7B", "--config", acc], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "TRL's default" in err


@pytest.mark.parametrize(
    ("text", "checkpointing"),
    [
        ("activation_checkpointing: false\ngradient_checkpointing: true\n", False),  # the new name wins
        ("gradient_checkpointing: true\nactivation_checkpointing: null\n", True),  # unset: the alias decides
        ("activation_checkpointing: true\n", True),
        ("gradient_checkpointing_kwargs: {every_n_layers: 2}\n", False),  # some layers keep activations
        ("activation_checkpointing_kwargs: '{\"use_reentrant\": false}'\n", True),  # a JSON string is a dict
    ],
)
def test_activation_checkpointing_names(tmp_path, capsys, text, checkpointing):
    path = write(tmp_path, "grpo.yaml", text)
    got = estimate(["--model", "1.5B", "--config", path], capsys)
    flag = "--gradient-checkpointing" if checkpointing else "--no-gradient-checkpointing"
    assert got["config"]["gradient_checkpointing"] is checkpointing
    assert got["peak_allocated_bytes"] == estimate(["--model", "1.5B", flag], capsys)["peak_allocated_bytes"]


def test_trl_yaml_env_sets_the_allocator_and_wins_over_the_shell(tmp_path, capsys):
    # TrlParser writes `env:` into os.environ before the run starts
    path = write(
        tmp_path,
        "grpo.yaml",
        "env:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\n  WANDB_MODE: off\n",
    )
    got = estimate(["--model", "1.5B", "--config", path], capsys)
    flags = estimate(["--model", "1.5B", "--alloc-conf", "expandable_segments:True"], capsys)
    assert got["config"]["pytorch_cuda_alloc_conf"] == "expandable_segments:True"
    assert got["peak_reserved_bytes"] == flags["peak_reserved_bytes"]
    cmd = f"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 trl grpo --config {path}"
    got = estimate(["--model", "1.5B", "--gpus", "1", "--from-command", cmd], capsys)
    assert got["config"]["pytorch_cuda_alloc_conf"] == "expandable_segments:True"


@pytest.mark.parametrize(("vllm", "length"), [(False, 2048), (True, 768)])
def test_generation_kwargs_lengths_override_max_completion_length(tmp_path, capsys, vllm, length):
    # TRL 1.16 updates its generation dict with generation_kwargs: max_new_tokens on transformers' generate,
    # max_tokens on vLLM's SamplingParams
    text = "max_completion_length: 512\ngeneration_kwargs:\n  max_new_tokens: 2048\n  max_tokens: 768\n"
    path = write(tmp_path, "grpo.yaml", text + f"use_vllm: {str(vllm).lower()}\n")
    got = estimate(["--model", "0.5B", "--config", path], capsys)
    assert got["config"]["max_completion_length"] == length
    # a flag still decides
    flagged = estimate(["--model", "0.5B", "--config", path, "--max-completion-length", "100"], capsys)
    assert flagged["config"]["max_completion_length"] == 100


def test_quantization_config_in_model_init_kwargs_is_4bit(tmp_path, capsys):
    text = (
        "use_peft: true\nmodel_init_kwargs:\n  dtype: bfloat16\n  quantization_config:\n"
        "    load_in_4bit: true\n    bnb_4bit_quant_type: nf4\n    bnb_4bit_use_double_quant: true\n"
    )
    got = estimate(["--model", "7B", "--config", write(tmp_path, "grpo.yaml", text)], capsys)
    flags = estimate(["--model", "7B", "--qlora", "--dtype", "bfloat16", "--use-bnb-nested-quant"], capsys)
    assert got["peak_allocated_bytes"] == flags["peak_allocated_bytes"]


@pytest.mark.parametrize("text", ["lora_modules_to_save: [lm_head, embed_tokens]\n", "use_dora: true\n"])
def test_unmodelled_keys_that_add_memory_are_refused(tmp_path, capsys, text):
    path = write(tmp_path, "grpo.yaml", "use_peft: true\n" + text)
    code, out, err = run(["--model", "7B", "--config", path], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "not modelled" in err


def test_load_in_8bit_is_said_to_err_high(tmp_path, capsys):
    path = write(tmp_path, "grpo.yaml", "use_peft: true\nload_in_8bit: true\n")
    err = notes(["--model", "7B", "--config", path], capsys)
    assert "load_in_8bit (an 8-bit bitsandbytes base) is not modelled" in err and "errs high" in err
    assert "do not change the estimate: load_in_8bit" not in err


def test_zero_knobs_off_their_defaults_are_named_and_partial_offload_refused(tmp_path, capsys):
    import json

    zero = {
        "stage": 3,
        "overlap_comm": True,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e8,
    }
    path = write(tmp_path, "ds.json", json.dumps({"zero_optimization": zero}))
    err = notes(["--model", "7B", "--gpus", "8", "--config", path], capsys)
    assert "stage3_max_reuse_distance 100000000.0 (estimated at 1e9)" in err
    assert "stage3_max_live_parameters" not in err  # DeepSpeed's default: nothing to say
    zero["offload_optimizer"] = {"device": "cpu", "ratio": 0.3}
    path = write(tmp_path, "ds.json", json.dumps({"zero_optimization": zero}))
    code, out, err = run(["--model", "7B", "--gpus", "8", "--config", path], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "ratio 0.3" in err


def test_training_arguments_fsdp_config_wins_over_the_fsdp_words(tmp_path, capsys):
    # transformers 5.24 _apply_legacy_fsdp_to_config: the words only setdefault into fsdp_config
    text = 'fsdp: "full_shard auto_wrap"\nfsdp_config:\n  fsdp_reshard_after_forward: false\n  cpu_offload: true\n'
    got = estimate(["--model", "7B", "--gpus", "4", "--config", write(tmp_path, "grpo.yaml", text)], capsys)
    flags = flags_run(capsys, "--fsdp-sharding-strategy", "SHARD_GRAD_OP", "--offload-param")
    assert strategy(got) == "SHARD_GRAD_OP" and got["config"]["offload_param"] is True
    assert got["peak_allocated_bytes"] == flags["peak_allocated_bytes"]


def test_training_arguments_fsdp_config_from_a_json_path_with_fsdp_checkpointing(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "fsdp.json", '{"fsdp_activation_checkpointing": true}')
    path = write(tmp_path, "grpo.yaml", "fsdp: true\nfsdp_config: fsdp.json\ngradient_checkpointing: false\n")
    got = estimate(["--model", "7B", "--gpus", "4", "--config", path], capsys)
    assert got["config"]["gradient_checkpointing"] is True
    assert got["peak_allocated_bytes"] == flags_run(capsys)["peak_allocated_bytes"]
    # without gradient_checkpointing: false the Trainer stops (TRL turns it on by default)
    path = write(tmp_path, "grpo.yaml", "fsdp: true\nfsdp_config: fsdp.json\n")
    code, out, err = run(["--model", "7B", "--gpus", "4", "--config", path], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "both are on" in err


def test_deepspeed_given_as_a_mapping_in_the_trl_config(tmp_path, capsys):
    text = "deepspeed:\n  zero_optimization:\n    stage: 3\n    offload_optimizer: {device: cpu}\n"
    got = estimate(["--model", "7B", "--gpus", "4", "--config", write(tmp_path, "grpo.yaml", text)], capsys)
    flags = estimate(["--model", "7B", "--gpus", "4", "--zero", "3", "--offload-optimizer"], capsys)
    assert got["peak_allocated_bytes"] == flags["peak_allocated_bytes"]


def test_deepspeed_micro_batch_alone_says_the_trl_side_must_match(tmp_path, capsys):
    # HF's fill_match compares it with TrainingArguments' value, TRL's default 8 when unset
    path = write(
        tmp_path, "ds.json", '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}'
    )
    err = notes(["--model", "0.5B", "--gpus", "4", "--gens", "4", "--config", path], capsys)
    assert "per_device_train_batch_size must be 1 too (TRL's default is 8" in err


def test_trl_grpo_hands_a_configs_launch_keys_to_accelerate(tmp_path, capsys, monkeypatch):
    # trl 1.16 TrlParser.set_defaults_with_config returns the keys its parser does not consume, and `trl grpo`
    # passes them to accelerate launch (accelerate_config becomes --config_file)
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path,
        "z3.yaml",
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\nnum_processes: 8\n",
    )
    path = write(tmp_path, "grpo.yaml", "accelerate_config: z3.yaml\nnum_processes: 4\n")
    flags = estimate(["--model", "7B", "--gpus", "4", "--zero", "3"], capsys)
    got = estimate(["--model", "7B", "--config", path], capsys)
    assert got["config"]["num_gpus"] == 4 and got["config"]["sharding"] == "zero3"
    assert got["peak_allocated_bytes"] == flags["peak_allocated_bytes"]
    # on the command line the options after the file's win, as accelerate's argparse takes the last
    got = estimate(["--model", "7B", "--from-command", f"trl grpo --config {path} --num_processes 2"], capsys)
    assert got["config"]["num_gpus"] == 2


def test_accelerate_launch_without_a_config_or_count_asks_for_gpus(capsys):
    code, out, err = run(["--from-command", "trl grpo --beta 0.1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "one process per visible GPU" in err and "--gpus N" in err


@pytest.mark.parametrize(
    ("command", "gpus"),
    [
        ("nohup uv run accelerate launch --num_processes 2 train.py --beta 0.0 > log.txt 2>&1 &", 2),
        ("poetry run torchrun --nproc_per_node 4 train.py | tee log", 4),
        # torch.distributed.run's `gpu` and accelerate launch without a config: torch.cuda.device_count(), which
        # CUDA_VISIBLE_DEVICES sets
        ("CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --nproc_per_node=gpu train.py", 4),
        ("CUDA_VISIBLE_DEVICES=2,3 trl grpo --beta 0.1", 2),
    ],
)
def test_launch_wrappers_shell_tails_and_visible_gpus(capsys, command, gpus):
    got = estimate(["--model", "0.5B", "--gens", "4", "--from-command", command], capsys)
    assert got["config"].get("num_gpus", 1) == gpus


def test_torchrun_on_every_gpu_without_a_count_asks_for_gpus_and_takes_them(capsys):
    code, _, err = run(["--model", "0.5B", "--from-command", "torchrun --nproc_per_node gpu x.py"], capsys)
    assert code == 2 and "CUDA_VISIBLE_DEVICES" in err and "--gpus N" in err
    got = estimate(
        [
            "--model",
            "0.5B",
            "--gens",
            "3",
            "--gpus",
            "3",
            "--from-command",
            "torchrun --nproc_per_node gpu x.py",
        ],
        capsys,
    )
    assert got["config"]["num_gpus"] == 3


def test_trl_014_vllm_device_takes_its_utilization_and_loads_weights_in_place(tmp_path, capsys):
    # TRL 0.14: vLLM on a GPU of its own in the trainer's process; vllm_gpu_memory_utilization is that GPU's share,
    # and _move_model_to_vllm copies each parameter into vLLM's own (load_weights): no NCCL, no packed chunks
    text = "use_vllm: true\nvllm_device: auto\nvllm_gpu_memory_utilization: 0.5\n"
    path = write(tmp_path, "grpo.yaml", text)
    got = estimate(["--model", "0.5B", "--trl-version", "0.14", "--gpu", "A100-80", "--config", path], capsys)
    vllm = got["layout"]["vllm"]
    assert vllm["utilization"] == 0.5 and vllm["requested"] == -(
        -got["layout"]["groups"][1]["total_bytes"] // 2
    )
    assert "vllm_weight_push" not in got["phases"]["generate"]
    assert "GRPOConfig keys of earlier TRL releases (not 1.16's), not read: vllm_device" in notes(
        ["--model", "0.5B", "--trl-version", "0.14", "--config", path], capsys
    )
    server = estimate(["--model", "0.5B", "--use-vllm", "--vllm-mode", "server", "--gpu", "A100-80"], capsys)
    assert server["phases"]["generate"]["vllm_weight_push"] > 0  # TRL 1.16's packed NCCL push


def test_accelerate_launch_without_a_config_file_reads_the_machines_default(tmp_path, capsys, monkeypatch):
    # accelerate 1.15 launch.py: with no --config_file (and not --cpu) it loads
    # $HF_HOME/accelerate/default_config.yaml when that file exists; its options still win over it
    monkeypatch.undo()  # tests/conftest.py hides this machine's default; here it is a file of the test's own
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\nnum_processes: 4\n"
    )
    monkeypatch.setenv("HF_HOME", str(home))
    got = estimate(["--model", "7B", "--from-command", "accelerate launch train.py"], capsys)
    assert got["config"]["sharding"] == "zero3" and got["config"]["num_gpus"] == 4
    got = estimate(
        ["--model", "7B", "--from-command", "accelerate launch --num_processes 2 train.py"], capsys
    )
    assert got["config"]["num_gpus"] == 2
    err = notes(["--model", "7B", "--from-command", "accelerate launch train.py"], capsys)
    assert "reads this machine's default config" in err
    monkeypatch.setenv("HF_HOME", str(tmp_path / "none"))  # no default config: the count is asked for
    code, _, err = run(["--model", "7B", "--from-command", "accelerate launch train.py"], capsys)
    assert code == 2 and "one process per visible GPU" in err
