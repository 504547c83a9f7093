"""DeepSpeed ZeRO-2/3 with CPU offload in the runner: the config dict each setting becomes (hand-written), what the
sweep accepts and refuses (deepspeed faked present / absent), the one-process distributed variables, the engine
step labelled as the optimizer phase, the zero-offload lineup, and one real run on DeepSpeed's CPU accelerator
where deepspeed is installed (skipped elsewhere)."""

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize

from estimator.settings.config import RunConfig
from sweeps.probes.phases import PhaseTracker
from sweeps.runner import deepspeed_config, grpo_setup, schema
from sweeps.runner.job import BadInput, to_job

REPO = Path(__file__).resolve().parents[2]
ZERO_YAML = REPO / "sweeps" / "runner" / "conf" / "experiment" / "zero-offload.yaml"
AUTO_BATCH = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
}
ADAMW = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
CPU_PINNED = {"device": "cpu", "pin_memory": True}


def test_no_zero_no_deepspeed_config():
    assert deepspeed_config.ds_config(RunConfig()) is None


def test_zero2_with_optimizer_offload():
    cfg = RunConfig(sharding="zero2", offload_optimizer=True)
    assert deepspeed_config.ds_config(cfg) == {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 2,
            "reduce_bucket_size": 500_000_000,  # DeepSpeed's default, as accelerate leaves it
            "offload_optimizer": CPU_PINNED,
        },
        "gradient_clipping": "auto",
        **AUTO_BATCH,
        "optimizer": ADAMW,
    }


def test_zero3_with_optimizer_and_parameter_offload():
    cfg = RunConfig(sharding="zero3", offload_optimizer=True, offload_param=True)
    assert deepspeed_config.ds_config(cfg) == {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 500_000_000,  # DeepSpeed's default, as accelerate leaves it
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "offload_optimizer": CPU_PINNED,
            "offload_param": CPU_PINNED,
        },
        "gradient_clipping": "auto",
        **AUTO_BATCH,
        "optimizer": ADAMW,
    }


def test_zero3_without_offload_leaves_the_optimizer_to_the_trainer():
    out = deepspeed_config.ds_config(RunConfig(sharding="zero3"))
    assert "optimizer" not in out
    assert out["zero_optimization"] == {
        "stage": 3,
        "reduce_bucket_size": 500_000_000,  # DeepSpeed's default, as accelerate leaves it
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    }


CUDA = {"device": "cuda"}


@pytest.mark.parametrize(
    "settings, fragment",
    [
        ({"sharding": "fsdp", **CUDA}, "trainer.sharding='fsdp': the runner measures one process"),
        ({"sharding": "zero2", "device": "cpu"}, "accepted only with device=cuda"),
        ({"sharding": "zero3", "load_in_4bit": True, **CUDA}, "accepted: zero2 for QLoRA"),
        (
            {"sharding": "zero2", "offload_optimizer": True, "optim": "adamw_bnb_8bit", **CUDA},
            "trainer.optim='adamw_bnb_8bit'",
        ),
        (
            {"offload_param": True, **CUDA},
            "trainer.offload_param=True: needs trainer.sharding=zero2 or zero3",
        ),
    ],
)
def test_what_the_runner_cannot_apply_is_one_line(settings, fragment):
    line = deepspeed_config.problem(settings, installed=True)
    assert fragment in line and "\n" not in line


def test_zero_needs_the_deepspeed_package():
    line = deepspeed_config.problem({"sharding": "zero3", **CUDA}, installed=False)
    assert "deepspeed" in line and "pip install deepspeed" in line
    assert deepspeed_config.problem({"sharding": "zero3", **CUDA}, installed=True) is None
    assert (
        deepspeed_config.problem({"sharding": "zero2", "load_in_4bit": True, **CUDA}, installed=True) is None
    )
    assert deepspeed_config.problem({"sharding": "none"}, installed=False) is None


def _rows() -> dict:
    return yaml.safe_load(ZERO_YAML.read_text())["zero_offload"]["rows"]


def _zero_job(row: str, *extra):
    schema.register()
    with initialize(config_path="../../sweeps/runner/conf", version_base="1.3"):
        return to_job(
            compose(config_name="config", overrides=["+experiment=zero-offload", f"zero_row={row}", *extra])
        )


def test_every_zero_row_composes_into_a_one_gpu_deepspeed_run(monkeypatch):
    monkeypatch.setattr(deepspeed_config, "deepspeed_installed", lambda: True)
    jobs = {r: _zero_job(r) for r in _rows()}
    assert len({j.key for j in jobs.values()}) == len(jobs) == 5
    for name, job in jobs.items():
        row, c = _rows()[name], job.config
        assert (c.model, c.use_peft, c.sharding, c.offload_param) == (
            row["model"],
            row["peft"],
            row["zero"],
            row["offload_param"],
        )
        assert (
            c.offload_optimizer
            and c.num_gpus == 1
            and c.optim == "adamw_torch"
            and c.max_completion_length == 256
        )
        assert job.source == "measured-gpu" and job.probes == ["torch_cuda", "nvml", "host"]
        assert job.variant["deepspeed"]["zero_optimization"]["stage"] == int(row["zero"][-1])
        # GRPOConfig.ds3_gather_for_generation is the row's setting, recorded in the variant of ZeRO-3 rows
        assert c.ds3_gather_for_generation == row["gather"]
        assert job.variant.get("ds3_gather_for_generation") == (
            row["gather"] if row["zero"] == "zero3" else None
        )
    assert {j.variant.get("ds3_gather_for_generation") for j in jobs.values()} == {True, False, None}


def test_a_zero_row_without_deepspeed_is_refused_naming_the_package(monkeypatch):
    monkeypatch.setattr(deepspeed_config, "deepspeed_installed", lambda: False)
    with pytest.raises(BadInput, match="pip install deepspeed"):
        _zero_job("r00")


def test_gather_off_outside_zero3_is_refused(monkeypatch):
    monkeypatch.setattr(deepspeed_config, "deepspeed_installed", lambda: True)
    with pytest.raises(
        BadInput, match="trainer.ds3_gather_for_generation=False: applies to trainer.sharding=zero3"
    ):
        _zero_job("r00", "trainer.ds3_gather_for_generation=false")


def test_grpo_args_pass_the_dict_and_the_gather_setting(monkeypatch, tmp_path):
    import trl

    seen = {}

    class Recording(trl.GRPOConfig):
        def __init__(self, **kwargs):  # no DeepSpeed import: only what the runner passes is kept
            seen.update(kwargs)

    monkeypatch.setattr(trl, "GRPOConfig", Recording)
    cfg = RunConfig(
        sharding="zero3",
        offload_optimizer=True,
        offload_param=True,
        optim="adamw_torch",
        ds3_gather_for_generation=False,
    )
    grpo_setup.grpo_args(cfg, grpo_setup.VARIANT_DEFAULTS, tmp_path)
    assert seen["deepspeed"]["zero_optimization"]["offload_param"] == CPU_PINNED
    assert seen["ds3_gather_for_generation"] is False and seen["use_cpu"] is False
    seen.clear()
    grpo_setup.grpo_args(RunConfig(sharding="zero2", device="cpu"), grpo_setup.VARIANT_DEFAULTS, tmp_path)
    # a CPU rehearsal goes through DeepSpeed's CPU accelerator: accelerate takes that path only without use_cpu
    assert seen["use_cpu"] is False and seen["ds3_gather_for_generation"] is True  # GRPOConfig's default
    seen.clear()
    grpo_setup.grpo_args(RunConfig(device="cpu"), grpo_setup.VARIANT_DEFAULTS, tmp_path)
    assert seen["use_cpu"] is True and "deepspeed" not in seen


def test_one_process_world_with_its_own_port():
    env: dict = {}
    assert deepspeed_config.prepare_process({"sharding": "zero2", "device": "cuda"}, env)
    port = int(env.pop("MASTER_PORT"))
    assert 0 < port < 65536
    assert env == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    cpu: dict = {}
    deepspeed_config.prepare_process({"sharding": "zero3", "device": "cpu"}, cpu)
    assert cpu["DS_ACCELERATOR"] == "cpu"
    untouched: dict = {}
    assert not deepspeed_config.prepare_process({"sharding": "none"}, untouched) and untouched == {}


class _Listener:
    def __init__(self):
        self.labels = []

    def set_phase(self, name):
        self.labels.append(name)


def test_the_engine_step_is_the_optimizer_phase():
    listener = _Listener()
    tracker = PhaseTracker([listener])
    calls = []

    class Engine:
        def step(self):
            calls.append(tracker.current)

    class Trainer:
        model_wrapped = Engine()
        callbacks = []

        def add_callback(self, cb):
            self.callbacks.append(cb)

    trainer = Trainer()
    deepspeed_config.install_step_phase(trainer, tracker)
    trainer.callbacks[0].on_train_begin(None, None, None)
    trainer.callbacks[0].on_train_begin(None, None, None)  # wrapped once, whatever calls it twice
    tracker.push("train")
    trainer.model_wrapped.step()
    tracker.pop()
    assert calls == ["optimizer"]
    assert listener.labels == ["train", "optimizer", "train", "other"]


def test_count_params_reads_the_full_size_of_a_zero3_partitioned_parameter():
    import torch

    p = torch.nn.Parameter(torch.empty(0))
    p.ds_numel = 12 * 34

    class Model:
        def named_parameters(self):
            return [("w", p)]

    assert grpo_setup.count_params(Model()) == (408, 408)


@pytest.mark.skipif(
    find_spec("deepspeed") is None, reason="deepspeed is not installed (make zero-cpu builds .venvs/ds)"
)
@pytest.mark.parametrize("case", [{"sharding": "zero2", "offload_optimizer": True}])
def test_a_real_zero_run_on_deepspeeds_cpu_accelerator(tmp_path, case):
    """The runner's child under DeepSpeed ZeRO-2 with CPU offload on its CPU accelerator (JIT-builds cpu_adam once,
    ~1.5 min on 2 cores; ~15 s after)."""
    cfg = RunConfig(
        model="tiny-2M",
        device="cpu",
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=16,
        max_completion_length=16,
        **case,
    )
    spec = {
        "config": cfg.to_dict(),
        "variant": {"steps": 2},
        "probes": ["host"],
        "result_path": str(tmp_path / "result.json"),
        "workdir": str(tmp_path / "work"),
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "sweeps.runner.run_one", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok", (result.get("error"), run.stderr[-2000:])
    host = result["observed"]["probes"]["host"]
    assert host["available"] and host["source"] == "measured-cpu"
    # the engine's step ran under the optimizer label, between the training steps
    assert {"generate", "train", "optimizer"} <= set(host["phases"])
    assert result["model"]["params"] == 2_002_048 == result["model"]["trainable_params"]


def test_a_row_that_ran_with_an_auto_reduce_bucket_is_predicted_with_it():
    from sweeps.runner.predict import config_of

    auto = {"deepspeed": {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}}
    row = {"config": RunConfig(sharding="zero2").to_dict(), "variant": auto}
    assert config_of(row)["zero_reduce_bucket_size"] is None  # HF's fill: hidden_size^2
    given = {"config": {**row["config"], "zero_reduce_bucket_size": 10**6}, "variant": auto}
    assert config_of(given)["zero_reduce_bucket_size"] == 10**6
    assert "zero_reduce_bucket_size" not in config_of({"config": RunConfig().to_dict()})
