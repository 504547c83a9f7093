"""+experiment=gpu-validate: every row composes into a GPU run with random weights, the table covers the terms,
the Makefile runs the same rows in the same order, and the per-row time budget fits the 20-minute lease."""

import re
from pathlib import Path

import yaml
from hydra import compose, initialize

from estimator.step.estimate import estimate
from sweeps.runner import schema
from sweeps.runner.job import to_job

REPO = Path(__file__).resolve().parents[2]
YAML = REPO / "sweeps" / "runner" / "conf" / "experiment" / "gpu-validate.yaml"


def _rows() -> dict:
    return yaml.safe_load(YAML.read_text())["gpu_validate"]["rows"]


def _jobs() -> dict:
    schema.register()  # the trainer/default node the config composes (the app registers it the same way)
    with initialize(config_path="../../sweeps/runner/conf", version_base="1.3"):
        return {
            r: to_job(
                compose(config_name="config", overrides=["+experiment=gpu-validate", f"validate_row={r}"])
            )
            for r in _rows()
        }


def test_every_row_is_a_distinct_gpu_run_with_random_weights():
    jobs = _jobs()
    assert len({j.key for j in jobs.values()}) == len(jobs) == 17
    for name, job in jobs.items():
        row = _rows()[name]
        c = job.config
        assert (
            job.source == "measured-gpu" and job.variant["weights"] == "random" and job.variant["steps"] == 2
        )
        assert (c.model, c.use_peft, c.load_in_4bit, c.gradient_checkpointing) == (
            row["model"],
            row["peft"],
            row["q4"],
            row["gc"],
        )
        assert (c.optim, c.beta, c.use_vllm, c.dtype) == (row["optim"], row["beta"], row["vllm"], "bfloat16")
        assert job.sweep == "gpu-validate" and job.probes == ["torch_cuda", "nvml", "host"]
        # no row is planned to run out of memory on an 80 GB card (estimated)
        assert estimate(c).peak_device_bytes < 80e9, name


def test_table_covers_sizes_methods_checkpointing_optimizers_reference_and_vllm():
    rows = list(_rows().values())
    methods = {(r["peft"], r["q4"]) for r in rows}
    assert methods == {(False, False), (True, False), (True, True)}
    for m in methods:  # each method with and without gradient checkpointing
        assert {r["gc"] for r in rows if (r["peft"], r["q4"]) == m} == {True, False}
    assert {r["model"].split("-")[1] for r in rows} == {"0.5B", "1.5B", "3B", "7B"}
    assert {r["optim"] for r in rows} == {"adamw_bnb_8bit", "adamw_torch_fused"}
    assert {r["peft"] for r in rows if r["beta"] > 0} == {True, False}  # reference: own model / adapters off
    assert [n for n, r in _rows().items() if r["vllm"]] == ["r16"]
    first = rows[:3]  # a run cut after three rows already spans 0.5B to 7B and full, LoRA and QLoRA
    assert {r["model"].split("-")[1] for r in first} == {"0.5B", "7B"}
    assert len({(r["peft"], r["q4"]) for r in first}) == 3


def test_makefile_runs_the_yaml_rows_in_order_and_adds_vllm_last():
    conf = yaml.safe_load(YAML.read_text())
    sweep_rows = conf["hydra"]["sweeper"]["params"]["validate_row"].split(",")
    make_rows = (
        re.search(r"^VALIDATE_ROWS := (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1).split(",")
    )
    assert make_rows == sweep_rows == [n for n, r in _rows().items() if not r["vllm"]]
    assert "echo ,r16" in (REPO / "Makefile").read_text()


def test_row_times_add_up_to_the_lease():
    """The per-row estimates in the yaml's comments (estimated, not measured) sum to what the header says."""
    text = YAML.read_text()
    secs = [int(s) for s in re.findall(r"^    r\d\d: \{.*# est\. [\d.]+ GiB, ~(\d+) s$", text, re.M)]
    assert len(secs) == 17
    total = sum(secs[:16]) + 25 + secs[16]  # rows, first saves of the random checkpoints, the vLLM row
    assert total == 944 and "944 s" in text
    assert total <= 20 * 60
