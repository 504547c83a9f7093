"""The rooms' import rules: the estimator never imports sweeps, and no sweeps package imports a higher one.

Layers, lowest first: records (row schema + I/O) < probes < runner < trace < report. Checked on the source
(every import statement, also those inside functions), so a lazy upward import fails too.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"records": 0, "probes": 1, "runner": 2, "trace": 3, "report": 4}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 and parts[0] == "sweeps" else None


def test_estimator_never_imports_sweeps():
    bad = [
        f"{p.relative_to(REPO)}: {m}"
        for p in sorted((REPO / "estimator").rglob("*.py"))
        for m in _imports(p)
        if m == "sweeps" or m.startswith("sweeps.")
    ]
    assert not bad, bad


def test_no_sweeps_package_imports_a_higher_one():
    bad = []
    for p in sorted((REPO / "sweeps").rglob("*.py")):
        rel = p.relative_to(REPO / "sweeps")
        own = LAYERS.get(rel.parts[0].removesuffix(".py"))
        if own is None:
            continue
        for m in _imports(p):
            layer = _layer(m)
            if layer is not None and layer > own:
                bad.append(f"sweeps/{rel}: {m}")
    assert not bad, bad
