"""notebooks/analysis.ipynb executes headless on the committed results, so it cannot silently rot."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent


def test_analysis_notebook_executes_and_reports_every_source():
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    summary = next(c for c in nb.cells if c.cell_type == "code" and "accuracy_summary" in c.source)
    html = "".join(o.get("data", {}).get("text/plain", "") for o in summary.outputs)
    assert "traced" in html and "measured-cpu" in html
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 4  # accuracy, breakdown and the two curves
