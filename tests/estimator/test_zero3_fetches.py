"""ZeRO-3's parameter fetches, from DeepSpeed 0.19.8's release rule worked by hand
(runtime/zero/partitioned_param_coordinator.py `__params_to_release`: a module's parameters stay gathered when the
module recurs before `stage3_max_reuse_distance` elements of the trace have been traversed)."""

from __future__ import annotations

import json

from cli_json import estimate, run

from estimator.model.architecture import Arch, Linear
from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate as run_estimate
from estimator.terms.sharding import zero3_fetched_weights, zero3_live_elements

# embedding 10 x 10 = 100, two layers of a (5 x 2 = 10) and b (4 x 5 = 20), untied head 100; no norms
TOY = Arch(
    name="toy",
    model_type="qwen2",
    hidden_size=10,
    num_layers=2,
    num_heads=1,
    num_kv_heads=1,
    head_dim=10,
    intermediate_size=2,
    vocab_size=10,
    tie_word_embeddings=False,
    layer_linears=(Linear("a", 5, 2), Linear("b", 4, 5)),
    layer_norm_params=0,
    final_norm_params=0,
)


def test_release_rule_by_hand():
    # order without checkpointing: E(100) 0a(10) 0b(20) 1a(10) 1b(20) H(100), then the reverse
    # reuse 1e9 covers the whole trace: every module recurs in backward, all six stay: 260 at H's forward
    assert zero3_live_elements(TOY, "train", False) == 260
    # reuse 25: each layer module sees >= 25 elements before its next use, so it goes; H recurs next and stays,
    # then goes after its backward: never more than H alone
    assert zero3_live_elements(TOY, "train", False, reuse=25) == 100
    # reuse 150: ahead of 1b are H, H (200 >= 150 before 1b recurs): released; 1a likewise: H alone again
    assert zero3_live_elements(TOY, "train", False, reuse=150) == 100
    # reuse 250: ahead of 1b are H, H (200 < 250) then 1b: kept; of 1a: 1b H H 1b (240 < 250) then 1a: kept;
    # of 0b: 1a 1b H H 1b 1a (250 >= 250 before 0b): released. At H's forward 1a + 1b + H = 130
    assert zero3_live_elements(TOY, "train", False, reuse=250) == 130


def test_gradient_checkpointing_recomputes_each_layer_before_its_backward():
    # backward: H, then per layer (top first) its forward again and its reverse, then E:
    # ... H | H 1a 1b 1b 1a 0a 0b 0b 0a E. With reuse 25: 1a (recomputed) sees 1b 1b (40) before its backward:
    # released; 1b recurs next: kept, alone; H is the most at once
    assert zero3_live_elements(TOY, "train", True, reuse=25) == 100
    # reuse 1e9: everything recurs, and at H's forward all of it is gathered
    assert zero3_live_elements(TOY, "train", True) == 260


def test_a_7b_under_zero3_holds_at_least_its_largest_module_gathered():
    # Qwen2.5-7B: the untied head (152064 x 3584 = 545 M elements) must be whole to run; beside the 7.6 B total,
    # DeepSpeed's 1e9 reuse distance keeps nothing else across the head's two uses
    arch = resolve_model("7B")
    cfg = RunConfig(model="7B", dtype="bfloat16", num_gpus=8, sharding="zero3")
    full = 2 * arch.total_params
    fetched = zero3_fetched_weights(cfg, arch, "train", full)
    assert 2 * 152064 * 3584 <= fetched < 2 * (152064 * 3584 + 10**8)
    # one GPU without parameter offload: the partition is the parameter, nothing is fetched
    assert zero3_fetched_weights(cfg.with_(num_gpus=1), arch, "train", full) == 0
    # a model below the reuse distance stays gathered through forward and backward: Qwen2.5-0.5B
    small = resolve_model("0.5B")
    assert zero3_live_elements(small, "train", False) == small.total_params - small.final_norm_params - (
        small.num_layers * small.layer_norm_params
    ) - small.num_layers * sum(lin.out_features for lin in small.layer_linears if lin.bias)


def test_ds3_gather_for_generation_off_fetches_module_by_module(tmp_path, capsys):
    gathered = run_estimate(RunConfig(model="7B", num_gpus=8, sharding="zero3"))
    fetched = run_estimate(
        RunConfig(model="7B", num_gpus=8, sharding="zero3", ds3_gather_for_generation=False)
    )
    full = gathered.phases["generate"]["gathered_weights"]
    assert full == 2 * 7_615_616_512  # the whole bf16 policy (DeepSpeed casts it)
    assert fetched.phases["generate"]["gathered_weights"] < full / 10
    # read from a TRL file as TRL names it
    p = tmp_path / "grpo.yaml"
    p.write_text("ds3_gather_for_generation: false\n")
    got = estimate(["--model", "7B", "--gpus", "8", "--zero", "3", "--config", str(p)], capsys)
    assert got["config"]["ds3_gather_for_generation"] is False


def answer(argv, capsys) -> dict:
    """The JSON answer whether or not the run fits (exit 0 or 1)."""
    code, out, err = run([*argv, "--json"], capsys)
    assert code in (0, 1), err
    return json.loads(out)


def test_advice_offers_fetching_in_generation_where_zero3_gathers(capsys):
    argv = ["--model", "7B", "--dtype", "bfloat16", "--gpus", "8", "--zero", "3", "--gpu", "A10G", "--advice"]
    singles = answer(argv, capsys)["advice"]["singles"]
    (change,) = [s for s in singles if s["changes"][0]["key"] == "no_gather"]
    # the generation phase held the whole bf16 policy gathered (2 x 7.6 B); fetching keeps about one module
    assert change["saved_bytes"] > 2 * 7_615_616_512 * 0.8
    # the flag the advice names runs as written
    flagged = answer([*argv, "--no-ds3-gather-for-generation"], capsys)
    assert flagged["phases"]["generate"]["gathered_weights"] < 2 * 7_615_616_512 / 10
    for other in (["--zero", "2"], ["--zero", "3", "--use-vllm"]):
        keys = {s["changes"][0]["key"] for s in answer([*argv, *other], capsys)["advice"]["singles"]}
        assert "no_gather" not in keys, other
