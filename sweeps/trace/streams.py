"""Record the allocation streams of a few traced GRPO runs (3 steps each) and simulate the caching allocator on them.

    python -m sweeps.trace.streams [--grid core] [--index 0 2 4] [--steps 3] [--out results/streams]

Per config: `<key>.txt.gz` (the event stream, `estimator.allocator.dump_stream` format) and one row appended to
`index.jsonl`: the config, the traced peak, and the simulation of the stream under the default allocator, with
`expandable_segments:True` and with `max_split_size_mb:128` (source "simulated", stream "traced"). A rerun skips
configs whose stream and row exist. Streams are kept to a handful of representative configs (repo size).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from estimator.allocator import AllocatorSettings, dump_stream, simulate
from estimator.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "results" / "streams"
# (grid, index): 0.5B full FT without checkpointing; 1.5B full FT, LoRA, QLoRA, full FT with a reference model; 7B LoRA,
# QLoRA with checkpointing, 7B LoRA without
DEFAULT_PICKS = (
    ("headline", 0),
    ("core", 0),
    ("core", 2),
    ("core", 4),
    ("core", 31),
    ("core", 14),
    ("core", 16),
    ("core", 39),
)
VARIANTS = {
    "default": "",
    "expandable_segments": "expandable_segments:True",
    "max_split_size_mb_128": "max_split_size_mb:128",
}


def stream_key(cfg: RunConfig, steps: int) -> str:
    """Stable file name for a config's stream."""
    from sweeps import records

    return records.make_key(cfg.to_dict(), {"steps": steps, "stream": "alloc"})


def simulate_variants(events: list) -> dict:
    """The stream under each allocator setting of VARIANTS (SimResult.to_dict)."""
    return {
        name: simulate(events, AllocatorSettings.from_conf(conf)).to_dict() for name, conf in VARIANTS.items()
    }


def record(cfg: RunConfig, out: Path, steps: int) -> dict | None:
    """Trace `cfg` for `steps` steps, write its stream and return its index row (None if already there)."""
    from sweeps.trace import step

    key = stream_key(cfg, steps)
    path = out / f"{key}.txt.gz"
    index = out / "index.jsonl"
    if path.exists() and index.exists() and key in index.read_text():
        return None
    res = step.run(cfg, fake=True, steps=steps)
    dump_stream(res.events, path)
    row = {
        "key": key,
        "source": "traced",
        "stream": path.name,
        "steps": steps,
        "config": cfg.to_dict(),
        "events": len(res.events),
        "traced_peak_bytes": res.observed["peak_bytes"],
        "simulated": simulate_variants(res.events),
    }
    with index.open("a") as fh:  # one line per config, appended whole
        fh.write(json.dumps(row, sort_keys=True) + "\n")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=None, help="grid name (with --index); default: the built-in picks")
    ap.add_argument("--index", type=int, nargs="*", default=None, help="config indices in --grid")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    from sweeps.trace.grid import grid_configs

    picks = [(a.grid, i) for i in a.index] if a.grid and a.index is not None else list(DEFAULT_PICKS)
    a.out.mkdir(parents=True, exist_ok=True)
    for grid, i in picks:
        try:
            cfg = grid_configs(grid)[i]
        except (KeyError, IndexError) as e:
            print(f"grid {grid!r} index {i}: {e}", file=sys.stderr)
            return 2
        row = record(cfg, a.out, a.steps)
        if row is None:
            print(f"{grid}[{i}]: already recorded")
            continue
        d = row["simulated"]["default"]
        print(
            f"{grid}[{i}] {cfg.model} peft={cfg.use_peft} 4bit={cfg.load_in_4bit} gc={cfg.gradient_checkpointing}: "
            f"{row['events']} events, allocated {d['peak_allocated'] / 2**30:.2f} GiB, reserved "
            f"{d['peak_reserved'] / 2**30:.2f} GiB (+{100 * d['fragmentation_fraction']:.1f}%)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
