"""Reading and aggregating result rows: unknown schemas rejected, corrupt lines counted, one row per
(source, key) chosen by status then time (not by file name), and every committed row valid per SCHEMA.md."""

import json
from pathlib import Path

from synthetic_rows import row as synthetic_row

from estimator.settings.config import RunConfig
from sweeps import records
from sweeps.runner import measure

REPO = Path(__file__).resolve().parents[2]


def _row(key, status="ok", peak=100, written_at=None, source="traced", sweep="s"):
    r = {"schema": 1, "key": key, "source": source, "status": status, "sweep": sweep}
    r["observed"] = {"peak_bytes": peak} if peak else None
    if written_at:
        r["written_at"] = written_at
    return r


def _lines(path: Path, *objs) -> Path:
    path.write_bytes(b"".join(o if isinstance(o, bytes) else (json.dumps(o) + "\n").encode() for o in objs))
    return path


def test_unknown_schema_corrupt_lines_and_list_keys_are_counted_not_read(tmp_path):
    path = _lines(
        tmp_path / "r.jsonl",
        _row("a"),
        {**_row("b"), "schema": 2},
        {**_row("c"), "schema": None},
        b"{not json\n",
        b"\xff\xfe binary\n",
        b"\n",
        [1, 2],
        {**_row("d"), "key": ["x", "y"]},
        {**_row("e"), "schema": True},
    )
    loaded = records.read_rows(path)
    assert [r["key"] for r in loaded.rows] == ["a"]
    assert [(s.line, s.reason.split(" (")[0]) for s in loaded.skipped] == [
        (2, "unknown schema version 2"),
        (3, "unknown schema version None"),
        (4, "corrupt"),
        (5, "corrupt"),
        (7, "not a JSON object"),
        (8, "key is not a non-empty string"),
        (9, "unknown schema version True"),
    ]
    (line,) = loaded.report_lines()
    assert (
        line.startswith(f"skipped 7 line(s) of {path}: ") and "2 corrupt (not JSON) (first: line 4)" in line
    )


def test_resume_survives_a_row_whose_key_is_a_list(tmp_path):
    v = records.package_versions()
    path = _lines(
        tmp_path / "r.jsonl", {**_row("ok"), "versions": v}, {**_row("x"), "key": ["a"], "versions": v}
    )
    assert measure.skip_keys(path, v) == {"ok"}
    assert records.finished_keys(records.load_rows(path), v) == {"ok"}


def test_later_failed_retry_never_hides_a_measurement():
    good, retry = (
        _row("k", written_at="2026-01-01T00:00:00.000000Z"),
        _row("k", "error", None, "2026-02-01T00:00:00.000000Z"),
    )
    assert records.latest_rows([good, retry]) == [good]
    assert records.latest_rows([retry, good]) == [good]
    oom = _row("k", "oom", None, "2026-03-01T00:00:00.000000Z")
    assert records.latest_rows([good, oom, retry]) == [good]
    assert records.latest_rows([oom, retry]) == [oom]


def test_duplicates_are_chosen_by_time_not_by_file_name(tmp_path):
    old = _row("k", peak=100, written_at="2026-01-01T00:00:00.000000Z", sweep="zzz-old")
    new = _row("k", peak=200, written_at="2026-05-01T00:00:00.000000Z", sweep="aaa-new")
    _lines(tmp_path / "a.jsonl", new)
    _lines(tmp_path / "z.jsonl", old)  # sorts later by name, written earlier
    (chosen,) = records.latest_rows(records.load_rows(tmp_path))
    assert chosen["observed"]["peak_bytes"] == 200
    # rows from before `written_at` existed: deterministic whatever the order they come in
    a, b = _row("j", peak=1, sweep="x"), _row("j", peak=2, sweep="y")
    assert records.latest_rows([a, b]) == records.latest_rows([b, a])
    # the same key from another source is another measurement
    assert len(records.latest_rows([old, {**old, "source": "measured-gpu"}])) == 2


def test_append_row_stamps_utc_time_that_sorts(tmp_path):
    path = tmp_path / "r.jsonl"
    records.append_row(path, _row("a"))
    records.append_row(path, _row("a", peak=5))
    first, second = records.load_rows(path)
    assert first["written_at"].endswith("Z") and first["written_at"] <= second["written_at"]
    assert records.latest_rows([second, first])[0]["observed"]["peak_bytes"] == 5


def test_every_committed_row_follows_the_schema():
    loaded = records.read_rows(records.RESULT_DIRS)
    assert loaded.skipped == []
    assert len(loaded.rows) > 200
    problems = {r["key"]: p for r in loaded.rows if (p := records.validate_row(r))}
    assert problems == {}


def test_the_validator_can_fail():
    r = synthetic_row(RunConfig(model="0.5B"), "traced", 10)
    r["key"] = records.make_key(r["config"], r["variant"])
    r["versions"] = {v: "1" for v in records.VERSION_FIELDS}
    assert records.validate_row(r) == []
    assert records.validate_row({**r, "key": "0" * 16}) == ["key is not make_key(config, variant)"]
    assert records.validate_row({**r, "status": "ok", "error": "boom"})[0].startswith("error must be null")
    assert records.validate_row({**r, "source": "guessed"})[0].startswith("source 'guessed'")
    bad_obs = {**r, "observed": {**r["observed"], "peak_bytes": -1}}
    assert records.validate_row(bad_obs) == ["observed.peak_bytes is not a positive integer"]
    assert records.validate_row({**r, "schema": 7})[0].startswith("unknown schema version 7")
    assert "missing field 'device'" in records.validate_row({k: v for k, v in r.items() if k != "device"})


def test_rows_that_predate_a_new_setting_still_match_their_config():
    from sweeps.report import frames as rd

    cfg = RunConfig(model="7B", dtype="bfloat16")
    old = cfg.to_dict()
    old.pop("trl_version")  # rows of the newest TRL release do not carry it
    assert rd.config_id(old) == rd.config_id(cfg)
    rows = records.load_rows(records.RESULT_DIRS)
    head = rd.headline_frame(rd.rows_frame(rows))
    # results/traced/tuned/headline.jsonl covers every cell; a measured-gpu row of the same config takes its place
    assert head["source"].isin(["traced", "measured-gpu"]).sum() == 25
