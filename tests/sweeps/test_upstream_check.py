"""`make upstream-check`'s report (sweeps/report/upstream_check.py) on a small synthetic junit file: no network,
no scratch venv. The XML is the shape pytest writes with --showlocals --tb=long (copied from a real run, trimmed);
its `path.py:N` locations are written with `&#58;` for the colon, so tests/contracts/test_sources.py (which reads every
`file.py:N` in the tree as an upstream line citation) does not take them for one."""

from __future__ import annotations

import re
from pathlib import Path

from sweeps.report import upstream_check as uc

REPO = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1"
failures="3" skipped="1" tests="6"><testcase classname="tests.ground_truth.test_decode_step" name="test_step[qwen2-gqa-eager]"
time="0.1"><failure message="AssertionError: ('qwen2-gqa', 1000, 1200, 10)&#10;assert 1200 &lt;= (1000 + 10)">case = 'qwen2-gqa'

    @pytest.mark.parametrize("case", ["qwen2-gqa"])
    def test_step(case):
        estimated = 1000
        measured = _measure(400)
        slack = 10
&gt;       assert estimated &lt;= measured &lt;= estimated + slack, (case, estimated, measured, slack)
E       AssertionError: ('qwen2-gqa', 1000, 1200, 10)
E       assert 1200 &lt;= (1000 + 10)

case       = 'qwen2-gqa'
estimated  = 1000
measured   = 1200
slack      = 10

tests/ground_truth/test_decode_step.py&#58;13: AssertionError</failure></testcase><testcase classname="tests.ground_truth.test_lora_output_instant"
name="test_helper" time="0.0"><failure message="assert 5 == 7">def test_helper():
        def check(est, real):
            assert est == real
&gt;       check(5, 7)

check      = &lt;function test_helper.&lt;locals&gt;.check at 0x7f21e678e8e0&gt;

tests/ground_truth/test_lora_output_instant.py&#58;18:
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _

est = 5, real = 7

    def check(est, real):
&gt;       assert est == real
E       assert 5 == 7

est        = 5
real       = 7

tests/ground_truth/test_lora_output_instant.py&#58;17: AssertionError</failure></testcase><testcase
classname="tests.ground_truth.test_lora_nograd_4bit" name="test_bnb" time="0.0"><skipped type="pytest.skip"
message="could not import 'bitsandbytes'">tests/ground_truth/test_lora_nograd_4bit.py&#58;21: skipped</skipped></testcase><testcase
classname="tests.ground_truth.test_moe_lora" name="test_ok" time="0.0" /><testcase classname="tests.ground_truth.test_moe_lora" name="test_err"
time="0.0"><error message="failed on setup with &quot;ImportError: cannot import name 'Qwen3MoeExperts'&quot;">
ImportError: cannot import name 'Qwen3MoeExperts'</error></testcase><testcase classname="tests.contracts.test_tracer_upstream"
name="test_upstream_source_matches_the_table[transformers.cache_utils:DynamicLayer]" time="0.0"><failure
message="transformers.cache_utils:DynamicLayer changed in transformers 5.99.0">transformers.cache_utils:DynamicLayer
changed in transformers 5.99.0</failure></testcase></testsuite></testsuites>
"""


def _junit(tmp_path: Path) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    return path


def test_outcomes_are_read_per_test_with_their_file(tmp_path):
    outcomes = uc.parse_junit(_junit(tmp_path))
    assert [(o.file, o.function, o.status) for o in outcomes] == [
        ("tests/ground_truth/test_decode_step.py", "test_step", "failed"),
        ("tests/ground_truth/test_lora_output_instant.py", "test_helper", "failed"),
        ("tests/ground_truth/test_lora_nograd_4bit.py", "test_bnb", "skipped"),
        ("tests/ground_truth/test_moe_lora.py", "test_ok", "passed"),
        ("tests/ground_truth/test_moe_lora.py", "test_err", "error"),
        (uc.GUARD, "test_upstream_source_matches_the_table", "failed"),
    ]
    assert outcomes[0].nodeid == "tests/ground_truth/test_decode_step.py::test_step[qwen2-gqa-eager]"
    assert outcomes[2].message == "could not import 'bitsandbytes'"


def test_a_failure_gives_its_assertion_and_the_values_it_compared(tmp_path):
    first, helper = uc.parse_junit(_junit(tmp_path))[:2]
    d = uc.failure_detail(first.text)
    assert d.location == "tests/ground_truth/test_decode_step.py line 13"
    assert d.source == [
        "assert estimated <= measured <= estimated + slack, (case, estimated, measured, slack)"
    ]
    assert d.error[-1] == "assert 1200 <= (1000 + 10)"
    assert d.numbers == {
        "estimated": 1000,
        "measured": 1200,
        "slack": 10,
    }  # the parameters line is not a local
    assert d.comparison() == ("estimated", 1000, "measured", 1200)
    # raised in a helper: the helper's frame names the values
    h = uc.failure_detail(helper.text)
    assert h.location == "tests/ground_truth/test_lora_output_instant.py line 17" and h.source == [
        "assert est == real"
    ]
    assert h.comparison() == ("est", 5, "real", 7)


def _report(outcomes, guard=(), versions=()) -> uc.Report:
    return uc.Report(list(versions), [], list(guard), outcomes, asked="UPSTREAM_PINS=transformers==5.99.0")


def test_the_report_names_what_drifted_by_how_much_and_where(tmp_path):
    changed = uc.GuardRow(
        "transformers.cache_utils:DynamicLayer",
        "transformers",
        "generate._fast_forward_cache (replaces layer.keys / layer.values)",
        installed="5.99.0",
        reference="5.23.0",
        status="changed",
        recorded=False,
    )
    same = uc.GuardRow(
        "torch.nn.functional:dropout", "torch", "patches._fused_dropout", "2.13.0", "2.13.0", "same", True
    )
    r = _report(
        uc.parse_junit(_junit(tmp_path)),
        guard=[changed, same],
        versions=[("transformers", "5.23.0", "5.99.0"), ("torch", "2.13.0", "2.13.0")],
    )
    assert r.drifted and len(r.broken) == 3 and r.changed == [changed]
    text = uc.render(r, when="2026-01-01 00:00 UTC", rev="abc1234")
    assert "**Drift**: 3 ground-truth test(s) failed, 1 guarded upstream source(s) changed." in text
    assert "| transformers | 5.23.0 | 5.99.0 | **differs** |" in text
    assert "| torch | 2.13.0 | 2.13.0 |  |" in text
    assert (
        "`transformers.cache_utils:DynamicLayer` | transformers 5.99.0 | 5.23.0 | generate._fast_forward_cache"
        in text
    )
    assert "### `tests/ground_truth/test_decode_step.py::test_step[qwen2-gqa-eager]` (failed)" in text
    assert f"- code path: {uc.GROUND_TRUTH['tests/ground_truth/test_decode_step.py']}" in text
    assert "**estimated 1,000 vs measured 1,200** (estimated − measured = -200, -16.7 % of measured)" in text
    assert "ImportError: cannot import name 'Qwen3MoeExperts'" in text  # an error says why
    assert (
        "- `tests/ground_truth/test_lora_nograd_4bit.py::test_bnb`: could not import 'bitsandbytes'" in text
    )  # skips listed
    assert "commit abc1234" in text and "asked: UPSTREAM_PINS=transformers==5.99.0" in text


def test_a_clean_run_says_so():
    passed = uc.Outcome("tests/ground_truth/test_decode_step.py", "test_step[a]", "passed")
    guard = uc.Outcome(uc.GUARD, "test_upstream_source_matches_the_table[x]", "passed")
    same = uc.GuardRow(
        "torch.nn.functional:dropout", "torch", "patches._fused_dropout", "2.13.0", "2.13.0", "same", True
    )
    r = _report([passed, guard], guard=[same])
    assert not r.drifted
    text = uc.render(r, when="2026-01-01 00:00 UTC", rev="")
    assert (
        "**Clean**" in text
        and "1 unchanged and recorded" in text
        and "## Ground-truth tests that failed\n\nNone." in text
    )


def test_main_on_a_junit_file_exits_1_and_writes_the_markdown(tmp_path, capsys):
    out = tmp_path / "report.md"
    assert uc.main(["--from-junit", str(_junit(tmp_path)), "--markdown", str(out)]) == 1
    assert out.read_text().startswith("# Upstream check")
    assert "test_step[qwen2-gqa-eager]" in capsys.readouterr().out


def test_every_listed_test_runs_upstream_code_and_the_left_out_one_does_not():
    upstream = re.compile(
        r"^\s*(import|from) (transformers|peft|bitsandbytes|accelerate)\b|importorskip\(\"(transformers|peft|bitsandbytes)",
        re.M,
    )
    assert (REPO / uc.GUARD).is_file()
    for entry in uc.GROUND_TRUTH:
        path = REPO / entry.split("::", 1)[0]
        assert path.is_file(), f"{entry} is gone: update GROUND_TRUTH"
        assert upstream.search(path.read_text()), f"{entry} imports no upstream package"
    for entry in uc.NOT_GROUND_TRUTH:
        assert not upstream.search((REPO / entry).read_text()), f"{entry} now runs upstream code: list it"
