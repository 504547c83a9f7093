"""Combinations TRL refuses are refused here too, in one line naming the setting; vLLM's arithmetic never shows a
negative KV pool."""

from __future__ import annotations

import json

import pytest

from estimator.interface import cli


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if "note:" not in line]


@pytest.mark.parametrize(
    "argv, needle",
    [
        # trl/generation/vllm_generation.py L314-318: colocate's TP groups must split the world evenly
        (
            ["--use-vllm", "--vllm-tensor-parallel-size", "3"],
            "--vllm-tensor-parallel-size 3 must divide --gpus 1",
        ),
        (["--use-vllm", "--vllm-tensor-parallel-size", "3", "--gpus", "4"], "must divide --gpus 4"),
        # the fused chunked head came with TRL 1.15
        (
            ["--trl-version", "0.14", "--logprob-head", "chunked"],
            "TRL 0.14 has no fused chunked log-prob head",
        ),
        # trl vllm-serve runs data_parallel_size x tensor_parallel_size GPUs: whole TP groups only
        (
            ["--use-vllm", "--vllm-mode", "server", "--vllm-tensor-parallel-size", "2"],
            "--vllm-server-gpus 1 is not a multiple of --vllm-tensor-parallel-size 2",
        ),
        (
            [
                "--use-vllm",
                "--vllm-mode",
                "server",
                "--vllm-server-gpus",
                "3",
                "--vllm-tensor-parallel-size",
                "2",
            ],
            "--vllm-server-gpus 3 is not a multiple of --vllm-tensor-parallel-size 2",
        ),
        # vLLM ModelConfig.verify_with_parallel_config: Qwen2.5-0.5B's config.json has num_attention_heads 14
        (["--use-vllm", "--gpus", "4", "--vllm-tensor-parallel-size", "4"], "has 14 attention heads"),
        (
            [
                "--use-vllm",
                "--vllm-mode",
                "server",
                "--vllm-server-gpus",
                "4",
                "--vllm-tensor-parallel-size",
                "4",
            ],
            "has 14 attention heads",
        ),
        (["--reward-model", "0.5B@own:65537"], "(N from 1 to 65536)"),
        (["--reward-model", "0.5B@own:" + "9" * 5000], "is not a role"),
    ],
)
def test_refused_in_one_line(capsys, argv, needle):
    code, out, err = _run(capsys, "--model", "0.5B", *argv)
    assert code == 2 and out == "" and len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["--use-vllm", "--vllm-tensor-parallel-size", "2", "--gpus", "4"],  # divides
        [
            "--use-vllm",
            "--vllm-mode",
            "server",
            "--vllm-tensor-parallel-size",
            "2",
            "--vllm-server-gpus",
            "4",
            "--gpus",
            "3",
        ],  # the server's own GPUs: two TP groups of 2; the trainer's 3 need not divide by 2
        ["--trl-version", "1.15", "--logprob-head", "chunked"],
    ],
)
def test_what_trl_runs_is_accepted(capsys, argv):
    code, _, err = _run(capsys, "--model", "0.5B", *argv)
    assert code == 0 and err == []


def test_a_vanishing_vllm_share_fails_start_up_with_no_negative_pool(capsys):
    code, out, _ = _run(
        capsys, "--model", "0.5B", "--use-vllm", "--vllm-gpu-memory-utilization", "1e-300", "--json"
    )
    vllm = json.loads(out)["layout"]["vllm"]
    assert vllm["kv_cache"] == 0 and "no memory left for the KV cache" in vllm["failure"]


def test_a_vllm_max_model_length_at_or_below_the_prompt_is_refused(capsys):
    # vLLM rejects a prompt of max_model_len tokens or more when one more token is asked for
    code, _, err = _run(capsys, "--model", "1.5B", "--use-vllm", "--vllm-max-model-length", "256")
    assert code == 2 and len(err) == 1
    assert "--vllm-max-model-length 256" in err[0] and "at least 768" in err[0]


def test_a_vllm_max_model_length_below_prompt_plus_completion_is_a_note(capsys):
    code = cli.main(["--model", "1.5B", "--use-vllm", "--vllm-max-model-length", "600"])
    err = capsys.readouterr().err
    assert code == 0
    assert "768 tokens is past --vllm-max-model-length 600" in err and "errs high" in err
