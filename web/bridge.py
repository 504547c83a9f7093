"""The page's only Python: `vram-estimate` itself (the CLI's `main`), run in the browser by Pyodide.

In the browser: `run(request_json)` writes the files the page was given (pasted / dropped config files, a pasted
config.json) into a fresh folder of Pyodide's virtual file system, runs the CLI's `main` there on the argv the page
built from its form, and returns what a terminal would have shown: exit code, stdout (the `--json` answer or the
text report) and stderr (notes, the one-line error). Nothing is computed here: every number is the CLI's.

At build time (`make web`): `python web/bridge.py build DIR` puts the page's static files, the Pyodide runtime from
web/node_modules, and one zip of the estimator package (+ PyYAML's pure-Python modules, for `--config` YAML files,
+ this file) into DIR. The import below is the one line to change if the CLI's entry point moves.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import sys
import zipfile
from pathlib import Path, PurePosixPath

from estimator.interface.cli import main

PROG = "vram-estimate"
RUN_DIR = "/tmp/vram-estimate-run"  # in the browser: Pyodide's in-memory file system


def run(request_json: str) -> str:
    """{"argv": [...], "extra": "more flags, shell syntax", "files": {"name": "text"}} -> JSON of
    {"code", "stdout", "stderr", "argv"}: the CLI's exit code and output for that command line."""
    req = json.loads(request_json)
    argv = [str(a) for a in req.get("argv", [])]
    try:
        argv += shlex.split(req.get("extra") or "")
    except ValueError as e:
        return json.dumps(
            {"code": 2, "stdout": "", "stderr": f"{PROG}: error: other flags: {e}\n", "argv": argv}
        )
    files = req.get("files") or {}
    out, err = io.StringIO(), io.StringIO()
    home = os.getcwd()
    try:
        _fresh_folder(RUN_DIR, files)
        os.chdir(RUN_DIR)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # --help / --version: argparse exits after printing
                code = e.code if isinstance(e.code, int) else 0
    except ValueError as e:  # a file name the page cannot place
        code, err = 2, io.StringIO(f"{PROG}: error: {e}\n")
    finally:
        os.chdir(home)
    return json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "argv": argv})


def _fresh_folder(folder: str, files: dict) -> None:
    """`folder` emptied, then every file written at its (relative, ..-free) name."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for name, text in files.items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or not rel.parts or ".." in rel.parts:
            raise ValueError(f"file name {name!r}: give a plain relative name (e.g. grpo.yaml)")
        path = Path(folder, *rel.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def choices() -> dict:
    """The catalog's model ids and the GPU names `--gpu` takes, from the package's own data files (the page's
    search lists; the CLI still validates whatever is typed)."""
    root = Path(sys.modules[main.__module__].__file__).resolve().parent
    while root.name != "estimator" and root.parent != root:
        root = root.parent
    models = sorted(p.stem.replace("--", "/", 1) for p in root.glob("**/catalog/*.json"))
    gpus = []
    for p in root.glob("**/gpus.json"):
        gpus += [g["name"] for g in json.loads(p.read_text()).get("gpus", [])]
    return {"models": models, "gpus": gpus}


# ---- build (`make web`): runs natively, never in the browser ----

PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
    "package.json",
)
PAGE_FILES = ("index.html", "app.js", "worker.js", "style.css")


def build(out: Path) -> None:
    from importlib import metadata

    import yaml  # the CLI's YAML reader, shipped as its pure-Python modules (Pyodide's core has no PyYAML)

    web = Path(__file__).resolve().parent
    package = Path(sys.modules[main.__module__.split(".")[0]].__file__).resolve().parent
    shutil.rmtree(out, ignore_errors=True)
    (out / "pyodide").mkdir(parents=True)
    for name in PAGE_FILES:
        shutil.copy2(web / name, out / name)
    runtime = web / "node_modules" / "pyodide"
    for name in PYODIDE_FILES:
        if not (runtime / name).is_file():
            raise SystemExit(f"{runtime / name} missing: run `npm ci` in web/ (make web does)")
        shutil.copy2(runtime / name, out / "pyodide" / name)
    yaml_dir = Path(yaml.__file__).resolve().parent
    with zipfile.ZipFile(out / "estimator.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(package.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".so"):
                z.write(f, f"{package.name}/{f.relative_to(package).as_posix()}")
        for f in sorted(yaml_dir.glob("*.py")):
            z.write(f, f"yaml/{f.name}")
        for f in metadata.distribution("PyYAML").files or []:  # its MIT license travels with it
            if "LICEN" in f.name.upper():
                z.write(f.locate(), f"yaml/{f.name}")
        z.write(Path(__file__).resolve(), "bridge.py")
    (out / "choices.json").write_text(json.dumps(choices()))
    (out / "THIRD_PARTY.txt").write_text(
        f"pyodide/: Pyodide {_pyodide_version(runtime)} (npm package pyodide), MPL-2.0, "
        "https://github.com/pyodide/pyodide (pyodide/package.json)\n"
        f"estimator.zip yaml/: PyYAML {yaml.__version__}'s pure-Python modules, MIT (yaml/LICENSE)\n"
        "estimator.zip estimator/, bridge.py: grpo-vram, Apache-2.0\n"
    )
    print(f"{out}/: the page, Pyodide {_pyodide_version(runtime)}, estimator.zip (PyYAML {yaml.__version__})")


def _pyodide_version(runtime: Path) -> str:
    return json.loads((runtime / "package.json").read_text())["version"]


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "build":
        raise SystemExit("usage: python web/bridge.py build OUT_DIR")
    build(Path(sys.argv[2]))
