"""Retrace the traced rows a tracer fix or an upstream release changes (`grpo-vram-trace retrace`), resumably.

In place: every `ok` row whose config meets each `--where` condition is traced again with its own config,
variant, sweep and seed (the same key) and replaces its line atomically (`records.replace_row`), tagged
`retraced: TAG`; other lines stay byte for byte, and a rerun skips rows carrying the tag. A retrace that fails
or runs past `--timeout` leaves the old row and is reported.

`--beside` (a new upstream release): the retrace is appended as a row of its own under the installed
transformers (its own key, `retrace_of` naming the old one); the old rows stay, and a rerun skips rows whose
retrace is in the file.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from estimator.settings.config import RunConfig
from estimator.settings.versions import default_transformers
from sweeps import records
from sweeps.trace.rows import DECODE_K, make_row


class _OverBudget(Exception):
    """Raised by SIGALRM inside a trace that ran past the per-row time budget."""


def _alarm(signum, frame):
    raise _OverBudget


def matches(config: dict, cond: str) -> bool:
    """`field` (truthy) or `field=value` (equal to the JSON value, e.g. `bf16=false`, `dtype="float16"`)."""
    field, eq, value = cond.partition("=")
    if not eq:
        return bool(config.get(field))
    try:
        wanted = json.loads(value)
    except ValueError:
        wanted = value
    return config.get(field) == wanted


def selected(rows: list[dict], where: list[str], tag: str) -> list[dict]:
    """The ok rows whose config meets every `where` condition and that do not yet carry `retraced: tag` (the
    latest row of each key: `records.replace_row` writes one line per key)."""
    return [
        r
        for r in records.latest_rows(rows)
        if r.get("status") == "ok"
        and all(matches(r.get("config", {}), c) for c in where)
        and r.get("retraced") != tag
    ]


def _installed_key(old: dict) -> str:
    """The key `old`'s retrace gets under the installed transformers."""
    cfg = RunConfig.from_dict(old["config"]).with_(transformers_version=default_transformers())
    return records.make_key(cfg.to_dict(), old.get("variant") or {})


def beside_todo(rows: list[dict], where: list[str], tag: str) -> list[dict]:
    """`selected` rows modelled at another transformers release than the installed one, whose retrace under
    the installed release is not in `rows` yet."""
    here = default_transformers()
    keys = {r.get("key") for r in rows}
    return [
        r
        for r in selected(rows, where, tag)
        if RunConfig.from_dict(r["config"]).transformers_version != here and _installed_key(r) not in keys
    ]


def retrace_row(old: dict, trace=make_row) -> dict:
    """`old`'s config traced again under its own variant (decode k, micro-batch cap, depth), sweep and seed."""
    var = old.get("variant") or {}
    cfg = RunConfig.from_dict(old["config"])
    extra = {"seed": old["seed"]} if old.get("seed") is not None else {}
    return trace(
        cfg,
        sweep=old.get("sweep") or "retrace",
        k=var.get("k", DECODE_K),
        max_micro=var.get("max_micro"),
        num_layers=var.get("layers"),
        **extra,
    )


def run(
    paths: list[Path], where: list[str], tag: str, timeout: int, trace=make_row, beside: bool = False
) -> int:
    """Retrace the selected rows of each file, in place or `beside` them; returns how many could not be."""
    failed = 0
    signal.signal(signal.SIGALRM, _alarm)
    for path in paths:
        rows = records.load_rows(path)
        todo = beside_todo(rows, where, tag) if beside else selected(rows, where, tag)
        print(f"{path}: {len(todo)} rows to retrace", flush=True)
        for i, old in enumerate(todo, 1):
            t0 = time.perf_counter()
            signal.alarm(timeout)
            try:
                new = retrace_row(old, trace)
            except _OverBudget:
                new = {"status": "error", "error": f"over {timeout} s"}
            except (KeyError, TypeError, ValueError) as e:  # a row whose config this code cannot read
                new = {"status": "error", "error": f"{type(e).__name__}: {e}"}
            finally:
                signal.alarm(0)
            if beside:
                ok = new.get("status") == "ok" and new.get("key") == _installed_key(old)
                if ok:
                    records.append_row(path, {**new, "retraced": tag, "retrace_of": old["key"]})
            else:
                ok = new.get("status") == "ok" and new.get("key") == old["key"]
                if ok:
                    records.replace_row(path, {**new, "retraced": tag})
            if not ok:
                failed += 1
            before = old["observed"]["peak_bytes"] / 2**20
            after = (
                f"{new['observed']['peak_bytes'] / 2**20:.0f} MiB traced"
                if ok
                else f"old row kept ({new.get('error') or 'key differs'})"
            )
            print(
                f"[{i}/{len(todo)}] {old['key']} {old['config'].get('model')}: peak {before:.0f} MiB traced "
                f"-> {after} "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
    return failed
