"""--config: TRL GRPOConfig YAML/JSON -> RunConfig field values."""

from __future__ import annotations

import json

import pytest

from estimator.interface.configfile import ConfigFileError, read_config_file

YAML = """\
model_name_or_path: Qwen/Qwen3-8B
model_init_kwargs:
  dtype: torch.bfloat16
  device_map: auto
use_peft: true
lora_r: 32
lora_target_modules: [q_proj, v_proj]
num_generations: 16
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
max_completion_length: 1024
beta: 0.04
learning_rate: 1.0e-6
report_to: none
"""


def test_yaml_keys_map_to_runconfig(tmp_path):
    p = tmp_path / "grpo.yaml"
    p.write_text(YAML)
    s = read_config_file(str(p))
    assert s.values == {
        "model": "Qwen/Qwen3-8B",
        "dtype": "bfloat16",
        "use_peft": True,
        "lora_r": 32,
        "lora_target_modules": ("q_proj", "v_proj"),
        "num_generations": 16,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "max_completion_length": 1024,
        "beta": 0.04,
    }
    assert len(s.notes) == 1
    for key in ("model_init_kwargs.device_map", "learning_rate", "report_to"):
        assert key in s.notes[0]


def test_json_and_use_cpu_and_fsdp(tmp_path):
    p = tmp_path / "grpo.json"
    p.write_text(json.dumps({"use_cpu": True, "fsdp": "full_shard auto_wrap", "torch_dtype": "bf16"}))
    assert read_config_file(str(p)).values == {"device": "cpu", "sharding": "fsdp", "dtype": "bfloat16"}


@pytest.mark.parametrize(
    "text, needle",
    [
        ("num_generations: eight\n", "num_generations must be an integer"),
        ("use_peft: 1\n", "use_peft must be true or false"),
        ("beta: true\n", "beta must be a number"),
        ("lora_target_modules: [1, 2]\n", "lora_target_modules must be a string or a list of strings"),
        ("model_init_kwargs: bf16\n", "model_init_kwargs must be a mapping"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "not valid YAML/JSON"),
    ],
)
def test_bad_files_are_one_line(tmp_path, text, needle):
    p = tmp_path / "grpo.yaml"
    p.write_text(text)
    with pytest.raises(ConfigFileError) as e:
        read_config_file(str(p))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigFileError):
        read_config_file(str(tmp_path / "nope.yaml"))


def test_generation_kwargs_use_cache_is_read_and_its_other_keys_named(tmp_path):
    p = tmp_path / "grpo.yaml"
    p.write_text("generation_kwargs:\n  use_cache: false\n  temperature: 0.7\n")
    s = read_config_file(str(p))
    assert s.values == {"generation_use_cache": False}
    assert "generation_kwargs.temperature" in s.notes[0]
    p.write_text("generation_kwargs:\n  use_cache: maybe\n")
    with pytest.raises(ConfigFileError, match="use_cache"):
        read_config_file(str(p))
