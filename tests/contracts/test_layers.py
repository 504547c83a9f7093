"""The rooms' import rules: the estimator never imports sweeps, and no sweeps package imports a higher one.

Layers, lowest first: records (row schema + I/O) < probes < runner < trace, mincard < report < lease (what a
GPU lease call runs and carries back). Checked on the source
(every import statement, also those inside functions), so a lazy upward import fails too.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = {"records": 0, "probes": 1, "runner": 2, "trace": 3, "mincard": 3, "report": 4, "lease": 5}


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


# The estimator's rooms, lowest first: each may import its own room and lower ones (docs/ARCHITECTURE.md).
ESTIMATOR_LAYERS = {
    "units": 0,
    "text": 0,
    "model": 1,
    "hardware": 1,
    "settings": 2,
    "terms": 3,
    "step": 4,
    "plan": 5,
    "interface": 6,
    "__main__": 7,
}


def _estimator_module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _estimator_graph() -> dict[str, set[str]]:
    """module -> the estimator modules it imports (statements inside functions too)."""
    modules = {_estimator_module(p): p for p in (REPO / "estimator").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for m in _imports(path):
            while m and m not in modules:
                m = m.rpartition(".")[0]
            if m and m not in ("estimator", name):
                targets.add(m)
        graph[name] = targets
    return graph


def _room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def test_every_estimator_module_sits_in_a_known_room():
    rooms = {_room(m) for m in _estimator_graph() if m != "estimator"}
    assert rooms <= set(ESTIMATOR_LAYERS), rooms - set(ESTIMATOR_LAYERS)


def test_no_estimator_room_imports_a_higher_one():
    bad = [
        f"{m} -> {t}"
        for m, targets in _estimator_graph().items()
        for t in targets
        if m != "estimator" and ESTIMATOR_LAYERS[_room(t)] > ESTIMATOR_LAYERS[_room(m)]
    ]
    assert not bad, bad


def test_no_estimator_import_circle():
    graph = _estimator_graph()
    done: set[str] = set()

    def circle_from(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            found = circle_from(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        assert circle_from(start, []) is None


def test_the_layer_check_sees_an_upward_import_inside_a_function(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from estimator.interface.cli import main\n")
    assert "estimator.interface.cli" in _imports(source)
