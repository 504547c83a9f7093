"""What the installed TRL, transformers and accelerate do with settings and files the estimate reads, against what
the estimator assumes: the default optimizer, the dtype of a model given `torch_dtype`, the logits' dtype under
DeepSpeed, a DeepSpeed config named by TrainingArguments, an accelerate config carrying DeepSpeed's keys. The
oracles are the libraries themselves (a tiny model loaded through TRL, the dataclass default, the Accelerator's
decisions, accelerate's own config reader)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re

import pytest
import torch
import yaml

from estimator.interface import cli
from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.settings.trl_versions import NEWEST, profile
from estimator.terms import logprob_head

trl = pytest.importorskip("trl")


def test_newest_release_default_optimizer_is_the_installed_transformers_default():
    """transformers picks adamw_torch_fused with torch >= 2.8 (the modelled torch), adamw_torch before."""
    from transformers import TrainingArguments
    from transformers import training_args as ta

    default = next(f for f in dataclasses.fields(TrainingArguments) if f.name == "optim").default
    assert torch.__version__ >= "2.8"
    assert str(getattr(default, "value", default)) == profile(f"{NEWEST[0]}.{NEWEST[1]}").defaults.optim
    # before torch 2.8 it is adamw_torch, which the table gives the releases of that time (0.14-0.21)
    src = inspect.getsource(ta)
    assert re.search(r'default_optim = "adamw_torch"\n', src), "transformers changed how it picks the default"


def _tiny_model_dir(tmp_path):
    """The tracer tests' tiny Qwen2, saved in bf16 (so a load in float32 is TRL's choice, not the checkpoint's)."""
    from tiny_configs import TINY_QWEN2
    from transformers import Qwen2Config, Qwen2ForCausalLM

    d = tmp_path / "tiny"
    Qwen2ForCausalLM(Qwen2Config.from_dict(TINY_QWEN2)).to(torch.bfloat16).save_pretrained(d)
    return d


def test_torch_dtype_is_not_read_by_the_newest_trl(tmp_path, capsys):
    """TRL 1.16 loads a model given `torch_dtype: bfloat16` (in model_init_kwargs, or top-level through its grpo
    script) in float32; the estimate says so and sizes float32."""
    from trl.scripts.grpo import make_parser
    from trl.trainer.utils import create_model_from_path

    d = _tiny_model_dir(tmp_path)
    loaded = next(create_model_from_path(str(d), torch_dtype="bfloat16").parameters()).dtype
    recipe = tmp_path / "recipe.yaml"
    # use_cpu, bf16 off: TrainingArguments refuses bf16 without a GPU
    recipe.write_text(
        yaml.safe_dump(
            {"model_name_or_path": str(d), "torch_dtype": "bfloat16", "use_cpu": True, "bf16": False}
        )
    )
    *_, model_args, _ = make_parser().parse_args_and_config(
        ["--config", str(recipe), "--output_dir", str(tmp_path / "o")], fail_with_unknown_args=False
    )
    assert loaded == torch.float32 and model_args.dtype == "float32"

    code = cli.main(["--config", str(recipe), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["config"]["dtype"] == str(loaded).removeprefix("torch.")
    assert "does not read torch_dtype" in err


def test_logits_stay_in_the_compute_dtype_under_deepspeed():
    """accelerate wraps the forward in autocast + convert_outputs_to_fp32 (fp32 logits) only where `native_amp`
    is set, which its bf16 branch leaves off for DeepSpeed (the engine runs the module it cast to bf16)."""
    from accelerate import Accelerator

    src = inspect.getsource(Accelerator.__init__)
    branch = re.search(
        r'elif self\.state\.mixed_precision == "bf16" and self\.distributed_type not in \((.*?)\)', src, re.S
    )
    assert branch and "DistributedType.DEEPSPEED" in branch.group(1)
    prepare = inspect.getsource(Accelerator.prepare_model)
    assert "if self.native_amp:" in prepare and "convert_outputs_to_fp32" in prepare

    arch = resolve_model("Qwen/Qwen2.5-1.5B-Instruct")
    assert arch is not None
    ddp = RunConfig(trl_version="0.18", bf16=True, num_gpus=2, logprob_head="selective")
    zero = ddp.with_(sharding="zero3", dtype="bfloat16")
    assert logprob_head.logits_bytes(ddp) == 4  # convert_outputs_to_fp32
    assert logprob_head.logits_bytes(zero) == 2  # the bf16 module's own output


def test_a_deepspeed_config_named_by_training_args_makes_the_run_deepspeed(tmp_path, capsys, monkeypatch):
    """`accelerate launch --num_processes 4 train.py --deepspeed ds.json`: transformers turns `deepspeed` into a
    DeepSpeedPlugin and the Accelerator given one switches itself to DeepSpeed, so the run is ZeRO over the
    launcher's processes (not DDP, as the accelerate options alone would say)."""
    from accelerate import Accelerator
    from transformers import training_args as ta

    assert re.search(r"if self\.deepspeed:.*?DeepSpeedPlugin\(hf_ds_config=", inspect.getsource(ta), re.S)
    init = inspect.getsource(Accelerator.__init__)
    assert re.search(
        r'if deepspeed_plugins is not None:\s*\n\s*os\.environ\["ACCELERATE_USE_DEEPSPEED"\] = "true"', init
    )

    (tmp_path / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}})
    )
    monkeypatch.chdir(tmp_path)
    command = "accelerate launch --num_processes 4 train.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --deepspeed ds.json"
    code = cli.main(["--from-command", command, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    config = json.loads(out)["config"]
    assert (config["sharding"], config["num_gpus"]) == ("zero3", 4)


def test_an_accelerate_config_with_deepspeed_keys_at_its_top_is_refused_as_accelerate_refuses_it(
    tmp_path, capsys
):
    from accelerate.commands.config.config_args import ClusterConfig

    path = tmp_path / "acc.json"
    path.write_text(
        json.dumps({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 4,
                    "zero_optimization": {"stage": 3}})
    )  # fmt: skip
    with pytest.raises(ValueError, match="unknown keys"):
        ClusterConfig.from_json_file(str(path))
    code = cli.main(["--config", str(path)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "acc.json" in err and "zero_optimization" in err
