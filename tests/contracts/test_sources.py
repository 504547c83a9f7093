"""Every upstream line reference (`GT:2634-2657`, `grpo_config.py:1096-1116`) and every "notes §N" in the tree
resolves through estimator/terms/SOURCES.md or NOTES.md, and the cited lines are still what the legend says."""

from __future__ import annotations

import os
import re
from importlib.metadata import distribution, version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TERMS = REPO / "estimator" / "terms"
SOURCES = (TERMS / "SOURCES.md").read_text()
NOTES = (TERMS / "NOTES.md").read_text()
SCANNED = (".py", ".md", ".ipynb", ".yaml", ".toml", ".cfg")
SKIP_DIRS = {".git", ".venv", "__pycache__", "results", "node_modules"}

ABBR_REF = re.compile(r"(?<![A-Za-z])([A-Z]{2}):(\d+)(?:-(\d+))?")
FILE_REF = re.compile(r"([\w/]+\.py):(\d+)(?:-(\d+))?")
VERSIONED_REF = re.compile(r"(?<![A-Za-z])[A-Z]{2} \d+\.\d+\.\d+:\d+(?:-\d+)?")  # TU 0.15.2:1677-1684
NOTES_REF = re.compile(r"notes §(\d+(?:\.\d+)*)")


def _table(heading: str) -> list[list[str]]:
    """The rows of the markdown table under `## heading` in SOURCES.md (header and rule dropped)."""
    section = SOURCES.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows[2:]]


VERSIONS = {pkg: ver for pkg, ver, _ in _table("Versions")}
ABBRS = {abbr: (pkg, path.strip("`"), url) for abbr, pkg, path, url in _table("Abbreviations")}
CITED = {
    ref: (url, starts.strip("`"), ends.strip("`")) for ref, url, starts, ends, _ in _table("Cited lines")
}
EARLIER = {
    ref.strip("`"): (pkg, release, url)
    for ref, pkg, release, url, _, _ in _table("Cited lines at earlier releases")
}
BY_NAME = {url: starts.strip("`") for _, url, starts in _table("Other upstream code cited by name")}
REPOS = {  # GitHub repository -> (distribution, path prefix in the repository that the wheel drops)
    "huggingface/trl": ("trl", ""),
    "huggingface/transformers": ("transformers", "src/"),
    "huggingface/peft": ("peft", "src/"),
    "pytorch/pytorch": ("torch", ""),
    "bitsandbytes-foundation/bitsandbytes": ("bitsandbytes", ""),
    "huggingface/accelerate": ("accelerate", "src/"),
}
PERMALINK = re.compile(r"https://github\.com/([\w-]+/[\w-]+)/blob/v([\w.]+)/([\w/.]+)#L(\d+)(?:-L\d+)?")


def _files():
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        for f in files:
            if f.endswith(SCANNED):
                yield Path(root, f)


def _references() -> list[tuple[str, str]]:
    """(where, `ABBR:N[-M]`) for every upstream line reference in the tree, file-style ones mapped to their abbr."""
    out = []
    for path in _files():
        text = path.read_text(errors="replace")
        where = str(path.relative_to(REPO))
        for m in ABBR_REF.finditer(text):
            out.append((where, m.group(0)))
        out.extend((where, m.group(0)) for m in VERSIONED_REF.finditer(text))
        for m in FILE_REF.finditer(text):
            if m.group(0) in EARLIER:  # a line of an older release, listed by the text as written
                out.append((where, m.group(0)))
                continue
            owners = [a for a, (_, p, _) in ABBRS.items() if p == m.group(1) or p.endswith("/" + m.group(1))]
            lines = m.group(0).split(":", 1)[1]
            out.append((where, f"{owners[0]}:{lines}" if len(owners) == 1 else f"?{m.group(0)} ({owners})"))
    return out


def test_the_tree_cites_lines_and_the_legend_resolves_every_one():
    refs = _references()
    assert len(refs) >= 15  # the terms cite upstream lines; a scanner that finds nothing must not pass
    missing = sorted({f"{where}: {ref}" for where, ref in refs if ref not in CITED and ref not in EARLIER})
    assert not missing, (
        "add these to estimator/terms/SOURCES.md (Cited lines, or Cited lines at earlier releases), each "
        "checked against the source of its release:\n" + ("\n".join(missing))
    )


def test_every_notes_section_cited_is_in_notes_md():
    cited = {(str(p.relative_to(REPO)), m) for p in _files() for m in NOTES_REF.findall(p.read_text())}
    assert {"1.3", "4"} <= {m for _, m in cited}
    headings = set(re.findall(r"^## §(\d+(?:\.\d+)*) ", NOTES, flags=re.MULTILINE))
    missing = sorted(f"{where}: notes §{m}" for where, m in cited if m not in headings)
    assert not missing, "copy these sections into estimator/terms/NOTES.md (with attribution):\n" + "\n".join(
        missing
    )


@pytest.mark.parametrize("ref", sorted(CITED))
def test_permalink_names_the_file_version_and_lines(ref):
    abbr, lines = ref.split(":")
    pkg, _, base = ABBRS[abbr]
    first, _, last = lines.partition("-")
    anchor = f"#L{first}-L{last}" if last else f"#L{first}"
    assert CITED[ref][0] == base + anchor
    assert f"/blob/v{VERSIONS[pkg]}/" in base


@pytest.mark.parametrize("ref", sorted(CITED))
def test_cited_lines_are_still_there_in_the_installed_package(ref):
    abbr, lines = ref.split(":")
    pkg, path, _ = ABBRS[abbr]
    installed = version(pkg).split("+")[0]
    if installed != VERSIONS[pkg]:
        pytest.fail(
            f"{pkg} {installed} is installed but SOURCES.md cites {pkg} {VERSIONS[pkg]}: line numbers drift between "
            f"releases; re-check every {abbr}: reference against the installed source, then update the legend",
            pytrace=False,
        )
    text = Path(str(distribution(pkg).locate_file(path))).read_text().splitlines()
    first, _, last = lines.partition("-")
    _, starts, ends = CITED[ref]
    assert text[int(first) - 1].strip().startswith(starts), f"{ref} no longer starts with {starts!r}"
    assert text[int(last or first) - 1].strip().startswith(ends), f"{ref} no longer ends with {ends!r}"


@pytest.mark.parametrize("url", sorted(BY_NAME))
def test_code_cited_by_name_is_at_the_permalinked_line(url):
    m = PERMALINK.fullmatch(url)
    assert m, f"not a versioned line permalink: {url}"
    repo, ver, path, line = m.groups()
    pkg, prefix = REPOS[repo]
    assert ver == VERSIONS[pkg], f"{url} is not at the pinned {pkg} {VERSIONS[pkg]}"
    if version(pkg).split("+")[0] != ver:
        pytest.skip(f"{pkg} {version(pkg)} installed; the legend is for {ver}")
    text = Path(str(distribution(pkg).locate_file(path.removeprefix(prefix)))).read_text().splitlines()
    assert text[int(line) - 1].strip().startswith(BY_NAME[url]), (
        f"{url} no longer starts with {BY_NAME[url]!r}"
    )


@pytest.mark.parametrize("ref", sorted(EARLIER))
def test_earlier_release_permalink_names_its_release_and_lines(ref):
    pkg, release, url = EARLIER[ref]
    m = PERMALINK.match(url)
    assert m, f"not a versioned line permalink: {url}"
    repo, ver, path, _ = m.groups()
    assert REPOS[repo][0] == pkg and ver == release, url
    cited_file = ref.split(":")[0]
    assert " " in cited_file or path.endswith(cited_file), f"{ref} does not name {path}"
    a, _, b = ref.rsplit(":", 1)[1].partition("-")
    assert url.endswith(f"#L{a}-L{b}" if b else f"#L{a}"), url
    assert release != VERSIONS[pkg], f"{ref} cites the pinned {pkg}: list it under Cited lines instead"
