"""Non-tensor memory items (estimator/terms/overhead.py) and torch's usable memory per GPU (estimator/hardware/gpus.py).

Expected bytes are the published figures written out by hand (notes/gpu-overheads.md and the sources named there).
"""

from __future__ import annotations

from estimator.hardware.gpus import GPUS, lookup
from estimator.settings.config import RunConfig
from estimator.terms import overhead

MIB = 2**20


def test_cuda_context_on_one_h100():
    # 426 MiB bare context (unsloth-zoo PR #1053) + (666,632,192 - 287,047,680) B lazily loaded modules
    # (pytorch PR #86509) + 32 MiB cuBLAS (sm 9.0) + 32 MiB cuBLASLt (Hopper); no NCCL on one GPU.
    want = 426 * MIB + 379_584_512 + 32 * MIB + 32 * MIB
    assert overhead.cuda_context(RunConfig(model="7B")) == want
    assert overhead.cuda_context(RunConfig(model="7B", device="cpu")) == 0


def test_cublas_workspaces_by_architecture():
    # parseChosenWorkspaceSize: sm 9.0 -> 4096*8 KiB = 33,554,432 B; else :4096:2:16:8 = 8,519,680 B.
    assert overhead.cublas_workspace_bytes((9, 0)) == 33_554_432
    assert overhead.cublas_workspace_bytes((8, 0)) == 8_519_680
    # Blackwell: B200 (sm 10.0), RTX 5090 / RTX PRO 6000 (sm 12.0) take Hopper's 32 MiB (pytorch PR #175344)
    assert overhead.cublas_workspace_bytes((10, 0)) == overhead.cublas_workspace_bytes((12, 0)) == 32 * 2**20
    # cuBLASLt (PR #120925): Hopper+ 32 MiB; Ampere >= 24 GB 4 MiB; otherwise 1 MiB.
    assert overhead.cublaslt_workspace_bytes((10, 0)) == 32 * MIB
    assert overhead.cublaslt_workspace_bytes((8, 0), 40 * 10**9) == 4 * MIB
    assert overhead.cublaslt_workspace_bytes((8, 6), 16 * 10**9) == 1 * MIB
    assert overhead.cublaslt_workspace_bytes((7, 5), 16 * 10**9) == 1 * MIB


def test_nccl_per_communicator():
    # nccl#964: 544 MB per 2-rank communicator, 688 MB for larger groups; a vLLM server adds a weight-sync one.
    assert overhead.nccl_bytes(RunConfig(num_gpus=1)) == 0
    assert overhead.nccl_bytes(RunConfig(num_gpus=2)) == 544 * MIB
    assert overhead.nccl_bytes(RunConfig(num_gpus=8)) == 688 * MIB
    assert overhead.nccl_bytes(RunConfig(num_gpus=8, use_vllm=True, vllm_mode="server")) == 2 * 688 * MIB
    # DeepSpeed on one GPU brings up a one-rank NCCL group: 484 MiB at NCCL's defaults (nccl PR #2366)
    assert overhead.nccl_bytes(RunConfig(num_gpus=1, sharding="zero2")) == 484 * MIB
    assert (
        overhead.nccl_bytes(RunConfig(num_gpus=1, sharding="zero3", use_vllm=True, vllm_mode="server"))
        == (484 + 544) * MIB
    )
    items = {i.name: i for i in overhead.non_tensor_items(RunConfig(num_gpus=4))}
    assert items["NCCL x1"].bytes == 688 * MIB and not items["NCCL x1"].in_reserved
    assert items["cuBLAS workspace"].in_reserved


def test_torch_usable_memory_below_nvidia_smi_total():
    # H100 80GB HBM3: nvidia-smi 81559 MiB, torch total_memory 81082 MiB (printed _CudaDeviceProperties).
    h100 = lookup("h100")
    assert h100.usable_bytes == 81082 * MIB
    # unmeasured cards: driver total - 870 MiB (0.85 GiB, AgileRL's A100-80GB gap): L4 23034 - 870 = 22164 MiB.
    assert lookup("l4").usable_bytes == 22164 * MIB
    for g in GPUS:
        assert g.usable_bytes <= g.memory_bytes, g.name


def test_a_card_before_hopper_is_charged_its_own_smaller_workspaces():
    # torch parseChosenWorkspaceSize: 32 MiB on sm 9.0, else 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 B; cuBLASLt
    # 32 MiB from Hopper, 4 MiB on Ampere / Ada with 24 GB or more. Newer or unknown cards keep the H100's.
    from estimator.step.estimate import estimate

    est = estimate(RunConfig(model="0.5B", use_peft=True))
    by_name = {g.name: g for g in GPUS}
    ada, blackwell = by_name["RTX 4090"], by_name["B200"]
    h100_workspaces = 32 * MIB + 32 * MIB
    assert (
        est.fit_bytes_on(ada.sm, ada.driver_mib * MIB)
        == est.fit_bytes - h100_workspaces + 8_519_680 + 4 * MIB
    )
    assert est.fit_bytes_on(blackwell.sm, blackwell.driver_mib * MIB) == est.fit_bytes
    assert est.fit_bytes_on((0, 0), 24 * 2**30) == est.fit_bytes
