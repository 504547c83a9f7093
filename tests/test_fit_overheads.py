"""fit-overheads recovers known constants from synthetic measured-gpu rows."""

import pytest
from synthetic_rows import row

from estimator.settings.config import RunConfig
from estimator.units import MIB
from sweeps.report import fit_overheads as fo


def _gpu_row(alloc: int, context: int, fraction: float) -> dict:
    reserved = int(alloc * (1 + fraction))
    probes = {
        "torch_cuda": {"peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved},
        "nvml": {"available": True, "peak_process_bytes": reserved + context},
    }
    return row(
        RunConfig(model="0.5B", dtype="bfloat16"), "measured-gpu", alloc, probes=probes, key=f"k{alloc}"
    )


def test_fit_recovers_context_and_fraction():
    rows = [_gpu_row(a * MIB, 731 * MIB, 0.042) for a in (3000, 8000, 20000, 41000)]
    samples = fo.samples_from_rows(rows, lambda cfg, hf: 10_000 * MIB)
    got = fo.fit(samples)
    assert got.rows == 4
    assert got.allocator_fraction == pytest.approx(0.042, abs=1e-4)
    assert got.cuda_context_bytes == pytest.approx(731 * MIB, rel=1e-3)


def test_fitted_constants_remove_the_device_error():
    rows = [_gpu_row(a * MIB, 600 * MIB, 0.03) for a in (5000, 9000, 30000)]
    samples = fo.samples_from_rows(rows, lambda cfg, hf: 0)
    samples = [fo.Sample(s.allocated, s.reserved, s.nvml, s.allocated) for s in samples]  # perfect allocated
    got = fo.fit(samples)
    after = fo.device_errors(samples, got.cuda_context_bytes, got.allocator_fraction)
    assert max(abs(e) for e in after) < 1e-3
    before = fo.device_errors(samples, 2000 * MIB, 0.2)
    assert max(abs(e) for e in before) > 0.1


def test_rows_without_gpu_probes_are_skipped(tmp_path, capsys):
    cpu = row(RunConfig(model="0.5B"), "measured-cpu", 123)
    assert fo.samples_from_rows([cpu], lambda cfg, hf: 0) == []
    assert fo.main(["--raw", str(tmp_path)]) == 0
    assert "no measured-gpu rows" in capsys.readouterr().out
    assert fo.main(["--raw", str(tmp_path / "missing")]) == 2


def test_report_compares_with_the_estimators_own_overheads():
    # a predictor giving (allocated, nvidia-smi peak, outside the allocator): the report sets the fitted C beside
    # the estimator's itemized figure and scores the estimator's own nvidia-smi peak (5 % over every NVML peak)
    rows = [_gpu_row(a * MIB, 700 * MIB, 0.05) for a in (4000, 16000)]
    samples = fo.samples_from_rows(rows, lambda cfg, hf: (0, 0, 788 * MIB))
    assert [s.predicted_outside for s in samples] == [788 * MIB] * 2  # the tuple reaches the samples
    samples = [
        fo.Sample(s.allocated, s.reserved, s.nvml, s.allocated, int(1.05 * s.nvml), 788 * MIB)
        for s in samples
    ]
    _, lines = fo.report(samples)
    text = "\n".join(lines)
    assert "700 MiB (fitted)" in text and "itemizes 788 MiB" in text
    assert "the estimator's nvidia-smi peak vs NVML: median 5.0%, worst +5.0%" in text
