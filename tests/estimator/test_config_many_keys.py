"""Config files with thousands of keys no tool reads: the typo check stays bounded and the note stays one short line.

A real TRL or accelerate file has a handful of unknown keys. Past `files.MAX_TYPO_CHECKS` the file is not such a
config, so only the first that many are checked for a near miss of a known key, and a note lists the first
`text.LISTED`, each escaped and cut, then how many more.
"""

from __future__ import annotations

import json

import pytest

from estimator import text
from estimator.interface import configfile, files, launchfile
from estimator.interface.configfile import ConfigFileError, read_config_file

MANY = 20_000


@pytest.fixture
def counted(monkeypatch):
    """How many times each reader calls the (quadratic) typo check."""
    calls = {"n": 0}
    real = files.suggestion

    def counting(key, known):
        calls["n"] += 1
        return real(key, known)

    monkeypatch.setattr(configfile, "suggestion", counting)
    monkeypatch.setattr(launchfile, "suggestion", counting)
    return calls


def _unknown_note(notes: list[str]) -> str:
    (note,) = [n for n in notes if "unknown keys" in n or "does not read" in n]
    return note


def test_a_trl_file_with_many_unknown_keys_is_checked_and_listed_in_bounds(tmp_path, counted):
    path = tmp_path / "grpo.yaml"
    path.write_text("".join(f"zz_unknown_{i}: 1\n" for i in range(MANY)) + "num_generations: 4\n")
    s = read_config_file(str(path))
    assert s.values == {"num_generations": 4}
    assert len(s.unknown) == MANY  # every key is still counted as unread
    assert counted["n"] == files.MAX_TYPO_CHECKS
    note = _unknown_note(s.notes)
    assert "zz_unknown_0, zz_unknown_1" in note
    assert note.endswith(f"and {MANY - text.LISTED} more")
    assert len(note) < 1000


def test_a_deepspeed_file_with_many_unknown_keys_is_checked_in_bounds(tmp_path, counted):
    path = tmp_path / "ds.json"
    keys = {f"zz_unknown_{i}": 1 for i in range(MANY)}
    zero = {f"zz_zero_{i}": 1 for i in range(MANY)} | {"stage": 2}
    path.write_text(json.dumps(keys | {"zero_optimization": zero}))
    s = read_config_file(str(path))
    assert counted["n"] <= 2 * files.MAX_TYPO_CHECKS
    assert len(_unknown_note(s.notes)) < 1000


def test_a_typo_among_the_first_unknown_keys_is_still_an_error(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("".join(f"zz_unknown_{i}: 1\n" for i in range(10)) + "num_generatoins: 4\n")
    with pytest.raises(ConfigFileError, match="did you mean num_generations"):
        read_config_file(str(path))


def test_unknown_keys_in_the_note_are_escaped(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text('"foo\\e[31mRED\\r\\n": 1\nbeta: 0.1\n')
    note = _unknown_note(read_config_file(str(path)).notes)
    assert "foo\\x1b[31mRED\\r\\n" in note
    assert not any(c in note for c in "\x1b\r\n")
