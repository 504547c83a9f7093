"""vram-estimate with roles and vLLM's own settings: schema fields read from flags, --config files and the tracer's
flags; bad values one line and exit 2; a layout that does not fit on --gpu exits 1; JSON carries the layout."""

import json

import pytest

from estimator.interface import cli
from estimator.interface.flags import FlagError, resolve_run
from estimator.settings.config import RunConfig
from estimator.settings.role_spec import Role, RoleSpecError, config_roles, parse_role

GPTQ = "examples/case1_gptq_qlora_vllm_colocate/Qwen2.5-7B-Instruct-GPTQ-Int4.config.json"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--value-model", "1.5B@moon"], "--value-model '1.5B@moon' is not a role"),
        (["--reward-model", "1.5B@own:0"], "MODEL@own:N"),
        (["--reference-model", "1.5B@policy:2"], "--reference-model '1.5B@policy:2'"),
        (["--vllm-max-model-length", "0"], "integer >= 1"),
        (["--vllm-server-utilization", "1.5"], "> 0 and <= 1"),
        (["--vllm-sleep-level", "3"], "invalid choice"),
        (["--vllm-sleep-level", "0", "--vllm-enable-sleep-mode"], "drop one"),
        (["--reward-model", "no-such-model"], "--reward-model: unknown model 'no-such-model'"),
        (["--model", GPTQ], "pass --use-peft"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys):
    assert cli.main(["--model", "0.5B", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_role_specs():
    assert parse_role("reward", "1.5B") == Role("reward", "1.5B")
    assert parse_role("reference", "1.5B@own=sampler:2") == Role("reference", "1.5B", "own", 2, "sampler")
    for bad in ("", "@own", "1.5B@own:x", "1.5B@elsewhere"):
        with pytest.raises(RoleSpecError):
            parse_role("value", bad)
    cfg = RunConfig(reward_models=("0.5B", "1.5B@own"), reference_models=("1.5B",), value_model="3B")
    assert [(r.kind, r.model, r.placement) for r in config_roles(cfg)] == [
        ("reward", "0.5B", "policy"),
        ("reward", "1.5B", "own"),
        ("reference", "1.5B", "policy"),
        ("value", "3B", "policy"),
    ]


def test_flags_repeat_and_config_file_keys(tmp_path):
    # the tracer derives the same flags (estimator/interface/flags.py): every new setting parses there too
    from sweeps.trace.cli import build_parser

    ns = build_parser().parse_args(
        [
            "one",
            "--model",
            "0.5B",
            "--reward-model",
            "0.5B",
            "--reward-model",
            "0.5B@own",
            "--vllm-sleep-level",
            "1",
        ]
    )
    cfg, _, _ = resolve_run(ns)
    assert cfg.reward_models == ("0.5B", "0.5B@own") and cfg.vllm_sleep_level == 1
    # ms-swift / TRL keys in a config file
    f = tmp_path / "swift.yaml"
    f.write_text(
        "model_name_or_path: 0.5B\nuse_vllm: true\nvllm_max_model_len: 2500\nsleep_level: 1\n"
        "ref_model: 0.5B\nreward_model: [0.5B, 0.5B@own]\nvllm_tensor_parallel_size: 2\n"
    )
    # two processes: colocated vLLM's tensor-parallel groups of 2 must split the world evenly (TRL)
    cfg, _, notes = resolve_run(cli.build_parser().parse_args(["--config", str(f), "--gpus", "2"]))
    assert cfg.vllm_max_model_length == 2500 and cfg.vllm_tensor_parallel_size == 2
    assert cfg.reference_models == ("0.5B",) and cfg.reward_models == ("0.5B", "0.5B@own")
    # no note but the size alias's (which model 0.5B means)
    assert cfg.vllm_sleeps and cfg.resolved_vllm_sleep_level == 1
    assert [n for n in notes if "sized as" not in n] == []
    f.write_text("model_name_or_path: 0.5B\nreward_model: 0.5B@nowhere\n")
    with pytest.raises(FlagError, match="--reward-model '0.5B@nowhere' is not a role"):
        resolve_run(cli.build_parser().parse_args(["--config", str(f)]))


def test_new_settings_leave_old_run_keys_unchanged():
    """A committed row's key was computed before these settings existed; recomputing it must give the same key
    (RunConfig.to_dict leaves out 0.2.0 settings at their default)."""
    from sweeps import records

    row = next(
        r for r in records.load_rows("results/traced/tuned/core.jsonl") if isinstance(r.get("config"), dict)
    )
    cfg = RunConfig.from_dict(row["config"])
    assert records.make_key(cfg.to_dict(), row["variant"]) == row["key"]
    d = cfg.with_(vllm_max_model_length=2048).to_dict()
    assert d["vllm_max_model_length"] == 2048 and "value_model" not in d


def test_every_setting_is_a_flat_immutable_value():
    # RunConfig.to_dict copies the fields shallowly and the allocator term caches its lookups by config: both
    # hold while every field is a bool, a number, a string, None or a tuple of strings
    from dataclasses import fields

    flat = {
        "bool",
        "int",
        "float",
        "str",
        "bool | None",
        "int | None",
        "float | None",
        "str | None",
        "tuple[str, ...] | None",
    }
    assert {f.name: f.type for f in fields(RunConfig) if f.type not in flat} == {}
    cfg = RunConfig(lora_target_modules=("q_proj", "v_proj"))
    d = cfg.to_dict()
    d["lora_target_modules"].append("o_proj")  # the dict is the caller's: the config is untouched
    assert cfg.lora_target_modules == ("q_proj", "v_proj") and hash(cfg) == hash(
        RunConfig.from_dict(cfg.to_dict())
    )


def test_vllm_start_up_failure_exits_1_and_names_the_fix(capsys):
    argv = [
        "--model",
        "7B",
        "--dtype",
        "bfloat16",
        "--lora",
        "--use-vllm",
        "--vllm-gpu-memory-utilization",
        "0.3",
        "--per-device-train-batch-size",
        "2",
        "--gens",
        "2",
        "--gpu",
        "A100-40",
    ]
    assert cli.main(argv) == 1
    short = capsys.readouterr().out
    assert short.splitlines()[0].startswith("Needs ") and "A100 40GB fails at vLLM start-up" in short
    assert "raise vllm_gpu_memory_utilization" in short
    # the plan lets vLLM start: a share that holds vLLM's 14.19 GiB of bf16 weights, buffers and one 768-token
    # request ((0.58 + 0.65 + 14.19 + 0.04) / 39.15 GiB = 0.395 -> 0.40), max_model_len cut to that request
    flat = " ".join(short.split())
    plan_line = "To let vLLM start and fit the A100 40GB: --vllm-gpu-memory-utilization 0.4 --vllm-max-model-length 768"
    assert plan_line in flat
    assert cli.main([*argv, "--vllm-gpu-memory-utilization", "0.4", "--vllm-max-model-length", "768"]) == 0
    capsys.readouterr()
    # one hundredth less does not start by the layout's own check; the model's own max_model_len does not either
    assert cli.main([*argv, "--vllm-gpu-memory-utilization", "0.39", "--vllm-max-model-length", "768"]) == 1
    assert "fails at vLLM start-up" in capsys.readouterr().out
    assert cli.main([*argv, "--vllm-gpu-memory-utilization", "0.4"]) == 1
    assert "fails at vLLM start-up" in capsys.readouterr().out
    assert cli.main([*argv, "--detail"]) == 1
    out = " ".join(capsys.readouterr().out.split())  # the detail wraps at 80 columns
    # 0.3 × 40 GiB = 12 GiB is less than the 14.19 GiB of bf16 weights vLLM loads: no KV cache at all
    assert "fails at vLLM start-up: no memory left for the KV cache" in out
    assert "raise vllm_gpu_memory_utilization" in out
    assert "(vLLM fails before the first step" in out
    assert "--qlora (LoRA on a 4-bit base) (vLLM starts)" in out  # vLLM then loads 4-bit weights
    assert (
        "--per-device-train-batch-size 1 --gradient-accumulation-steps 2 (vLLM still fails at start-up)"
        in out
    )
    # the GPU line agrees with the layout: the step alone would leave room, vLLM does not start
    # torch can use 40,536 MiB of the 40,960 MiB nvidia-smi total (gpus.py: printed total_memory)
    assert "A100 40GB (39.59 GiB torch can use of 40.00 GiB): does NOT fit, fails at vLLM start-up" in out
    # the same run without --gpu: no fit question asked, exit 0 (the layout still shows the failure on 80 GiB)
    assert cli.main(argv[:-2]) == 0


def test_json_layout_and_solve_vllm_share(capsys):
    argv = [
        "--model",
        "1.5B",
        "--dtype",
        "bfloat16",
        "--use-vllm",
        "--vllm-gpu-memory-utilization",
        "0.9",
        "--per-device-train-batch-size",
        "2",
        "--gens",
        "2",
        "--vllm-max-model-length",
        "1024",
        "--value-model",
        "1.5B",
        "--gpu",
        "A100-80",
        "--json",
    ]
    assert cli.main(argv) in (0, 1)
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["source"] == "estimated" and d["layout"]["total_gpus"] == 1
    assert [r["role"] for r in d["layout"]["groups"][0]["roles"]] == ["policy (TRL step)", "value 1.5B"]
    # vLLM requests utilization x the total cudaMemGetInfo reports (vllm gpu_worker: init_snapshot.total_memory *
    # gpu_memory_utilization), the total torch can use: A100 80GB has no printed total_memory in gpus.py, so
    # 81,920 MiB nvidia-smi - 870 MiB (the largest published gap) = 81,050 MiB
    assert d["layout"]["vllm"]["requested"] == -(-81050 * 2**20 * 9 // 10)
    assert d["config"]["value_model"] == "1.5B" and d["config"]["vllm_max_model_length"] == 1024
    assert all("cost" in o for o in d["advice"]["singles"])
    text_argv = [a for a in argv if a != "--json"] + ["--solve", "vllm_gpu_memory_utilization"]
    assert cli.main([*text_argv, "--detail"]) in (0, 1)
    out = capsys.readouterr().out
    assert "solve: largest vllm_gpu_memory_utilization that fits = 0." in out
    assert cli.main(text_argv) in (0, 1)
    assert "Largest vllm_gpu_memory_utilization that fits: 0." in capsys.readouterr().out


def test_roles_and_gpu_count_in_the_text_report(capsys):
    argv = ["--model", "1.5B", "--dtype", "bfloat16", "--gpus", "2", "--zero", "2", "--gens", "4"]
    argv += [
        "--reference-model",
        "1.5B@own=sampler",
        "--reference-model",
        "1.5B@own=sampler",
        "--gpu",
        "A100-80",
    ]
    assert cli.main(argv) == 0
    assert "Per GPU (3 in all, estimated):" in capsys.readouterr().out
    assert cli.main([*argv, "--detail"]) == 0
    out = capsys.readouterr().out
    assert "layout: 3 GPU(s)" in out and "sampler × 1" in out
    # two bf16 copies of Qwen2.5-1.5B (1,543,714,304 params) resident on the sampler GPU
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("reference 1.5B"))
    assert f"{2 * 1_543_714_304 / 2**30:.2f}" in line


def test_with_roles_adds_resident_roles_to_every_phase():
    from estimator.model.catalog import resolve_model
    from estimator.plan.layout import with_roles
    from estimator.step.estimate import estimate

    cfg = RunConfig(model="1.5B", dtype="bfloat16", per_device_train_batch_size=2, num_generations=2)
    plain = estimate(cfg)
    fn = with_roles(lambda c, a: estimate(c, a), [Role("reward", "1.5B")], resolve_model)
    both = fn(cfg, plain.arch)
    rm = 2 * (1_543_714_304 + 1536)  # the reward model's bf16 weights
    assert both.phases["train"]["roles"] == rm
    assert both.phases["score"]["roles"] > rm  # its scoring pass happens with the no-grad passes
    assert both.peak_allocated_bytes >= plain.peak_allocated_bytes + rm


def test_fits_line_gives_vllm_its_share_of_each_card(capsys, monkeypatch):
    """vLLM colocate at 0.5 takes half of each card: a bf16 0.5B step (~1 GiB of weights, small batches) fits in the
    other half of a 16 GiB T4, though half of the 80 GiB card named by --gpu would not fit on it."""
    from estimator.step import band

    monkeypatch.setattr(
        band, "margin", lambda cfg=None, model_type=None: 0.0
    )  # vLLM's share per card, not the band, is tested here
    argv = ["--model", "0.5B", "--dtype", "bfloat16", "--gens", "2", "--per-device-train-batch-size", "2"]
    argv += ["--use-vllm", "--vllm-gpu-memory-utilization", "0.5", "--vllm-max-model-length", "1024"]
    assert cli.main([*argv, "--gpu", "A100-80", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    t4 = next(f for f in d["fits"] if f["gpu"].startswith("T4"))
    assert t4["fits"] and t4["free_bytes"] < t4["gpu_memory_bytes"] // 2
    assert d["target"]["fits"] and d["target"]["free_bytes"] < d["target"]["gpu_memory_bytes"] // 2


def test_no_qlora_advice_for_a_gptq_base(capsys):
    argv = [
        "--config",
        "examples/case1_gptq_qlora_vllm_colocate/grpo_config.yaml",
        "--model",
        GPTQ,
        "--advice",
    ]
    assert cli.main(argv) == 0
    assert "--qlora" not in capsys.readouterr().out


def test_the_run_line_gives_a_vllm_server_its_own_share(capsys):
    # in server mode vLLM takes trl vllm-serve's utilization of its own GPU(s), not the colocate share
    argv = [
        "--model",
        "0.5B",
        "--lora",
        "--use-vllm",
        "--vllm-mode",
        "server",
        "--vllm-server-utilization",
        "0.8",
    ]
    assert cli.main([*argv, "--vllm-server-gpus", "2"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "vLLM server 0.8 on 2 GPUs of its own" in flat and "vLLM server 0.3" not in flat
    assert cli.main([*argv, "--detail"]) == 0  # the detail's settings line says the same
    flat = " ".join(capsys.readouterr().out.split())
    assert "vLLM server 0.8 on 1 GPU of its own" in flat and "vLLM server 0.3" not in flat
    assert cli.main(["--model", "0.5B", "--lora", "--use-vllm", "--vllm-gpu-memory-utilization", "0.4"]) == 0
    assert "vLLM colocate 0.4" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("asked", "plan", "edge", "fails"), [("0.05", "0.17", "0.16", "0.15"), ("0.999", "0.79", "0.8", "0.81")]
)
def test_a_vllm_server_that_does_not_start_is_given_the_share_that_does(capsys, asked, plan, edge, fails):
    # a 0.5B server on a T4 of its own (vllm serve's T4 defaults: 2048 batched tokens, 256 sequences): 0.05 ×
    # 14.58 GiB does not hold its 0.92 GiB of bf16 weights, 0.36 of profile activations (2048 × 19,328 × 2 B of
    # one layer + 8 × 256 × 151,936 B of sampler logits), 0.65 of CUDA graphs and one 32768-token request's
    # 0.38 GiB of KV with the null block ((2048 + 1) × 16 × 12,288 B): 2.31 GiB, 0.16 of the card.
    # 0.999 asks more than the card has free beside its CUDA context (0.78 GiB), the weight-sync NCCL group
    # (544 MiB) and the pushed fp32 weights (1.84 GiB in two chunks, both in flight, less the 0.36 GiB of profile
    # room inside its share): 11.79 / 14.58 = 0.80.
    argv = ["--model", "0.5B", "--use-vllm", "--vllm-mode", "server", "--gpu", "T4"]
    assert cli.main([*argv, "--vllm-server-utilization", asked]) == 1
    flat = " ".join(capsys.readouterr().out.split())
    assert f"To let vLLM start and fit the T4: --vllm-server-utilization {plan} ->" in flat
    # the layout's own check agrees: the plan's share starts and holds the push, and so does the edge (the plan
    # sizes the card by the rule for an unmeasured card, at most 0.01 inside it); one hundredth beyond does not
    assert cli.main([*argv, "--vllm-server-utilization", plan]) == 0
    assert cli.main([*argv, "--vllm-server-utilization", edge]) == 0
    capsys.readouterr()
    assert cli.main([*argv, "--vllm-server-utilization", fails]) == 1
    out = capsys.readouterr().out
    assert "fails at vLLM start-up" in out or "runs out when the trainer pushes weights" in out


def test_no_closest_plan_is_offered_when_no_change_lets_vllm_start(capsys):
    # 72B: vLLM's own bf16 copy alone is 72.7e9 × 2 B = 135 GiB, more than a T4 at any share; no change tried
    # loads fewer weights into vLLM than a 4-bit base (~40 GiB), so none lets it start
    assert cli.main(["--model", "72B", "--use-vllm", "--gpu", "T4"]) == 1
    flat = " ".join(capsys.readouterr().out.split())
    assert "No change tried lets vLLM start on the T4; the layout below says why." in flat
    assert "closest" not in flat
    assert (
        "vLLM needs a larger card, or its weights split over several GPUs (--vllm-tensor-parallel-size)"
        in flat
    )
    # the trainer's load (271.68 GiB in fp32) stays above the card in bf16 and with a 4-bit base: no way is named
    assert "load less into the trainer" not in flat


def test_solve_says_when_no_value_can_help_because_vllm_does_not_start(capsys):
    # vLLM's 0.3 share of an A100 40GB holds less than its 14.19 GiB of bf16 weights: no completion length helps
    argv = ["--model", "7B", "--lora", "--dtype", "bfloat16", "--use-vllm", "--gpu", "A100-40"]
    assert cli.main([*argv, "--solve", "max_completion_length"]) == 1
    flat = " ".join(capsys.readouterr().out.split())
    assert (
        "nothing fits, even the smallest value (estimated; vLLM does not start at this configuration" in flat
    )


def test_a_vllm_server_that_starts_but_cannot_take_the_weight_push_is_told_so(capsys):
    # a 0.5B LoRA run (fp32 weights) with trl vllm-serve's default share 0.9 on an L4 (21.64 GiB torch can use):
    # vLLM starts with 19.48 GiB, then the trainer pushes its 1.84 GiB of fp32 weights in two packed chunks (both
    # in flight; 0.36 GiB of them fit the profile room inside the share) over a weight-sync NCCL group (544 MiB):
    # 19.48 + 1.48 + 0.53 + 0.83 of CUDA context = 22.32 GiB, 0.68 more than the card
    argv = ["--model", "0.5B", "--lora", "--use-vllm", "--vllm-mode", "server", "--gpu", "L4"]
    argv += ["--vllm-max-model-length", "1024"]
    assert cli.main(argv) == 1
    flat = " ".join(capsys.readouterr().out.split())
    assert "vLLM server x 1: 22.3 of 21.6 GiB, 0.7 GiB short" in flat
    assert "vLLM server starts, then its GPU runs out when the trainer pushes weights" in flat
    assert "the vLLM server GPU misses 0.68 GiB once the trainer pushes weights" in flat
    plan = "To fit the L4: --vllm-server-utilization 0.86 ->"
    assert plan in flat
    # the plan reproduces; 0.87 leaves the push too little room
    assert cli.main([*argv, "--vllm-server-utilization", "0.86"]) == 0
    capsys.readouterr()
    assert cli.main([*argv, "--vllm-server-utilization", "0.87"]) == 1
    assert "runs out when the trainer pushes weights" in capsys.readouterr().out


def test_advice_resolves_each_role_model_once_per_answer(capsys, monkeypatch):
    """Advice sizes every role for each candidate run it tries: the role's model is resolved once, not per try."""
    from estimator.model import catalog

    calls = []
    real = catalog.resolve_model
    monkeypatch.setattr(
        catalog, "resolve_model", lambda spec, revision=None: calls.append(spec) or real(spec, revision)
    )
    roles = 8
    assert cli.main(["--model", "0.5B", "--gpu", "T4", "--advice", "--reward-model", *["1.5B"] * roles]) in (
        0,
        1,
    )
    capsys.readouterr()
    assert (
        0 < calls.count("1.5B") <= roles + 1
    )  # the check that each resolves (flags.py), then the answer's one


def test_roles_past_the_limit_are_refused_in_one_line(tmp_path, capsys):
    from estimator.settings.role_spec import MAX_ROLES

    many = [
        "--reward-model",
        *["0.5B"] * (MAX_ROLES - 1),
        "--reference-model",
        "0.5B",
        "--value-model",
        "0.5B",
    ]
    assert cli.main(["--model", "0.5B", *many]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and f"{MAX_ROLES + 1} models beside the policy" in err[0]
        and f"at most {MAX_ROLES}" in err[0]
    )
    config = tmp_path / "grpo.yaml"
    config.write_text("reward_models:\n" + "  - 0.5B\n" * 1000)
    assert cli.main(["--model", "0.5B", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1000 models beside the policy" in err[0], err
    assert cli.main(["--model", "0.5B", "--reward-model", *["0.5B"] * MAX_ROLES]) in (0, 1)
