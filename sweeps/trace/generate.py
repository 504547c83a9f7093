"""The generation phase as transformers' `generate` runs it in TRL 1.16, as a fixed-length loop FakeTensors can run.

`generate()` itself cannot run on FakeTensors (data-dependent `.item()` checks and stopping criteria), so this is
`GenerationMixin._sample` with the same tensors: prefill with `logits_to_keep=1` into a `DynamicCache`, then per
token a forward on one new position; every forward runs under the accelerate wrapper's autocast and its
bf16 logits are copied to fp32 (`convert_outputs_to_fp32`), `_sample` copies the last-token logits to fp32
again, softmax, multinomial, and the growing `input_ids` / `attention_mask` are re-concatenated each step. No
logits processors run at TRL's defaults (temperature 1, top_p 1, top_k 0). Completions are forced to full length.

Fast-forward (decode 1024 tokens under fake tensors costs ~0.25 s/token at 7B): after the prefill, every cache
layer's keys/values are replaced by tensors of exactly the shapes and dtype the cache would hold after
`C - k` tokens, `[B, kv_heads, P + C - k, head_dim]`, and so are `input_ids` and `attention_mask`; then the last
`k` decode steps run for real. Memory only grows during decoding (the cache and ids get longer), so the last
steps hold the decode peak; the prefill's own peak is seen too. The row's variant says `{"decode": "fast-forward",
"k": k}`; `k >= C` decodes every token.

Without a cache (`use_cache=False`: what `generate` does when the checkpoint's generation config says
`"use_cache": false` and TRL's `generation_kwargs` do not set it, `RunConfig.generation_use_cache`), `_sample`
passes the whole sequence every step (`prepare_inputs_for_generation` with `next_sequence_length=None` clones
`input_ids`), with `use_cache=False` and still `logits_to_keep=1`, and keeps nothing between steps. Fast-forward
there jumps `input_ids` and `attention_mask` to `P + C - k` positions; the allocations of the skipped steps (each
a little longer than the last, which is what fragments the allocator's segments) are then absent, so the
allocator replay of a no-cache stream wants `k >= C`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


def cache_kwarg() -> str:
    """The keyword a decoder's forward takes its KV cache by: `cache` from transformers 5.24 (`past_key_values`
    is deprecated there until 5.40, https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/models/llama/modeling_llama.py#L424-L435),
    `past_key_values` before."""
    import transformers

    from estimator.settings.version_text import parse_version

    return "cache" if parse_version(transformers.__version__) >= (5, 24) else "past_key_values"


def _forward(model, autocast, cache, **kw):
    """One generation forward into `cache` (updated in place), as accelerate wraps it: autocast, then bf16/fp16
    outputs converted to fp32; returns the logits."""
    with autocast:
        out = model(**kw, **({cache_kwarg(): cache} if cache is not None else {}))
    logits = out.logits
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return logits


def _sample_step(logits: torch.Tensor) -> torch.Tensor:
    """`_sample`'s per-token work: fp32 last-token copy, softmax, multinomial."""
    next_token_logits = logits[:, -1, :].to(copy=True, dtype=torch.float32)
    probs = torch.nn.functional.softmax(next_token_logits, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def _fast_forward_cache(cache, length: int) -> None:
    """Replace every cache layer's keys/values with same-shaped tensors `length` positions long.

    A sliding-window layer (transformers `DynamicSlidingWindowLayer.update`, cache_utils.py) keeps only the last
    `sliding_window - 1` positions and counts the rest in `cumulative_length`: it is fast-forwarded the same way.
    """
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        kept = length
        window = getattr(layer, "sliding_window", None)
        if window is not None:
            kept = min(length, window - 1)
            layer.cumulative_length = length
        layer.keys = k.new_zeros((*k.shape[:-2], kept, k.shape[-1]))
        layer.values = v.new_zeros((*v.shape[:-2], kept, v.shape[-1]))


def generate(
    model, batch: int, prompt_len: int, completion_len: int, bf16: bool, k: int = 2, use_cache: bool = True
) -> torch.Tensor:
    """Generate `completion_len` tokens for `batch` prompts of `prompt_len`; returns `[B, P + C]` token ids."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    input_ids = torch.zeros((batch, prompt_len), dtype=torch.long, device=dev)
    attention_mask = torch.ones((batch, prompt_len), dtype=torch.long, device=dev)
    unfinished = torch.ones(batch, dtype=torch.long, device=dev)
    if not use_cache:
        return _generate_without_cache(
            model, autocast, input_ids, attention_mask, unfinished, completion_len, k
        )
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        position_ids = attention_mask.cumsum(-1) - 1
        logits = _forward(
            model,
            autocast,
            cache,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        steps = completion_len
        nxt = _sample_step(logits)
        del logits
        input_ids = torch.cat([input_ids, (nxt * unfinished)[:, None]], dim=-1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
        done = 1
        if k < steps:
            length = prompt_len + steps - k
            _fast_forward_cache(cache, length - 1)
            input_ids = input_ids.new_zeros((batch, length))
            attention_mask = attention_mask.new_ones((batch, length))
            done = steps - k
        for _ in range(done, steps):
            seen = input_ids.shape[1]
            logits = _forward(
                model,
                autocast,
                cache,
                input_ids=input_ids[:, -1:],
                attention_mask=attention_mask,
                position_ids=torch.full((batch, 1), seen - 1, dtype=torch.long, device=dev),
                use_cache=True,
                logits_to_keep=1,
            )
            nxt = _sample_step(logits)
            del logits
            input_ids = torch.cat([input_ids, (nxt * unfinished)[:, None]], dim=-1)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
        del cache
    return input_ids


def _generate_without_cache(model, autocast, input_ids, attention_mask, unfinished, steps: int, k: int):
    """`_sample` with `use_cache=False`: every step a no-grad forward over the whole sequence so far (a clone of
    `input_ids`, as `prepare_inputs_for_generation` makes it), the last position's logits only. The forwards run
    over P, P + 1, ..., P + C - 1 positions; fast-forward runs the first, then the last `k`."""
    batch, prompt_len = input_ids.shape

    def step(ids, mask):
        logits = _forward(
            model,
            autocast,
            None,
            input_ids=ids.clone(),
            attention_mask=mask,
            position_ids=mask.cumsum(-1) - 1,
            use_cache=False,
            logits_to_keep=1,
        )
        nxt = _sample_step(logits)
        del logits
        ids = torch.cat([ids, (nxt * unfinished)[:, None]], dim=-1)
        return ids, torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)

    with torch.no_grad():
        input_ids, attention_mask = step(input_ids, attention_mask)
        remaining = steps - 1
        if k < remaining:
            input_ids = input_ids.new_zeros((batch, prompt_len + steps - k))
            attention_mask = attention_mask.new_ones((batch, prompt_len + steps - k))
            remaining = k
        for _ in range(remaining):
            input_ids, attention_mask = step(input_ids, attention_mask)
    return input_ids
