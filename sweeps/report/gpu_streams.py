"""`make gpu-streams`: the real allocation streams a GPU lease recorded (`probe=history`, results/streams/gpu/) against
the traced streams of the same configs (results/streams/), written as results/streams/GPU_STREAMS.md.

    python -m sweeps.report.gpu_streams [--gpu results/streams/gpu] [--traced results/streams]
        [--out results/streams/GPU_STREAMS.md] [--trace-missing] [--no-need]

Per real stream (`index.jsonl` there, one line per run): the traced stream whose config matches (the estimator's
settings, the library versions aside), in the traced folder or one of its subfolders (`make tables` traces the
lineups' configs into results/streams/mincard/ and gpu-validate/); with `--trace-missing` a config without one is
traced first
(`sweeps.trace.streams.record`, CPU only, minutes per config). The analysis is `sweeps.report.stream_diff`, and
(without `--no-need`) what strands the memory just below each stream's need, real beside traced
(`sweeps.report.stranding`). A DeepSpeed
ZeRO stream has no traced counterpart (the tracer cannot run DeepSpeed) and is never traced: it is replayed alone
(`stream_diff.alone`: the simulator's fidelity on it, the reserve and smallest limit it implies against the
estimate's, its allocations by CUDA stream).
Without any real stream it says so on one line and exits 0, the report untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from estimator.hardware.allocator import load_stream
from estimator.settings.config import RunConfig
from sweeps.oneline import OneLineParser
from sweeps.records import read_index
from sweeps.report import stream_diff
from sweeps.report.row_traces import config_id
from sweeps.report.stranding import describe, stranding

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "results" / "streams" / "gpu"
TRACED_DIR = REPO / "results" / "streams"
OUT = TRACED_DIR / "GPU_STREAMS.md"


def traced_rows(traced_dir: Path, gpu: Path | None = None) -> list[dict]:
    """The traced index rows of `traced_dir` and of its subfolders (not `gpu`, the real streams), each with the
    folder its stream lies in under "_dir"."""
    rows = []
    for index in [traced_dir / "index.jsonl", *sorted(traced_dir.glob("*/index.jsonl"))]:
        if gpu is not None and index.parent.resolve() == gpu.resolve():
            continue
        found, _ = read_index(index)
        rows += [{**r, "_dir": index.parent} for r in found]
    return rows


def traced_for(real: dict, traced: list[dict]) -> dict | None:
    """The traced index row with the real row's config (the most steps, where several)."""
    want = config_id(real["config"])
    found = [t for t in traced if config_id(t["config"]) == want]
    return max(found, key=lambda t: t.get("steps", 0)) if found else None


def _gib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.3f}"


def _title(cfg: dict) -> str:
    c = RunConfig.from_dict(
        {k: v for k, v in cfg.items() if k not in ("transformers_version", "trl_version")}
    )
    method = "QLoRA" if c.load_in_4bit else "LoRA" if c.use_peft else "full"
    return (
        f"{c.model} {method}, {c.num_generations} generations, prompt {c.max_prompt_length} + completion "
        f"{c.max_completion_length}, GC {'on' if c.gradient_checkpointing else 'off'}"
    )


# settings the CPU tracer cannot run: their real streams have no traced counterpart and are replayed alone
UNTRACEABLE = {"zero2": "DeepSpeed ZeRO-2", "zero3": "DeepSpeed ZeRO-3"}


def untraceable(config: dict) -> str | None:
    """What in a real stream's config no CPU trace can run (None: it can be traced)."""
    return UNTRACEABLE.get(str(config.get("sharding")))


def section_alone(real: dict, result: dict, what: str, est: dict | None) -> list[str]:
    """The markdown of a real stream replayed alone: what it implies, set beside the estimate."""
    r, f, at = result["real"], result["fidelity"], result["at_peak"]
    lines = [
        *_real_stream(real),
        "",
        f"{what}: no traced counterpart (no DeepSpeed step runs under the CPU tracer), so this stream is replayed "
        "alone: it is the reserve's only evidence for this setting.",
        "",
        "**(a) Simulator fidelity on the real stream**: simulated peak reserved "
        f"{_gib(f['simulated_peak_reserved'])} GiB vs torch's {_gib(f['measured_peak_reserved'])} GiB "
        f"(measured-gpu): {f['error_bytes'] / 2**20:+.0f} MiB"
        + (f" ({100 * f['error_fraction']:+.2f} %)" if f["error_fraction"] is not None else "")
        + ".",
        "",
        f"**(c) What the stream implies (simulated)**: peak allocated {_gib(r['peak_allocated'])} GiB in "
        f"`{r['peak_label']}`, peak reserved {_gib(r['peak_reserved'])} GiB, reserve {_gib(r['reserve'])} GiB"
        + (
            f"; smallest limit that runs it {_gib(r['min_device_limit'])} GiB, {_gib(r['need'])} over peak allocated"
            if "need" in r
            else ""
        )
        + ".",
    ]
    if est is not None:
        need = est.get("need_bytes")
        lines.append(
            f"The estimate (estimated): peak allocated {_gib(est.get('peak_allocated_bytes'))} GiB, peak reserved "
            f"{_gib(est.get('peak_reserved_bytes'))} GiB, what the card must hold {_gib(need)} GiB"
            + (
                f" ({100 * (need / r['min_device_limit'] - 1):+.1f} % against the simulated smallest limit)"
                if need and r.get("min_device_limit")
                else ""
            )
            + "."
        )
    lines += [
        "",
        "Allocations by CUDA stream (measured-gpu): the allocator serves each stream from its own blocks, so a side "
        "stream's peak is reserved beside the default stream's.",
        "",
        "| CUDA stream | allocations | GiB requested | peak live (GiB) |",
        "|---|---|---|---|",
    ]
    for sid, c in result["streams"].items():
        lines.append(f"| {sid} | {c['allocs']} | {c['bytes'] / 2**30:.2f} | {_gib(c['peak_live'])} |")
    lines += [
        "",
        f"At the allocated peak ({_gib(at['requested'])} GiB requested, in `{at['phase']}`), the largest live request "
        "sizes (measured-gpu):",
        "",
        "| size (MiB) | live | GiB |",
        "|---|---|---|",
    ]
    for x in at["sizes"]:
        lines.append(f"| {x['size'] / 2**20:.2f} | {x['count']} | {x['bytes'] / 2**30:.3f} |")
    if at["others_bytes"]:
        lines.append(f"| other sizes | | {at['others_bytes'] / 2**30:.3f} |")
    lines += ["", "Allocations by size class and phase: count / GiB requested (measured-gpu).", ""]
    lines += ["| phase | " + " | ".join(n for n, _ in stream_diff.SIZE_CLASSES) + " |"]
    lines += ["|---|" + "---|" * len(stream_diff.SIZE_CLASSES)]
    for ph, cells in sorted(result["profile"].items()):
        row = [cells.get(n, [0, 0]) for n, _ in stream_diff.SIZE_CLASSES]
        lines.append(f"| {ph} | " + " | ".join(f"{c} / {b / 2**30:.2f}" for c, b in row) + " |")
    return [*lines, ""]


def _estimate_of(config: dict) -> dict | None:
    """The estimator's figures for a real stream's config (estimated), None when it cannot size it."""
    from sweeps.runner.predict import predict

    est, _ = predict(config)
    return est


def section(real: dict, traced: dict | None, result: dict | None) -> list[str]:
    """The markdown of one real stream: its numbers, each labelled by where it came from."""
    lines = _real_stream(real)
    if traced is None or result is None:
        return [
            *lines,
            "",
            "No traced stream of this config: rerun with `--trace-missing` (CPU, minutes).",
            "",
        ]
    spg = (real.get("config") or {}).get("steps_per_generation") or 1
    window = (
        [
            f"With steps_per_generation {spg} the real run trains up to {spg} micro-batches per generation and the "
            "trace generates every step, so the cut streams hold different numbers of training micro-steps: the "
            "phases' peaks compare, the size-class counts of `train` and `optimizer` do not.",
            "",
        ]
        if spg > 1
        else []
    )
    return [
        *lines,
        *_fidelity(traced, result),
        *window,
        *_phase_table(real.get("torch_reserved", {}), result["real"], result["traced"]),
        *_size_classes(result["profile"]),
        *_unmatched(result["unmatched"]),
        *_at_peak(result["at_peak"]),
        *_reserves(result["real"], result["traced"]),
        *_stranded(result.get("stranding")),
    ]


def _stranded(found: dict | None) -> list[str]:
    """(e): what the allocator cannot give back just below each stream's need (`sweeps.report.stranding`), the
    real stream's beside the traced one's: the same segments held by the same blocks says the trace shows the
    mechanism that sets the need."""
    if not found:
        return []
    out = [
        "**(e) What strands the memory at the need (simulated)**: each stream replayed under a limit just below "
        "its smallest passing one; the request that fails, and the free space held inside segments a live block "
        "occupies, by the phase and size each segment was made for and the largest block in it.",
        "",
    ]
    for what, s in found.items():
        if s is None:
            continue
        groups = "; ".join(describe(p) for p in s.pinned[:3])
        out.append(
            f"- {what}: a {s.request_bytes / 2**20:,.1f} MiB request in `{s.phase or '(none)'}` fails with "
            f"{_gib(s.stranded_bytes)} GiB stranded; largest: {groups}."
        )
    return [*out, ""]


def _real_stream(real: dict) -> list[str]:
    """The real stream's own figures, and what it may be missing (measured-gpu)."""
    tr = real.get("torch_reserved", {})
    lines = [f"## {real['key']}: {_title(real['config'])}", ""]
    lines.append(
        f"Real stream `{real.get('stream')}` (measured-gpu): {real.get('events')} events, trace entries by action "
        f"{json.dumps(real.get('actions', {}), sort_keys=True)}; torch reserved (measured-gpu, segment events): "
        f"start {_gib(tr.get('start_bytes'))} GiB, peak {_gib(tr.get('peak_bytes'))} GiB in "
        f"`{tr.get('peak_phase') or '-'}`, end {_gib(tr.get('end_bytes'))} GiB."
    )
    at_stop = real.get("memory_reserved_at_stop_bytes")
    if at_stop is not None and at_stop != tr.get("end_bytes"):
        lines.append(
            f"The segment events miss something: they end at {_gib(tr.get('end_bytes'))} GiB, "
            f"torch.cuda.memory_reserved said {_gib(at_stop)} GiB (measured-gpu)."
        )
    if real.get("truncated") or real.get("unmatched_frees"):
        lines.append(
            f"The trace is incomplete: {real.get('lost')} (allocations, frees) lost to the ring buffer, "
            f"{real.get('unmatched_frees')} frees of unseen blocks."
        )
    return lines


def _fidelity(traced: dict, result: dict) -> list[str]:
    """(a): the simulator replaying the real stream against torch's own reserved peak."""
    f = result["fidelity"]
    return [
        f"Traced stream `{_rel(Path(traced.get('_dir', TRACED_DIR)) / traced['stream'])}` (traced, {traced.get('steps')} steps, cut to the real "
        f"{result['steps']}).",
        "",
        "**(a) Simulator fidelity on the real stream**: simulated peak reserved "
        f"{_gib(f['simulated_peak_reserved'])} GiB vs torch's {_gib(f['measured_peak_reserved'])} GiB "
        f"(measured-gpu): {f['error_bytes'] / 2**20:+.0f} MiB"
        + (f" ({100 * f['error_fraction']:+.2f} %)" if f["error_fraction"] is not None else "")
        + f"; torch had {_gib(f['measured_start_reserved'])} GiB reserved when the recording began.",
        "",
    ]


def _phase_table(tr: dict, r: dict, t: dict) -> list[str]:
    """(b): allocated and reserved per phase, real against traced, beside torch's own reserved."""
    lines = [
        "**(b) The streams (GiB)**",
        "",
        "| phase | allocated, real (simulated blocks) | allocated, traced (simulated blocks) | reserved, torch "
        "(measured-gpu) | reserved, real (simulated) | reserved, traced (simulated) |",
        "|---|---|---|---|---|---|",
    ]
    for p in sorted(set(r["phases"]) | set(t["phases"]) | set(tr.get("phases", {}))):
        rp, tp = r["phases"].get(p, [None, None]), t["phases"].get(p, [None, None])
        torch_p = max(
            (v for k, v in tr.get("phases", {}).items() if stream_diff.phase_name(k) == p), default=None
        )
        lines.append(
            f"| {p} | {_gib(rp[1])} | {_gib(tp[1])} | {_gib(torch_p)} | {_gib(rp[0])} | {_gib(tp[0])} |"
        )
    lines.append(
        f"| **peak** | {_gib(r['peak_allocated'])} | {_gib(t['peak_allocated'])} | "
        f"{_gib(tr.get('peak_bytes'))} | {_gib(r['peak_reserved'])} | {_gib(t['peak_reserved'])} |"
    )
    return lines


def _size_classes(prof: dict) -> list[str]:
    """Allocations by size class and phase, real against traced."""
    lines = [
        "",
        "Allocations by size class and phase: count / GiB requested, real (measured-gpu) vs traced (traced).",
        "",
        "| phase | " + " | ".join(f"{n} real | {n} traced" for n, _ in stream_diff.SIZE_CLASSES) + " |",
        "|---|" + "---|---|" * len(stream_diff.SIZE_CLASSES),
    ]
    for p in sorted(set(prof["real"]) | set(prof["traced"])):
        cells = []
        for n, _ in stream_diff.SIZE_CLASSES:
            for side in ("real", "traced"):
                c, b = prof[side].get(p, {}).get(n, [0, 0])
                cells.append(f"{c} / {b / 2**30:.2f}")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def _unmatched(unmatched: list[dict]) -> list[str]:
    """The largest request sizes only the real stream makes: what the CPU trace misses."""
    lines = [
        "",
        "Largest request sizes in the real stream that the traced stream never makes (measured-gpu):",
        "",
    ]
    if not unmatched:
        return [*lines, "none: every size the real run requests, the trace requests too."]
    lines += ["| size (MiB) | count | GiB in all | first phase |", "|---|---|---|---|"]
    for u in unmatched:
        lines.append(
            f"| {u['size'] / 2**20:.2f} | {u['count']} | {u['bytes'] / 2**30:.2f} | {u['first_phase']} |"
        )
    return lines


def _at_peak(d: dict) -> list[str]:
    """What each stream holds at its allocated peak, where the two differ by request size."""
    (rp, rph), (tp, tph) = d["real"], d["traced"]
    lines = [
        "",
        f"At the allocated peak: real {_gib(rp)} GiB in {rph} (measured-gpu), traced {_gib(tp)} GiB in {tph} (traced); "
        "request sizes live a different number of times, largest byte difference first:",
        "",
    ]
    if not d["sizes"]:
        return [*lines, "none: the two hold the same sizes at their peaks."]
    lines += ["| size (MiB) | live, real | live, traced | real - traced (GiB) |", "|---|---|---|---|"]
    for r in d["sizes"]:
        lines.append(f"| {r['size'] / 2**20:.2f} | {r['real']} | {r['traced']} | {r['bytes'] / 2**30:+.3f} |")
    if d["others_bytes"]:
        lines.append(f"| other sizes | | | {d['others_bytes'] / 2**30:+.3f} |")
    return lines


def _reserves(r: dict, t: dict) -> list[str]:
    """(c): the reserve each stream implies under the simulated allocator."""
    lines = ["", "**(c) The reserve each stream implies (simulated, GiB)**", ""]
    for name, s in (("real", r), ("traced", t)):
        need = (
            f"; smallest limit that runs it {_gib(s['min_device_limit'])}, {_gib(s['need'])} over peak allocated"
            if "need" in s
            else ""
        )
        lines.append(f"- {name}: peak reserved - peak allocated = {_gib(s['reserve'])}{need}")
    lines.append("")
    return lines


def report(gpu: Path, traced_dir: Path, trace_missing: bool = False, need: bool = True) -> tuple[str, int]:
    """The markdown for every real stream in `gpu`, and how many were compared with a traced stream (a stream of
    a setting no CPU trace can run, `untraceable`, is never traced: it is replayed alone)."""
    reals, bad = read_index(gpu / "index.jsonl")
    traced = traced_rows(traced_dir, gpu)
    lines = [
        "# Real allocation streams (measured-gpu) against traced ones",
        "",
        "Written by `python -m sweeps.report.gpu_streams` (`make gpu-streams`) from the `history` probe's streams "
        f"(`{_rel(gpu)}`) and the traced streams (`{_rel(traced_dir)}`). measured-gpu: torch's own allocator "
        "history on the GPU; traced: the FakeTensorMode trace on CPU, its tied gradients' sum made in place as on the GPU; simulated: `estimator.hardware.allocator` "
        "replaying a stream. Sizes are requests; allocated and reserved from a replay count whole blocks.",
        "",
    ]
    if bad:
        lines += [f"{bad} line(s) of `index.jsonl` skipped: not a run's JSON line.", ""]
    compared = 0
    for real in reals:
        what = untraceable(real.get("config") or {})
        if what is not None:
            result = stream_diff.alone(load_stream(gpu / real["stream"]), real["torch_reserved"], need=need)
            lines += section_alone(real, result, what, _estimate_of(real["config"]))
            continue
        match = traced_for(real, traced)
        if match is None and trace_missing:
            match = _trace(real, traced_dir)
        result = None
        if match is not None:
            events = load_stream(gpu / real["stream"])
            traced_events = _traced_events(match.get("_dir", traced_dir), match)
            result = stream_diff.compare(events, traced_events, real["torch_reserved"], need=need)
            if need:
                result["stranding"] = {
                    "real stream (measured-gpu)": stranding(events),
                    "traced stream": stranding(traced_events),
                }
            compared += 1
        lines += section(real, match, result)
    return "\n".join(lines).rstrip() + "\n", compared


def _traced_events(traced_dir: Path, row: dict) -> list:
    """The traced stream of `row` with its tied sums made in place as on the GPU (`row_traces.real_events`), so the
    comparison shows what the trace misses, not that known difference."""
    from sweeps.report import row_traces

    config = {k: v for k, v in row["config"].items() if k != "trl_version"}
    cfg, arch = row_traces.config_and_arch(config, (row.get("model") or {}).get("config"))
    return row_traces.real_events(traced_dir / row["stream"], cfg, arch)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def _trace(real: dict, traced_dir: Path) -> dict | None:
    """Trace the real row's config into `traced_dir` (as many steps as the real run) and return its index row."""
    from sweeps.trace import streams

    cfg = RunConfig.from_dict({k: v for k, v in real["config"].items() if k != "trl_version"})
    steps = int((real.get("variant") or {}).get("steps", 2))
    streams.record(cfg, traced_dir, steps)
    rows, _ = read_index(traced_dir / "index.jsonl")
    found = traced_for(real, rows)
    return None if found is None else {**found, "_dir": traced_dir}


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="gpu-streams", description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=Path, default=GPU_DIR, help="folder of the history probe's streams")
    ap.add_argument("--traced", type=Path, default=TRACED_DIR, help="folder of the traced streams")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--trace-missing", action="store_true", help="trace a config that has no traced stream")
    ap.add_argument("--no-need", action="store_true", help="skip the smallest-limit search (faster)")
    a = ap.parse_args(argv)
    for flag, folder in (("--gpu", a.gpu), ("--traced", a.traced)):
        if folder.exists() and not folder.is_dir():
            ap.error(f"{flag} {str(folder)[:80]!r}: not a folder; accepted values are folders of streams")
    if not (a.gpu / "index.jsonl").exists():
        print(f"gpu-streams: no real streams in {_rel(a.gpu)} (record some with probe=history on a GPU)")
        return 0
    text, compared = report(a.gpu, a.traced, a.trace_missing, need=not a.no_need)
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(a.out)
    print(f"gpu-streams: {compared} real stream(s) compared with traced ones -> {_rel(a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
