"""The GPU catalog (estimator/data/gpus.json via estimator/hardware/gpus.py): its figures against facts that do not come
from the file, sizes, ambiguous names, hostile --gpu values and the generated docs/GPUS.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from estimator.hardware import gpus
from estimator.hardware.gpus import (
    ALL_GPUS,
    AMBIGUOUS,
    GPUS,
    UNMEASURED_GAP_MIB,
    UnknownGPU,
    for_memory_gib,
    lookup,
    resolve,
)
from estimator.units import MIB

REPO = Path(__file__).resolve().parents[2]

# Marketed memory (GB) from the vendors' spec sheets, written here independently of gpus.json.
SPEC_GB = {
    "RTX 3060 12GB": 12,
    "RTX 3080 10GB": 10,
    "RTX 3080 12GB": 12,
    "RTX 3080 Ti": 12,
    "RTX 3080 Laptop": 16,
    "RTX 3090": 24,
    "RTX 3090 Ti": 24,
    "RTX 4070 Ti SUPER": 16,
    "RTX 4080": 16,
    "RTX 4080 SUPER": 16,
    "RTX 4090": 24,
    "RTX 5070 Ti": 16,
    "RTX 5080": 16,
    "RTX 5090": 32,
    "T4": 16,
    "A10": 24,
    "A10G": 24,
    "L4": 24,
    "RTX A6000": 48,
    "RTX 6000 Ada": 48,
    "L40S": 48,
    "V100 16GB": 16,
    "V100 32GB": 32,
    "A100 40GB": 40,
    "A100 PCIe 40GB": 40,
    "A100 80GB": 80,
    "A100 PCIe 80GB": 80,
    "H100 80GB": 80,
    "H100 PCIe": 80,
    "H100 NVL": 94,
    "H20": 96,
    "H200": 141,
    "GH200 96GB": 96,
    "GH200 144GB": 144,
    "B200": 192,
    "MI300X": 192,
}

# Compute capability by architecture (NVIDIA's CUDA GPUs table; gfx942 for the MI300X as torch reports it).
SPEC_SM = {
    (7, 0): {"V100 16GB", "V100 32GB"},
    (7, 5): {"T4"},
    (8, 0): {"A100 40GB", "A100 PCIe 40GB", "A100 80GB", "A100 PCIe 80GB"},
    (8, 6): {"RTX 3060 12GB", "RTX 3080 10GB", "RTX 3080 12GB", "RTX 3080 Ti", "RTX 3080 Laptop", "RTX 3090"}
    | {"RTX 3090 Ti", "A10", "A10G", "RTX A6000"},
    (8, 9): {"RTX 4070 Ti SUPER", "RTX 4080", "RTX 4080 SUPER", "RTX 4090", "L4", "L40S", "RTX 6000 Ada"},
    (9, 0): {"H100 80GB", "H100 PCIe", "H100 NVL", "H20", "H200", "GH200 96GB", "GH200 144GB"},
    (9, 4): {"MI300X"},
    (10, 0): {"B200"},
    (12, 0): {"RTX 5070 Ti", "RTX 5080", "RTX 5090"},
}

# The brief's "Any GPU" list: each must be found by the name people type.
MUST_FIND = [
    "3060",
    "3080 Ti",
    "3090",
    "3090 Ti",
    "4070 Ti Super",
    "4080",
    "4080 Super",
    "4090",
    "5070 Ti",
    "5080",
    "5090",
    "A10",
    "A10G",
    "A6000",
    "RTX 6000 Ada",
    "L4",
    "L40S",
    "V100-16",
    "V100-32",
    "A100-40",
    "A100-80",
    "A100-PCIe-40GB",
    "A100-PCIe-80GB",
    "A100-SXM4-80GB",
    "H100-PCIe",
    "H100-SXM",
    "H100-NVL",
    "H20",
    "H200",
    "GH200",
    "B200",
    "MI300X",
]


def test_every_card_has_its_spec_size_and_architecture():
    assert {g.name for g in ALL_GPUS} == set(SPEC_GB)
    for g in ALL_GPUS:
        assert g.marketed_gb == SPEC_GB[g.name], g.name
        m = re.search(r"(\d+)GB", g.name)  # a size in the name is the marketed size
        if m:
            assert g.marketed_gb == int(m.group(1)), g.name
    by_sm = {name: sm for sm, names in SPEC_SM.items() for name in names}
    assert {g.name: g.sm for g in ALL_GPUS} == by_sm


def test_driver_totals_are_within_the_marketed_size():
    # the driver never reports more than the marketed GB read as GiB, and loses at most ~7% of it
    # (ECC / reserved framebuffer: L4 23034 of 24576, B200 183359 of 196608)
    for g in ALL_GPUS:
        cap = g.marketed_gb * 1024
        assert 0.92 * cap <= g.driver_mib <= cap + 16, (g.name, g.driver_mib, cap)


def test_torch_totals_sit_below_the_driver_totals():
    for g in ALL_GPUS:
        gap = g.driver_mib - g.usable_mib
        if g.vendor == "amd":  # ROCm's total_memory is the whole rocm-smi total (printed)
            assert 0 <= gap, g.name
        else:
            assert 0 < gap <= UNMEASURED_GAP_MIB, (g.name, gap)
        assert g.usable_bytes == g.usable_mib * MIB and g.memory_bytes == g.driver_mib * MIB


def test_every_figure_says_where_it_came_from():
    for g in ALL_GPUS:
        assert g.source.startswith(("stored: ", "spec: ")), g.name
        if g.torch_mib is None:
            assert g.torch_source.startswith("unmeasured"), g.name
        else:
            assert g.torch_source.startswith("printed: ") and f"{g.torch_mib}MB" in g.torch_source, g.name
        if g.source.startswith("stored: "):
            assert re.search(r"\bids? \d+", g.source), g.name  # the search index's ids
            # the figure in the stored line is the figure used (nvidia-smi MiB, or rocm-smi bytes for AMD)
            assert str(g.driver_mib) in g.source, g.name
        assert g.vendor in ("nvidia", "amd"), g.name


def test_other_vendors_carry_the_overheads_caveat():
    for g in ALL_GPUS:
        assert g.overheads_estimated == (g.vendor != "nvidia"), g.name
    mi = lookup("MI300X")
    assert mi.vendor == "amd" and "CUDA's figures" in mi.overheads_note and "wider" in mi.overheads_note


def test_names_and_aliases_are_unique_across_cards():
    seen: dict[str, str] = {}
    for g in ALL_GPUS:
        for k in (g.name, *g.aliases):
            for key in {gpus._key(k), gpus._key(k).replace("-", "")}:
                assert seen.setdefault(key, g.name) == g.name, (k, seen[key], g.name)
    for a in AMBIGUOUS:
        for k in (a.name, *a.keys):
            assert gpus._key(k) not in seen, k


def test_the_listed_cards_are_the_fits_list():
    # GPUS is what "fits on:" shows (tests/estimator/test_cli.py: one verdict per listed card), in the file's order
    assert GPUS == tuple(g for g in ALL_GPUS if g.listed)
    assert [g.name for g in GPUS] == [
        "RTX 3080 Laptop",
        "T4",
        "A10G",
        "L4",
        "RTX 4090",
        "RTX 5090",
        "A100 40GB",
        "L40S",
        "A100 80GB",
        "H100 80GB",
        "H200",
        "B200",
    ]


def test_the_data_file_is_the_catalog(tmp_path):
    data = REPO / "estimator" / "data" / "gpus.json"
    raw = json.loads(data.read_text())
    assert [d["name"] for d in raw["gpus"]] == [g.name for g in ALL_GPUS]
    assert gpus._load(data) == (ALL_GPUS, AMBIGUOUS)
    bad = tmp_path / "gpus.json"  # a misspelt field is an error, not a silently dropped figure
    bad.write_text(data.read_text().replace('"listed": false', '"listed": false, "colour": "green"', 1))
    with pytest.raises(ValueError, match="unknown fields"):
        gpus._load(bad)


@pytest.mark.parametrize("name", MUST_FIND)
def test_the_common_cards_are_found(name):
    gpu, note = resolve(name)
    assert gpu in ALL_GPUS
    assert (note is None) != (name in ("GH200",))  # GH200 alone is ambiguous (96 GB or 144 GB)


@pytest.mark.parametrize(
    "smi_name, card",
    [
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "RTX 4070 Ti SUPER"),
        ("Tesla V100-SXM2-16GB", "V100 16GB"),
        ("Tesla V100-PCIE-32GB", "V100 32GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA GH200 480GB", "GH200 96GB"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_nvidia_smi_names_are_found(smi_name, card):
    assert lookup(smi_name).name == card


@pytest.mark.parametrize(
    "name, picked, sizes, other",
    [
        ("A100", "A100 40GB", ("40 GB", "80 GB"), "A100-80"),
        ("a100", "A100 40GB", ("40 GB", "80 GB"), "A100-80"),
        ("V100", "V100 16GB", ("16 GB", "32 GB"), "V100-32"),
        ("H100", "H100 80GB", ("80 GB", "94 GB"), "H100-NVL"),
        ("nvidia h100", "H100 80GB", ("80 GB", "94 GB"), "H100-NVL"),
        ("3080", "RTX 3080 10GB", ("10 GB", "12 GB", "16 GB"), "3080-12gb"),
        ("RTX 3080", "RTX 3080 10GB", ("10 GB", "12 GB", "16 GB"), "3080-laptop"),
        ("GH200", "GH200 96GB", ("96 GB", "144 GB"), "GH200-144"),
    ],
)
def test_an_ambiguous_name_checks_the_smaller_card_and_says_so(name, picked, sizes, other):
    gpu, note = resolve(name)
    assert gpu.name == picked and lookup(name) is gpu
    assert note is not None and "\n" not in note
    assert all(s in note for s in sizes) and f"checked the {gpu.marketed_gb:g} GB card" in note
    assert f"say {other}" in note or f", {other}" in note
    assert lookup(other).name != picked


def test_ambiguous_groups_are_consistent():
    for a in AMBIGUOUS:
        assert a.pick in a.cards
        assert a.pick.marketed_gb == min(c.marketed_gb for c in a.cards), a.name
        for alias, _ in a.say:  # each suggested name reaches another card of the group
            other, note = resolve(alias)
            assert note is None and other in a.cards and other is not a.pick, alias
        assert len({c.marketed_gb for c in a.cards}) >= 2, a.name


def test_a100_is_the_smaller_card():
    # A100 names two cards: the 40 GB one is checked (resolve says so); A100-80 names the other
    assert lookup("A100").driver_mib == 40960
    assert lookup("A100-80").driver_mib == 81920 and lookup("A100-80").name == "A100 80GB"
    # the figures tests elsewhere rely on stay: H100 is the SXM card, 81,559 / 81,082 MiB
    assert lookup("H100").driver_mib == 81559 and lookup("H100").usable_bytes == 81082 * MIB


@pytest.mark.parametrize(
    "text, gb",
    [("24GB", 24), ("24 GB", 24), ("24gib", 24), ("24 GiB", 24), ("80G", 80), ("80g", 80), (" 48gb ", 48)]
    + [("12.5GB", 12.5), ("1GB", 1), ("4096GB", 4096)],
)
def test_a_size_is_a_generic_card(text, gb):
    gpu, note = resolve(text)
    assert gpu.name == f"{gb:g} GB (generic)" and gpu.marketed_gb == gb
    assert gpu.driver_mib == round(gb * 1024)  # marketed GB read as GiB
    assert gpu.usable_mib == gpu.driver_mib - UNMEASURED_GAP_MIB and gpu.torch_mib is None
    assert gpu.vendor == "generic" and gpu not in ALL_GPUS
    assert note is not None and str(gpu.driver_mib) in note and "\n" not in note
    assert gpu.source and gpu.torch_source.startswith("derived")


def test_a_generic_24gb_card_is_close_to_the_real_ones():
    g = lookup("24GB")
    assert g.driver_mib == lookup("RTX 3090").driver_mib  # 24576 MiB
    assert g.driver_mib - lookup("L4").driver_mib < 0.07 * g.driver_mib


def test_for_memory_gib():
    g = for_memory_gib(48)
    assert (
        g.name == "48 GiB (generic)" and g.driver_mib == 49152 and g.usable_mib == 49152 - UNMEASURED_GAP_MIB
    )
    assert for_memory_gib(79.65).driver_mib == round(79.65 * 1024)
    for bad in (0, 0.5, -3, float("nan"), float("inf"), 1e9, "x", None):
        with pytest.raises(UnknownGPU) as e:
            for_memory_gib(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text", ["0GB", "0.5GB", "5000GB", "99999999GB", "-24GB", "24TB", "24", "GB", "24 G B"]
)
def test_bad_sizes_are_one_line(text):
    with pytest.raises(UnknownGPU) as e:
        resolve(text)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400


HOSTILE = [
    "",
    "   ",
    "\t\n",
    "\x00",
    "\x1b[31mred\x1b[0m",
    "a\nb",
    "H100\r\nrm -rf /",
    "H\u2028100",
    "é" * 10,
    "🙂",
    "x" * 1_000_000,
    "A" * 65,
    "'; DROP TABLE gpus; --",
    "%s%s%n",
    "{0}",
    "24GB" * 100,
    "../../etc/passwd",
    "\ud800",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_values_give_one_escaped_line(text):
    with pytest.raises(UnknownGPU) as e:
        resolve(text)
    msg = str(e.value)
    assert "\n" not in msg and "\r" not in msg and "\x1b" not in msg and "\x00" not in msg
    assert "\u2028" not in msg
    assert len(msg) < 400
    assert "24GB" in msg  # the size form is always offered


def test_non_strings_are_refused_in_one_line():
    for bad in (None, 24, 24.0, b"H100", ["H100"]):
        with pytest.raises(UnknownGPU) as e:
            resolve(bad)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)


def test_unknown_names_suggest_the_closest():
    with pytest.raises(UnknownGPU) as e:
        lookup("X100")
    msg = str(e.value)
    assert msg.startswith("unknown --gpu 'X100'; closest: ") and "H100 80GB" in msg and "--gpu 24GB" in msg
    with pytest.raises(UnknownGPU) as e:
        lookup("4070 ti")
    assert "closest: RTX 4070 Ti SUPER" in str(e.value)
    with pytest.raises(UnknownGPU) as e:
        lookup("rtx 6000")
    assert "RTX 6000 Ada" in str(e.value) and "RTX A6000" in str(e.value)


def test_a_long_value_is_truncated():
    with pytest.raises(UnknownGPU) as e:
        lookup("Z" * 500)
    assert "Z" * 41 not in str(e.value) and "…" in str(e.value)


def test_docs_gpus_md_is_generated():
    # regenerate with: python -m estimator.hardware.gpus > docs/GPUS.md
    assert (REPO / "docs" / "GPUS.md").read_text(encoding="utf-8") == gpus.markdown()


def test_docs_list_every_card_and_ambiguous_name():
    doc = gpus.markdown()
    for g in ALL_GPUS:
        assert f"| {g.name} |" in doc
    for a in AMBIGUOUS:
        assert a.note in doc
