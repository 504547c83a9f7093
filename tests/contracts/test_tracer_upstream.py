"""A TRL / transformers / accelerate / torch / bitsandbytes upgrade that changes a function the tracer copies or
patches fails here, naming the function and the tracer code to re-read, instead of silently rotting the trace."""

from __future__ import annotations

import pytest

from sweeps.trace import upstream

TABLE = upstream.load_table()
HOW = (
    "re-read it in the installed package, update the tracer code named above to match, re-run "
    "tests/sweeps/test_trace.py, then record the new hashes with `PYTHONPATH=. python -m sweeps.trace.upstream`"
)


@pytest.mark.parametrize("target", upstream.TARGETS, ids=lambda t: t.name)
def test_upstream_source_matches_the_table(target):
    ver = upstream.installed_version(target.package)
    known = TABLE.get(target.package, {})
    if ver not in known:
        pytest.fail(
            f"{target.package} {ver} is installed, but the tracer was checked against {sorted(known)} only. "
            f"{target.name} is followed by {target.used_by}: {HOW}",
            pytrace=False,
        )
    want = known[ver].get(target.name)
    assert want is not None, f"{target.name} has no hash for {target.package} {ver}: {HOW}"
    if upstream.source_hash(target) != want:
        pytest.fail(
            f"{target.name} changed in {target.package} {ver} since the tracer was checked against it. "
            f"It is followed by {target.used_by}: {HOW}",
            pytrace=False,
        )


def test_a_changed_source_is_caught(tmp_path, monkeypatch):
    """The check reads the installed text: one edited character changes the hash."""
    target = upstream.TARGETS[0]
    original = upstream.source(target)
    edited = original.replace("def ", "def  ", 1)
    assert edited != original
    monkeypatch.setattr(upstream, "source", lambda t: edited)
    assert (
        upstream.source_hash(target)
        != TABLE[target.package][upstream.installed_version(target.package)][target.name]
    )


def test_the_table_covers_every_target_and_nothing_else():
    names = {t.name for t in upstream.TARGETS}
    for pkg, versions in TABLE.items():
        for ver, hashes in versions.items():
            pkg_names = {t.name for t in upstream.TARGETS if t.package == pkg}
            assert set(hashes) == pkg_names, f"{pkg} {ver}: stale or missing entries"
    assert names == {n for versions in TABLE.values() for hashes in versions.values() for n in hashes}


def test_every_pointer_to_tracer_code_names_something_that_exists():
    import importlib
    import re
    from pathlib import Path

    modules = ("patches", "step", "generate", "fake_model", "optim8bit", "bnb_dispatch")
    pattern = re.compile(r"(?<![/\w])(" + "|".join(modules) + r")((?:\.\w+)+)")
    repo = Path(__file__).resolve().parents[2]
    for target in upstream.TARGETS:
        names = pattern.findall(target.used_by)
        paths = re.findall(r"sweeps/trace/\w+\.py", target.used_by)
        assert names or paths, f"{target.name}: used_by names no tracer code"
        for module, attrs in names:
            obj = importlib.import_module(f"sweeps.trace.{module}")
            for attr in attrs.strip(".").split("."):
                assert hasattr(obj, attr), f"{target.name}: {module}{attrs} does not exist"
                obj = getattr(obj, attr)
        for path in paths:
            assert (repo / path).is_file(), f"{target.name}: {path} does not exist"
