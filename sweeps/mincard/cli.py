"""grpo-vram-mincard: for each configuration of the lineup, the smallest torch memory limit its GRPO steps pass
under (measured), by k-ary search over `memory_limit_bytes`, several limit runs at once on one GPU.

    grpo-vram-mincard [--rows r00,r01] [--budget-s 540] [OVERRIDE ...]

Rows are `+experiment=mincard`'s (sweeps/runner/conf/experiment/mincard.yaml); OVERRIDEs are Hydra overrides
applied to every row after it (e.g. `model=tiny-2M device=cpu`). One row per configuration goes to
`<results-dir>/<name>.jsonl` when its search is over; every finished limit run is kept in
`<results-dir>/trials/<name>.jsonl`, so a rerun skips finished configurations and resumes the others from the
limits already tried. With --budget-s no limit run starts that its expected time would carry past the budget, and
one still going at the end is killed, its run not kept: the command ends by itself inside a lease's time.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from estimator.units import GIB
from sweeps import records
from sweeps.mincard import checkpoints, lineup, rows, schedule, search, trials
from sweeps.oneline import OneLineParser
from sweeps.probes import allocator_history
from sweeps.runner import measure
from sweeps.runner.job import BadInput, name_problem, printable
from sweeps.runner.run_one import PROBES

PROG = "grpo-vram-mincard"
CHILD = "sweeps.runner.run_one"


def _parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides applied to every row")
    p.add_argument("--rows", help="comma-separated row names (default: every row, in the lineup's order)")
    p.add_argument("--budget-s", type=float, help="wall-clock budget in seconds (default: none)")
    p.add_argument("--k", type=int, default=4, help="limits per round (default 4)")
    p.add_argument("--resolution", type=float, default=0.015, help="stop at (hi - lo) / lo <= this (0.015)")
    p.add_argument("--max-concurrent", type=int, default=6, help="limit runs at once (default 6)")
    p.add_argument(
        "--context-gib", type=float, default=0.6, help="per-run memory outside torch's allocator (0.6 GiB)"
    )
    p.add_argument(
        "--usable-fraction", type=float, default=0.95, help="share of the card the runs may use (0.95)"
    )
    p.add_argument(
        "--leave-gib",
        type=float,
        default=0.0,
        help="GiB of the card left to other work running beside the search, e.g. another lease stage (0)",
    )
    p.add_argument("--device-total-bytes", type=int, help="the card's memory (default: NVML's total)")
    p.add_argument("--cap-gib", type=float, help="every baseline's limit (default: 2 x the estimator's need)")
    p.add_argument(
        "--baseline-probes",
        default="history",
        help="probes added to each configuration's run at its baseline limit, comma-separated: history records "
        "torch's own allocator stream there (default history; '' for none); a resumed search on a GPU whose "
        "stream was never recorded runs the largest limit it passed under once more for it",
    )
    p.add_argument("--results-dir", default="results/raw", help="where the rows go (default results/raw)")
    p.add_argument("--name", default="mincard", help="rows file name without .jsonl (default mincard)")
    p.add_argument(
        "--log-dir", default="outputs/mincard", help="one log per limit run (default outputs/mincard)"
    )
    # test doubles (CPU tests): the child fails under a limit below this; a child module taking the same spec
    p.add_argument("--simulated-need-bytes", type=int, help="tests only: runs fail under a limit below this")
    p.add_argument("--child-module", default=CHILD, help="tests only: the child run as python -m MODULE spec")
    return p


# Bounds no card nears: a PiB of device memory, and limits per round far past the few a search runs at once
# (the search enumerates each round's limits, so a huge --k never ends).
MAX_BYTES = 1 << 50
MAX_K = 64


def _check(args) -> None:
    """Each number in its range (BadInput, one line)."""
    checks = [
        ("--k", args.k, 1 <= args.k <= MAX_K, f"integers from 1 to {MAX_K}"),
        ("--resolution", args.resolution, 0 < args.resolution < 1, "numbers in (0, 1)"),
        ("--max-concurrent", args.max_concurrent, args.max_concurrent >= 1, "integers >= 1"),
        ("--context-gib", args.context_gib, 0 <= args.context_gib < 1e6, "numbers of GiB >= 0"),
        ("--usable-fraction", args.usable_fraction, 0 < args.usable_fraction <= 1, "numbers in (0, 1]"),
        ("--leave-gib", args.leave_gib, 0 <= args.leave_gib < 1e6, "numbers of GiB >= 0"),
    ]
    for flag, value, top, optional in (
        ("--budget-s", args.budget_s, float("inf"), "seconds > 0"),
        ("--cap-gib", args.cap_gib, MAX_BYTES / GIB, f"GiB > 0, at most {MAX_BYTES // GIB}"),
        ("--device-total-bytes", args.device_total_bytes, MAX_BYTES, f"integers from 1 to {MAX_BYTES}"),
        ("--simulated-need-bytes", args.simulated_need_bytes, MAX_BYTES, f"integers from 1 to {MAX_BYTES}"),
    ):
        if value is not None:
            checks.append((flag, value, 0 < value <= top and value < float("inf"), optional))
    if args.rows is not None and not [r for r in args.rows.split(",") if r.strip()]:
        raise BadInput(
            f"--rows={args.rows!r}: accepted values are comma-separated row names (leave it out for all)"
        )
    for flag, value, ok, accepted in checks:
        if not ok or value != value:
            raise BadInput(f"{flag}={value!r}: accepted values are {accepted}")
    problem = name_problem(args.name)
    if problem:
        raise BadInput(f"--name={args.name!r}: {problem}")
    for probe in (p for p in args.baseline_probes.split(",") if p):
        if probe not in PROBES:
            raise BadInput(
                f"--baseline-probes={printable(args.baseline_probes)[:80]!r}: accepted names are {', '.join(PROBES)}"
            )


def device_total(device: str, given: int | None) -> int:
    """The card's bytes: given, else NVML's total (no CUDA context in this process), else the host's memory."""
    if given is not None:
        return given
    if device == "cuda":
        from sweeps.probes.nvml import open_cuda_device

        nv, reason = open_cuda_device(0)
        if nv is None:
            raise BadInput(f"device=cuda: no GPU to measure on ({reason}); accepted: a machine with one")
        return nv.total_bytes()
    total = records.device_info(device)["total_bytes"]
    if not total:
        raise BadInput("--device-total-bytes: this machine's memory is unknown; give it")
    return total


class ChildRun:
    """One limit run in a child process (measure.run_child: timeout, dies with this process, work dir), waited
    for by a thread of its own so that several run at once."""

    def __init__(self, spec: dict, timeout_s: float, log_path: Path, module: str):
        self.timeout_s = timeout_s
        self._result: dict | None = None
        self._thread = threading.Thread(
            target=self._run, args=(spec, log_path, module), name="mincard-child", daemon=True
        )
        self._thread.start()

    def _run(self, spec: dict, log_path: Path, module: str) -> None:
        try:
            self._result = measure.run_child(spec, self.timeout_s, log_path, module=module)
        except Exception as exc:  # a run's failure is its outcome
            self._result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            shutil.rmtree(spec["workdir"], ignore_errors=True)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> dict:
        return self._result or {"status": "error", "error": "no result"}


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def run(args) -> int:
    """Everything after the command line was read; the exit code."""
    _check(args)
    wanted = args.rows.split(",") if args.rows else None
    results_path = Path(args.results_dir) / f"{args.name}.jsonl"
    entries = [
        replace(e, job=replace(e.job, results_path=results_path, sweep=args.name))
        for e in lineup.entries(wanted, args.overrides)
    ]
    measure.check_writable(results_path)
    if any(e.job.config.device == "cpu" for e in entries):
        # CPU runs side by side share the cores, each its share of threads: OpenMP threads beyond the cores spin
        # (two tiny-2M runs side by side on 2 cores take 130 s each, not 13; measured-cpu); a value the user set
        # is kept
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.max_concurrent)))
    clock = time.monotonic
    deadline = clock() + args.budget_s if args.budget_s else None
    lock_path = results_path.with_name(f".{results_path.stem}.mincard.jsonl.lock")
    with records.file_lock(lock_path, blocking=False) as lock:
        if lock is None:
            print(f"{PROG}: another {PROG} is measuring into {results_path} right now", file=sys.stderr)
            return 1
        measure.recover(results_path)
        versions = records.package_versions()
        todo = _not_done(entries, results_path, versions)
        if not todo:
            return 0
        searches = Searches(args, todo, trials.trials_path(results_path), _card(todo, args))
        searches.resume(versions)
        for model, seed, device in checkpoints.needed([e.job for e in todo]):
            problem = checkpoints.build(model, seed, device)
            if problem:
                print(f"{PROG}: {problem}", file=sys.stderr)
                return 1
        complete = schedule.run(
            searches.states,
            searches.launch,
            searches.card,
            child_timeout_s=min(e.job.timeout_s for e in todo),
            deadline=deadline,
            on_trial=searches.on_trial,
            on_done=searches.on_done,
            clock=clock,
        )
        if not complete:
            left = sum(1 for s in searches.states if s.state == "searching")
            print(
                f"{PROG}: budget reached with {left} configuration(s) unfinished; their runs are kept in "
                f"{searches.trials_path}, a rerun of the same command resumes them",
                flush=True,
            )
    return 0


def _not_done(entries: list, results_path: Path, versions: dict) -> list:
    """The entries without a finished row in `results_path` (the sweep's one "already done" rule)."""
    done = measure.skip_keys(results_path, versions)
    todo = []
    for e in entries:
        if e.job.key in done:
            print(f"skip {e.row} {e.job.key} {e.job.config.model}: already in {results_path}", flush=True)
        else:
            todo.append(e)
    return todo


def _card(todo: list, args) -> schedule.Card:
    """The card the runs share: its usable bytes, each run's memory outside torch, the most runs at once."""
    devices = {e.job.config.device for e in todo}
    if len(devices) != 1:
        raise BadInput(f"device: the rows run on {sorted(devices)}; accepted: one device for the lineup")
    card = schedule.Card(
        usable_bytes=int(device_total(devices.pop(), args.device_total_bytes) * args.usable_fraction)
        - int(args.leave_gib * GIB),
        context_bytes=int(args.context_gib * GIB),
        max_concurrent=args.max_concurrent,
    )
    if card.max_limit <= 0:
        raise BadInput(
            f"--context-gib={args.context_gib!r}, --leave-gib={args.leave_gib!r}: leave no memory for torch on "
            "this card; accepted: smaller values"
        )
    return card


@dataclass
class Searches:
    """One search per configuration: its state, the runs kept so far, and what the scheduler calls back (a run
    to start, a run finished, a search done)."""

    args: object
    todo: list
    trials_path: Path
    card: schedule.Card
    states: list = field(default_factory=list)
    kept: list = field(default_factory=list)
    stream_limits: dict = field(default_factory=dict)  # search -> the limit whose first run gets the probes
    log_dir: Path = field(default_factory=lambda: Path("."))

    def resume(self, versions: dict) -> None:
        """Each configuration's search from its kept runs (none for a new one), its baseline under the cap."""
        cap = int(self.args.cap_gib * GIB) if self.args.cap_gib else None
        for e in self.todo:
            first = lineup.baseline_limit(e, cap)
            if first is None:
                raise BadInput(f"row {e.row}: the estimator cannot size {e.job.config.model}; give --cap-gib")
            params = search.Params(
                first_limit=min(first, self.card.max_limit),
                max_limit=self.card.max_limit,
                k=self.args.k,
                resolution=self.args.resolution,
            )
            lines = trials.load(self.trials_path, e.job.key, versions)
            self.kept.append(lines)
            state = schedule.SearchState(
                params, [trials.as_trial(x) for x in lines], e.expected_s, seconds=[]
            )
            again = ""
            passed = [t.limit_bytes for t in state.trials if t.status == "ok"]
            if not lines:
                self.stream_limits[len(self.states)] = search.baseline(params)
            elif passed and self.stream_missing(e.job) and state.state == "searching":
                # its baseline ran without a stream: the largest limit it passed under again, beside the next
                # round, with the probes (the baseline's own, where that passed: the allocator's own reserve)
                self.stream_limits[len(self.states)] = max(passed)
                state.waiting = sorted(set(search.next_limits(state.trials, params)) | {max(passed)})
                again = f", {_gib(max(passed))} again for the allocator stream"
            self.states.append(state)
            need = f"need {_gib(e.need_bytes)} (estimated)" if e.need_bytes else "need unknown"
            print(
                f"{e.row} {e.job.key} {e.job.config.model}: {need}, baseline limit {_gib(params.first_limit)}, "
                f"{len(lines)} run(s) kept{again}",
                flush=True,
            )
        self.log_dir = Path(self.args.log_dir) / time.strftime("%Y%m%d-%H%M%S")

    def stream_missing(self, job) -> bool:
        """Whether the history probe is asked for, can record (a GPU run) and has no stream of `job` yet."""
        if "history" not in self.args.baseline_probes.split(",") or job.config.device != "cuda":
            return False
        out = (job.probe_options.get("history") or {}).get("out_dir") or allocator_history.OUT_DIR
        rows, _ = records.read_index(Path(out) / "index.jsonl")
        return not any(r.get("key") == job.key for r in rows)

    def launch(self, i: int, limit: int, timeout_s: float) -> ChildRun:
        """The child run of search `i` under `limit`; the baseline probes go to its first run at its stream limit
        (a new search's baseline, or a resumed one's extra run for a stream never recorded)."""
        job = self.todo[i].job
        workdir = Path(tempfile.mkdtemp(prefix=f"grpo-vram-mincard-{job.key}-"))
        probes = list(job.probes)
        if self.stream_limits.get(i) == limit:
            del self.stream_limits[i]  # once: the real stream comes back too
            extra = [p for p in self.args.baseline_probes.split(",") if p]
            probes += [p for p in extra if p not in probes]
        spec = {
            "config": job.config.to_dict(),
            "variant": job.variant,
            "probes": probes,
            "probe_options": job.probe_options,
            "inject_failure": job.inject_failure,
            "result_path": str(workdir / "result.json"),
            "workdir": str(workdir),
            "remove_workdir_if_orphaned": True,
            "memory_limit_bytes": limit,
            "simulated_need_bytes": self.args.simulated_need_bytes,
        }
        log = self.log_dir / f"{self.todo[i].row}-{limit}.log"
        return ChildRun(spec, timeout_s, log, self.args.child_module)

    def on_trial(self, f: schedule.Finished) -> search.Trial | None:
        """A finished run, kept at once (a crash bounds nothing: not kept, run again)."""
        e = self.todo[f.search]
        line = trials.trial_line(e.job.key, self.args.name, f.limit_bytes, f.result, f.seconds)
        t = line["trial"]
        print(
            f"{e.row} limit {_gib(f.limit_bytes)}: {t['status']} (reserved {_gib(t['peak_reserved_bytes'])} "
            f"{e.job.source}, {f.seconds:.0f} s)" + (f": {t['error']}" if t["status"] == "error" else ""),
            flush=True,
        )
        if t["status"] == "error":
            return None
        trials.record(self.trials_path, line)
        self.kept[f.search].append(line)
        return trials.as_trial(line)

    def on_done(self, i: int) -> None:
        """Search `i` ended: its one row, written atomically."""
        e, s = self.todo[i], self.states[i]
        if s.state == "no-fit" and self.args.leave_gib > 0:
            # a share of the card bounds nothing about the configuration: no row, its runs stay kept for a
            # search with the whole card (a written oom row would be final)
            print(
                f"open {e.row} {e.job.key} {e.job.config.model}: no limit up to {_gib(s.params.max_limit)} passes "
                f"on the card less --leave-gib {self.args.leave_gib:g}; left for a search with the whole card",
                flush=True,
            )
            return
        row = rows.make_mincard_row(e.job, self.kept[i], s.state, s.params)
        with measure.signals_deferred():
            measure.store_row(e.job, row, Path(tempfile.gettempdir()))
        m = row["mincard"]
        print(
            f"{row['status']} {e.row} {e.job.key} {e.job.config.model}: min {_gib(m['min_torch_bytes'])}, "
            f"max failing {_gib(m['max_failing_bytes'])} ({e.job.source}, {len(m['limits_tried'])} runs)",
            flush=True,
        )


class Terminated(BaseException):
    """SIGTERM, handled like Ctrl-C."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input is one stderr line and exit 2; Ctrl-C / SIGTERM one line (130 / 143)."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)

    def on_term(*_):
        raise Terminated

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        return run(args)
    except BadInput as exc:
        print(f"{PROG}: {printable(str(exc))}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        print(
            f"{PROG}: stopped; the limit runs still going are stopped with it and not kept, every finished one is "
            "kept (a rerun resumes)",
            file=sys.stderr,
            flush=True,
        )
        # exiting ends the threads waiting on the children, whose parent-death signal then stops them
        os._exit(143 if isinstance(exc, Terminated) else 130)


if __name__ == "__main__":
    sys.exit(main())
