"""The worked examples in examples/ say what the tool says today (regenerate with `make examples`)."""

import os

import pytest

from examples import make_examples


@pytest.fixture(autouse=True)
def _repo_root():
    here = os.getcwd()
    os.chdir(make_examples.ROOT)
    yield
    os.chdir(here)


def test_every_case_has_runs_and_outputs():
    cases = sorted(make_examples.EXAMPLES.glob("case*"))
    assert len(cases) == 5  # four field OOM reports, and a TRL user's own files
    for case in cases:
        assert make_examples.runs(case), case


def test_examples_are_not_stale():
    for path, text in make_examples.outputs().items():
        assert path.exists(), f"{path} missing: run `make examples`"
        assert path.read_text() == text, f"{path} is stale: run `make examples`"
