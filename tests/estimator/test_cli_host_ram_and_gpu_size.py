"""Two verdicts that must agree with the rest of the answer: --host-ram short is a non-fit like a card that is
short (exit 1, JSON `fits: false`, no plan that needs more host RAM than given), and --gpu with a
--gpu-memory-gib of another size is refused instead of sizing vLLM's share from one card and the fit from another."""

from __future__ import annotations

import json

import pytest

from estimator.hardware import gpus
from estimator.interface import cli

GIB = 2**30
ZERO3_OFFLOAD_7B = ["--model", "7B", "--zero", "3", "--gpus", "8", "--offload-optimizer", "--offload-param"]


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_host_ram_short_is_a_non_fit_in_text_json_and_exit_code(capsys):
    # ZeRO-3 offloads the fp32 master weights and AdamW's two moments of 7.6 B parameters (12 bytes each) to the
    # node's host: about 85 GiB before the parameters themselves, far past 16 GiB
    argv = [*ZERO3_OFFLOAD_7B, "--host-ram", "16", "--gpu", "H100"]
    code, out, _ = _run(argv, capsys)
    first = out.splitlines()[0]
    assert code == 1
    assert "fits the" not in first and "host RAM" in first and "short" in first
    code_json, out_json, _ = _run([*argv, "--json"], capsys)
    d = json.loads(out_json)
    assert code_json == 1 and d["target"]["fits"] is False and "host RAM" in d["target"]["blocked"]
    assert not any(f["fits"] for f in d["fits"])  # the host is short whatever the card


def test_host_ram_that_holds_the_run_changes_nothing(capsys):
    base = [*ZERO3_OFFLOAD_7B, "--gpu", "H100", "--json"]
    code_free, out_free, _ = _run(base, capsys)
    code_big, out_big, _ = _run([*base, "--host-ram", "4096"], capsys)
    assert code_free == code_big == 0
    assert json.loads(out_free)["target"] == json.loads(out_big)["target"]


def test_advice_proposes_no_offload_the_host_cannot_hold(capsys):
    # full fine-tune of 7B over 8 GPUs with ZeRO-3 on a 30 GB card: offloading the optimizer makes the card fit,
    # but puts ~12 bytes x 7.6 B parameters (85 GiB) on the host, more than --host-ram 40
    argv = ["--model", "7B", "--zero", "3", "--gpus", "8", "--gpu", "30GB", "--json"]
    free = json.loads(_run(argv, capsys)[1])["advice"]
    capped = json.loads(_run([*argv, "--host-ram", "40"], capsys)[1])["advice"]
    offload = next(o for o in free["singles"] if o["changes"][0]["key"].startswith("offload"))
    assert offload["fits"] is True
    capped_offload = next(
        o for o in capped["singles"] if o["changes"][0]["key"] == offload["changes"][0]["key"]
    )
    assert capped_offload["fits"] is False
    assert capped["plan"]["fits"] and not any("offload" in c["key"] for c in capped["plan"]["changes"])


def test_solve_with_host_ram_short_finds_nothing_and_says_why(capsys):
    argv = [*ZERO3_OFFLOAD_7B, "--host-ram", "16", "--gpu", "H100", "--solve", "per_device_train_batch_size"]
    code, out, _ = _run([*argv, "--json"], capsys)
    solve = json.loads(out)["solve"]
    assert code == 1 and solve["value"] is None and "host RAM" in solve["note"]


@pytest.mark.parametrize("given", ["200", "40", "60"])
def test_gpu_and_a_different_gpu_memory_gib_are_refused_naming_both(capsys, given):
    code, out, err = _run(
        ["--model", "1.5B", "--use-vllm", "--gpu", "H100", "--gpu-memory-gib", given], capsys
    )
    errors = [line for line in err.splitlines() if ": note: " not in line]
    assert code == 2 and out == "" and len(errors) == 1
    assert "H100 80GB" in errors[0] and f"--gpu-memory-gib is {given}" in errors[0]


def test_gpu_with_its_own_size_is_the_card_alone(capsys):
    # the H100 80GB's driver reports 81559 MiB (79.6 GiB); typing its marketed 80 is that card, not another one
    assert abs(gpus.lookup("H100").memory_gib - 81559 / 1024) < 1e-9
    base = ["--model", "1.5B", "--use-vllm", "--gpu", "H100", "--json"]
    code_alone, out_alone, _ = _run(base, capsys)
    code_both, out_both, _ = _run([*base, "--gpu-memory-gib", "80"], capsys)
    alone, both = json.loads(out_alone), json.loads(out_both)
    assert code_alone == code_both
    assert alone["target"] == both["target"] and alone["verdict"] == both["verdict"]


def test_solve_completion_length_with_a_prompt_past_the_context_finds_none(capsys):
    # Qwen2.5-0.5B's config.json: max_position_embeddings 32768; a 40000-token prompt leaves 32768 - 40000 < 0
    argv = [
        "--model",
        "0.5B",
        "--max-prompt-length",
        "40000",
        "--solve",
        "max_completion_length",
        "--gpu",
        "B200",
    ]
    code, out, _ = _run([*argv, "--json"], capsys)
    solve = json.loads(out)["solve"]
    assert code == 1 and solve["value"] is None and "32768" in solve["note"] and "40000" in solve["note"]
    code, out, _ = _run(argv, capsys)
    assert code == 1 and "that fits: " not in out
    # a prompt that leaves room: the cap is the context left, 32768 - 32000
    code, out, _ = _run([*argv[:3], "32000", *argv[4:], "--json"], capsys)
    assert code == 0 and json.loads(out)["solve"]["value"] == 32768 - 32000
