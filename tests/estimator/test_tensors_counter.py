"""`estimate(tensors=...)`: what counts the tensors, the device's own counters or a Python dispatch mode."""

import pytest

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate
from estimator.step.single import train_instants


def test_a_bad_value_is_named_with_what_is_accepted():
    with pytest.raises(ValueError, match=r"tensors='fake': accepted values are real, dispatch"):
        estimate(RunConfig(model="0.5B"), tensors="fake")


def _end_of_backward(cfg: RunConfig, tensors: str) -> int:
    return sum(train_instants(cfg, resolve_model(cfg.model), tensors)["backward_end"].values())


def test_the_counters_differ_by_one_head_gradient_where_a_tied_full_fine_tune_ends_backward():
    # Qwen2.5-0.5B ties its head to the embedding: V x H = 151936 x 896 (its config.json), a bf16 gradient
    full = RunConfig(model="0.5B", dtype="bfloat16")
    assert _end_of_backward(full, "dispatch") - _end_of_backward(full, "real") == 151936 * 896 * 2
    for same in (
        full.with_(use_peft=True),
        full.with_(logprob_head="full"),
    ):  # no [V, H] gradient; out of place on real tensors too
        assert _end_of_backward(same, "dispatch") == _end_of_backward(same, "real")
    # with accumulation the resident .grad takes the sum in place on either counter: still one apart
    ga = full.with_(gradient_accumulation_steps=2)
    assert _end_of_backward(ga, "dispatch") - _end_of_backward(ga, "real") == 151936 * 896 * 2
