"""`make upstream-check`: would the newest upstream releases still behave as the estimator and the tracer assume?

    PYTHONPATH=. <venv>/bin/python -m sweeps.report.upstream_check [--lock requirements/lock.txt]
        [--markdown docs/upstream-check.md] [--junit PATH] [--from-junit PATH]

Run it with the interpreter of the venv to check (`make upstream-check` builds .venvs/upstream with the newest
releases pyproject.toml allows, or UPSTREAM_PINS). In that interpreter it runs pytest on the tracer's
upstream-source guard (`GUARD`) and on the ground-truth tests (`GROUND_TRUTH`: tests that run real transformers,
peft, bitsandbytes, accelerate or torch modules and compare what they allocate or build with the estimator's terms or the
tracer's emulation), then reports

- each upstream package's installed version beside the lock's;
- each guard target whose source differs from the one the tracer was checked against, with the tracer code that
  follows it (targets whose version is only unrecorded, with the same source, are counted apart);
- each ground-truth test that failed or errored: the code path it runs, its failing assertion and the numbers
  it compared (the test's locals: estimated vs measured, and by how much);
- the tests that were skipped (they checked nothing).

Exit 0 when every test passed and no guarded source changed, 1 when anything drifted, 2 when pytest could not run.
"""

from __future__ import annotations

import ast
import datetime
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from sweeps.oneline import OneLineParser

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "lock.txt"

# The upstream-source guard: hashes of the upstream functions the tracer copies or patches (sweeps/trace/upstream.py).
GUARD = "tests/contracts/test_tracer_upstream.py"

# Tests that run upstream code and hold the estimator (or the tracer's emulation) to what it does, with the
# upstream code each one runs. Each was read to check it imports and runs that code (tests/sweeps/test_upstream_check.py
# checks every file still imports an upstream package).
GROUND_TRUTH: dict[str, str] = {
    "tests/ground_truth/test_decode_step.py": "transformers: a decode step of qwen2/llama/phi3 models (DynamicCache update, "
    "eager/sdpa attention, bf16 autocast)",
    "tests/ground_truth/test_rotary_instant.py": "transformers: Llama and Qwen3 attention forwards (apply_rotary_pos_emb)",
    "tests/ground_truth/test_lora_backward_chain.py": "peft: a LoRA linear's backward (adapter chain, dropout, 4-bit-style "
    "bf16 base)",
    "tests/ground_truth/test_lora_nograd_down.py": "transformers LlamaMLP + peft LoRA on down_proj: a no-grad forward under "
    "autocast",
    "tests/ground_truth/test_lora_nograd_4bit.py": "peft's bitsandbytes LoRA wrapper on bnb Linear4bit: a no-grad MLP forward",
    "tests/ground_truth/test_final_norm_backward.py": "transformers tiny causal LM (+ peft): the final norm's backward",
    "tests/ground_truth/test_rmsnorm_backward.py": "transformers LlamaRMSNorm / Gemma3RMSNorm: backward op by op",
    "tests/ground_truth/test_recompute_waiting_gradients.py": "transformers + peft under torch's non-reentrant checkpoint: the "
    "top layer's recompute",
    "tests/ground_truth/test_recompute_weight_casts.py": "transformers: decoder-layer Linear weights of catalog configs "
    "(meta device)",
    "tests/ground_truth/test_layer_saved_tensors.py": "transformers (+ peft) decoder layers: tensors autograd saves for backward",
    "tests/ground_truth/test_lora_output_instant.py": "peft lora.Linear forward: the adapter's add and cast",
    "tests/ground_truth/test_fake_model_4bit.py": "bitsandbytes Linear4bit (MatMul4Bit backward) and peft's dispatch vs the "
    "tracer's emulated 4-bit layer",
    "tests/ground_truth/test_moe_lora.py": "peft LoRA on transformers Qwen3-MoE fused experts: trainable tensors",
    "tests/ground_truth/test_architecture.py": "transformers: every catalog config built on the meta device (parameter counts)",
    "tests/accuracy/test_validation_band.py::test_peft_default_targets_match_installed_peft": "peft: its default LoRA "
    "target modules per model type",
    "tests/sweeps/test_bnb_dispatch.py": "bitsandbytes' CUDA gemm_4bit heuristic (compiled from the installed source): "
    "fused kernel or dequantized weight, per card",
    "tests/ground_truth/test_ddp_buckets.py": "torch DistributedDataParallel with accelerate's default DDP kwargs: the "
    "gradient buckets it allocates and keeps",
    "tests/ground_truth/test_traces_reproduce.py": "torch + transformers + peft + bitsandbytes: nine committed traced rows "
    "(full, LoRA, QLoRA, MoE) retraced under FakeTensorMode, peak for peak",
}
# Read and left out: it runs no upstream code, so a release cannot fail it.
NOT_GROUND_TRUTH = {
    "tests/ground_truth/test_bnb_4bit_terms.py": "bitsandbytes 0.50's code paths written out by hand, no bitsandbytes call "
    "(the guard's MatMul4Bit, dequantize_4bit, _gemm_4bit_kernel_impl, _dequant_linear_fallback and "
    "_gemm_4bit_use_custom_cuda hashes watch that code)",
}

HOW_TO_ADOPT = "docs/CONTRIBUTING.md (Adopting a new upstream release)"


def normalize(name: str) -> str:
    """PEP 503 name: `PyYAML` and `pyyaml`, `huggingface_hub` and `huggingface-hub` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{normalized name: version} of a `pkg==ver` file (comments and blank lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            pins[normalize(name)] = ver.strip()
    return pins


def direct_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """Names in pyproject's `dependencies` and `sweep` extra: the upstream packages the harness runs."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed project's metadata says the same
        reqs = metadata.requires("grpo-vram") or []
        reqs = [r for r in reqs if "extra ==" not in r or "sweep" in r]
    else:
        project = tomllib.loads(pyproject.read_text())["project"]
        reqs = project["dependencies"] + project["optional-dependencies"]["sweep"]
    return [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in reqs]


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


# --- junit ------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One test case of the junit file."""

    file: str  # tests/test_x.py
    name: str  # test_fn[param-ids]
    status: str  # passed, failed, error, skipped
    message: str = ""
    text: str = ""

    @property
    def nodeid(self) -> str:
        return f"{self.file}::{self.name}"

    @property
    def function(self) -> str:
        return self.name.split("[", 1)[0].split("::")[-1]


def _file_of(classname: str) -> str:
    """`tests.test_x` or `tests.test_x.TestClass` -> tests/test_x.py (classes are kept in the name)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if (REPO / path).is_file():
            return path
    return "/".join(parts) + ".py"


def parse_junit(path: Path) -> list[Outcome]:
    """Every test case of a pytest junit XML file, in file order."""
    outcomes = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        file = _file_of(classname)
        stem = file[: -len(".py")].replace("/", ".")
        if classname != stem:  # a test class: keep it in the name
            name = f"{classname[len(stem) + 1 :]}::{name}"
        status, message, text = "passed", "", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed"}.get(child.tag, child.tag)
                message, text = child.get("message", ""), child.text or ""
                break
        outcomes.append(Outcome(file, name, status, message, text))
    return outcomes


# --- a failure's assertion and values -----------------------------------------------------------------------------

_LOCAL = re.compile(r"^([A-Za-z_]\w*)\s*= (.*)$")
_LOCATION = re.compile(r"^(\S+\.py):(\d+): ")
_SEPARATOR = re.compile(r"^(_ )+_?\s*$")
_PY_LINE = re.compile(r"(\w\.py):(\d+)")
# which local names hold the estimator's number and which the measured one
_ESTIMATED = re.compile(r"estimat|^est(_|$)|predicted|^expected$|^want(ed)?$|^hand$|formula", re.I)
_MEASURED = re.compile(r"measur|traced|^peak$|^real|^actual|^got$|observed|counted|^saved", re.I)


@dataclass
class Detail:
    """What a failed test's longrepr says: the failing source line(s), the error lines, the numeric locals."""

    # where the failing statement is: "tests/test_x.py line 103" (not `path:line`, which tests/contracts/test_sources.py
    # reads as an upstream line citation once a drifted report is committed)
    location: str = ""
    source: list[str] = field(default_factory=list)
    error: list[str] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)

    def comparison(self) -> tuple[str, float, str, float] | None:
        """(estimated name, value, measured name, value) when the locals name both sides."""
        est = next(((k, v) for k, v in self.numbers.items() if _ESTIMATED.search(k)), None)
        meas = next(((k, v) for k, v in self.numbers.items() if _MEASURED.search(k)), None)
        if est is None or meas is None:
            return None
        return est[0], est[1], meas[0], meas[1]


def _number(text: str) -> float | None:
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def failure_detail(text: str) -> Detail:
    """Parse pytest's long traceback (run with --showlocals): entries are split by `_ _ _` lines; in each, code
    lines are indented or start with `>`, error lines start with `E `, locals (`name = repr`) follow the code,
    and a `path.py:N: Error` line closes it. Locals of the test files' frames are kept, deeper ones win."""
    detail = Detail()
    entries: list[list[str]] = [[]]
    for line in text.splitlines():
        if _SEPARATOR.match(line):
            entries.append([])
        else:
            entries[-1].append(line)
    for lines in entries:
        source, error, numbers, location, seen_code = [], [], {}, "", False
        for line in lines:
            if line.startswith(">"):
                source = [line[1:].strip()]
                seen_code = True
            elif line.startswith("    "):
                if source and not error:  # a statement continued on the lines after `>`
                    source.append(line.strip())
                seen_code = True
            elif line.startswith("E ") or line == "E":
                error.append(line[1:].strip())
            elif m := _LOCATION.match(line):
                location = f"{m.group(1)} line {m.group(2)}"
            elif seen_code and (m := _LOCAL.match(line)):
                value = _number(m.group(2))
                if value is not None:
                    numbers[m.group(1)] = value
        in_tests = location.startswith("tests/") or "/tests/" in location
        if in_tests or not detail.location:
            detail.numbers.update(numbers)
        if error:
            detail.source, detail.error = source, error
            detail.location = location or detail.location
        elif in_tests and not detail.error:
            detail.location, detail.source = location, source
    return detail


def docstring_line(file: str, function: str | None = None) -> str:
    """First line of the test function's docstring (or the module's), read without importing the test."""
    path = REPO / file
    if not path.is_file():
        return ""
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return ""
    node: ast.AST = tree
    if function:
        defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
        node = defs[0] if defs and ast.get_docstring(defs[0]) else tree
    doc = ast.get_docstring(node) or ""  # type: ignore[arg-type]
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ")


# --- the guard ----------------------------------------------------------------------------------------------------


@dataclass
class GuardRow:
    name: str
    package: str
    used_by: str
    installed: str | None
    reference: str | None  # the recorded version its source is compared with
    status: str  # same, changed, missing (gone or unreadable), unchecked (no recorded version)
    recorded: bool  # the installed version has its own entry
    note: str = ""


def guard_rows(lock: dict[str, str]) -> list[GuardRow]:
    """Each guard target's installed source against the hash recorded for the installed version, else for the
    lock's version, else for the newest recorded one."""
    from sweeps.trace import upstream

    table = upstream.load_table()
    rows = []
    for t in upstream.TARGETS:
        installed = installed_version(t.package)
        versions = table.get(t.package, {})
        locked = lock.get(normalize(t.package))
        if installed in versions:
            ref = installed
        elif locked in versions:
            ref = locked
        else:
            ref = max(versions, key=_version_key, default=None)
        want = versions.get(ref, {}).get(t.name) if ref else None
        row = GuardRow(t.name, t.package, t.used_by, installed, ref, "same", installed in versions)
        if installed is None:
            row.status, row.note = "missing", f"{t.package} is not installed"
        else:
            try:
                now = upstream.source_hash(t)
            except (LookupError, OSError, SyntaxError, UnicodeDecodeError) as e:
                row.status, row.note = "missing", str(e)
            else:
                if want is None:
                    row.status = "unchecked"
                elif now != want:
                    row.status = "changed"
        rows.append(row)
    return rows


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", v))


# --- the report ---------------------------------------------------------------------------------------------------


@dataclass
class Report:
    versions: list[tuple[str, str | None, str | None]]  # (package, lock, installed)
    other_differences: list[tuple[str, str | None, str | None]]
    guard: list[GuardRow]
    outcomes: list[Outcome]
    asked: str = ""

    @property
    def ground_truth(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.file != GUARD]

    @property
    def broken(self) -> list[Outcome]:
        return [o for o in self.ground_truth if o.status in ("failed", "error")]

    @property
    def guard_failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.file == GUARD and o.status in ("failed", "error")]

    @property
    def changed(self) -> list[GuardRow]:
        return [r for r in self.guard if r.status in ("changed", "missing")]

    @property
    def drifted(self) -> bool:
        return bool(self.broken or self.guard_failures or self.changed)


def build_report(outcomes: list[Outcome], lock: dict[str, str], asked: str = "") -> Report:
    names = direct_requirements()
    versions = [(n, lock.get(normalize(n)), installed_version(n)) for n in names]
    direct = {normalize(n) for n in names} | {"grpo-vram"}
    # the first of a name on sys.path is the one imports get (not a copy vendored inside setuptools)
    first: dict[str, str] = {}
    for dist in metadata.distributions():
        if dist.metadata["Name"]:
            first.setdefault(normalize(dist.metadata["Name"]), dist.version.split("+")[0])
    others = [(n, lock.get(n), v) for n, v in sorted(first.items()) if n not in direct and lock.get(n) != v]
    return Report(versions, others, guard_rows(lock), outcomes, asked)


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b * 100:+.1f} %" if b else "n/a"


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.4g}"


def revision(report: Path | None = None) -> str:
    """The checkout the tests ran from: its commit, and whether tracked files other than `report` (the last run's
    report, which this run rewrites) differed from it."""
    git = ["git", "-C", str(REPO)]
    mine = [f":(exclude){report.resolve().relative_to(REPO)}"] if report and _inside(report.resolve()) else []
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        status = [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", *mine]
        dirty = subprocess.run(status, capture_output=True, text=True)
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def _inside(path: Path) -> bool:
    try:
        path.relative_to(REPO)
    except ValueError:
        return False
    return True


def render(r: Report, when: str | None = None, rev: str | None = None, report: Path | None = None) -> str:
    """The report as markdown (also what the terminal shows)."""
    when = when or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rev = revision(report) if rev is None else rev
    out = ["# Upstream check", ""]
    out.append(
        f"`make upstream-check` on {when}{', commit ' + rev if rev else ''}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}{'; asked: ' + r.asked if r.asked else ''}. What it is and how "
        f"to act on it: {HOW_TO_ADOPT}."
    )
    out.append("")
    counts = {s: sum(o.status == s for o in r.ground_truth) for s in ("passed", "failed", "error", "skipped")}
    if r.drifted:
        parts = []
        if r.broken:
            parts.append(f"{len(r.broken)} ground-truth test(s) failed")
        if r.changed:
            parts.append(f"{len(r.changed)} guarded upstream source(s) changed")
        if r.guard_failures and not r.changed:
            parts.append(f"the guard failed {len(r.guard_failures)} time(s) (versions it has no hashes for)")
        out.append(f"**Drift**: {', '.join(parts)}.")
    else:
        out.append(
            "**Clean**: every guarded source is the one the tracer was checked on; every ground-truth test passed."
        )
    out.append(
        f"Ground truth: {counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
        f"{counts['skipped']} skipped, of {len(r.ground_truth)} tests in {len(GROUND_TRUTH)} entries."
    )
    out += ["", "## Versions", "", "| package | lock | installed | |", "|---|---|---|---|"]
    for name, locked, inst in r.versions:
        mark = "" if locked == inst else "**differs**" if inst else "not installed"
        out.append(f"| {name} | {locked or '-'} | {inst or '-'} | {mark} |")
    if r.other_differences:
        shown = ", ".join(f"{n} {lk or 'unlocked'} → {v}" for n, lk, v in r.other_differences)
        out += ["", f"Other installed packages that differ from the lock: {shown}."]

    out += ["", "## Guarded upstream sources (tests/contracts/test_tracer_upstream.py)", ""]
    unrecorded_same = [g for g in r.guard if g.status == "same" and not g.recorded]
    unchecked = [g for g in r.guard if g.status == "unchecked"]
    same = [g for g in r.guard if g.status == "same" and g.recorded]
    if r.changed:
        out += [
            "Changed since the version the tracer was checked on (re-read each, update the code named):",
            "",
        ]
        out += ["| target | installed | compared with | tracer code that follows it |", "|---|---|---|---|"]
        for g in r.changed:
            what = g.used_by + (f" ({g.note})" if g.note else "")
            out.append(f"| `{g.name}` | {g.package} {g.installed or '-'} | {g.reference or '-'} | {what} |")
        out.append("")
    unrecorded_versions = sorted({f"{g.package} {g.installed}" for g in unrecorded_same})
    out.append(
        f"{len(same)} unchanged and recorded; {len(unrecorded_same)} unchanged but under a version the table does "
        f"not record yet (record with `PYTHONPATH=. python -m sweeps.trace.upstream` once the rest is adopted)"
        + (f": {', '.join(unrecorded_versions)}" if unrecorded_versions else "")
        + (f"; {len(unchecked)} with no recorded hash to compare with" if unchecked else "")
        + "."
    )

    out += ["", "## Ground-truth tests that failed", ""]
    if not r.broken:
        out.append("None.")
    for o in r.broken:
        d = failure_detail(o.text)
        key = o.file if o.file in GROUND_TRUTH else o.nodeid.split("[", 1)[0]
        path = GROUND_TRUTH.get(key) or GROUND_TRUTH.get(o.file, "")
        out += [f"### `{o.nodeid}` ({o.status})", ""]
        if path:
            out.append(f"- code path: {path}")
        doc = docstring_line(o.file, o.function)
        if doc:
            out.append(f"- checks: {doc}")
        if d.source:
            src = " ".join(d.source)
            out.append(f"- assertion{' at ' + d.location if d.location else ''}: `{src[:300]}`")
        cmp = d.comparison()
        if cmp:
            en, ev, mn, mv = cmp
            out.append(
                f"- **estimated {_fmt(ev)} vs measured {_fmt(mv)}** ({en} − {mn} = {_fmt(ev - mv)}, "
                f"{_pct(ev, mv)} of measured)"
            )
        if d.numbers:
            out.append("- values: " + ", ".join(f"{k}={_fmt(v)}" for k, v in d.numbers.items()))
        lines = d.error or [o.message]
        lines = [ln for ln in lines if ln.strip()][:6]
        if lines:
            out += ["", "```", *(ln[:240] for ln in lines), "```"]
        out.append("")

    skipped = [o for o in r.ground_truth if o.status == "skipped"]
    if skipped:
        out += ["", "## Skipped (these checked nothing)", ""]
        out += [f"- `{o.nodeid}`: {o.message}" for o in skipped]
    out += [
        "",
        "## What ran",
        "",
        f"- guard: `{GUARD}`",
        *(f"- `{k}`: {v}" for k, v in GROUND_TRUTH.items()),
        *(f"- left out: `{k}`: {v}" for k, v in NOT_GROUND_TRUTH.items()),
    ]
    # any `file.py:N` left in quoted messages, written `file.py line N` (see Detail.location)
    return _PY_LINE.sub(r"\1 line \2", "\n".join(out).rstrip() + "\n")


def run_pytest(junit: Path, log: Path) -> int:
    """The guard and the ground-truth tests in this interpreter, with --showlocals so failures carry values."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--showlocals",
        "--tb=long",
        f"--junitxml={junit}",
        GUARD,
        *GROUND_TRUTH,
    ]
    junit.parent.mkdir(parents=True, exist_ok=True)
    print(f"upstream-check: running {len(GROUND_TRUTH) + 1} test entries with {sys.executable} (log: {log})")
    with open(log, "w") as fh:
        return subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT).returncode


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=LOCK)
    ap.add_argument("--markdown", type=Path, help="also write the report here")
    ap.add_argument("--junit", type=Path, default=Path(sys.prefix) / "upstream-check.xml")
    ap.add_argument("--from-junit", type=Path, help="report on this junit file instead of running the tests")
    ap.add_argument("--asked", default="", help="what the venv was asked for (printed in the report)")
    ap.add_argument("--list", action="store_true", help="print the tests it runs and exit")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join([GUARD, *GROUND_TRUTH]))
        return 0
    junit = a.from_junit or a.junit
    if a.from_junit is None:
        log = junit.with_suffix(".log")
        rc = run_pytest(junit, log)
        if rc not in (0, 1) or not junit.exists():
            tail = log.read_text().splitlines()[-30:] if log.exists() else []
            print("\n".join(tail))
            print(f"upstream-check: pytest exited {rc} without test results (see {log})", file=sys.stderr)
            return 2
    outcomes = parse_junit(junit)
    report = build_report(outcomes, read_lock(a.lock), a.asked)
    text = render(report, report=a.markdown)
    print(text)
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(text)
        print(f"upstream-check: report written to {a.markdown}")
    return 1 if report.drifted else 0


if __name__ == "__main__":
    sys.exit(main())
