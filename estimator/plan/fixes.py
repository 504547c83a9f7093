"""What fixes the cause when the layout fails (layout.py): vLLM by its own accounting, or a training GPU that
roles beside the policy overfill. Each line names the change and what it frees; all `estimated`."""

from __future__ import annotations

from collections.abc import Callable

from estimator.plan.changes import load_bf16, qlora
from estimator.plan.layout import Layout, VllmFailure
from estimator.settings.config import RunConfig
from estimator.units import GIB


def layout_fixes(
    layout: Layout, cfg: RunConfig, failure_of: Callable[[RunConfig], VllmFailure | None] | None = None
) -> list[str]:
    """The change that fixes the real cause when vLLM fails by its own accounting (layout.py), with what it frees.
    With `failure_of` (vLLM's start-up failure for a changed config: layout.failure_on), a way to load less into
    the trainer is named only if vLLM's request is then free at start-up."""
    v = layout.vllm
    if v is None:
        return []
    kind = v.failure_kind
    if kind is None:
        return _server_push_fix(layout)
    lines: list[str] = []
    if kind == "kv_short":
        need = cfg.sequence_length
        lines.append(
            f"--vllm-max-model-length {need} (TRL vllm_max_model_length, ms-swift vllm_max_model_len) = prompt + "
            f"completion: vLLM sizes "
            f"its start-up check for one request of max_model_len={v.max_model_len} tokens "
            f"({v.one_sequence / GIB:.2f} GiB of KV), the run never needs more than {need}"
        )
    if kind == "no_kv_room":
        lo = ""
        if v.smallest_utilization:
            shorter = (
                f"; less with --vllm-max-model-length {cfg.sequence_length}"
                if v.max_model_len > cfg.sequence_length
                else ""
            )
            lo = f" (at least {v.smallest_utilization} at max_model_len={v.max_model_len}{shorter})"
        knob = (
            "--vllm-server-utilization (trl vllm-serve --gpu_memory_utilization)"
            if v.mode == "server"
            else "vllm_gpu_memory_utilization"
        )
        lines.append(
            f"vLLM's share {v.utilization} does not hold its own weights ({v.weights / GIB:.2f} GiB) and buffers: "
            f"raise {knob}{lo}, or load fewer weights into vLLM (LoRA-only / quantized)"
        )
    if kind == "server_request":
        if v.largest_safe_utilization is not None:
            lines.append(
                f"lower --vllm-server-utilization (trl vllm-serve --gpu_memory_utilization) to "
                f"{v.largest_safe_utilization}, what its card has free beside the CUDA context and the weight push"
            )
    if kind in ("request_not_free", "training_step"):
        if v.largest_safe_utilization is not None:
            lines.append(
                f"lower vllm_gpu_memory_utilization to {v.largest_safe_utilization} (the largest that starts and "
                f"leaves the step room); frees {(v.utilization - v.largest_safe_utilization) * v.requested / max(v.utilization, 1e-9) / GIB:.2f} GiB of vLLM's share"
            )
        elif v.smallest_utilization is None:
            lines.append(
                f"no vllm_gpu_memory_utilization holds vLLM's weights and one max_model_len={v.max_model_len} "
                "request on this card: vLLM needs a larger card, or its weights split over several GPUs "
                "(--vllm-tensor-parallel-size)"
            )
        else:
            lines.append(
                f"no vllm_gpu_memory_utilization from {v.smallest_utilization} (what one max_model_len="
                f"{v.max_model_len} request needs) starts and leaves the step room: make the step smaller (--advice "
                "lists how) or move vLLM to its own GPU (server mode)"
            )
    if kind == "request_not_free" and v.free_at_start is not None:
        candidates = [(t.label, t(cfg)[0].config) for t in (load_bf16, qlora) if t.when(cfg)]
        if cfg.num_gpus > 1 and cfg.sharding != "zero3":
            candidates.append(("--zero 3 (weights sharded over the GPUs)", cfg.with_(sharding="zero3")))

        def after(label: str, c: RunConfig) -> str | None:
            """The way's label, with what still fails after it; None if vLLM's request is still not free."""
            failure = failure_of(c) if failure_of is not None else None
            if failure is None:
                return label
            if failure.kind == "request_not_free":
                return None
            return f"{label} (vLLM then still fails: {_short_failure(failure)})"

        ways = [w for label, c in candidates if isinstance(label, str) and (w := after(label, c))]
        if ways:
            lines.append(
                f"load less into the trainer before vLLM starts (its models take "
                f"{(layout.groups[0].total_bytes - v.free_at_start) / GIB:.2f} GiB then): " + "; ".join(ways)
            )
    return lines


def _server_push_fix(layout: Layout) -> list[str]:
    """A vLLM server that starts but whose GPU runs out when the trainer pushes weights (layout.server_group)."""
    v = layout.vllm
    over = [g for g in layout.groups if g.name == "vLLM server" and not g.fits]
    if v is None or v.mode != "server" or not over:
        return []
    g = over[0]
    lower = (
        f"lower --vllm-server-utilization (trl vllm-serve --gpu_memory_utilization) to "
        f"{v.largest_safe_utilization}"
        if v.largest_safe_utilization is not None and v.largest_safe_utilization < v.utilization
        else "give the server a larger card"
    )
    return [
        f"the vLLM server GPU misses {(g.held_bytes - g.total_bytes) / GIB:.2f} GiB once the trainer pushes weights "
        f"(the weight-sync NCCL group and two packed chunks beside vLLM's share): {lower}"
    ]


def _short_failure(failure: VllmFailure) -> str:
    """vLLM's start-up failure in a few words."""
    if failure.kind == "no_kv_room":
        return "its share does not hold its own weights"
    if failure.kind == "kv_short":
        return "its KV cache does not hold one max_model_len request"
    return failure.text.split(":", 1)[0]


def role_moves(layout: Layout) -> list[str]:
    """When the training GPUs do not fit: each role beside the policy moved to a GPU of its own, with the bytes it
    frees on every training GPU (its resident bytes, at least) and the GPU it costs; largest first."""
    training = layout.groups[0]
    if training.fits:
        return []
    rows = sorted(training.roles[1:], key=lambda r: -r.resident)
    return [
        f"move {r.role} to a GPU of its own (MODEL@own): frees at least {r.resident / GIB:.2f} GiB on each "
        "training GPU, costs one more GPU"
        for r in rows
    ]


def own_gpu_fixes(layout: Layout) -> list[str]:
    """A GPU of roles placed on their own that does not hold them: what it misses, and what can make it hold them
    (a larger card, or the role sharded over several under ZeRO-3 / FSDP: MODEL@own:N)."""
    return [
        f"the {g.name} GPU misses {(g.held_bytes - g.total_bytes) / GIB:.2f} GiB: give it a larger card, or "
        "several with --zero 3 / --fsdp (MODEL@own:N shards it over N)"
        for g in layout.groups[1:]
        if not g.fits and g.name != "vLLM server"
    ]
