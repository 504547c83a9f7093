"""A real stream against a traced one (sweeps/report/stream_diff.py) and the report (sweeps/report/gpu_streams.py),
on two tiny hand-made streams whose replay is worked out by hand below."""

from __future__ import annotations

import json

import pytest

from estimator.hardware.allocator import dump_stream
from estimator.settings.config import RunConfig
from sweeps.report import gpu_streams, stream_diff

MIB = 1024**2
# real: model loading churns a 3 MB tensor (a 20 MiB segment); generation adds a 50 MiB buffer the trace never sees
REAL = [
    ("m", "load"),
    ("a", 1, 3_000_000, 0),
    ("f", 1),
    ("m", "generate"),
    ("a", 1, 100, 0),
    ("a", 2, 50 * MIB, 0),
    ("f", 2),
    ("m", "train"),
    ("a", 2, 4 * MIB, 0),
    ("f", 2),
    ("f", 1),
    ("m", "other"),
]
# traced: two steps; the second ("a" of 8 MiB) is cut away to compare with the real stream's one step
TRACED = [
    ("a", 1, 100, 0),
    ("m", "generate"),
    ("a", 2, 4 * MIB, 0),
    ("f", 2),
    ("m", "(none)"),
    ("m", "train"),
    ("a", 2, 4 * MIB, 0),
    ("f", 2),
    ("f", 1),
    ("m", "generate"),
    ("a", 1, 8 * MIB, 0),
    ("f", 1),
]
TORCH = {
    "start_bytes": 0,
    "peak_bytes": 80 * MIB,
    "end_bytes": 80 * MIB,
    "peak_phase": "generate",
    "phases": {},
}


def test_size_classes_at_their_edges():
    assert stream_diff.size_class(1 * MIB) == "<=1 MiB"
    assert stream_diff.size_class(1 * MIB + 1) == "1-10 MiB"  # rounds to 1 MiB + 512 B: the large pool
    assert stream_diff.size_class(10 * MIB) == "1-10 MiB"
    assert stream_diff.size_class(10 * MIB + 1) == ">10 MiB"


def test_first_steps_cuts_at_the_next_generate_mark():
    assert stream_diff.steps_in(TRACED) == 2 and stream_diff.steps_in(REAL) == 1
    assert stream_diff.first_steps(TRACED, 1) == TRACED[:9]
    assert stream_diff.first_steps(TRACED, 2) == TRACED


def test_comparison_by_hand():
    res = stream_diff.compare(REAL, TRACED, TORCH)
    r, t = res["real"], res["traced"]
    # real: 3,000,320 B -> a 20 MiB segment (freed, cached); 100 B -> a 2 MiB small segment; 50 MiB -> its own
    # segment: 72 MiB reserved with 50 MiB + 512 B allocated; the 4 MiB request reuses the cached 20 MiB segment
    assert (r["peak_reserved"], r["peak_allocated"]) == (72 * MIB, 50 * MIB + 512)
    assert r["reserve"] == 22 * MIB - 512
    assert r["phases"] == {
        "load": [20 * MIB, 3_000_320],
        "generate": [72 * MIB, 50 * MIB + 512],
        "train": [72 * MIB, 4 * MIB + 512],
        "other": [72 * MIB, 0],
    }
    # peak allocated and reserved are 22 MiB - 512 B apart, under the 64 MiB search step: the limit is the peak
    assert (r["min_device_limit"], r["need"]) == (72 * MIB, 22 * MIB - 512)
    # traced, one step: 2 MiB small + one 20 MiB segment for both 4 MiB requests
    assert (t["peak_reserved"], t["peak_allocated"]) == (22 * MIB, 4 * MIB + 512)
    assert t["phases"] == {
        "generate": [22 * MIB, 4 * MIB + 512],
        "other": [22 * MIB, 512],
        "train": [22 * MIB, 4 * MIB + 512],
    }
    # (a) the simulator 8 MiB under torch's 80 MiB on the real stream
    f = res["fidelity"]
    assert (f["error_bytes"], f["error_fraction"]) == (-8 * MIB, -0.1)
    # (b) what only the real stream requests, largest first
    assert res["unmatched"] == [
        {"size": 50 * MIB, "count": 1, "bytes": 50 * MIB, "first_phase": "generate"},
        {"size": 3_000_320, "count": 1, "bytes": 3_000_320, "first_phase": "load"},
    ]
    assert res["profile"]["real"]["generate"] == {"<=1 MiB": [1, 100], ">10 MiB": [1, 50 * MIB]}
    assert res["profile"]["real"]["all"]["1-10 MiB"] == [2, 3_000_000 + 4 * MIB]
    assert res["profile"]["traced"]["all"] == {"<=1 MiB": [1, 100], "1-10 MiB": [2, 8 * MIB]}


CONFIG = {"model": "0.5B", "num_generations": 4, "max_prompt_length": 64, "max_completion_length": 32}


def _folders(tmp_path, traced: bool = True):
    gpu, tr = tmp_path / "gpu", tmp_path / "traced"
    gpu.mkdir()
    tr.mkdir()
    dump_stream(REAL, gpu / "k1.gpu.txt.gz")
    real_row = {
        "key": "k1",
        "stream": "k1.gpu.txt.gz",
        "config": {
            **CONFIG,
            "model": "Qwen/Qwen2.5-0.5B-Instruct",
            "device": "cuda",
        },  # the traced one says 0.5B
        "torch_reserved": TORCH,
    }
    (gpu / "index.jsonl").write_text(json.dumps(real_row) + "\nnot json\n")
    if traced:
        dump_stream(TRACED, tr / "t1.txt.gz")
        full = RunConfig.from_dict(CONFIG).to_dict()
        (tr / "index.jsonl").write_text(
            json.dumps({"key": "t1", "stream": "t1.txt.gz", "steps": 2, "config": full}) + "\n"
        )
    return gpu, tr


def test_report_pairs_a_real_stream_with_its_traced_one(tmp_path, capsys):
    gpu, tr = _folders(tmp_path)
    out = tmp_path / "GPU.md"
    assert gpu_streams.main(["--gpu", str(gpu), "--traced", str(tr), "--out", str(out)]) == 0
    text = out.read_text()
    assert "1 line(s) of `index.jsonl` skipped" in text
    assert "simulated peak reserved 0.070 GiB vs torch's 0.078 GiB (measured-gpu): -8 MiB (-10.00 %)" in text
    assert "| **peak** | 0.049 | 0.004 | 0.078 | 0.070 | 0.021 |" in text
    assert "| 50.00 | 1 | 0.05 | generate |" in text
    # (e) by hand: the real stream needs 72 MiB (20 + 2 + 50); just above its 50 MiB allocated peak the 50 MiB
    # request finds the 20 MiB loading segment given back and the small segment held by the 100-byte block
    assert (
        "- real stream (measured-gpu): a 50.0 MiB request in `generate` fails with 0.002 GiB stranded; largest: "
        "1 x 2 MiB (generate) held by 0.0 MiB (generate)." in text
    )
    # the traced one: its 100-byte block, allocated before any phase mark, holds the small segment
    assert (
        "- traced stream: a 4.0 MiB request in `generate` fails with 0.002 GiB stranded; largest: "
        "1 x 2 MiB ((none)) held by 0.0 MiB ((none))." in text
    )
    assert "1 real stream(s) compared" in capsys.readouterr().out


def test_report_says_when_no_traced_stream_matches(tmp_path):
    gpu, tr = _folders(tmp_path, traced=False)
    out = tmp_path / "GPU.md"
    assert gpu_streams.main(["--gpu", str(gpu), "--traced", str(tr), "--out", str(out), "--no-need"]) == 0
    assert "No traced stream of this config: rerun with `--trace-missing`" in out.read_text()


def test_no_real_streams_is_one_line_and_no_report(tmp_path, capsys):
    out = tmp_path / "GPU.md"
    assert gpu_streams.main(["--gpu", str(tmp_path / "none"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("gpu-streams: no real streams in")
    assert not out.exists()


def test_a_file_for_a_folder_is_one_line_and_exit_2(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(SystemExit) as e:
        gpu_streams.main(["--gpu", str(f)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu" in err and "accepted values are folders" in err


def test_what_each_stream_holds_at_its_peak_by_hand():
    # the trace sums a tied gradient out of place (three 50-byte blocks live), the real run in place (two) but holds
    # a 30-byte block the trace never keeps that long; both also hold 10 bytes. Peaks: traced 160, real 140
    traced = [("m", "train"), ("a", 9, 10, 0), ("a", 1, 50, 0), ("a", 2, 50, 0), ("a", 3, 50, 0), ("f", 1),
              ("f", 2), ("a", 4, 50, 0), ("f", 3), ("f", 4), ("f", 77)]  # fmt: skip
    real = [("m", "generate"), ("a", 8, 500, 0), ("f", 8), ("m", "train"), ("a", 9, 10, 0), ("a", 1, 50, 0),
            ("a", 7, 30, 0), ("a", 2, 50, 0), ("f", 1), ("f", 7), ("a", 3, 60, 0)]  # fmt: skip
    assert stream_diff.live_at_peak(traced) == (160, "train", {50: 3, 10: 1})
    # the first highest instant: 500 bytes in generation, before the train phase's 140 (and 120 later)
    assert stream_diff.live_at_peak(real) == (500, "generate", {500: 1})
    d = stream_diff.peak_difference(real[3:], traced)
    assert d["real"] == [140, "train"] and d["traced"] == [160, "train"]
    assert d["sizes"] == [
        {"size": 50, "real": 2, "traced": 3, "bytes": -50},
        {"size": 30, "real": 1, "traced": 0, "bytes": 30},
    ]
    md = "\n".join(gpu_streams._at_peak(d))
    assert "| 0.00 | 2 | 3 | -0.000 |" in md and "real 0.000 GiB in train (measured-gpu)" in md


def test_a_traced_stream_in_a_lineup_subfolder_is_found(tmp_path):
    # `make tables` traces the lineups' configs into results/streams/mincard/: the report must not trace them again
    gpu, tr = _folders(tmp_path)
    sub = tr / "mincard"
    sub.mkdir()
    (tr / "t1.txt.gz").rename(sub / "t1.txt.gz")
    (tr / "index.jsonl").rename(sub / "index.jsonl")
    out = tmp_path / "GPU.md"
    assert gpu_streams.main(["--gpu", str(gpu), "--traced", str(tr), "--out", str(out), "--no-need"]) == 0
    text = out.read_text()
    assert "mincard/t1.txt.gz" in text and "No traced stream" not in text


def test_steps_per_generation_says_the_windows_differ(tmp_path):
    gpu, tr = _folders(tmp_path)
    row = json.loads((gpu / "index.jsonl").read_text().splitlines()[0])
    row["config"]["steps_per_generation"] = 4
    (gpu / "index.jsonl").write_text(json.dumps(row) + "\n")
    full = RunConfig.from_dict({**CONFIG, "steps_per_generation": 4}).to_dict()
    (tr / "index.jsonl").write_text(
        json.dumps({"key": "t1", "stream": "t1.txt.gz", "steps": 2, "config": full}) + "\n"
    )
    out = tmp_path / "GPU.md"
    assert gpu_streams.main(["--gpu", str(gpu), "--traced", str(tr), "--out", str(out), "--no-need"]) == 0
    assert "With steps_per_generation 4" in out.read_text()


# a DeepSpeed run's real stream: a 1000 MiB buffer on a side CUDA stream (1), freed, then a 1000 MiB tensor on the
# default stream (0), which cannot take the side stream's cached block: a second segment, 2000 MiB reserved for
# 1000 MiB allocated. Under a limit the allocator frees the cached block and retries, so 1000 MiB would do; the
# bisection (64 MiB resolution) passes 1500, 1250, 1125 and 1062.5 MiB and stops there.
GIB_ = 1000 * MIB
DS_REAL = [
    ("m", "train"),
    ("a", 1, GIB_, 1),
    ("f", 1),
    ("a", 2, GIB_, 0),
    ("f", 2),
    ("m", "other"),
]
DS_CONFIG = {
    "model": "Qwen/Qwen2.5-1.5B-Instruct",
    "sharding": "zero2",
    "offload_optimizer": True,
    "device": "cuda",
    "num_generations": 4,
    "max_prompt_length": 64,
    "max_completion_length": 32,
}


def test_by_cuda_stream_by_hand():
    assert stream_diff.by_cuda_stream(DS_REAL) == {
        0: {"allocs": 1, "bytes": GIB_, "peak_live": GIB_},
        1: {"allocs": 1, "bytes": GIB_, "peak_live": GIB_},
    }


def test_a_deepspeed_stream_is_never_traced_and_is_replayed_alone(tmp_path, monkeypatch):
    gpu, tr = tmp_path / "gpu", tmp_path / "traced"
    gpu.mkdir()
    dump_stream(DS_REAL, gpu / "ds.gpu.txt.gz")
    torch_reserved = {**TORCH, "peak_bytes": 2 * GIB_, "end_bytes": 2 * GIB_}
    row = {"key": "ds", "stream": "ds.gpu.txt.gz", "config": DS_CONFIG, "torch_reserved": torch_reserved}
    (gpu / "index.jsonl").write_text(json.dumps(row) + "\n")

    def no_trace(*_):
        raise AssertionError("a DeepSpeed config was traced")

    monkeypatch.setattr(gpu_streams, "_trace", no_trace)
    text, compared = gpu_streams.report(gpu, tr, trace_missing=True)
    assert compared == 0
    assert "DeepSpeed ZeRO-2: no traced counterpart" in text
    # the simulator reproduces torch's 2000 MiB: the side stream's block is not reused
    assert "simulated peak reserved 1.953 GiB vs torch's 1.953 GiB (measured-gpu): +0 MiB (+0.00 %)" in text
    assert "reserve 0.977 GiB; smallest limit that runs it 1.038 GiB, 0.061 over peak allocated" in text
    assert "| 0 | 1 | 0.98 | 0.977 |" in text and "| 1 | 1 | 0.98 | 0.977 |" in text
    assert "The estimate (estimated): peak allocated" in text
