"""The hostile-input corpus (tests/contracts/hostile_inputs.py): every case ends in its expected clean class.

Combinations, files of every kind, hostile config.json content, output streams, environments, every numeric flag
with values no schema field lists: one clean line on stderr and exit 2 (3 for an answer that cannot be written),
or a clean answer. Never a traceback, never a hang, never bad input taken as good. A case failing today because
of a known defect is xfail(strict=True) naming it (hostile_inputs.KNOWN_DEFECTS); counts:
benchmarks/hostile_inputs.py.
"""

from __future__ import annotations

import pytest
from hostile_inputs import CLASSES, OUTCOMES, classify, corpus, expected_outcomes

CASES = corpus()


def _param(case):
    marks = []
    if case.defect:
        marks.append(pytest.mark.xfail(strict=True, reason=case.defect))
    if case.skip:
        marks.append(pytest.mark.skip(reason=case.skip))
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_hostile_input_is_handled_cleanly(case):
    result = classify(case)
    assert result.outcome in OUTCOMES
    assert result.outcome in expected_outcomes(case), (
        f"{case.id}: {result.outcome} (exit {result.code}) {result.detail}; argv={case.argv!r}; stderr={result.err}"
    )


def test_the_corpus_covers_every_class_with_several_cases():
    per_class = {name: sum(c.cls == name for c in CASES) for name in CLASSES}
    assert all(n >= 5 for n in per_class.values()), per_class
    assert {c.cls for c in CASES} == set(CLASSES)
    assert 150 <= len(CASES), len(CASES)
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
    both = {c.expect for c in CASES}
    assert {"refused", "accepted"} <= both  # good input is in the corpus too: a blanket refusal fails


def test_known_defects_name_real_cases():
    from hostile_inputs import KNOWN_DEFECTS

    ids = {c.id for c in CASES}
    assert set(KNOWN_DEFECTS) <= ids, set(KNOWN_DEFECTS) - ids


def test_the_classifier_sees_a_traceback_and_a_wrong_acceptance(monkeypatch):
    """The suite can fail: an exception escaping main is a traceback, an exit 0 on bad input is accepted-wrong."""
    from hostile_inputs import Case

    from estimator.interface import cli

    monkeypatch.setattr(cli, "main", lambda argv: 1 / 0)
    assert classify(Case("numbers", "boom", ("--gpus", "0"))).outcome == "traceback"
    monkeypatch.setattr(cli, "main", lambda argv: 0)
    assert classify(Case("numbers", "ok", ("--gpus", "0"))).outcome == "accepted-wrong"
