"""accelerate config YAML / DeepSpeed JSON readers: translated values and one-line errors."""

import json

import pytest

from estimator.interface.launchfile import LaunchFileError, read_launch_file

ACCEL_DS = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 2
  offload_optimizer_device: cpu
  offload_param_device: none
  gradient_accumulation_steps: 4
mixed_precision: bf16
num_machines: 1
num_processes: 8
"""

ACCEL_FSDP = """distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_reshard_after_forward: false
  fsdp_offload_params: true
mixed_precision: bf16
num_processes: 4
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_accelerate_deepspeed_zero2_offload(tmp_path):
    s = read_launch_file(_write(tmp_path, "ds.yaml", ACCEL_DS))
    assert s.values == {
        "num_gpus": 8,
        "bf16": True,
        "sharding": "zero2",
        "gradient_accumulation_steps": 4,
        "offload_optimizer": True,
        "offload_param": False,
    }


def test_accelerate_fsdp2_shard_grad_op_offload(tmp_path):
    s = read_launch_file(_write(tmp_path, "fsdp.yaml", ACCEL_FSDP))
    assert s.values == {
        "num_gpus": 4,
        "bf16": True,
        "sharding": "fsdp",
        "fsdp_sharding_strategy": "SHARD_GRAD_OP",
        "offload_param": True,
    }
    assert s.extra == {"fsdp_version": 2}


def test_fsdp1_numeric_strategy(tmp_path):
    text = "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 1\n"
    assert (
        read_launch_file(_write(tmp_path, "f1.yaml", text)).values["fsdp_sharding_strategy"] == "FULL_SHARD"
    )


def test_deepspeed_json_zero3_param_offload(tmp_path):
    ds = {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        },
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": "auto",
    }
    s = read_launch_file(_write(tmp_path, "ds.json", json.dumps(ds)))
    assert s.values == {
        "sharding": "zero3",
        "offload_optimizer": True,
        "offload_param": True,
        "per_device_train_batch_size": 4,
    }


def test_accelerate_points_at_a_deepspeed_json(tmp_path):
    _write(tmp_path, "z3.json", json.dumps({"zero_optimization": {"stage": 3}}))
    text = (
        "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: z3.json\n"
    )
    s = read_launch_file(_write(tmp_path, "a.yaml", text))
    assert s.values["sharding"] == "zero3" and s.values["num_gpus"] == 2


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("a.yaml", "distributed_type: TPU\n", "distributed_type 'TPU'"),
        ("b.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 1\n", "zero_stage 1"),
        (
            "c.json",
            '{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}',
            "needs stage 3",
        ),
        ("d.json", '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}', "nvme"),
        ("e.yaml", "distributed_type: FSDP\nnum_processes: 0\n", "num_processes must be"),
        ("f.yaml", "just: a mapping\n", "neither an accelerate config"),
        ("g.json", "{not json", "not valid YAML/JSON"),
        (
            "h.yaml",
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n",
            "HYBRID",
        ),
    ],
)
def test_bad_files_are_one_line(tmp_path, name, text, needle):
    with pytest.raises(LaunchFileError) as exc:
        read_launch_file(_write(tmp_path, name, text))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(LaunchFileError, match="No such file"):
        read_launch_file(str(tmp_path / "nope.yaml"))


def test_vram_estimate_reads_an_accelerate_config(tmp_path, capsys):
    """`vram-estimate --config accelerate.yaml` takes the spread from the file (the schema's --config path)."""
    from estimator.interface.cli import main

    path = _write(
        tmp_path, "fsdp.yaml", ACCEL_FSDP.replace("fsdp_offload_params: true", "fsdp_offload_params: false")
    )
    assert main(["--model", "1.5B", "--config", path, "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["num_gpus"], cfg["sharding"], cfg["fsdp_sharding_strategy"]) == (4, "fsdp", "SHARD_GRAD_OP")


def test_vram_estimate_config_error_is_one_line(tmp_path):
    from estimator.interface.configfile import ConfigFileError, read_config_file

    path = _write(tmp_path, "bad.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 7\n")
    with pytest.raises(ConfigFileError) as exc:
        read_config_file(path)
    assert str(exc.value).startswith("--config bad.yaml: deepspeed_config.zero_stage 7") and "\n" not in str(
        exc.value
    )


def _estimate_err(capsys, *argv) -> tuple[int, list[str]]:
    from estimator.interface import cli

    code = cli.main(["--model", "1.5B", *argv])
    return code, [line for line in capsys.readouterr().err.splitlines() if "note:" not in line]


@pytest.mark.parametrize(
    "ds, gpus, ok",
    [
        ({"train_batch_size": 16}, 2, True),  # 2 GPUs x micro-batch 8 (default) x GA 1 = 16
        ({"train_batch_size": 64}, 2, False),
        (
            {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3},
            2,
            True,
        ),
        (
            {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
            2,
            False,
        ),
        ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4}, 4, True),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, False),  # 4 x 4 x 1 = 16
    ],
)
def test_deepspeed_train_batch_size_must_be_gpus_times_micro_times_accumulation(
    tmp_path, capsys, ds, gpus, ok
):
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({**ds, "zero_optimization": {"stage": 2}}))
    code, err = _estimate_err(capsys, "--config", str(f), "--gpus", str(gpus))
    if ok:
        assert code == 0, err
    else:
        assert code == 2 and len(err) == 1
        assert f"train_batch_size {ds['train_batch_size']} is not {gpus} GPU(s)" in err[0]


def test_an_inner_deepspeed_file_error_names_the_yaml_that_points_at_it(tmp_path, capsys):
    (tmp_path / "inner.json").write_text(json.dumps({"zero_optimization": {"stage": 7}}))
    yaml_file = tmp_path / "acc.yaml"
    yaml_file.write_text(
        f"distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  deepspeed_config_file: {tmp_path / 'inner.json'}\n"
    )
    code, err = _estimate_err(capsys, "--config", str(yaml_file))
    assert code == 2 and len(err) == 1
    assert "acc.yaml: deepspeed_config_file inner.json: zero_optimization.stage 7" in err[0]
