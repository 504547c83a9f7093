"""Every plan the answer gives reproduces: its changes, given back to the command as flags, make the run fit the
card and, with vLLM, vLLM start (exit 0), by the same command's own layout and checks.

The runs sit where the plan and the layout can disagree: a share on the edge of what the card must hold, a role
on a GPU of its own that stays over, a tensor-parallel size a plan's GPU count must divide.
"""

from __future__ import annotations

import contextlib
import io
import json

import cli_json
import pytest

cli = cli_json.cli


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(argv)
    return code, out.getvalue()


def flags_of(label: str) -> list[str]:
    """The command-line flags a plan's change label stands for (labels name the flag, or the setting in words)."""
    if label.startswith("load in bf16"):
        return ["--dtype", "bfloat16"]
    if label.startswith("--qlora"):
        return ["--qlora"]
    if label.startswith("--use-peft"):
        return ["--lora"]
    if label.startswith("PYTORCH_CUDA_ALLOC_CONF="):
        return ["--alloc-conf", label.split("=", 1)[1]]
    if label.startswith("GRPOConfig(torch_empty_cache_steps=1)"):
        return ["--torch-empty-cache-steps", "1"]
    return label.split(" (")[0].split()


RUNS = [
    # the share on the edge of what a 24 GiB card must hold beside a LoRA-only vLLM
    "--model 7B --use-vllm --gpu 4090 --dtype bfloat16 --lora --vllm-gpu-memory-utilization 0.6 --vllm-share-base",
    # vLLM's share below its own weights: raised, with max_model_len cut to prompt + completion
    "--model 7B --lora --dtype bfloat16 --use-vllm --vllm-gpu-memory-utilization 0.3 --gpu A100-40",
    # the trainer's fp32 load leaves vLLM no room: a 4-bit base
    "--model 7B --dtype float32 --use-vllm --gpu A100-40",
    # a server asking more than its card has, and one asking too little
    "--model 0.5B --use-vllm --vllm-mode server --vllm-server-utilization 0.99 --gpu T4",
    "--model 0.5B --use-vllm --vllm-mode server --vllm-server-utilization 0.05 --gpu T4",
    # vLLM reserving first (OpenRLHF order): the models must load beside its share
    "--model 7B --use-vllm --vllm-starts-first --vllm-gpu-memory-utilization 0.9 --gpu A100-40",
    # a reward model beside the policy, vLLM over two GPUs
    "--model 1.5B --use-vllm --gpu T4 --vllm-gpu-memory-utilization 0.2 --gpus 2 --zero 3 "
    "--vllm-tensor-parallel-size 2 --reward-model 0.5B --max-completion-length 2048",
    # fewer completions per prompt moves the batch size with it: the label names both flags
    "--model 0.5B --use-vllm --gpu T4 --max-completion-length 8192 --vllm-gpu-memory-utilization 0.2",
    # a 7B reward model on two (four) T4s of its own, no vLLM: sharding it over them is what makes it hold
    "--model 0.5B --gpu T4 --dtype bfloat16 --reward-model 7B@own:2",
    "--model 3B --gpu T4 --dtype bfloat16 --lora --reward-model 7B@own:4",
    # three GPUs with vLLM's tensor parallel size 3 (Qwen2.5-1.5B's 12 attention heads split in 3): no plan may
    # name a GPU count 3 does not divide
    "--model 1.5B --use-vllm --gpu T4 --gpus 3 --vllm-tensor-parallel-size 3 --dtype bfloat16",
]


@pytest.mark.parametrize("run", RUNS, ids=[r[:70] for r in RUNS])
def test_the_plan_reproduces(run):
    argv = run.split()
    code, out = _run([*argv, "--json"])
    assert code == 1, "each run here fails as given"
    plan = json.loads(out)["advice"]["plan"]
    assert plan is not None and plan["fits"], plan
    flags = [f for c in plan["changes"] for f in flags_of(c["label"])]
    again, text = _run([*argv, *flags])
    assert again == 0, (flags, text[:800])


def test_a_role_on_its_own_gpu_that_stays_over_is_no_plan_that_fits():
    # a 7B reward model in fp32 on a T4 of its own (28 GiB of weights): nothing tried for the policy makes that GPU
    # hold it; the plan must not say it fits, and the layout says what that GPU misses
    argv = ["--model", "1.5B", "--use-vllm", "--gpu", "T4", "--reward-model", "7B@own"]
    code, out = _run([*argv, "--json"])
    d = json.loads(out)
    assert code == 1 and (d["advice"]["plan"] is None or not d["advice"]["plan"]["fits"])
    assert any(f.startswith("the reward (7B) GPU misses") for f in d["layout"]["fixes"])


def test_where_vllm_fails_at_start_up_the_changes_that_let_it_start_come_first():
    # a 0.01 share holds none of a 0.5B model's 0.92 GiB of weights: the changes that let vLLM start lead the list
    code, out = _run(
        ["--model", "0.5B", "--use-vllm", "--vllm-gpu-memory-utilization", "0.01", "--advice", "--json"]
    )
    singles = json.loads(out)["advice"]["singles"]
    starts = [o["starts"] for o in singles]
    assert starts[0] and starts == sorted(starts, reverse=True)


def test_the_layout_fixes_say_what_still_fails_after_them():
    flat = lambda s: " ".join(s.split())  # noqa: E731 (the short answer wraps at 80 columns)
    # fp32 7B on an A100 40GB: in bf16 the trainer's load leaves vLLM's 11.88 GiB request free, but 0.3 of the card
    # still holds less than vLLM's own 14.19 GiB of bf16 weights; a 4-bit base fixes both
    _, out = _run(["--model", "7B", "--dtype", "float32", "--use-vllm", "--gpu", "A100-40"])
    assert (
        "load in bf16 (model_init_kwargs dtype: bfloat16) (vLLM then still fails: its share does not hold its own "
        "weights); --qlora (LoRA on a 4-bit base)" in flat(out)
    )
    # the share that holds one request, at the run's max_model_len and with it cut to prompt + completion
    _, out = _run(["--model", "7B", "--lora", "--dtype", "bfloat16", "--use-vllm", "--gpu", "A100-40"])
    assert "(at least 0.44 at max_model_len=32768; less with --vllm-max-model-length 768)" in flat(out)
    # a server asking more than its card has free is told the share it can have: on a T4 (14.58 GiB torch can use)
    # its CUDA context and workspaces (0.78 GiB), the weight-sync NCCL group (0.53) and the fp32 weight push (1.84
    # GiB less 0.36 of profile room inside its share) leave 0.80 of the card
    server = ["--model", "0.5B", "--use-vllm", "--vllm-mode", "server", "--gpu", "T4"]
    _, out = _run([*server, "--vllm-server-utilization", "0.99"])
    assert "lower --vllm-server-utilization (trl vllm-serve --gpu_memory_utilization) to 0.8, " in flat(out)


@pytest.mark.parametrize(
    ("knob", "flag", "step"),
    [
        ("vllm_gpu_memory_utilization", "--vllm-gpu-memory-utilization", 0.01),
        ("max_completion_length", "--max-completion-length", 1),
    ],
)
def test_the_solved_value_reproduces_and_one_step_more_does_not(knob, flag, step):
    # a LoRA-only vLLM beside a 3B LoRA step on an A10G: the answer is on the edge of what the card must hold
    argv = [
        "--model",
        "3B",
        "--use-vllm",
        "--gpu",
        "A10G",
        "--lora",
        "--vllm-share-base",
        "--dtype",
        "bfloat16",
    ]
    code, out = _run([*argv, "--solve", knob, "--json"])
    value = json.loads(out)["solve"]["value"]
    assert code == 0 and value is not None
    assert _run([*argv, flag, str(value)])[0] == 0
    beyond = round(value + step, 2) if isinstance(step, float) else value + step
    assert _run([*argv, flag, str(beyond)])[0] == 1


def test_the_layout_leaves_offloaded_optimizer_state_off_the_gpu():
    # ZeRO-3 with the optimizer offloaded: AdamW state and fp32 master weights live on the host (step/offload.py),
    # so the policy's resident bytes on the GPU are its weight shard, adapters and vLLM's share: no negative
    # "working" bytes, and the nvidia-smi peak at or above what the card must hold less the band
    from estimator.model.catalog import resolve_model
    from estimator.plan.layout import VllmSettings, plan
    from estimator.settings.config import RunConfig
    from estimator.step.estimate import estimate

    cfg = RunConfig(model="1.5B", use_vllm=True, num_gpus=2, sharding="zero3", offload_optimizer=True)
    lay = plan(estimate(cfg), [], VllmSettings.of(cfg), resolve_model, 80 * 2**30)
    policy = lay.groups[0].roles[0]
    assert policy.working >= 0
    on = plan(
        estimate(cfg.with_(offload_optimizer=False)), [], VllmSettings.of(cfg), resolve_model, 80 * 2**30
    )
    # 1.54e9 params: at least AdamW's two fp32 moments, 8 B per parameter halved over 2 GPUs, leave the GPU (the
    # fp32 master copy leaves too; the gradient staging buffer that carries them comes)
    assert on.groups[0].roles[0].resident - policy.resident >= 1_543_714_304 * 8 // 2


def test_a_plan_says_each_setting_once_with_the_value_that_stands():
    # smaller micro-batches (GA 8) then fewer generations (which sets GA again): the plan names
    # --gradient-accumulation-steps once, with the value the run ends up with
    argv = ["--model", "14B", "--lora", "--gpu", "L4", "--reward-model", "1.5B"]
    code, text = _run(argv)
    plan_text = " ".join(text.split()).split("To fit the L4: ")[1].split(" -> ")[0]
    assert code == 1 and plan_text.count("--gradient-accumulation-steps") == 1
    assert "--per-device-train-batch-size" in plan_text and "--num-generations" in plan_text
    named = int(plan_text.split("--gradient-accumulation-steps ")[1].split()[0])
    flags = [f for part in plan_text.split(" + ") for f in flags_of(part)]
    assert _run([*argv, *flags])[0] == 0  # the plan's flags, as printed, reproduce it
    code, out = _run([*argv, *flags, "--json"])
    assert json.loads(out)["config"]["gradient_accumulation_steps"] == named


def test_solve_finds_nothing_while_a_role_gpu_stays_over_whatever_the_value():
    # a 14B value model in bf16 on a 4090 of its own (28 GiB of weights alone): no num_generations makes that GPU
    # hold it, so --solve answers none and says why, whatever num_generations the training GPU could take
    argv = ["--model", "1.5B", "--gpu", "4090", "--dtype", "bfloat16", "--value-model", "14B@own"]
    code, out = _run([*argv, "--solve", "num_generations", "--json"])
    sol = json.loads(out)["solve"]
    assert code == 1 and sol["value"] is None and "a GPU of a role placed on its own" in sol["note"]
