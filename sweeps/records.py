"""Result rows (results/SCHEMA.md): stable keys, atomic appends, tolerant loading, environment info."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from estimator.settings.config import NEWEST_TRL

SCHEMA = 1
SCHEMAS = (SCHEMA,)  # row schema versions this code reads; any other is rejected, not guessed at
SOURCES = ("measured-gpu", "measured-cpu", "traced")
STATUSES = ("ok", "oom", "error", "skipped")  # skipped: not run, with the reason (over budget, not traceable)
VERSION_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes")
# Versions that must match for a finished row to count as done when a sweep is rerun.
KEY_VERSIONS = VERSION_PACKAGES
# Every field of a row's `versions` that describes the environment (environment_info adds CUDA and the driver).
VERSION_FIELDS = ("python", *VERSION_PACKAGES, "cuda", "driver")
REPO = Path(__file__).resolve().parent.parent
# the committed rows: measured (results/raw/) and traced (the tuned, random and held-out grids' folders)
RESULT_DIRS = (
    REPO / "results" / "raw",
    REPO / "results" / "traced" / "tuned",
    REPO / "results" / "traced" / "random",
    REPO / "results" / "traced" / "heldout",
)


def canonical_json(obj) -> str:
    """JSON with sorted keys and no whitespace: the same value always gives the same text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable)


def _jsonable(obj):
    """Fallback encoder: tuples/sets as lists, everything else as str."""
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def make_key(config: dict, variant: dict) -> str:
    """Stable sha256 (first 16 hex chars) of the canonical JSON of config + variant."""
    if config.get("trl_version") == NEWEST_TRL:  # rows made before trl_version existed keep their keys
        config = {k: v for k, v in config.items() if k != "trl_version"}
    text = canonical_json({"config": config, "variant": variant})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SpecialFile(OSError):
    """A results path that is a FIFO, a device, a socket or a directory: rows are never written there."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def resolve_target(path: str | os.PathLike) -> Path:
    """The regular file rows for `path` are written to: symlinks are followed (the link stays a link and its
    target gets the rows, atomically); a FIFO, device, socket or directory raises SpecialFile (one line)."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return real
    for test, kind in _KINDS:
        if test(mode):
            shown = f"{path} (-> {real})" if real != path.absolute() else str(path)
            raise SpecialFile(f"{shown} is {kind}, not a regular file; give a .jsonl file")
    return real


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def file_lock(lock_path: str | os.PathLike, blocking: bool = True):
    """An exclusive flock on `lock_path`, created if needed and removed on release; yields its fd, or None when
    not `blocking` and another process holds it. A lock file removed by its previous holder between our open
    and our flock is noticed (the path no longer names our inode) and opened again. Opened read-only, so a lock
    file another user created in a shared folder is still usable."""
    lock_path = Path(lock_path)
    while True:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield None
            return
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield fd
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        os.close(fd)


def utc_now() -> str:
    """The current UTC time as ISO 8601 with a `Z` and microseconds (sorts as text in time order)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a short write is retried; ENOSPC and EIO raise)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _replace_file(path: Path, data: bytes) -> None:
    """Write `data` to a temp file beside `path`, fsync it, os.replace it over `path`, fsync the folder. The file
    keeps its permission bits and owner (a new one gets 0666 less the umask, as open() would give it)."""
    try:
        st = os.stat(path)
        mode, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
    except FileNotFoundError:
        mode, owner = 0o666 & ~_umask(), None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                with contextlib.suppress(OSError):
                    os.fchown(fd, *owner)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _complete_lines(old: bytes, path: Path) -> bytes:
    """`old` ending in a newline: a last line without one is kept (newline added) when it is whole JSON, and
    dropped, with one stderr line saying so, when it is a partial line (a writer died mid-line)."""
    if not old or old.endswith(b"\n"):
        return old
    cut = old.rfind(b"\n") + 1
    tail = old[cut:]
    try:
        json.loads(tail)
    except RecursionError:
        return old + b"\n"  # whole JSON nested too deep to parse here: kept as it is, never a row
    except ValueError:
        if tail.strip():
            number = old.count(b"\n") + 1
            print(
                f"records: dropped a partial last line of {path} (line {number}, "
                f"{len(tail)} bytes, not JSON)",
                file=sys.stderr,
            )
        return old[:cut]
    return old + b"\n"


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Append one row atomically: rewrite the whole file to a temp file, fsync, os.replace (under a lock).

    The row gets `written_at` (UTC) unless it has one: duplicates of a key are told apart by time, not file name.
    A symlink is written through (its target gets the row); a FIFO, device or socket raises SpecialFile; a
    failed write (disk full, read-only folder) raises OSError with the file untouched.
    """
    path = resolve_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not row.get("written_at"):
        row = {**row, "written_at": utc_now()}
    line = json.dumps(row, sort_keys=True, default=_jsonable) + "\n"
    with file_lock(_lock_path(path)):
        path = resolve_target(path)  # what it is now, under the lock
        old = path.read_bytes() if path.exists() else b""
        _replace_file(path, _complete_lines(old, path) + line.encode())


def replace_row(path: str | os.PathLike, row: dict) -> bool:
    """Replace the line(s) whose key is `row["key"]` by `row`, atomically (temp file, fsync, os.replace, under
    the same lock as `append_row`); every other line is kept byte for byte. False, and nothing written, when no
    line has that key."""
    path = resolve_target(path)
    if not row.get("written_at"):
        row = {**row, "written_at": utc_now()}
    line = (json.dumps(row, sort_keys=True, default=_jsonable) + "\n").encode()
    with file_lock(_lock_path(path)):
        out, found = [], False
        for old in path.read_bytes().splitlines(keepends=True) if path.exists() else []:
            try:
                same = json.loads(old).get("key") == row["key"]
            except (ValueError, AttributeError, RecursionError):
                same = False  # an unreadable line is kept as it is
            if same and not found:
                out.append(line)
            if not same:
                out.append(old if old.endswith(b"\n") else old + b"\n")
            found = found or same
        if not found:
            return False
        _replace_file(path, b"".join(out))
        return True


# What the up-front check writes (and removes) beside the results file, on top of the file's own size: an
# append rewrites the whole file into a temp file, and a measured row is about 10 KB.
ROW_BYTES = 64 * 1024


def writable_problem(path: str | os.PathLike) -> str | None:
    """Why rows cannot be appended to `path` (its folder cannot be made or written, no room for an append, the
    file is read-only, a folder, a FIFO or a device), or None when they can. Checked before hours of measuring,
    not after: it writes and fsyncs a temp file as large as the next append's (file + ROW_BYTES), then removes
    it, so a full disk or a read-only mount is found here."""
    path = Path(path)
    need = ROW_BYTES
    try:
        if path.is_dir():
            return f"{path} is a directory; give a .jsonl file"
        target = resolve_target(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            if not os.access(target, os.W_OK):
                return f"{path} is read-only"
            need += target.stat().st_size
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=target.parent)
        try:
            try:
                chunk = b"\0" * min(need, 1 << 20)
                left = need
                while left > 0:
                    _write_all(fd, chunk[:left])
                    left -= min(left, len(chunk))
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except SpecialFile as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot write {need // 1024} KiB in {path.parent} ({exc.strerror or exc})"
    return None


# ---------------------------------------------------------------- rows that could not be appended


def unsaved_dir(path: str | os.PathLike) -> Path:
    """Where a row that could not be appended to `path` is kept first: `<results>.unsaved/`."""
    return Path(str(path) + ".unsaved")


def state_unsaved_dir() -> Path:
    """The fallback for kept rows: $XDG_STATE_HOME/grpo-vram/unsaved (default ~/.local/state/grpo-vram/unsaved)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "grpo-vram" / "unsaved"


def save_unsaved(path: str | os.PathLike, row: dict) -> Path | None:
    """Keep a row that could not be appended to `path`, as `{"results": path, "row": row}` in
    `<results>.unsaved/<key>-<time>.json`, else in state_unsaved_dir(); its path, or None when neither place
    could be written. `recover_unsaved` appends such rows later."""
    target = Path(os.path.realpath(path))
    row = row if row.get("written_at") else {**row, "written_at": utc_now()}
    data = (
        json.dumps({"results": str(target), "row": row}, sort_keys=True, default=_jsonable) + "\n"
    ).encode()
    stamp = row["written_at"].replace(":", "").replace("-", "")
    name = f"{row.get('key') or 'row'}-{stamp}.json"
    for folder in (unsaved_dir(target), state_unsaved_dir()):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _replace_file(folder / name, data)
            return folder / name
        except OSError:
            continue
    return None


def recover_unsaved(path: str | os.PathLike) -> tuple[int, list[str]]:
    """Append the rows `save_unsaved` kept for `path` (both places), removing each file once its row is in;
    (rows appended, one line per kept file that could not be read or appended)."""
    target = Path(os.path.realpath(path))
    n, problems = 0, []
    for folder in (unsaved_dir(target), state_unsaved_dir()):
        if not folder.is_dir():
            continue
        for f in sorted(folder.glob("*.json")):
            try:
                kept = json.loads(f.read_text())
                if kept.get("results") != str(target):
                    continue
                append_row(target, kept["row"])
            except (OSError, ValueError, KeyError, AttributeError, TypeError, RecursionError) as exc:
                problems.append(f"{f}: {getattr(exc, 'strerror', None) or exc}")
                continue
            f.unlink(missing_ok=True)
            n += 1
        if folder == unsaved_dir(target):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
    return n, problems


def _fsync_dir(directory: Path) -> None:
    """fsync a directory so the rename is durable (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Skipped:
    """A line of a results file that was not read as a row, and why (line 0: the whole file was not read)."""

    path: str
    line: int
    reason: str


@dataclass
class Loaded:
    """The rows read from result files, and the lines that were not rows (counted, never silently dropped)."""

    rows: list[dict] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def report_lines(self) -> list[str]:
        """One line per file with skipped lines: how many, why, and the first line number of each reason."""
        out = []
        by_path: dict[str, list[Skipped]] = {}
        for s in self.skipped:
            by_path.setdefault(s.path, []).append(s)
        for path, items in by_path.items():
            if items[0].line == 0:  # the whole file was not read
                out.append(f"skipped {path}: {items[0].reason}")
                continue
            reasons = Counter(s.reason for s in items)
            first = {}
            for s in items:
                first.setdefault(s.reason, s.line)
            parts = ", ".join(f"{n} {r} (first: line {first[r]})" for r, n in sorted(reasons.items()))
            out.append(f"skipped {len(items)} line(s) of {path}: {parts}")
        return out


# fields every reader indexes as a mapping when present: any other type is a bad row, skipped like a corrupt line
_OBJECT_FIELDS = ("config", "variant", "model", "observed", "versions", "device")


def row_problem(obj) -> str | None:
    """Why `obj` cannot be read as a row of a schema this code knows (None when it can)."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    schema = obj.get("schema")
    if schema not in SCHEMAS or isinstance(schema, bool):
        return f"unknown schema version {schema!r} (this code reads {', '.join(map(str, SCHEMAS))})"
    if not isinstance(obj.get("key"), str) or not obj["key"]:
        return "key is not a non-empty string"
    for name in _OBJECT_FIELDS:
        value = obj.get(name)
        if value is not None and not isinstance(value, dict):
            return f"{name} is neither null nor an object"
    return None


def _read_jsonl(path: Path, loaded: Loaded, check: Callable[[dict], str | None] | None = None) -> None:
    """Rows of one .jsonl file into `loaded`; blank lines are ignored, every other unreadable line is counted. A
    path that is not a regular file (a FIFO, a device, a socket) or cannot be opened is noted, never read: opened
    without blocking, so a FIFO with no writer never hangs the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        loaded.skipped.append(Skipped(str(path), 0, f"not read ({exc.strerror or exc})"))
        return
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        loaded.skipped.append(Skipped(str(path), 0, f"not read ({kind}, not a regular file)"))
        return
    with os.fdopen(fd, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                obj = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                loaded.skipped.append(Skipped(str(path), n, "corrupt (not JSON)"))
                continue
            problem = row_problem(obj) or (check(obj) if check else None)
            if problem:
                loaded.skipped.append(Skipped(str(path), n, problem))
            else:
                loaded.rows.append(obj)


def read_rows(
    path_or_dir: str | os.PathLike | Iterable[str | os.PathLike],
    check: Callable[[dict], str | None] | None = None,
) -> Loaded:
    """Rows of a .jsonl file, of every .jsonl in a directory (sorted), or of several such paths, plus what was
    skipped: corrupt lines, rows of an unknown schema version, rows without a string key, and files that are
    not regular files (noted with line 0). `check`, when given, names what else makes a row unreadable."""
    loaded = Loaded()
    paths = [path_or_dir] if isinstance(path_or_dir, (str, os.PathLike)) else list(path_or_dir)
    for path in paths:
        p = Path(path)
        files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p] if p.exists() else []
        for f in files:
            _read_jsonl(f, loaded, check)
    return loaded


def load_rows(path_or_dir: str | os.PathLike | Iterable[str | os.PathLike]) -> list[dict]:
    """The readable rows of `read_rows` (use `read_rows` to also see what was skipped)."""
    return read_rows(path_or_dir).rows


def read_index(path: Path) -> tuple[list[dict], int]:
    """The rows of a stream index (`results/streams/index.jsonl`, `sampled.jsonl`, `gpu/index.jsonl`: JSON
    objects with a `config`, no schema version), and how many lines were not such a row (skipped)."""
    rows, bad = [], 0
    if not path.exists():
        return rows, bad
    if not path.is_file():  # a FIFO or a device is never read (a FIFO would block)
        return rows, 1
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("config"), dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


_STATUS_RANK = {"ok": 2, "oom": 1}


def _has_peak(row: dict) -> bool:
    peak = (row.get("observed") or {}).get("peak_bytes") if isinstance(row.get("observed"), dict) else None
    return isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0


def _preference(row: dict) -> tuple:
    """Sort key of a row among the rows of its (source, key): a measurement beats an OOM beats an error (a later
    failed retry never hides an earlier good measurement), then the latest `written_at` (rows from before that
    field sort first), then the row's canonical text (deterministic, whatever file or order the rows came in)."""
    rank = _STATUS_RANK.get(row.get("status"), 0)
    if rank == 2 and not _has_peak(row):
        rank = 0
    written = row.get("written_at") if isinstance(row.get("written_at"), str) else ""
    return (rank, written, canonical_json(row))


def latest_rows(rows: Iterable[dict]) -> list[dict]:
    """One row per (source, key): the preferred one (see `_preference`), in the order the keys first appear."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if not isinstance(r.get("key"), str):
            continue
        k = (r.get("source"), r["key"])
        if k not in best or _preference(r) > _preference(best[k]):
            best[k] = r
    return list(best.values())


def versions_match(row_versions: dict | None, versions: dict | None) -> bool:
    """True when the package versions that matter (KEY_VERSIONS) agree; None for `versions` accepts any."""
    if versions is None:
        return True
    row_versions = row_versions or {}
    return all(row_versions.get(k) == versions.get(k) for k in KEY_VERSIONS)


FINISHED = ("ok", "oom", "skipped")  # a measurement, an out-of-memory, or not runnable here (with the reason)


def finished_keys(rows: Iterable[dict], versions: dict | None = None) -> set[str]:
    """The one "already done" rule of every sweep and grid: keys of rows that finished (`FINISHED`) under the
    same package versions (`versions_match`; None accepts any). An error row never skips a rerun."""
    return {
        r["key"]
        for r in rows
        if isinstance(r.get("key"), str)
        and r.get("status") in FINISHED
        and versions_match(r.get("versions"), versions)
    }


def package_versions() -> dict[str, str | None]:
    """Installed versions of python and the packages that shape a run (None when absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        out["grpo_vram"] = metadata.version("grpo-vram")
    except metadata.PackageNotFoundError:
        out["grpo_vram"] = None
    return out


def _driver_version() -> str | None:
    """NVIDIA driver version from NVML, or None where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def device_info(device: str) -> dict:
    """{"type", "name", "total_bytes"} of the device a run uses (torch imported lazily)."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return {"type": "cuda", "name": props.name, "total_bytes": int(props.total_memory)}
        return {"type": "cuda", "name": None, "total_bytes": None}
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "total_bytes": total}


def environment_info(device: str) -> dict:
    """{"versions": {... "cuda", "driver"}, "device": {...}} for the row of a run on `device`."""
    versions = package_versions()
    cuda = None
    try:
        import torch

        cuda = torch.version.cuda
    except ImportError:
        pass
    versions["cuda"] = cuda
    versions["driver"] = _driver_version()
    return {"versions": versions, "device": device_info(device)}


# the commit of a checkout copied without its .git (a lent GPU machine's tree)
COMMIT_ENV = "GRPO_VRAM_COMMIT"


def git_commit(repo: str | os.PathLike = REPO) -> str | None:
    """$GRPO_VRAM_COMMIT where given (a lent GPU machine gets a copy of the tree, sometimes inside a git checkout
    of another commit, so its own git would name the wrong one); else HEAD of this repo, with a `-dirty` suffix
    when the tree has changes; else None."""
    given = os.environ.get(COMMIT_ENV) or None
    if given:
        return given
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return given
    return head + ("-dirty" if dirty else "") if head else given


def base_row(
    *,
    key: str,
    source: str,
    sweep: str,
    config: dict,
    variant: dict,
    status: str = "ok",
    error: str | None = None,
) -> dict:
    """A row with the identifying fields filled and measurement fields empty (SCHEMA.md order)."""
    return {
        "schema": SCHEMA,
        "key": key,
        "source": source,
        "status": status,
        "error": error,
        "sweep": sweep,
        "variant": variant,
        "config": config,
        "model": None,
        "observed": None,
        "step_seconds": [],
        "versions": None,
        "device": None,
        "git_commit": None,
        "written_at": None,
    }


# ---------------------------------------------------------------- schema check (results/SCHEMA.md)

REQUIRED_FIELDS = (
    "schema",
    "key",
    "source",
    "status",
    "error",
    "sweep",
    "variant",
    "config",
    "model",
    "observed",
    "step_seconds",
    "versions",
    "device",
    "git_commit",
)
DEVICE_TYPES = ("cuda", "cpu", "fake-cuda")


def _is_int(v, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _is_num(v, minimum: float = 0.0) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= minimum


def validate_row(row) -> list[str]:
    """Every way `row` departs from results/SCHEMA.md (empty when it conforms)."""
    from estimator.settings.config import RunConfig

    problem = row_problem(row)
    if problem:
        return [problem]
    out = [f"missing field {f!r}" for f in REQUIRED_FIELDS if f not in row]
    if out:
        return out
    status = row["status"]
    if row["source"] not in SOURCES:
        out.append(f"source {row['source']!r} not in {SOURCES}")
    if status not in STATUSES:
        out.append(f"status {status!r} not in {STATUSES}")
    if (status == "ok") != (row["error"] is None) or not (
        row["error"] is None or isinstance(row["error"], str)
    ):
        out.append("error must be null exactly when status is ok, else a one-line message")
    elif isinstance(row["error"], str) and "\n" in row["error"]:
        out.append("error is not one line")
    if not isinstance(row["sweep"], str) or not row["sweep"]:
        out.append("sweep is not a non-empty string")
    for name in ("variant", "config"):
        if not isinstance(row[name], dict):
            out.append(f"{name} is not an object")
    if isinstance(row["config"], dict):
        unknown = sorted(set(row["config"]) - set(RunConfig.field_names()))
        if unknown:
            out.append(f"config has fields RunConfig does not: {unknown}")
        if isinstance(row["variant"], dict) and row["key"] != make_key(row["config"], row["variant"]):
            out.append("key is not make_key(config, variant)")
    model = row["model"]
    if model is not None or status == "ok":
        if not isinstance(model, dict) or not isinstance(model.get("name"), str):
            out.append("model is not {name, params, trainable_params}")
        elif status == "ok" and not (_is_int(model.get("params"), 1)):
            out.append("model.params is not a positive integer")
    obs = row["observed"]
    if status == "ok" or obs is not None:
        if not isinstance(obs, dict):
            out.append("observed is not an object")
        else:
            if obs.get("source") != row["source"]:
                out.append(f"observed.source {obs.get('source')!r} differs from source {row['source']!r}")
            if status == "ok" and not _is_int(obs.get("peak_bytes"), 1):
                out.append("observed.peak_bytes is not a positive integer")
            phases = obs.get("phases")
            if not isinstance(phases, dict) or not all(
                isinstance(k, str) and _is_int(v) for k, v in phases.items()
            ):
                out.append("observed.phases is not {phase: bytes}")
            if (
                status == "ok"
                and obs.get("peak_phase") is not None
                and not isinstance(obs["peak_phase"], str)
            ):
                out.append("observed.peak_phase is not a phase name")
            if not isinstance(obs.get("probes"), dict):
                out.append("observed.probes is not an object")
    pred = row.get("prediction")  # rows written before the estimate was left to sweeps/report/accuracy.py
    if pred is not None and (not isinstance(pred, dict) or pred.get("source") != "estimated"):
        out.append('prediction is neither null nor an Estimate dict with source "estimated"')
    steps = row["step_seconds"]
    if not isinstance(steps, list) or not all(_is_num(s) for s in steps):
        out.append("step_seconds is not a list of non-negative seconds")
    versions = row["versions"]
    if status == "ok" or versions is not None:
        if not isinstance(versions, dict):
            out.append("versions is not an object")
        else:
            missing = [v for v in ("python", *VERSION_PACKAGES) if v not in versions]
            if missing:
                out.append(f"versions lacks {missing}")
    device = row["device"]
    if status == "ok" or device is not None:
        if not isinstance(device, dict) or device.get("type") not in DEVICE_TYPES:
            out.append(f"device is not {{type in {DEVICE_TYPES}, name, total_bytes}}")
        elif device.get("total_bytes") is not None and not _is_int(device["total_bytes"], 1):
            out.append("device.total_bytes is neither null nor a positive integer")
    if row["git_commit"] is not None and not isinstance(row["git_commit"], str):
        out.append("git_commit is neither null nor a string")
    written = row.get("written_at")
    if written is not None and not (isinstance(written, str) and written.endswith("Z") and "T" in written):
        out.append("written_at is not an ISO 8601 UTC time")
    return out
