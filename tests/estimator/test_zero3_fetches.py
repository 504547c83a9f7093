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
    # train order without checkpointing: E(100) 0a(10) 0b(20) 1a(10) 1b(20), then TRL's fused head gathers H(100)
    # itself (outside the hooks: it is traversed as 0 elements), then the layers in reverse and E
    # reuse 1e9 covers the whole trace: every module recurs, all stay: 160 + H = 260 at the head
    assert zero3_live_elements(TOY, "train", False) == 260
    # reuse 25: 1b recurs right after the head (0 traversed): kept; 1a sees 1b twice (40) first: released. At the
    # head 1b + H = 120
    assert zero3_live_elements(TOY, "train", False, reuse=25) == 120
    # reuse 61: 1a sees 40 and 0b 1a 1b 1b 1a (60 < 61) before their backward: kept; 0a sees 70: released. At
    # the head 0b + 1a + 1b + H = 150
    assert zero3_live_elements(TOY, "train", False, reuse=61) == 150
    # reuse 121: E sees 0a 0b 1a 1b 1b 1a 0b 0a (120 < 121): kept, and with it everything -> 260
    assert zero3_live_elements(TOY, "train", False, reuse=121) == 260


def test_gradient_checkpointing_recomputes_each_layer_before_its_backward():
    # backward with checkpointing: H, then per layer (top first) its forward again and its reverse, then E:
    # ... 1b | H | 1a 1b 1b 1a 0a 0b 0b 0a E. With reuse 25, 1a (forward) sees 1b (20) then itself in the
    # recompute: kept; 1b sees itself next: kept -> 1a + 1b + H = 130 at the head
    assert zero3_live_elements(TOY, "train", True, reuse=25) == 130
    assert zero3_live_elements(TOY, "train", True) == 260
    # a scoring forward ends at the fused head: nothing recurs, the head is the largest at once
    assert zero3_live_elements(TOY, "forward", False) == 100
    # one generated token: the head runs as a module, each top-level forward is a new trace
    assert zero3_live_elements(TOY, "decode", False) == 100


def test_a_7b_under_zero3_holds_its_top_layers_and_the_head_at_the_turnaround():
    # Qwen2.5-7B, checkpointing on: a decoder layer gathers 2 x 3584^2 (q, o) + 2 x 3584 x 512 (k, v)
    # + 3 x 3584 x 18944 (MLP) = 233.0 M elements; the top two layers recur within 1e9 elements of their recompute
    # (the third sees 2 x 466 M first), and the untied head (152064 x 3584 = 545 M) is gathered by the fused head
    arch = resolve_model("7B")
    layer = 2 * 3584**2 + 2 * 3584 * 512 + 3 * 3584 * 18944
    assert zero3_live_elements(arch, "train", True) == 2 * layer + 152064 * 3584
    cfg = RunConfig(model="7B", dtype="bfloat16", num_gpus=8, sharding="zero3")
    full = 2 * arch.total_params
    fetched = zero3_fetched_weights(cfg, arch, "train", full)
    assert 2 * (2 * layer + 152064 * 3584) < fetched < 2 * (2 * layer + 152064 * 3584 + 10**8)
    # one GPU without parameter offload: the partition is the parameter, nothing is fetched
    assert zero3_fetched_weights(cfg.with_(num_gpus=1), arch, "train", full) == 0
    # a model below the reuse distance stays gathered through forward and backward: Qwen2.5-0.5B (tied)
    small = resolve_model("0.5B")
    module_weights = (
        small.total_params
        - small.final_norm_params
        - small.num_layers * small.layer_norm_params
        - small.num_layers * sum(lin.out_features for lin in small.layer_linears if lin.bias)
    )
    assert zero3_live_elements(small, "train", False) == module_weights


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
