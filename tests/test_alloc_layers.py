"""In the estimator's output: the allocator settings as run settings, the layers from tensor bytes to
what the card holds, the fit verdict against what torch can use, and the fragmentation settings in the advice.

Expected numbers are worked by hand from the stored simulations of the traced 7B LoRA stream c12c87f2df5952d9
(estimator/data/allocator_streams.json: peak allocated, fragmentation and smallest passing limit per allocator
variant), the non-tensor items' published figures and the GPUs' printed total_memory, never from the code's
own formulas.
"""

from __future__ import annotations

import json

import pytest

from estimator.hardware import gpus
from estimator.interface import cli
from estimator.interface.report import check_fit
from estimator.model.catalog import resolve_model
from estimator.plan.advice import advise
from estimator.settings.config import RunConfig, alloc_conf_problem
from estimator.step import band
from estimator.step.estimate import Estimate, estimate
from estimator.units import MIB

# 7B LoRA, TRL defaults (fp32 load, GC on, 8 generations): the config whose stream c12c87f2df5952d9 was traced
LORA7B = RunConfig(model="7B", use_peft=True, transformers_version="5.23")  # its stream was traced under 5.23
# the stream's simulated (peak allocated, fragmentation at max_memory_reserved, smallest passing limit) per variant
SIM = {
    "default": (35_277_086_208, 1_280_467_456, 36_237_436_800),
    "expandable_segments": (35_127_664_128, 316_301_824, 35_285_815_040),
    "max_split_size_mb_128": (35_281_804_800, 2_607_440_384, 35_648_476_104),
    "torch_empty_cache_steps_1": (35_278_659_072, 1_264_214_528, 36_226_819_968),
}
# sm 9.0 workspaces (torch CublasHandlePool.cpp "32MiB for Hopper"; pytorch PR #120925): in reserved
WORKSPACES = 2 * 32 * MIB
# 426 MiB context (unsloth-zoo PR #1053) + 666,632,192 - 287,047,680 B of lazily loaded modules (pytorch PR #86509)
OUTSIDE = 426 * MIB + 379_584_512


# ---- 1. the settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conf",
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "expandable_segments:False,max_split_size_mb:512",
        "max_split_size_mb:20",  # torch 2.13 takes >= 20
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,>:4]",
        "roundup_power2_divisions:[64:0,>:8]",
        "large_segment_size_mb:11",
    ],
)
def test_alloc_conf_accepted(conf):
    assert alloc_conf_problem(conf) is None


@pytest.mark.parametrize(
    "conf, named",
    [
        # torch 2.13's parser (AcceleratorAllocatorConfig; its messages in libc10.so): "too small, must be >= 20"
        ("max_split_size_mb:19", "at least 20"),
        ("max_non_split_rounding_mb:1", "at least 20"),
        ("roundup_power2_divisions:3", "a power of two"),
        ("roundup_power2_divisions:[64:3]", "N a power of two or 0"),
        ("roundup_power2_divisions:[3:4]", "interval '3' is not a power of two"),
        ("large_segment_size_mb:0", "above kMinLargeAlloc's 10"),  # parseLargeSegmentSize: must be > 10 MB
        (":", "where an option name belongs"),
        ("expandable_segments:True,,", "where an option name belongs"),
        ("expandable_segments:1", "True or False"),  # torch's parser takes exactly True / False
        ("garbage_collection_threshold:0.6", "'garbage_collection_threshold'"),  # a torch key, not simulated
        ("max_split_size_mb:128,max_split_size_mb:x", "max_split_size_mb:x"),  # names the bad part only
    ],
)
def test_alloc_conf_refused_naming_the_bad_part(conf, named, capsys):
    assert named in alloc_conf_problem(conf)
    assert cli.main(["--model", "0.5B", "--alloc-conf", conf]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "accepted:" in err[0]


def test_new_settings_keep_row_keys_and_reach_the_config(capsys):
    assert "pytorch_cuda_alloc_conf" not in RunConfig().to_dict()  # since 0.2.0: absent at the default
    assert "torch_empty_cache_steps" not in RunConfig().to_dict()
    argv = ["--model", "0.5B", "--alloc-conf", "expandable_segments:True", "--torch-empty-cache-steps", "4"]
    assert cli.main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config"]["pytorch_cuda_alloc_conf"] == "expandable_segments:True"
    assert d["config"]["torch_empty_cache_steps"] == 4
    assert cli.main(["--model", "0.5B", "--torch-empty-cache-steps", "0"]) == 2


@pytest.mark.parametrize(
    "changes, variant",
    [
        ({}, "default"),
        ({"pytorch_cuda_alloc_conf": "expandable_segments:True"}, "expandable_segments"),
        ({"pytorch_cuda_alloc_conf": "max_split_size_mb:128"}, "max_split_size_mb_128"),
        ({"torch_empty_cache_steps": 1}, "torch_empty_cache_steps_1"),
        # every 2nd step: only N = 1 was simulated; between two emptyings the cache builds up as without them
        ({"torch_empty_cache_steps": 2}, "default"),
    ],
)
def test_the_settings_select_the_simulated_variant_of_the_same_stream(changes, variant):
    e = estimate(LORA7B.with_(**changes))
    peak, frag, _ = SIM[variant]
    assert e.allocator_variant == variant and e.reserve_source == "simulated"
    assert e.allocator_overhead_bytes == pytest.approx(e.peak_allocated_bytes * frag / peak, abs=1)


# ---- 2. the layers ---------------------------------------------------------------------------------------------


def test_layers_from_allocated_to_nvidia_smi(capsys):
    assert cli.main(["--model", "7B", "--lora", "--transformers-version", "5.23", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    L = d["layers"]
    a = L["allocated"]["bytes"]
    peak, frag, limit = SIM["default"]
    assert L["fragmentation"]["source"] == "simulated" and "c12c87f2df5952d9" in L["fragmentation"]["basis"]
    assert L["fragmentation"]["bytes"] == pytest.approx(a * frag / peak, abs=1)  # 3.63 % of the peak
    assert [i["name"] for i in L["in_reserved"]] == ["cuBLAS workspace", "cuBLASLt workspace"]
    assert L["reserved"]["bytes"] == pytest.approx(a * (1 + frag / peak) + WORKSPACES, abs=1)
    assert sum(i["bytes"] for i in L["outside_allocator"]) == OUTSIDE
    assert L["nvidia_smi_peak"]["bytes"] == d["peak_device_bytes"]
    assert d["peak_device_bytes"] == pytest.approx(a * (1 + frag / peak) + WORKSPACES + OUTSIDE, abs=1)
    # release-and-retry: the smallest limit the stream passes is 960,350,592 B above its peak, not 1,280,467,456
    assert L["need"]["bytes"] == pytest.approx(a * limit / peak + WORKSPACES + OUTSIDE, abs=2)
    assert d["peak_reserved_bytes"] == L["reserved"]["bytes"]  # the old keys still say the same things
    assert all(i["source"] == "estimated" for i in L["in_reserved"] + L["outside_allocator"])


def test_human_table_shows_the_layers(capsys):
    assert cli.main(["--model", "7B", "--lora", "--transformers-version", "5.23"]) == 0
    out = capsys.readouterr().out.splitlines()
    order = [
        "peak allocated",
        "+ allocator overhead (fragmentation)",
        "+ cuBLAS workspace (in reserved)",
        "+ cuBLASLt workspace (in reserved)",
        "= peak reserved",
        "+ CUDA context (lazy loading)",
        "+ lazily loaded kernel modules (bound)",
        '= "nvidia-smi" peak',
        "card must hold",
    ]
    rows = [next(i for i, ln in enumerate(out) if ln.startswith(label)) for label in order]
    assert rows == sorted(rows)
    assert "simulated (traced stream c12c87f2df5952d9" in out[rows[1]]
    assert all(out[r].rstrip().endswith(")") or "estimated" in out[r] or "simulated" in out[r] for r in rows)


def test_cpu_has_no_allocator_layers():
    e = estimate(LORA7B.with_(device="cpu", bf16=False))
    assert e.allocator_overhead_bytes == 0 and e.non_tensor == () and e.need_bytes == e.peak_allocated_bytes


# ---- 3. the verdict --------------------------------------------------------------------------------------------


def _card(allocated: int, extra: int, need_extra: int, context: int) -> Estimate:
    return Estimate(
        LORA7B,
        resolve_model("0.5B"),
        {"train": {"x": allocated}},
        cuda_context_bytes=context,
        allocator_overhead_bytes=extra,
        need_extra_bytes=need_extra,
    )


def test_verdict_is_against_what_torch_can_use_not_the_box(monkeypatch):
    monkeypatch.setattr(
        band, "margin", lambda cfg=None, model_type=None: 0.0
    )  # the band's own share: tests/test_validation_band.py
    h100 = gpus.lookup("H100")  # nvidia-smi 81,559 MiB, torch total_memory 81,082 MiB (printed)
    # needs 81,300 MiB: under the nvidia-smi total, over what torch can use -> 218 MiB missing
    e = _card(80_000 * MIB, 500 * MIB, 300 * MIB, 1000 * MIB)
    assert e.need_bytes == 81_300 * MIB and e.peak_device_bytes == 81_500 * MIB
    assert check_fit(e, h100).free_bytes == -218 * MIB and not check_fit(e, h100).fits


def test_verdict_uses_release_and_retry_not_the_unlimited_reserve(monkeypatch):
    monkeypatch.setattr(
        band, "margin", lambda cfg=None, model_type=None: 0.0
    )  # the band's own share: tests/test_validation_band.py
    h100 = gpus.lookup("H100")
    # with room the allocator would reserve 2,000 MiB beyond the peak (nvidia-smi 82,000 MiB > 81,082), but the
    # stream passes under a limit 82 MiB above it: the card must hold 79,000 + 82 + 1,000 = 80,082 MiB
    e = _card(79_000 * MIB, 2_000 * MIB, 82 * MIB, 1000 * MIB)
    assert e.peak_device_bytes == 82_000 * MIB
    assert check_fit(e, h100).free_bytes == 1000 * MIB and check_fit(e, h100).fits


def test_gpu_line_says_what_is_compared(capsys):
    assert cli.main(["--model", "7B", "--lora", "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "H100 80GB (79.18 GiB torch can use of 79.65 GiB): fits" in out  # 81,082 and 81,559 MiB
    assert "smallest allocator reserve the step passes with" in out


# ---- 4. the advice ---------------------------------------------------------------------------------------------


def _singles(cfg: RunConfig) -> dict:
    a = advise(cfg, resolve_model(cfg.model), lambda c, arch: estimate(c, arch))
    return {o.changes[0].key: o for o in a.singles}


def test_fragmentation_settings_in_the_advice_save_what_the_simulation_says():
    base = estimate(LORA7B)
    a = base.peak_allocated_bytes
    s = _singles(LORA7B)
    frac = {v: (limit - peak) / peak for v, (peak, _, limit) in SIM.items()}
    # expandable segments: the smallest passing limit falls from 2.72 % to 0.45 % above the peak
    assert s["expandable"].saved_bytes == pytest.approx(
        a * (frac["default"] - frac["expandable_segments"]), abs=2
    )
    assert s["max_split"].saved_bytes == pytest.approx(
        a * (frac["default"] - frac["max_split_size_mb_128"]), abs=2
    )
    assert "only near the limit" in s["max_split"].changes[0].tradeoff
    # emptying the cache every step lowers the passing limit by 0.03 % of the peak (12 MB): below the 0.1 % floor
    assert a * (frac["default"] - frac["torch_empty_cache_steps_1"]) < 0.001 * base.need_bytes
    assert "empty_cache" not in s


def test_expandable_segments_caveat_and_never_with_a_sleeping_colocated_vllm():
    colocate = RunConfig(model="1.5B", use_peft=True, use_vllm=True, vllm_mode="colocate")
    s = _singles(colocate)
    assert "expandable" in s and "vLLM" in s["expandable"].changes[0].tradeoff
    # vLLM's sleep mode allocates through CuMemAllocator, which asserts expandable segments are off
    assert "expandable" not in _singles(colocate.with_(vllm_enable_sleep_mode=True))
    assert not {"expandable", "max_split", "empty_cache"} & set(
        _singles(LORA7B.with_(device="cpu", bf16=False))
    )
