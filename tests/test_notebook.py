"""notebooks/explore_run.ipynb executes top to bottom against a fake run folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_run import small_protocol, write_fake_run

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_run.ipynb"


def test_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no python3 Jupyter kernel installed (pip install ipykernel)")
    root = write_fake_run(tmp_path / "run", small_protocol(), cohort_kind="ptbxl")
    monkeypatch.setenv("RAYBENCH_RUN_DIR", str(root))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend returns the figures
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert str(root) in text and "complete primary blocks: 18 of 18" in text
    html_tables = [o for o in outputs if o.output_type == "execute_result" and "text/html" in o.data]
    assert len(html_tables) >= 2  # the profiles table and the validation R² table
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5  # forest, curves, heatmaps, families + rank stability, atlas
