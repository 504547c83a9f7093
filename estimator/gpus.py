"""The GPUs `--gpu` and "fits on:" know: marketed memory and the memory the driver reports.

`driver_mib` is `nvidia-smi --query-gpu=name,memory.total` (MiB), the whole framebuffer a process can see
in nvidia-smi; we compare the estimated nvidia-smi peak of the process against it. Each entry names where
its driver figure comes from: "stored" = the line `NAME, N MiB` as printed by nvidia-smi, found verbatim in
several public repositories (search tool's GitHub index, ids given); "spec" = the vendor's marketed size only.

`torch_mib` is what torch can really use: `torch.cuda.get_device_properties(i).total_memory` (cudaMemGetInfo's
total), below the nvidia-smi total by the framebuffer the driver reserves (0.35-0.85 GiB on datacenter cards,
AgileRL's published nvidia-smi vs torch gap). Each figure is the smallest `_CudaDeviceProperties(name=..., total_memory=N MB)`
line found printed in public repositories (torch prints MiB; search tool's index, ids given), or, where none
was found, the driver total minus `UNMEASURED_GAP_MIB`, the largest gap the notes give (AgileRL's 0.85 GiB on
an A100-80GB), so an unmeasured card errs small. `sm` is the compute capability (major, minor), which selects
the cuBLAS/cuBLASLt workspace sizes (estimator/terms/overhead.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.units import GIB, MIB

# 0.85 GiB: AgileRL's A100-80GB nvidia-smi vs torch gap (published; see estimator/terms/SOURCES.md)
UNMEASURED_GAP_MIB = 870


@dataclass(frozen=True)
class GPU:
    """One GPU model: its marketed size and the total its driver reports."""

    name: str
    marketed_gb: float  # as sold ("80 GB"); vendors mean GB or GiB loosely
    driver_mib: int  # nvidia-smi memory.total
    aliases: tuple[str, ...] = ()
    source: str = ""
    sm: tuple[int, int] = (0, 0)  # compute capability
    torch_mib: int | None = None  # torch total_memory (MiB); None: driver_mib - UNMEASURED_GAP_MIB
    torch_source: str = ""

    @property
    def memory_bytes(self) -> int:
        """Total device memory as the driver reports it (bytes)."""
        return self.driver_mib * MIB

    @property
    def usable_bytes(self) -> int:
        """Memory torch can allocate in (its `total_memory`): the capacity a fit verdict must compare with."""
        mib = self.torch_mib if self.torch_mib is not None else self.driver_mib - UNMEASURED_GAP_MIB
        return mib * MIB

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


GPUS: tuple[GPU, ...] = (
    GPU(
        "RTX 3080 Laptop",
        16,
        16384,
        ("3080-laptop", "rtx3080-laptop", "3080laptop", "rtx-3080-laptop"),
        "stored: 'NVIDIA GeForce RTX 3080 Laptop GPU, 16384 MiB' (ids 54516528043, 68525140150, 70133163579)",
        sm=(8, 6),
        torch_mib=None,
        torch_source="unmeasured (the 16 GB laptop part; only 8 GB variants found printed)",
    ),
    GPU(
        "T4",
        16,
        15360,
        ("tesla-t4", "t4-16gb"),
        "stored: 'Tesla T4, 15360 MiB' (ids 67234800047, 53052278521, 69562736807)",
        sm=(7, 5),
        torch_mib=14930,
        torch_source="printed: 'Tesla T4 ... total_memory=14930MB' (id 12462193998; others 15079-15109)",
    ),
    GPU(
        "A10G",
        24,
        23028,
        ("a10g-24gb",),
        "stored: 'NVIDIA A10G, 23028 MiB' (ids 27636968701, 57510727102, 66686965076)",
        sm=(8, 6),
        torch_mib=22587,
        torch_source="printed: 'NVIDIA A10G ... total_memory=22587MB' (id 67234836605)",
    ),
    GPU(
        "L4",
        24,
        23034,
        ("l4-24gb",),
        "stored: 'NVIDIA L4, 23034 MiB' (ids 54526473293, 53915601895, 71028648115)",
        sm=(8, 9),
        torch_mib=None,
        torch_source="unmeasured",
    ),
    GPU(
        "RTX 4090",
        24,
        24564,
        ("4090", "rtx4090", "geforce-rtx-4090"),
        "stored: 'NVIDIA GeForce RTX 4090, 24564 MiB' (id 71005093260)",
        sm=(8, 9),
        torch_mib=24563,
        torch_source="printed: 'NVIDIA GeForce RTX 4090 ... total_memory=24563MB' (id 7862287914)",
    ),
    GPU(
        "RTX 5090",
        32,
        32607,
        ("5090", "rtx5090", "geforce-rtx-5090"),
        "stored: '... 32607 MiB' labelled 5090 in a GPU-detection test (id 67229337618)",
        sm=(12, 0),
        torch_mib=None,
        torch_source="unmeasured",
    ),
    GPU(
        "A100 40GB",
        40,
        40960,
        ("a100-40", "a100-40gb", "a100-sxm4-40gb", "a10040"),
        "stored: 'NVIDIA A100-SXM4-40GB, 40960 MiB' (ids 65782662244, 53417432869, 59111912696)",
        sm=(8, 0),
        torch_mib=40536,
        torch_source="printed: 'A100-SXM4-40GB ... total_memory=40536MB' (ids 15187234989, 34325702647)",
    ),
    GPU(
        "A100 80GB",
        80,
        81920,
        ("a100", "a100-80", "a100-80gb", "a100-sxm4-80gb", "a10080"),
        "stored: 'NVIDIA A100-SXM4-80GB, 81920 MiB' and 'NVIDIA A100 80GB PCIe, 81920 MiB' (id 67229337618)",
        sm=(8, 0),
        torch_mib=None,
        torch_source="unmeasured here; AgileRL's published 0.85 GiB gap",
    ),
    GPU(
        "H100 80GB",
        80,
        81559,
        ("h100", "h100-80", "h100-80gb", "h100-sxm", "h10080"),
        "stored: 'NVIDIA H100 80GB HBM3, 81559 MiB' (ids 67229337618, 70203326633)",
        sm=(9, 0),
        torch_mib=81082,
        torch_source="printed: 'NVIDIA H100 80GB HBM3 ... total_memory=81082MB' (id 16920867219; 81089-81090 in ids 43466784132, 53763892014)",
    ),
    GPU(
        "H200",
        141,
        143771,
        ("h200-141gb", "h200-141"),
        "stored: 'NVIDIA H200, 143771 MiB' (ids 59658599221, 5738237740, 60457285259)",
        sm=(9, 0),
        torch_mib=143156,
        torch_source="printed: 'NVIDIA H200 ... total_memory=143156MB' (id 2097843420)",
    ),
    GPU(
        "B200",
        192,
        183359,
        ("b200-192gb", "b200-180gb"),
        "stored: 'NVIDIA B200, 183359 MiB' (= 179.06 GiB; ids 70203326633, 56804298258, 58914151436)",
        sm=(10, 0),
        torch_mib=182631,
        torch_source="printed: 'NVIDIA B200 ... total_memory=182631MB' (id 25224556183; 182642 in id 2097843420)",
    ),
)


class UnknownGPU(ValueError):
    """A --gpu value that is not in the catalog."""


def _key(name: str) -> str:
    """Case-, space- and underscore-insensitive lookup key."""
    return (
        name.strip()
        .lower()
        .replace(" ", "-")
        .replace("_", "-")
        .replace("nvidia-", "")
        .replace("geforce-", "")
    )


def _index() -> dict[str, GPU]:
    idx: dict[str, GPU] = {}
    for g in GPUS:
        for k in (g.name, *g.aliases):
            idx[_key(k)] = g
            idx[_key(k).replace("-", "")] = g
    return idx


def lookup(name: str) -> GPU:
    """The GPU called `name` (case-insensitive, aliases allowed), else UnknownGPU listing the names."""
    idx = _index()
    key = _key(name)
    gpu = idx.get(key) or idx.get(key.replace("-", ""))
    if gpu is None:
        raise UnknownGPU(f"unknown --gpu {name!r}; known: {', '.join(g.name for g in GPUS)}")
    return gpu
