"""notebooks/analysis.ipynb executes headless on the committed results, so it cannot silently rot."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient
from synthetic_rows import row, write_jsonl

from sweeps.report import frames as rd

REPO = Path(__file__).resolve().parents[2]


def test_analysis_notebook_executes_and_reads_extra_rows(tmp_path, monkeypatch):
    # one row of one's own (a GPU measurement kept outside results/), passed the way the notebook documents
    mine = row(rd.method_config("0.5B", "LoRA"), "measured-gpu", 2 * 2**30, key="my-h100-row")
    monkeypatch.setenv("MY_ROWS", str(write_jsonl(tmp_path / "mine.jsonl", [mine])))
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    summary = next(
        c for c in nb.cells if c.cell_type == "code" and 'summary_frame(acc, ("source",))' in c.source
    )
    text = "".join(o.get("data", {}).get("text/plain", "") for o in summary.outputs)
    assert "traced" in text and "measured-cpu" in text
    assert "measured-gpu" in text  # the extra row joined the committed ones
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 4  # accuracy, breakdown and the two curves
