"""The CLI's answer for any GPU and any size alias: an ambiguous name checks the smaller card and says so, a size or
`--gpu-memory-gib` gets a verdict against a card of that size, a model size alias names the model it chose."""

from __future__ import annotations

import json

from estimator.interface import cli

MIB = 2**20


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_ambiguous_gpu_checks_the_smaller_card_and_says_so(capsys):
    code, out, err = _run(["--model", "0.5B", "--gpu", "A100", "--json"], capsys)
    target = json.loads(out)["target"]
    assert target["gpu"] == "A100 40GB"
    assert any("A100 is 40 GB or 80 GB" in line and "A100-80" in line for line in err.splitlines())


def test_a_size_and_gpu_memory_gib_give_the_same_verdict(capsys):
    base = ["--model", "7B", "--lora", "--json"]
    _, out_size, _ = _run([*base, "--gpu", "24GB"], capsys)
    code_mem, out_mem, _ = _run([*base, "--gpu-memory-gib", "24"], capsys)
    by_size, by_mem = json.loads(out_size)["target"], json.loads(out_mem)["target"]
    # marketed GB read as GiB: 24 x 1024 MiB, of which torch can use all but the 870 MiB unmeasured-gap rule
    assert by_size["usable_bytes"] == by_mem["usable_bytes"] == (24 * 1024 - 870) * MIB
    assert by_size["fits"] == by_mem["fits"] is False  # a 7B LoRA in fp32 weights needs ~36 GiB
    assert code_mem == 1


def test_a_size_alias_names_the_model_it_chose(capsys):
    code, _, err = _run(["--model", "8b", "--json"], capsys)
    assert code == 0
    assert "sized as Qwen/Qwen3-8B" in err  # the alias, matched case-insensitively
