"""The two ways a user installs this project, and the lock every install of the repo goes through.

`pip install .` (or `pip install grpo-vram`) gets the estimator alone: the wheel must hold every data file the code
reads from its own folders (a missing estimator/band.json made every `vram-estimate` call a FileNotFoundError).
Here the wheel is built from a copy of the sources with this venv's setuptools (the lock's, no build isolation),
installed into a bare venv with PyYAML from the lock, and run from a folder outside the repo. The data files it
must hold are found by reading the code (`Path(__file__)` expressions, hydra's `config_path`), not pyproject.toml.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "lock.txt"
PACKAGES = ("estimator", "sweeps")
# what pip prints when it cannot reach the index (the one reason this test may skip)
OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|ConnectTimeout|ProxyError|Name or service not known|No route to host"
)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, ver = line.strip().partition("==")
            assert sep and ver and " " not in line.strip(), f"{LOCK.name}: {line!r} is not an exact pin"
            pins[_normalize(name)] = ver
    return pins


# --- which files the code reads from its own folders ------------------------------------------------------------


def _anchored(node: ast.AST, here: PurePosixPath, names: dict[str, str]) -> str | None:
    """The repo-relative path (a glob where an f-string fills in a name) that `node` builds from `__file__`, or
    None when it builds none. `here` is the module's path, `names` the module's constants already resolved."""

    def walk(n: ast.AST) -> str | None:
        called = n.func.id if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.args else None
        if called in ("Path", "str"):
            if isinstance(n.args[0], ast.Name) and n.args[0].id == "__file__":
                return str(here)
            return walk(n.args[0]) if called == "str" else None
        if isinstance(n, ast.Name):
            return names.get(n.id)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            base = walk(n.func.value)
            if base is None:
                return None
            arg = n.args[0] if n.args else None
            if n.func.attr in ("resolve", "absolute"):
                return base
            if n.func.attr == "with_name" and isinstance(arg, ast.Constant):
                return str(PurePosixPath(base).with_name(arg.value))
            if n.func.attr in ("glob", "rglob") and isinstance(arg, ast.Constant):
                return f"{base}/{'**/' if n.func.attr == 'rglob' else ''}{arg.value}"
            if n.func.attr == "joinpath" and isinstance(arg, ast.Constant):
                return f"{base}/{arg.value}"
            return None
        if isinstance(n, ast.Attribute) and n.attr == "parent":
            base = walk(n.value)
            return None if base is None else str(PurePosixPath(base).parent)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "parents":
            base = walk(n.value.value)
            if base is None or not isinstance(n.slice, ast.Constant):
                return None
            return str(PurePosixPath(base).parents[n.slice.value])
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            base = walk(n.left)
            if base is None:
                return None
            if isinstance(n.right, ast.Constant) and isinstance(n.right.value, str):
                return f"{base}/{n.right.value}"
            if isinstance(n.right, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else "*" for v in n.right.values]
                return f"{base}/{''.join(parts)}"
        return None

    return walk(node)


def data_files_read_by_the_code() -> set[str]:
    """Repo-relative paths of the non-Python files under estimator/ and sweeps/ that the code of those packages
    reaches from its own `__file__` (or hydra's `config_path`); paths that leave the package (the repo's
    results/ and the like) are not package data."""
    patterns: set[str] = set()
    for pkg in PACKAGES:
        for py in sorted((REPO / pkg).rglob("*.py")):
            here = PurePosixPath(py.relative_to(REPO).as_posix())
            tree = ast.parse(py.read_text())
            names: dict[str, str] = {}
            for stmt in tree.body:  # module constants first: CATALOG_DIR = Path(__file__).parent / "catalog"
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target = stmt.targets[0]
                    if isinstance(target, ast.Name):
                        found = _anchored(stmt.value, here, names)
                        if found is not None:
                            names[target.id] = found
            anchored = {}  # every expression that builds a path from __file__ ...
            for node in ast.walk(tree):
                if isinstance(node, ast.keyword) and node.arg in ("config_path", "config_dir"):
                    if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                        patterns.add(f"{here.parent}/{node.value.value}")
                elif isinstance(node, ast.expr) and (found := _anchored(node, here, names)) is not None:
                    anchored[node] = found
            inner = {child for node in anchored for child in ast.walk(node) if child is not node}
            # ... counted whole: `Path(__file__).resolve().parents[2]` is the repo, not its inner `.parent`
            outer = {found for node, found in anchored.items() if node not in inner}
            patterns |= outer - {str(here)}
    files: set[str] = set()
    for pattern in patterns:
        parts = PurePosixPath(pattern).parts
        if "." in parts or ".." in parts or not parts or parts[0] not in PACKAGES:
            continue  # outside the packages (REPO / "results" / ...): read from a checkout, not from the wheel
        matches = [REPO / pattern] if "*" not in pattern else list(REPO.glob(pattern))
        for m in matches:
            for f in [m] if m.is_file() else sorted(m.rglob("*")) if m.is_dir() else []:
                if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts:
                    files.add(f.relative_to(REPO).as_posix())
    return files


def test_the_scan_finds_the_files_the_estimator_reads_at_every_call():
    found = data_files_read_by_the_code()
    assert {
        "estimator/band.json",  # band.py: Path(__file__).with_name("band.json")
        "estimator/data/allocator_streams.json",  # allocator_term.py: ... / "data" / "allocator_streams.json"
        "estimator/catalog/Qwen--Qwen2.5-7B-Instruct.json",  # catalog.py: CATALOG_DIR.glob("*.json")
        "sweeps/trace/upstream.json",
        "sweeps/runner/conf/config.yaml",  # app.py: @hydra.main(config_path="conf")
        "sweeps/runner/data/gsm8k/train.jsonl.gz",  # data.py: GSM8K_DIR / f"{split}.jsonl.gz"
    } <= found
    assert not any(f.startswith("results/") for f in found)


# --- the wheel, installed where the repo is out of reach ----------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` builds, from a copy of what it is built from (the checkout stays untouched)."""
    pytest.importorskip("setuptools", minversion="77", reason="the dev extra's setuptools (make install)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    cmd += ["-w", str(tmp), str(src)]
    build = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    assert build.returncode == 0, build.stdout + build.stderr
    (whl,) = tmp.glob("grpo_vram-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_holds_every_data_file_the_code_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(data_files_read_by_the_code() - names)
    assert not missing, f"read at run time but not in the wheel (pyproject's package-data): {missing}"


@pytest.mark.slow
def test_pip_install_dot_answers_from_a_bare_venv_outside_the_repo(wheel, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    # this venv's pip (the lock's) installs into the bare one: PyYAML at the lock's version, nothing else
    cmd = [sys.executable, "-m", "pip", "--python", str(bare / "bin" / "python"), "install", "-q"]
    cmd += ["--retries", "1", "--timeout", "30", "-c", str(LOCK), str(wheel)]
    install = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    offline = OFFLINE.search(install.stdout + install.stderr)
    if install.returncode != 0 and offline:
        pytest.skip(f"PyPI is unreachable, so PyYAML cannot be installed ({offline[0]})")
    assert install.returncode == 0, install.stdout + install.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    run = subprocess.run(
        [str(bare / "bin" / "vram-estimate"), "--model", "7B", "--lora", "--gens", "8"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^Needs [\d.]+ GiB per GPU: ", run.stdout), run.stdout  # the answer, first line
    # trl's packaged accelerate configs resolve by name without TRL installed (the wheel's copies)
    named = subprocess.run(
        [
            str(bare / "bin" / "vram-estimate"),
            "--json",
            "--from-command",
            "trl grpo --accelerate_config zero3",
        ],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    assert named.returncode == 0, named.stdout + named.stderr
    assert '"sharding": "zero3"' in named.stdout and '"num_gpus": 8' in named.stdout

    probe = "import estimator, importlib.util as u; print(estimator.__file__); print(u.find_spec('torch') is None)"
    where = subprocess.run(
        [str(bare / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    module_file, no_torch = where.stdout.split()
    assert Path(module_file).resolve().is_relative_to(bare.resolve()), f"ran {module_file}, not the wheel"
    assert no_torch == "True", "the light install pulled in torch"


# --- the lock -----------------------------------------------------------------------------------------------------


def _requirements(extra: str) -> list[str]:
    """pyproject's `dependencies` (extra "") or one extra's requirement strings."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"] if extra == "" else project["optional-dependencies"][extra]


def test_the_lock_pins_every_harness_package_inside_pyproject_ranges():
    requirements = pytest.importorskip("packaging.requirements")
    pins = _lock()
    for name in ("pip", "setuptools", "wheel", "torch"):
        assert _normalize(name) in pins, f"{LOCK.name} lacks {name}"
    for extra in ("", "sweep", "dev"):
        for line in _requirements(extra):
            req = requirements.Requirement(line)
            pinned = pins.get(_normalize(req.name))
            assert pinned is not None, (
                f"{req.name} ({extra or 'dependencies'}) is not in {LOCK.name}: make lock"
            )
            assert req.specifier.contains(pinned, prereleases=True), (
                f"{LOCK.name} pins {req.name}=={pinned}, outside pyproject's {req}: make lock"
            )


def test_this_venv_has_the_locked_versions():
    """`make install` goes through the lock (pip -c), and reinstalls when the lock changes (its stamp depends on
    the lock): every installed package the lock names has the lock's version (torch's +cpu/+cuXXX label aside)."""
    pins = _lock()
    wrong = []
    for name, pinned in pins.items():
        try:  # the first on sys.path, as an import finds it (not setuptools' vendored copies further down)
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if installed.split("+")[0] != pinned:
            wrong.append(f"{name} {installed} (lock: {pinned})")
    assert not wrong, f"this venv is not the lock's: {', '.join(sorted(wrong))}; run make install"
