"""Every role on the card: the policy's Estimate plus reward, reference and value models and vLLM, per GPU.

`plan(est, roles, vllm_settings)` places each role on the training GPUs (sharded like the policy under ZeRO-3 /
FSDP) or on GPUs of its own, and checks vLLM the way vLLM checks itself (terms/vllm.py): in colocate mode whether
it starts (its request must be free when it starts, after the policy has loaded) and whether the training step
then fits beside it; in server mode a report for the vLLM card(s). Every number is `estimated`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.settings.role_spec import PLACEMENTS, ROLE_KINDS, Role, config_roles  # noqa: F401 (re-exported)
from estimator.step import offload
from estimator.step.estimate import Estimate, allocator_layers
from estimator.step.single import resident
from estimator.terms import allocator_reserve as allocator_term
from estimator.terms import overhead
from estimator.terms import roles as rt
from estimator.terms import vllm as vt
from estimator.terms import weights as wt
from estimator.terms.sharding import deepspeed_dtype_config, shard
from estimator.units import nbytes


@dataclass(frozen=True)
class VllmSettings:
    """vLLM's settings as the layout reads them (`VllmSettings.of(cfg)`: RunConfig's vllm_* fields)."""

    max_model_length: int | None = (
        None  # TRL vllm_max_model_length / ms-swift vllm_max_model_len; None = model's
    )
    tensor_parallel_size: int = 1  # TRL vllm_tensor_parallel_size
    sleep_level: int = (
        2  # TRL 1.16 always sleeps at level 2 when vllm_enable_sleep_mode; ms-swift sleep_level
    )
    share_base: bool = False  # vLLM loads only the LoRA weights and shares the base (Unsloth fast_inference)
    server_gpus: int = 1  # server mode: GPUs running `trl vllm-serve` (data parallel × tensor parallel)
    server_utilization: float = vt.TRL_SERVE_UTILIZATION  # `trl vllm-serve --gpu_memory_utilization`
    starts_first: bool = (
        False  # colocate: vLLM reserves its share before the trainer loads (OpenRLHF/ORZ Ray order)
    )

    @classmethod
    def of(cls, cfg: RunConfig) -> VllmSettings:
        """The vLLM settings a RunConfig carries (its vllm_* fields)."""
        return cls(
            max_model_length=cfg.vllm_max_model_length,
            tensor_parallel_size=cfg.vllm_tensor_parallel_size,
            sleep_level=cfg.resolved_vllm_sleep_level or 2,
            share_base=cfg.vllm_share_base,
            server_gpus=cfg.vllm_server_gpus,
            server_utilization=cfg.vllm_server_utilization,
            starts_first=cfg.vllm_starts_first,
        )


@dataclass(frozen=True)
class RoleBytes:
    """One role on one GPU: bytes it holds all step, and bytes its own work adds at its peak."""

    role: str
    resident: int
    working: int
    loaded: int = 0  # bytes held at start-up, before any optimizer state exists (the weights)


@dataclass(frozen=True)
class GpuGroup:
    """GPUs that hold the same roles: how many, what each holds, and the estimated nvidia-smi peak of each."""

    name: str
    count: int
    roles: tuple[RoleBytes, ...]
    peak_device_bytes: int
    total_bytes: int
    # training GPUs: what the card must hold as the fit verdict counts it (`training_need`); None: the peak
    need_bytes: int | None = None

    @property
    def held_bytes(self) -> int:
        """What the fit is decided on: `need_bytes` where known, else the nvidia-smi peak."""
        return self.need_bytes if self.need_bytes is not None else self.peak_device_bytes

    @property
    def fits(self) -> bool:
        return self.held_bytes <= self.total_bytes


FailureKind = Literal[
    "server_request", "request_not_free", "no_kv_room", "kv_short", "load_after", "training_step"
]
START_UP_KINDS: frozenset[str] = frozenset({"server_request", "request_not_free", "no_kv_room", "kv_short"})


@dataclass(frozen=True)
class VllmFailure:
    """Why vLLM fails, by its own checks: a kind to branch on and the line a reader sees.

    server_request: a server's request exceeds its card's free memory at start-up; request_not_free: colocated,
    its request is not free after the trainer loaded; no_kv_room: its share leaves nothing for the KV cache;
    kv_short: its KV pool does not hold one max_model_len request; load_after: vLLM started first and the
    trainer's models do not load beside its share; training_step: vLLM starts, the step beside it does not fit."""

    kind: FailureKind
    text: str

    @property
    def at_start_up(self) -> bool:
        return self.kind in START_UP_KINDS


@dataclass(frozen=True)
class VllmCheck:
    """vLLM's own accounting on one of its GPUs, and the verdict: where it fails, if it does."""

    mode: str
    utilization: float
    requested: int
    weights: int
    activation_peak: int
    non_torch: int
    cuda_graphs: int
    kv_cache: int
    kv_tokens: int
    max_model_len: int
    one_sequence: int
    free_at_start: int | None  # colocate only: free memory when vLLM starts
    failure: str | None  # the reader's line (VllmFailure.text)
    largest_safe_utilization: float | None = None
    smallest_utilization: float | None = None
    sleep_residue: int = 0  # colocate with sleep mode: what stays on the GPU while vLLM sleeps
    host_bytes: int = 0  # sleep level 1: vLLM's weights parked in pinned host RAM
    failure_kind: FailureKind | None = None  # VllmFailure.kind
    graphs_on_top: int = (
        0  # CUDA graphs held beyond the request (vLLM before 0.21: terms/vllm.py VLLM_GRAPHS)
    )


@dataclass(frozen=True)
class Layout:
    groups: tuple[GpuGroup, ...]
    vllm: VllmCheck | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_gpus(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def fits(self) -> bool:
        return all(g.fits for g in self.groups) and (self.vllm is None or self.vllm.failure is None)

    @property
    def blockers(self) -> tuple[str, ...]:
        """What fails, in a few words each: vLLM's start-up or the models loading after it, or a GPU group."""
        out = []
        kind = self.vllm.failure_kind if self.vllm is not None else None
        if kind in START_UP_KINDS:
            out.append("vLLM start-up")
        elif kind == "load_after":
            out.append("loading the models after vLLM's share")
        out += [f"{g.name} GPU" for g in self.groups if not g.fits]
        return tuple(out)


ArchFn = Callable[[str], Arch]


def _role_bytes(cfg: RunConfig, role: Role, arch: Arch, shards: int) -> RoleBytes:
    """Resident (sharded over `shards` GPUs under ZeRO-3 / FSDP) and working bytes of one role."""
    sharded = cfg.sharding in ("zero3", "fsdp") and shards > 1

    def part(n: int) -> int:
        return -(-n // shards) if sharded else n

    if role.kind == "reward":
        return RoleBytes(
            f"reward {role.model}", part(rt.reward_weights(cfg, arch)), rt.reward_forward_peak(cfg, arch)
        )
    if role.kind == "reference":
        ref = part(rt.frozen_weights(cfg, arch))
        return RoleBytes(f"reference {role.model}", ref, rt.reference_forward_peak(cfg, arch), ref)
    states = rt.critic_states(cfg, arch)
    if cfg.sharding in ("zero2", "zero3", "fsdp") and shards > 1:
        c = cfg.with_(num_gpus=shards)
        states = {k: shard(c, k, v) for k, v in states.items()}
    return RoleBytes(
        f"value {role.model}", sum(states.values()), rt.critic_train_peak(cfg, arch), states["weights"]
    )


def _device(
    cfg: RunConfig, allocated: int, shares: allocator_term.Shares = allocator_term.NO_GENERATION
) -> int:
    """allocated + the allocator's reserve + one CUDA context (terms/overhead.py); `shares`: where generation sits
    on this GPU (a role's own GPU runs none)."""
    return allocated + overhead.allocator_overhead(cfg, allocated, shares) + overhead.cuda_context(cfg)


def policy_resident(cfg: RunConfig, arch: Arch) -> int:
    """What the policy holds through its step (weights, adapters, optimizer state, vLLM's share) on one GPU; what
    CPU offload moves to the host is not on it (step/offload.py, as the step's own phases)."""
    held, _ = offload.apply(cfg, arch, {"held": resident(deepspeed_dtype_config(cfg), arch)})
    return sum(held["held"].values())


def training_peak(est: Estimate, roles: list[RoleBytes]) -> int:
    """nvidia-smi peak of a training GPU: the policy's peak with every role resident beside it, or a role's own work
    while the policy holds only its resident state, whichever is larger."""
    cfg, arch = est.config, est.arch
    held = sum(r.resident for r in roles)
    candidates = [est.peak_allocated_bytes + held]
    base = policy_resident(cfg, arch) + held
    candidates += [base + r.working for r in roles]
    peak = max(candidates)
    # the policy generates on this GPU with the roles' resident state beside it; a role's own work may set the peak
    shares = allocator_term.shares_of({p: {**c, "roles": held} for p, c in est.phases.items()}, peak)
    return _device(cfg, peak, shares)


def vllm_weights(cfg: RunConfig, arch: Arch, settings: VllmSettings) -> int:
    """vLLM's own copy per rank: packed GPTQ/AWQ, bitsandbytes 4-bit (TRL passes quantization='bitsandbytes'),
    the checkpoint's 16-bit weights, or only LoRA slots when it shares the trainer's base."""
    tp = settings.tensor_parallel_size
    if settings.share_base and cfg.use_peft:
        targets = [(lin.in_features, lin.out_features) for lin in wt.lora_targets(cfg, arch)]
        return vt.lora_buffer_bytes(arch, cfg.lora_r, targets, tp)
    if cfg.load_in_4bit:
        return -(-wt.qlora_base_weights(arch, "bfloat16") // tp)
    return vt.checkpoint_weight_bytes(arch, tp)


def max_model_len(arch: Arch, settings: VllmSettings) -> int:
    """vllm_max_model_length, or the model's max_position_embeddings (vLLM's derived default; 2048 if none)."""
    if settings.max_model_length:
        return settings.max_model_length
    return int((arch.extra or {}).get("config", {}).get("max_position_embeddings") or 2048)


def vllm_budget(
    cfg: RunConfig, arch: Arch, settings: VllmSettings, total: int, utilization: float, server: bool
) -> tuple[int, int, int, int, int, int]:
    """(requested, weights, activation peak, non-torch, CUDA graphs, KV) of one vLLM rank at `utilization`."""
    tp = settings.tensor_parallel_size
    requested = vt.requested_memory(total, utilization)
    weights = vllm_weights(cfg, arch, settings)
    activation = profile_activation(cfg, arch, settings, total, server)
    non_torch = vt.non_torch_bytes(tp)
    graphs = vt.graphs_charged(cfg)
    kv = vt.kv_pool(requested, weights, activation, non_torch, graphs)
    return requested, weights, activation, non_torch, graphs, kv


def profile_activation(cfg: RunConfig, arch: Arch, settings: VllmSettings, total: int, server: bool) -> int:
    """vLLM's profile-run peak on a card of `total`: `vllm serve`'s batch defaults for that card in server mode,
    TRL's colocate arguments otherwise (terms/vllm.py)."""
    tp = settings.tensor_parallel_size
    if server:
        tokens, seqs = vt.server_batch_defaults(total)
    else:
        tokens, seqs = vt.TRL_MAX_NUM_BATCHED_TOKENS, cfg.generation_sequences * tp
    return vt.profile_activation_peak(arch, tokens, seqs, tp)


def server_free_at_start(cfg: RunConfig, settings: VllmSettings, total: int) -> int:
    """What a `trl vllm-serve` GPU has free when vLLM takes its snapshot: the card less the server's CUDA context
    and its TP communicators (set up before the snapshot)."""
    return total - server_context(cfg) - vt.non_torch_bytes(settings.tensor_parallel_size)


def server_weight_sync(cfg: RunConfig, arch: Arch, settings: VllmSettings, activation_peak: int) -> int:
    """What each vLLM server GPU holds beyond its start-up footprint once the trainer pushes weights: the
    weight-sync NCCL communicator, and the packed chunks it receives (`packed_nccl_broadcast_consumer`: every
    rank receives every tensor whole) less the profile-activation room inside its request, which no forward uses
    during the push. Nothing for TRL 0.14-0.15's in-process vLLM device (`vt.in_process_device`)."""
    if vt.in_process_device(cfg):
        return 0
    chunks = vt.packed_broadcast_bytes(
        vt.sent_tensor_bytes(arch, wt.policy_weights(cfg, arch), nbytes(cfg.dtype))
    )
    return overhead.server_weight_sync_nccl(settings.server_gpus) + max(0, chunks - activation_peak)


def _kv_failure(kv: int, one: int, length: int) -> VllmFailure | None:
    if kv <= 0:
        return VllmFailure(
            "no_kv_room",
            "vLLM start-up: no memory left for the KV cache (weights, activations and graphs exceed its share)",
        )
    if kv < one:
        return VllmFailure(
            "kv_short",
            f"vLLM start-up: one max_model_len={length} request needs {one / 2**30:.2f} GiB of KV cache, "
            f"only {kv / 2**30:.2f} GiB is left",
        )
    return None


def smallest_utilization(
    cfg: RunConfig, arch: Arch, settings: VllmSettings, total: int, server: bool
) -> float | None:
    """Smallest gpu_memory_utilization (2 decimals) whose KV pool holds one max_model_len request."""
    one = vt.one_sequence_kv(arch, max_model_len(arch, settings), settings.tensor_parallel_size)
    for u100 in range(1, 100):
        if vllm_budget(cfg, arch, settings, total, u100 / 100, server)[5] >= one:
            return u100 / 100
    return None


def server_share_range(
    cfg: RunConfig, arch: Arch, settings: VllmSettings, total: int
) -> tuple[float | None, float]:
    """trl vllm-serve's --gpu_memory_utilization values with which a vLLM server starts on its own card and then
    takes the trainer's weights: from the smallest whose KV pool holds one max_model_len request (None if none
    does) to the largest that leaves the CUDA context, the TP communicators, the CUDA graphs a vLLM before 0.21
    captures beyond its request, and the weight push room (2 decimals)."""
    lo = smallest_utilization(cfg, arch, settings, total, True)
    push = server_weight_sync(cfg, arch, settings, profile_activation(cfg, arch, settings, total, True))
    room = server_free_at_start(cfg, settings, total) - push - vt.graphs_on_top(cfg)
    return lo, vt.largest_startable_utilization(room, total)


def init_resident(cfg: RunConfig, arch: Arch, roles: list[RoleBytes]) -> int:
    """What a training GPU holds when TRL starts vLLM (GRPOTrainer.__init__): context + weights, reference,
    adapters and roles' weights; no optimizer state yet (it appears at the first optimizer step)."""
    held = resident(deepspeed_dtype_config(cfg), arch)
    loaded = held.get("weights", 0) + held.get("reference_weights", 0) + held.get("lora_adapters", 0)
    return overhead.cuda_context(cfg) + loaded + sum(r.loaded for r in roles)


def start_failure(
    cfg: RunConfig, arch: Arch, settings: VllmSettings, total_bytes: int, on_policy: list[RoleBytes]
) -> VllmFailure | None:
    """Why vLLM does not start, by its own checks (terms/vllm.py), or None: colocated, its request must be free
    after the trainer has loaded (or, when it starts first, the trainer's models must load beside its share);
    in either mode its KV pool must hold one max_model_len request. Arithmetic only: no estimate."""
    server = cfg.vllm_mode == "server"
    util = settings.server_utilization if server else cfg.vllm_gpu_memory_utilization
    requested, *_, kv = vllm_budget(cfg, arch, settings, total_bytes, util, server)
    length = max_model_len(arch, settings)
    one = vt.one_sequence_kv(arch, length, settings.tensor_parallel_size)
    context = overhead.cuda_context(cfg)
    comms = vt.non_torch_bytes(settings.tensor_parallel_size)  # set up before vLLM's snapshot
    if server:
        if not vt.starts(server_free_at_start(cfg, settings, total_bytes), total_bytes, util):
            return VllmFailure(
                "server_request", "vLLM start-up: its request exceeds the free memory of its card"
            )
        return _kv_failure(kv, one, length)
    loaded = init_resident(cfg, arch, on_policy)
    held = vt.footprint(requested, settings.tensor_parallel_size, vt.graphs_on_top(cfg))
    if settings.starts_first and held + loaded > total_bytes:
        return VllmFailure(
            "load_after",
            f"loading the models after vLLM took {util} × {total_bytes / 2**30:.2f} GiB = "
            f"{held / 2**30:.2f} GiB: they need {(loaded - context) / 2**30:.2f} GiB, "
            f"{(total_bytes - held - context) / 2**30:.2f} GiB is left",
        )
    free = total_bytes - (context if settings.starts_first else loaded) - comms
    if not vt.starts(free, total_bytes, util):
        have = (
            f"only {free / 2**30:.2f} GiB is free after the trainer loaded"
            if free >= 0
            else f"the trainer's loaded models already take {(total_bytes - free) / 2**30:.2f} GiB of the "
            f"card's {total_bytes / 2**30:.2f} GiB"
        )
        return VllmFailure(
            "request_not_free",
            f"vLLM start-up: it asks {util} × {total_bytes / 2**30:.2f} GiB = {requested / 2**30:.2f} GiB, "
            + have,
        )
    return _kv_failure(kv, one, length)


def failure_on(
    roles: list[Role], arch_of: ArchFn, total_bytes: int
) -> Callable[[RunConfig, Arch], VllmFailure | None]:
    """`start_failure` for any config of this run on a card of `total_bytes`, with the roles placed on the policy's
    GPUs loaded beside it; None when the run uses no vLLM."""

    def failure(cfg: RunConfig, arch: Arch) -> VllmFailure | None:
        if not cfg.use_vllm:
            return None
        on_policy = [
            _role_bytes(cfg, r, arch_of(r.model), cfg.num_gpus) for r in roles if r.placement == "policy"
        ]
        return start_failure(cfg, arch, VllmSettings.of(cfg), total_bytes, on_policy)

    return failure


def starts_on(roles: list[Role], arch_of: ArchFn, total_bytes: int) -> Callable[[RunConfig, Arch], bool]:
    """Whether vLLM starts for a config of this run on a card of `total_bytes` (`failure_on`)."""
    failure = failure_on(roles, arch_of, total_bytes)
    return lambda cfg, arch: failure(cfg, arch) is None


def others_fit_on(roles: list[Role], arch_of: ArchFn, total_bytes: int) -> Callable[[RunConfig, Arch], bool]:
    """Whether the GPUs of roles placed on their own (`MODEL@own`) hold them, and a vLLM server's GPU holds the
    weight push once it has started (`server_group`), for any config of this run on cards of `total_bytes`; True
    when there are none."""

    def fit(cfg: RunConfig, arch: Arch) -> bool:
        if cfg.use_vllm and cfg.vllm_mode == "server":
            if not server_group(cfg, arch, VllmSettings.of(cfg), total_bytes).fits:
                return False
        return all(g.fits for g in _own_groups(cfg, roles, arch_of, total_bytes))

    return fit


def server_context(cfg: RunConfig) -> int:
    """The CUDA context and workspaces of a `trl vllm-serve` process on each of its GPUs: the trainer's
    communicators are not there (its weight-sync group is `server_weight_sync`'s)."""
    return overhead.cuda_context(cfg.with_(num_gpus=1, use_vllm=False))


def server_group(cfg: RunConfig, arch: Arch, settings: VllmSettings, total_bytes: int) -> GpuGroup:
    """Each `trl vllm-serve` GPU: vLLM's footprint at its share (`vt.footprint`), the weight push it takes
    afterwards (`server_weight_sync`), and the CUDA context."""
    requested, _, activation, *_ = vllm_budget(
        cfg, arch, settings, total_bytes, settings.server_utilization, True
    )
    held = vt.footprint(requested, settings.tensor_parallel_size, vt.graphs_on_top(cfg))
    sync = server_weight_sync(cfg, arch, settings, activation)
    row = RoleBytes(f"vLLM server (TP {settings.tensor_parallel_size})", held, sync)
    return GpuGroup(
        "vLLM server", settings.server_gpus, (row,), held + sync + server_context(cfg), total_bytes
    )


def _own_groups(cfg: RunConfig, roles: list[Role], arch_of: ArchFn, total_bytes: int) -> list[GpuGroup]:
    """The GPUs of roles placed on their own: one group per `=GROUP` (roles sharing it share its GPUs)."""
    groups = []
    own: dict[str, list[Role]] = {}
    for i, r in enumerate(roles):
        if r.placement == "own":
            own.setdefault(r.group or f"#{i}", []).append(r)
    for name, members in own.items():
        gpus = max(r.gpus for r in members)
        rows = tuple(_role_bytes(cfg, r, arch_of(r.model), gpus) for r in members)
        held = sum(b.resident for b in rows)
        peak = _device(cfg, held + max(b.working for b in rows))
        label = name if not name.startswith("#") else f"{members[0].kind} ({members[0].model})"
        groups.append(GpuGroup(label, gpus, rows, peak, total_bytes))
    return groups


def _vllm(
    est: Estimate,
    roles: list[Role],
    settings: VllmSettings,
    arch_of: ArchFn,
    total_bytes: int,
    on_policy: list[RoleBytes],
    training: GpuGroup,
    estimate_fn: Callable[[RunConfig, Arch], Estimate] | None,
) -> tuple[VllmCheck, list[GpuGroup], list[str]]:
    """vLLM checked as vLLM checks itself: its budget, its start-up and KV cache, the server's own GPUs."""
    cfg, arch = est.config, est.arch
    extra: list[GpuGroup] = []
    notes: list[str] = []
    server = cfg.vllm_mode == "server"
    util = settings.server_utilization if server else cfg.vllm_gpu_memory_utilization
    requested, weights, activation, non_torch, graphs, kv = vllm_budget(
        cfg, arch, settings, total_bytes, util, server
    )
    length = max_model_len(arch, settings)
    one = vt.one_sequence_kv(arch, length, settings.tensor_parallel_size)
    failure = start_failure(cfg, arch, settings, total_bytes, on_policy)
    free = None
    largest = None
    if server:  # its own card: the step does not bound its share, what is free at start-up does
        free = server_free_at_start(cfg, settings, total_bytes)
        floor, cap = server_share_range(cfg, arch, settings, total_bytes)
        largest = cap if floor is not None and floor <= cap else None
        extra.append(server_group(cfg, arch, settings, total_bytes))
    else:
        loaded = init_resident(cfg, arch, on_policy)
        comms = vt.non_torch_bytes(settings.tensor_parallel_size)
        free = total_bytes - (overhead.cuda_context(cfg) if settings.starts_first else loaded) - comms
        if failure is None and not training.fits:
            failure = VllmFailure(
                "training_step",
                f"training step (step 1, {est.peak_phase} phase): the trainer and vLLM's share exceed the card",
            )
        start_cap = total_bytes - loaded - comms if settings.starts_first else free
        floor = smallest_utilization(cfg, arch, settings, total_bytes, server)
        largest = _largest_safe(est, roles, settings, arch_of, total_bytes, start_cap, floor, estimate_fn)
    check = VllmCheck(
        "server" if server else "colocate",
        util,
        requested,
        weights,
        activation,
        non_torch,
        graphs,
        max(kv, 0),  # vLLM's arithmetic may leave nothing: the failure says so
        vt.kv_tokens(kv, arch, settings.tensor_parallel_size),
        length,
        one,
        free,
        failure.text if failure is not None else None,
        largest,
        smallest_utilization(cfg, arch, settings, total_bytes, server),
        *_sleep(cfg, settings, weights, server),
        failure_kind=failure.kind if failure is not None else None,
        graphs_on_top=vt.graphs_on_top(cfg),
    )
    if check.kv_tokens and check.kv_tokens < cfg.generation_sequences * cfg.sequence_length:
        notes.append(
            f"vLLM's KV cache holds {check.kv_tokens} tokens, less than the generation batch's "
            f"{cfg.generation_sequences} × {cfg.sequence_length}: it generates in waves (slower, not OOM)"
        )
    return check, extra, notes


def plan(
    est: Estimate,
    roles: list[Role],
    settings: VllmSettings,
    arch_of: ArchFn,
    total_bytes: int,
    estimate_fn: Callable[[RunConfig, Arch], Estimate] | None = None,
) -> Layout:
    """Per-GPU, per-role bytes of a layout and the number of GPUs it needs; vLLM checked as vLLM checks itself."""
    cfg, arch = est.config, est.arch
    on_policy = [
        _role_bytes(cfg, r, arch_of(r.model), cfg.num_gpus) for r in roles if r.placement == "policy"
    ]
    policy_row = RoleBytes(
        "policy (TRL step)", policy_resident(cfg, arch), est.peak_allocated_bytes - policy_resident(cfg, arch)
    )
    groups = [
        GpuGroup(
            "training",
            cfg.num_gpus,
            (policy_row, *on_policy),
            banded_training_peak(est, on_policy),
            total_bytes,
            training_need(est, roles, arch_of),
        )
    ]
    groups += _own_groups(cfg, roles, arch_of, total_bytes)
    check, notes = None, []
    if cfg.use_vllm:
        check, server_group, notes = _vllm(
            est, roles, settings, arch_of, total_bytes, on_policy, groups[0], estimate_fn
        )
        groups += server_group
    return Layout(tuple(groups), check, tuple(notes))


def _sleep(cfg: RunConfig, settings: VllmSettings, weights: int, server: bool) -> tuple[int, int]:
    """(GPU residue, pinned host bytes) of a sleeping colocated vLLM; (0, 0) when it never sleeps."""
    if server or not cfg.vllm_sleeps:
        return 0, 0
    level = settings.sleep_level
    return vt.sleep_residue(level, settings.tensor_parallel_size), vt.sleep_host_bytes(level, weights)


def banded_training_peak(est: Estimate, on_policy: list[RoleBytes]) -> int:
    """A training GPU's peak with the estimated tensor peak raised by the validated error band of its regime
    (`Estimate.band_bytes`, estimator/step/band.py), as report.check_fit decides fits; vLLM's share is not raised."""
    return training_peak(est, on_policy) + est.band_bytes


def training_need(est: Estimate, roles: list[Role], arch_of: ArchFn) -> int:
    """What a training GPU must hold, counted as the fit verdict counts it (`Estimate.fit_bytes`: the allocator
    frees its cache and retries before an OOM, raised by the validated band), with the roles placed on the policy's
    GPUs beside it (`with_roles`): the number the advice, --solve and each card's fit compare with the card."""
    if not any(r.placement == "policy" for r in roles):
        return est.fit_bytes
    return with_roles(lambda c, a: est, roles, arch_of)(est.config, est.arch).fit_bytes


def _largest_safe(
    est: Estimate,
    roles: list[Role],
    settings: VllmSettings,
    arch_of: ArchFn,
    total: int,
    free_at_start: int,
    floor: float | None,
    estimate_fn: Callable[[RunConfig, Arch], Estimate] | None,
) -> float | None:
    """Largest gpu_memory_utilization (2 decimals) that starts, holds one max_model_len request (at least `floor`,
    `smallest_utilization`) and leaves the training step room on the card; None when no share does all three."""
    if estimate_fn is None or floor is None:
        return None
    cfg, arch = est.config, est.arch
    cap = vt.largest_startable_utilization(free_at_start, total)
    best = None
    lo, hi = round(floor * 100), min(99, int(math.floor(cap * 100)))
    while lo <= hi:
        mid = (lo + hi) // 2
        e = estimate_fn(cfg.with_(vllm_gpu_memory_utilization=mid / 100), arch)
        if training_need(e, roles, arch_of) <= total:
            best, lo = mid / 100, mid + 1
        else:
            hi = mid - 1
    return best


def with_roles(
    estimate_fn: Callable[[RunConfig, Arch], Estimate], roles: list[Role], arch_of: ArchFn
) -> Callable[[RunConfig, Arch], Estimate]:
    """An estimate function whose training-GPU phases also hold the roles placed on the policy's GPUs: every
    role's resident bytes in every phase, the reward/reference passes in `score`, the critic's step in `optimizer`
    (so advice and --solve see the whole card)."""
    placed = [r for r in roles if r.placement == "policy"]

    def fn(cfg: RunConfig, arch: Arch) -> Estimate:
        est = estimate_fn(cfg, arch)
        if not placed:
            return est
        rows = [(r.kind, _role_bytes(cfg, r, arch_of(r.model), cfg.num_gpus)) for r in placed]
        held = sum(b.resident for _, b in rows)
        nograd = max((b.working for k, b in rows if k != "value"), default=0)
        critic = max((b.working for k, b in rows if k == "value"), default=0)
        phases = {p: dict(c) for p, c in est.phases.items()}
        for p, comps in phases.items():
            comps["roles"] = held + (nograd if p == "score" else 0) + (critic if p == "optimizer" else 0)
        allocated = max(sum(c.values()) for c in phases.values())
        return dataclasses.replace(
            est,
            phases=phases,
            notes=(*est.notes, f"roles on the training GPUs: {', '.join(b.role for _, b in rows)}"),
            **allocator_layers(cfg, allocated, allocator_term.shares_of(phases)),
        )

    return fn
