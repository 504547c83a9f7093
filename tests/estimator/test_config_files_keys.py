"""Several --config files merged by kind; unknown keys are never silent; bad files are one line."""

from __future__ import annotations

import json
import os

import pytest

from estimator.interface import cli
from estimator.interface.configfile import ConfigFileError, read_config_file, suggestion


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, name, text) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_two_configs_of_different_kinds_both_apply(tmp_path, capsys):
    grpo = write(tmp_path, "grpo.yaml", "num_generations: 4\nper_device_train_batch_size: 4\n")
    acc = write(tmp_path, "acc.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    code, out, _ = run(["--model", "0.5B", "--config", grpo, "--config", acc, "--json"], capsys)
    d = json.loads(out)
    assert code == 0 and (d["config"]["num_generations"], d["config"]["num_gpus"]) == (4, 2)
    assert d["settings_from"] == {
        "num_gpus": "acc.yaml num_processes",
        "sharding": "acc.yaml distributed_type",
        "num_generations": "grpo.yaml num_generations",
        "per_device_train_batch_size": "grpo.yaml per_device_train_batch_size",
        "model": "flags",
    }
    code, out, _ = run(["--model", "0.5B", "--config", grpo, "--config", acc, "--detail"], capsys)
    assert "settings read from:\n  acc.yaml: num_gpus=2 (num_processes)" in out
    code, out, _ = run(["--model", "0.5B", "--config", grpo, "--config", acc], capsys)
    assert "settings from " in out and "acc.yaml" in out and "grpo.yaml" in out


def test_two_configs_of_one_kind_are_refused(tmp_path, capsys):
    """Before: the last --config silently replaced the first."""
    b = write(tmp_path, "B.yaml", "num_generations: 4\n")
    a = write(tmp_path, "A.yaml", "beta: 0.1\n")
    code, out, err = run(["--model", "0.5B", "--config", b, "--config", a], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "two TRL config" in err and "B.yaml" in err and "A.yaml" in err


def test_flags_override_files(tmp_path, capsys):
    acc = write(tmp_path, "acc.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    code, out, _ = run(["--model", "0.5B", "--config", acc, "--gpus", "4", "--json"], capsys)
    d = json.loads(out)
    assert d["config"]["num_gpus"] == 4 and d["settings_from"]["num_gpus"] == "flags"


def test_contradicting_files_are_refused(tmp_path, capsys):
    grpo = write(tmp_path, "grpo.yaml", "fsdp: full_shard auto_wrap\n")
    acc = write(
        tmp_path,
        "acc.yaml",
        "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n",
    )
    code, _, err = run(["--model", "0.5B", "--config", grpo, "--config", acc], capsys)
    assert code == 2 and err.count("\n") == 1 and "sharding" in err


@pytest.mark.parametrize(
    ("text", "typo", "suggested"),
    [
        ("num_generation: 4\n", "num_generation", "num_generations"),
        ("max_completion_lenght: 100\n", "max_completion_lenght", "max_completion_length"),
        ("per_device_train_batchsize: 2\n", "per_device_train_batchsize", "per_device_train_batch_size"),
        ("lerning_rate: 1.0e-6\n", "lerning_rate", "learning_rate"),
    ],
)
def test_a_near_miss_of_a_known_key_is_an_error(tmp_path, capsys, text, typo, suggested):
    """Before: listed as 'keys that do not change the estimate', exit 0."""
    code, out, err = run(["--model", "0.5B", "--config", write(tmp_path, "grpo.yaml", text)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"unknown key '{typo}'; did you mean {suggested}?" in err


def test_known_unknown_and_open_r1_keys_are_listed(tmp_path):
    s = read_config_file(
        write(
            tmp_path,
            "grpo.yaml",
            "learning_rate: 1.0e-6\nsystem_prompt: hi\nswift_template_xyz: qwen\nnum_generations: 4\n",
        )
    )
    # system_prompt is open-r1's, but other trainers' configs carry one too: it does not make a recipe
    assert s.values == {"num_generations": 4} and s.flavour == ""
    assert "known keys that do not change the estimate: learning_rate, system_prompt" in s.notes[0]
    assert "unknown keys" in s.notes[1] and "swift_template_xyz" in s.notes[1]


def test_accelerate_and_deepspeed_typos(tmp_path):
    with pytest.raises(ConfigFileError, match="did you mean num_processes"):
        read_config_file(write(tmp_path, "a.yaml", "distributed_type: MULTI_GPU\nnum_proceses: 2\n"))
    with pytest.raises(ConfigFileError, match="did you mean deepspeed_config.zero_stage"):
        read_config_file(
            write(tmp_path, "b.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stag: 3\n")
        )
    with pytest.raises(ConfigFileError, match="did you mean zero_optimization"):
        read_config_file(
            write(tmp_path, "c.json", '{"zero_optimisation": {"stage": 3}, "train_batch_size": 8}')
        )


def test_suggestion_is_not_too_eager():
    assert suggestion("seed", ["seeds", "beta"]) == "seeds"
    assert suggestion("dataset_xyz", ["beta", "num_generations"]) is None
    assert suggestion("ab", ["cd"]) is None


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda d: os.mkfifo(d / "fifo.yaml") or "fifo.yaml", "not a regular file"),
        (lambda d: (d / "dir.yaml").mkdir() or "dir.yaml", "not a regular file"),
        (
            lambda d: (d / "big.yaml").write_text("a: " + "x" * (2 << 20)) and "big.yaml",
            "larger than a config file",
        ),
        (
            lambda d: (d / "x.yaml").write_text("num_generation\u00e9: 3\n") and "x.yaml",
            "'num_generation\\xe9'",
        ),
    ],
)
def test_bad_files_are_one_line_never_a_hang(tmp_path, capsys, setup, needle):
    name = setup(tmp_path)
    code, out, err = run(["--config", str(tmp_path / name)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_long_values_are_truncated(tmp_path, capsys):
    code, _, err = run(["--config", write(tmp_path, "g.yaml", f"num_generations: {'9' * 500}x\n")], capsys)
    assert code == 2 and err.count("\n") == 1 and len(err) < 300


def test_trl_spelling_of_every_flag(capsys):
    """Before: 'unrecognized arguments: --per_device_train_batch_size 4'."""
    code, out, err = run(
        [
            *("--model_name_or_path", "0.5B", "--per_device_train_batch_size", "4", "--num_generations", "4"),
            *("--torch_dtype", "bfloat16", "--use_peft", "--lora_r", "8", "--lora_target_modules", "q_proj"),
            *("v_proj", "--gradient_checkpointing", "false", "--no_bf16", "--num_gpus", "1", "--json"),
        ],
        capsys,
    )
    assert code == 0, err
    c = json.loads(out)["config"]
    assert (c["model"], c["per_device_train_batch_size"], c["num_generations"], c["dtype"]) == (
        "0.5B",
        4,
        4,
        "bfloat16",
    )
    assert (c["use_peft"], c["lora_r"], c["lora_target_modules"]) == (True, 8, ["q_proj", "v_proj"])
    assert (c["gradient_checkpointing"], c["bf16"]) == (False, False)


def test_trl_spellings_come_from_the_schema():
    from estimator.interface.flags import trl_spellings
    from estimator.settings.config import schema

    parser = cli.build_parser()
    for f in schema():
        for name in trl_spellings(f):
            assert parser._option_string_actions[name].dest == f.name, name
    assert "--per_device_train_batch_size" in parser._option_string_actions
    assert "--model_name_or_path" in parser._option_string_actions


def test_bad_trl_bool_value_is_one_line(capsys):
    code, _, err = run(["--use_peft", "maybe"], capsys)
    assert code == 2 and err.count("\n") == 1 and "true or false" in err


def test_a_bad_value_from_a_file_is_named_by_its_file_and_key(tmp_path, capsys):
    f = tmp_path / "grpo.yaml"
    f.write_text("num_generations: -3\n")
    assert cli.main(["--config", str(f)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "note:" not in ln]
    assert len(err) == 1 and "grpo.yaml num_generations -3: must be an integer >= 2" in err[0]
    assert "--num-generations" not in err[0]


def test_the_detail_report_titles_the_modelled_release(capsys):
    assert cli.main(["--trl-version", "0.14", "--detail"]) in (0, 1)
    assert "one GRPO step, TRL 0.14)" in " ".join(capsys.readouterr().out.split())


def test_a_key_only_open_r1_has_makes_a_recipe(tmp_path):
    s = read_config_file(write(tmp_path, "r.yaml", "dataset_prompt_column: problem\nnum_generations: 4\n"))
    assert s.flavour == "open-r1 recipe"
