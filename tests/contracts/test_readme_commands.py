"""Every command the README shows runs as shown, every output it pastes is what that command prints today,
and its numbers (the at-a-glance table, the counts, the modelled releases) are the estimator's and the
catalogs' own. Outputs are compared at the lock's TRL and transformers (requirements/lock.txt), the releases
CI installs, whatever this environment has."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from estimator.interface import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)
COMMAND = re.compile(r"^(?:\.venv/bin/)?vram-estimate(?:\s|$)")


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / "lock.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    return pins


@pytest.fixture
def as_locked(monkeypatch):
    """The installed TRL / transformers as the lock pins them (what the pasted outputs were made with)."""
    from estimator.settings import trl_versions, versions

    pins = _lock()
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda p: pins.get(p.lower()) or real(p))
    monkeypatch.setattr(trl_versions, "installed_version", lambda: trl_versions.parse_version(pins["trl"]))
    monkeypatch.chdir(REPO)


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def _words(line: str) -> list[str]:
    """A README command line without its trailing `# comment`, split as a shell would."""
    return shlex.split(re.split(r"\s{2,}#", line)[0])


def _make_recipe(target: str) -> list[str]:
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert m, f"make {target}: no such target in the Makefile"
    return [ln.strip() for ln in m.group(1).splitlines()]


def _argv(command: str) -> list[str]:
    words = _words(command)
    if words[:2] == ["make", "estimate"]:  # what the Makefile's recipe runs
        words = _words(
            next(ln for ln in _make_recipe("estimate") if ln.startswith(".venv/bin/vram-estimate"))
        )
    assert COMMAND.match(" ".join(words)), command
    return words[1:]


def pasted_outputs() -> list[tuple[str, str]]:
    """(command, output) of every README block that starts with `$ command`."""
    out = []
    for _, body in BLOCKS:
        if body.startswith("$ "):
            first, _, rest = body.partition("\n")
            out.append((first[2:], rest))
    return out


def shown_commands() -> list[str]:
    return [
        ln.strip()
        for lang, body in BLOCKS
        if lang in ("", "bash") and not body.startswith("$ ")
        for ln in body.splitlines()
        if COMMAND.match(ln.strip())
    ]


def test_the_readme_shows_commands_and_outputs():
    assert len(pasted_outputs()) >= 3 and len(shown_commands()) >= 8
    assert README.index("make estimate") < README.index("## ")  # the two commands lead the README
    assert README.index("make test") < README.index("## ")


@pytest.mark.parametrize("command, output", pasted_outputs(), ids=lambda x: x[:60] if " " in x[:3] else "")
def test_pasted_output_is_what_the_command_prints(command, output, as_locked):
    code, out, err = run(_argv(command))
    assert code in (0, 1), err
    assert out == output, f"README output of `{command}` is stale:\n{out}"
    assert max(len(ln) for ln in out.splitlines()) <= 80
    if "--detail" not in command:  # the short answer: the verdict first, about 20 lines
        assert out.startswith("Needs ") and len(out.splitlines()) <= 22


@pytest.mark.parametrize("command", shown_commands())
def test_every_shown_command_runs(command, as_locked, monkeypatch):
    argv = _argv(command)
    if (
        "--trace" in argv
    ):  # the fast variant: a stand-in tracer (tests/estimator/test_trace_cli.py runs the real one)
        monkeypatch.setattr(cli, "check_tracer", lambda: None)
        phases = {"generate": 1 << 30, "score": 1 << 30, "train": 2 << 30, "optimizer": 1 << 30}
        row = {"status": "ok", "observed": {"peak_bytes": 2 << 30, "peak_phase": "train", "phases": phases}}
        monkeypatch.setattr(cli, "load_tracer", lambda: lambda cfg, sweep: row)
    code, out, err = run(argv)
    assert code in (0, 1), f"{command}: exit {code}: {err}"
    assert out.strip(), command
    assert "Traceback" not in err


def test_make_and_pip_commands_name_what_exists():
    text = (REPO / "pyproject.toml").read_text()
    for lang, body in BLOCKS:
        if lang not in ("", "bash") or body.startswith("$ "):
            continue
        for ln in body.splitlines():
            words = _words(ln.strip()) if ln.startswith(("make ", "pip ")) else []
            if words[:1] == ["make"]:
                _make_recipe(words[1])  # installing targets are not run here, but they must exist
            if words[:2] == ["pip", "install"]:
                for extra in re.findall(r"\[(\w+)\]", " ".join(words)):
                    assert re.search(rf"^{extra} = \[", text, re.M), f"pip install: no extra {extra!r}"
                for flag, path in zip(words, words[1:], strict=False):
                    if flag == "-c":
                        assert (REPO / path).is_file(), path
    assert (REPO / "examples" / "case5_trl_user_files" / "grpo.yaml").is_file()


def test_python_example_runs_and_says_what_its_comments_say(as_locked):
    (code,) = [body for lang, body in BLOCKS if lang == "python"]
    assert len(code.strip().splitlines()) <= 12
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Needs ")
    claimed = re.search(r"# ([\d.]+ \w+):", code).group(
        1
    )  # `print(r.need_gib, r.peak_phase)    # 19.8 train:`
    assert claimed in lines, (claimed, lines)
    version = json.loads((REPO / "docs" / "estimate.schema.json").read_text())["properties"][
        "schema_version"
    ]["const"]
    assert lines[-1] == f"True {version}" and lines[-2].endswith(" cards listed")


def _glance_rows() -> dict[str, list[str]]:
    section = README.split("## How much memory, at a glance")[1].split("## ")[0]
    rows = {}
    for ln in section.splitlines():
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if ln.startswith("| ") and re.fullmatch(r"[\d.]+B", cells[0]):
            rows[cells[0]] = cells[1:]
    return rows


def test_at_a_glance_table_is_the_estimators(as_locked):
    from estimator import estimate

    rows = _glance_rows()
    assert list(rows) == ["0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B"]
    methods = ({"dtype": "bfloat16"}, {"dtype": "bfloat16", "use_peft": True}, {"qlora": True})
    for size, cells in rows.items():
        for kw, cell in zip(methods, cells, strict=True):
            r = estimate(model=size, **kw)
            fit = r.gpus_that_fit()
            # the card: the smallest listed one whose usable memory holds the answer
            assert cell == f"{r.need_gib} GiB: " + (fit[0] if fit else "none (shard it)"), (size, kw)
            assert all(r.fits(name) == (name in fit) for name in fit[:1])


def test_counts_and_releases_are_the_catalogs():
    models = [ln for ln in (REPO / "docs" / "MODELS.md").read_text().splitlines() if ln.startswith("| `")]
    assert f"Models: {len(models)} ship in the catalog" in README
    gpus = json.loads((REPO / "estimator" / "data" / "gpus.json").read_text())["gpus"]
    assert f"GPUs: {len(gpus)} cards" in README
    from estimator.settings import versions

    modelled = (
        versions.describe().replace("-", "–").replace(";", ",")
    )  # TRL 0.14–1.16, transformers 5.23–5.24, ...
    assert " ".join(modelled.split()) in " ".join(README.split())


def test_models_list_is_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_models", REPO / "docs" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (REPO / "docs" / "MODELS.md").read_text() == mod.text(), "stale: run python docs/make_models.py"


def test_linked_files_exist():
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in link:
            assert (REPO / link).exists(), link
    assert "vram-estimate" in sys.modules["estimator.interface.cli"].PROG
