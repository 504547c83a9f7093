"""The lease's transformers wheel keeps the model folders its runs import and drops the rest."""

from __future__ import annotations

import zipfile

from sweeps.lease.trim_transformers import catalog_types, trim


def _wheel(path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)


def test_kept_folders_are_the_given_types_and_what_they_import(tmp_path):
    wheel = tmp_path / "transformers-0-py3-none-any.whl"
    _wheel(
        wheel,
        {
            "transformers/__init__.py": "",
            "transformers/modeling_utils.py": "from .models.core_needs import X\n",
            "transformers/models/auto/configuration_auto.py": "",
            "transformers/models/qwen3/modeling_qwen3.py": "from ..qwen2.modeling_qwen2 import Y\n",
            "transformers/models/qwen2/modeling_qwen2.py": "",
            "transformers/models/core_needs/__init__.py": "",
            "transformers/models/gemma3/modeling_gemma3.py": "",
            "transformers/models/unused/modeling_unused.py": "x = 1\n" * 1000,
        },
    )
    trim(wheel, ["qwen3", "gemma3_text"])  # gemma3_text lives in gemma3
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "transformers/models/unused/modeling_unused.py" not in names
    for kept in ("qwen3", "qwen2", "core_needs", "gemma3", "auto"):
        assert any(n.startswith(f"transformers/models/{kept}/") for n in names), kept
    assert "transformers/modeling_utils.py" in names


def test_catalog_types_cover_the_catalog():
    types = catalog_types()
    assert {"qwen2", "qwen3", "llama", "gemma3_text"} <= set(types)
