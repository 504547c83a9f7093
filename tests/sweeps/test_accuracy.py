"""accuracy: recomputed predictions vs observed peaks, per-source summary lines."""

import json

from estimator.units import MIB
from sweeps import records
from sweeps.report import accuracy, accuracy_cli
from sweeps.runner.tiny import hf_config


def _row(key, source, observed, status="ok", nvml=None, model="m"):
    probes = {"nvml": {"available": True, "peak_process_bytes": nvml}} if nvml else {}
    return {
        "schema": 1,
        "key": key,
        "source": source,
        "status": status,
        "sweep": "t",
        "config": {"model": model, "per_device_train_batch_size": 4, "num_generations": 4},
        "model": {"name": model},
        "observed": {"peak_bytes": observed, "peak_phase": "train", "probes": probes},
    }


def fake_predictor(config, hf, tensors="real"):
    """Predicts 100 MiB allocated / 120 MiB device for every config."""
    return {"peak_allocated_bytes": 100 * MIB, "peak_device_bytes": 120 * MIB, "peak_phase": "train"}, None


def test_frame_errors_and_summary_lines(tmp_path):
    rows = [
        _row("a", "measured-cpu", 80 * MIB),  # +25%
        _row("b", "measured-cpu", 125 * MIB),  # -20%
        _row("c", "measured-cpu", 100 * MIB),  # 0%
        _row("d", "traced", 110 * MIB),
        _row("e", "measured-gpu", 50 * MIB, nvml=100 * MIB),
        _row("f", "measured-cpu", None, status="oom"),
    ]
    for r in rows:
        records.append_row(tmp_path / "x.jsonl", r)
    df = accuracy.accuracy_frame(records.load_rows(tmp_path), predictor=fake_predictor)
    assert len(df) == 5
    a = df.set_index("key")
    assert a.loc["a", "abs_error_bytes"] == 20 * MIB
    assert abs(a.loc["a", "rel_error"] - 0.25) < 1e-12
    assert abs(a.loc["b", "rel_error"] + 0.2) < 1e-12
    assert abs(a.loc["e", "device_rel_error"] - 0.2) < 1e-12
    lines = accuracy.summary_lines(df)
    assert lines == [
        "accuracy[traced]: 1 configs, median 9.1%, worst 9.1%",
        "accuracy[traced, full fine-tune + grad. ckpt]: 1 configs, median 9.1%, worst 9.1%",
        "accuracy[measured-cpu]: 3 configs, median 20.0%, worst 25.0%",
        "accuracy[measured-cpu, full fine-tune + grad. ckpt]: 3 configs, median 20.0%, worst 25.0%",
        "accuracy[measured-gpu]: 1 configs, median 100.0%, worst 100.0%",
        "accuracy[measured-gpu, full fine-tune + grad. ckpt]: 1 configs, median 100.0%, worst 100.0%",
    ]


def test_latest_row_per_key_wins():
    rows = [_row("a", "measured-cpu", 10 * MIB, status="error"), _row("a", "measured-cpu", 100 * MIB)]
    df = accuracy.accuracy_frame(rows, predictor=fake_predictor)
    assert list(df["observed_bytes"]) == [100 * MIB]
    rows.append(_row("a", "measured-cpu", None, status="error"))  # a later failed retry
    df = accuracy.accuracy_frame(rows, predictor=fake_predictor)
    assert list(df["observed_bytes"]) == [100 * MIB]  # never hides the earlier good measurement


def _tiny_row() -> dict:
    """A measured-cpu row of the in-code tiny-2M model (bs 4, 4 generations)."""
    row = _row("t", "measured-cpu", 30 * MIB, model="tiny-2M")
    row["config"] = {
        "model": "tiny-2M",
        "device": "cpu",
        "per_device_train_batch_size": 4,
        "num_generations": 4,
    }
    return row


def test_real_predictor_sizes_tiny_models_from_stored_config():
    row = _tiny_row()
    row["model"]["config"] = hf_config("tiny-2M")
    df = accuracy.accuracy_frame([row])
    assert df.loc[0, "prediction_error"] is None
    assert df.loc[0, "predicted_bytes"] > 8 * MIB  # at least the fp32 weights of 2M params


def test_main_prints_table_and_summary(tmp_path, capsys):
    row = _tiny_row()
    (tmp_path / "s.jsonl").write_text(json.dumps(row) + "\n")
    assert accuracy_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny-2M full" in out
    lines = out.strip().splitlines()
    assert any(line.startswith("accuracy[measured-cpu]: 1 configs, median ") for line in lines)
    # the three sets follow, by file name: s.jsonl is in-sample, and holds no traced row; then the same sets
    # under each modelled transformers release (the measured-cpu row is no measured-gpu one: no line of its own)
    sets = ("in-sample", "validation", "held-out")
    by_release = [f"accuracy[transformers {r}, {s}]: no rows" for r in ("5.23", "5.24") for s in sets]
    assert lines[-13:-4] == [f"accuracy[{s}]: no rows" for s in sets] + by_release
    # then the layers above the tensors on GPU runs, the host RAM line, and the smallest card measured: none here
    assert [line.split(":")[0] for line in lines[-4:]] == [
        "reserve[measured-gpu, reserved]",
        "reserve[measured-gpu, nvidia-smi]",
        "host[measured-gpu]",
        "mincard[measured-gpu]",
    ]
    assert all("no rows" in line for line in lines[-4:])


def test_main_rejects_missing_path(tmp_path, capsys):
    assert accuracy_cli.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1


def test_main_reports_skipped_lines(tmp_path, capsys):
    row = _tiny_row()
    text = json.dumps(row) + "\n{broken\n" + json.dumps({**row, "schema": 99}) + "\n"
    (tmp_path / "s.jsonl").write_text(text)
    assert accuracy_cli.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("skipped 2 line(s) of ")
    assert "1 corrupt (not JSON) (first: line 2)" in err[0] and "unknown schema version 99" in err[0]


WRONG_TYPES = {
    "versions": "x",
    "config": "x",
    "observed": [1, 2],
    "model": "x",
    "device": 5,
    "variant": 3,
}


def test_rows_whose_objects_have_another_type_are_skipped_everywhere(tmp_path, capsys):
    row = _tiny_row()
    bad = [{**row, "key": f"bad-{name}", name: value} for name, value in WRONG_TYPES.items()]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [row, *bad]))
    assert [records.row_problem(r) for r in bad] == [
        f"{name} is neither null nor an object" for name in WRONG_TYPES
    ]
    loaded = records.read_rows(tmp_path)
    assert [r["key"] for r in loaded.rows] == [row["key"]] and len(loaded.skipped) == len(bad)
    assert accuracy_cli.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"skipped {len(bad)} line(s) of ")


def test_a_rerun_skips_a_row_whose_versions_are_not_an_object(tmp_path, capsys):
    from sweeps.runner import measure

    path = tmp_path / "s.jsonl"
    rows = [
        {"schema": 1, "key": "a", "status": "ok", "versions": "x"},
        {"schema": 1, "key": "b", "status": "ok"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert measure.skip_keys(path, {}) == {"b"}
    assert "versions is neither null nor an object" in capsys.readouterr().err


def test_own_line_sets_say_whether_their_error_is_the_estimates():
    """The padded runs count their under-predictions; the CPU rehearsal of ZeRO offload, whose one device holds
    the host state too, says it is no error instead of counting two 'under-predicted' rows."""
    padded = {**_row("p", "measured-cpu", 125 * MIB), "sweep": "padded"}  # -20 %
    zero = {**_row("z", "measured-cpu", 150 * MIB), "sweep": "zero-cpu"}  # -33 %
    lines = accuracy.summary_lines(accuracy.accuracy_frame([padded, zero], predictor=fake_predictor))
    assert (
        "accuracy[measured-cpu, padded]: 1 configs, median 20.0%, worst 20.0%, 1 under-predicted by more than 2%"
        in lines
    )
    (rehearsal,) = [line for line in lines if "zero-offload on CPU" in line]
    assert rehearsal.startswith("accuracy[measured-cpu, zero-offload on CPU]: 1 configs, median 33.3%")
    assert "not an error" in rehearsal and "under-predicted" not in rehearsal
