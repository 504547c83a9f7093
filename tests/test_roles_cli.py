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
