"""roles_cli: bad role or vLLM settings are one line on stderr and exit 2; a layout that does not fit exits 1."""

import pytest

from estimator import roles_cli


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--value-model", "1.5B@moon"], "--value-model '1.5B@moon'"),
        (["--reward-model", "1.5B@own:0"], "MODEL@own:N"),
        (["--vllm-max-model-length", "0"], "integer >= 1"),
        (["--vllm-server-utilization", "1.5"], "(0, 1]"),
        (["--reward-model", "no-such-model"], "no-such-model"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys):
    assert roles_cli.main(["--model", "0.5B", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


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
    assert roles_cli.main(argv) == 1
    out = capsys.readouterr().out
    # 0.3 × 40 GiB = 12 GiB is less than the 14.19 GiB of bf16 weights vLLM loads: no KV cache at all
    assert "fails at vLLM start-up: no memory left for the KV cache" in out
    assert "raise vllm_gpu_memory_utilization" in out


def test_json_layout_and_solve_vllm_share(capsys):
    import json

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
    assert roles_cli.main(argv) in (0, 1)
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["source"] == "estimated" and d["layout"]["total_gpus"] == 1
    assert [r["role"] for r in d["layout"]["groups"][0]["roles"]] == ["policy (TRL step)", "value 1.5B"]
    assert d["layout"]["vllm"]["requested"] == -(-81920 * 2**20 * 9 // 10)
    assert roles_cli.main(
        [a for a in argv if a != "--json"] + ["--solve", "vllm_gpu_memory_utilization"]
    ) in (0, 1)
    out = capsys.readouterr().out
    assert "solve: largest vllm_gpu_memory_utilization that fits = 0." in out


def test_with_roles_adds_resident_roles_to_every_phase():
    from estimator.catalog import resolve_model
    from estimator.config import RunConfig
    from estimator.estimate import estimate
    from estimator.layout import Role, with_roles

    cfg = RunConfig(model="1.5B", dtype="bfloat16", per_device_train_batch_size=2, num_generations=2)
    plain = estimate(cfg)
    fn = with_roles(lambda c, a: estimate(c, a), [Role("reward", "1.5B")], resolve_model)
    both = fn(cfg, plain.arch)
    rm = 2 * (1_543_714_304 + 1536)  # the reward model's bf16 weights
    assert both.phases["train"]["roles"] == rm
    assert both.phases["score"]["roles"] > rm  # its scoring pass happens with the no-grad passes
    assert both.peak_allocated_bytes >= plain.peak_allocated_bytes + rm
