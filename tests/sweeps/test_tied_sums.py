"""`sweeps.trace.tied_sums.in_place`: a traced out-of-place sum of two live [V, H] gradients becomes the in-place
sum real tensors run; nothing else in a stream changes."""

from __future__ import annotations

from estimator.hardware.allocator import simulate
from sweeps.trace.tied_sums import in_place

VH = 3 * 2**20  # a [V, H] gradient's bytes (large pool)


def _stream() -> list[tuple]:
    """Head's gradient waits (1), activations come and go, the embedding's arrives (3), their sum (4) replaces
    both, then .grad (the sum) is freed after the optimizer."""
    return [
        ("a", 1, VH, 0),
        ("a", 2, 4096, 0),
        ("f", 2),
        ("a", 3, VH, 0),
        ("a", 4, VH, 0),
        ("f", 1),
        ("f", 3),
        ("a", 5, 512, 0),
        ("f", 5),
        ("f", 4),
    ]


def test_the_out_of_place_sum_becomes_the_waiting_gradient():
    out, n = in_place(_stream(), VH)
    assert n == 1
    assert out == [
        ("a", 1, VH, 0),
        ("a", 2, 4096, 0),
        ("f", 2),
        ("a", 3, VH, 0),
        ("f", 3),
        ("a", 5, 512, 0),
        ("f", 5),
        ("f", 1),
    ]
    # two [V, H] live at the meeting instead of three
    assert simulate(_stream()).peak_allocated - simulate(out).peak_allocated == VH


def test_other_streams_are_left_alone():
    s = _stream()
    assert in_place(s, 0) == (s, 0)  # no tied gradient
    assert in_place(s, VH + 512) == (s, 0)  # another size
    late = s[:5] + [("a", 6, 512, 0)] + s[5:]  # the frees do not follow the sum at once
    assert in_place(late, VH) == (late, 0)


def test_as_real_applies_where_real_tensors_sum_in_place():
    from estimator.model.catalog import resolve_model
    from estimator.settings.config import RunConfig
    from sweeps.trace.tied_sums import as_real

    arch = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")  # tied embeddings
    vh = arch.vocab_size * arch.hidden_size * 2  # bf16
    s = [(e[0], e[1], vh, e[3]) if e[0] == "a" and e[2] == VH else e for e in _stream()]
    full = RunConfig(model="0.5B", dtype="bfloat16")
    assert len(as_real(s, full, arch)) == len(s) - 2  # TRL's fused head: in place
    assert as_real(s, full.with_(logprob_head="full"), arch) == s  # the model's own lm_head: out of place too
    assert as_real(s, full.with_(use_peft=True), arch) == s  # no [V, H] gradient
