"""Dashboards and the SAELens export on a trained run (the session's finished run: synthetic cohort, two demo
encoders; csfm's E = 8 cells)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from raybench.analysis.features.dashboards import Choice, model_view
from raybench.analysis.features.figures import read_index, write_dashboards
from raybench.app.export_formats import FormatExportError, export_cells, threshold_codes
from raybench.core.config import FeaturesConfig
from raybench.core.paths import RunLayout
from raybench.sae.cell_files import load_cell_metrics, load_cell_sae
from raybench.sae.data import load_cell_data


@pytest.fixture(scope="module")
def trained(finished_small_run, tmp_path_factory):
    """A copy of the session's finished run (tests/small_run.py finished_config: csfm among its two demo encoders,
    E = 8 cells of seeds 4311 and 4312 at both depths), without the dashboards its analyze stage drew."""
    from tests.small_run import copy_run

    cfg = copy_run(finished_small_run[0], tmp_path_factory.mktemp("features") / "run")
    shutil.rmtree(RunLayout.at(cfg.run_dir).dashboards_dir)  # drawn again below, not copied from the old folder
    return cfg


def _only(protocol, model: str):
    """`protocol` with one model in its grid: the dashboards of that model alone."""
    return replace(protocol, grid=replace(protocol.grid, models=(model,)))


@pytest.mark.slow
def test_dashboard_data_matches_the_cells_evaluation(trained):
    cfg = trained
    root = RunLayout.at(cfg.run_dir).root
    view = model_view(root, cfg.protocol, "csfm", Choice.resolve(FeaturesConfig(), cfg.protocol))
    assert view.cell["cell_id"] == "csfm-q100-E08-primary-s4311"  # the lowest seed at the final depth
    metrics = load_cell_metrics(root / "cells" / view.cell["cell_id"])
    assert [c.latent for c in view.concepts] == metrics["selected"]
    assert np.allclose([c.r for c in view.concepts], metrics["r_test"], atol=1e-12)
    for c, cv in enumerate(view.concepts):
        top = [p for p in cv.picks if p.kind == "top"]
        assert top[0].activation == view.activations[:, c].max()

    csfm = _only(cfg.protocol, "csfm")
    written = write_dashboards(root, csfm)
    index = read_index(root)
    assert written and [m["model"] for m in index["models"]] == ["csfm"] and not index["skipped"]
    assert all((RunLayout.at(root).dashboards_dir / rel).is_file() for rel in index["records"].values())
    folder = RunLayout.at(root).dashboards_dir
    drawn = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}  # by Ray tasks
    shutil.rmtree(folder)  # nothing to copy from: every image is drawn again, here
    write_dashboards(root, csfm, parallel=False)
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == drawn


@pytest.mark.slow
def test_saelens_export_of_a_trained_cell(trained, tmp_path):
    sae_lens = pytest.importorskip("sae_lens")
    cfg = trained
    root = RunLayout.at(cfg.run_dir).root
    cell = "csfm-q100-E08-primary-s4312"
    (folder,) = export_cells(root, tmp_path / "out", (cell,), "saelens")
    meta = json.loads((folder / "cfg.json").read_text())["metadata"]["raybench"]
    card = (folder / "README.md").read_text()
    assert meta["cell_id"] == cell and "| seed | 4312 |" in card and "95% CI" in card and cfg.config_hash() in card
    conv = meta["conversion"]
    assert f"{conv['r2_threshold']:.4f} (threshold)" in card

    sae, norm = load_cell_sae(root / "cells" / cell)
    x = load_cell_data(root, "csfm", int(pd.read_parquet(RunLayout.at(root).cells_table).set_index("cell_id")
                                         .loc[cell, "layer"]), cfg.protocol.eval).acts["test"]
    loaded = sae_lens.SAE.load_from_disk(folder)
    with torch.no_grad():
        x_hat = loaded.decode(loaded.encode(torch.from_numpy(x))).double().numpy()
    with torch.no_grad():
        pre = sae.pre_activations(torch.from_numpy(norm.apply(x)).unsqueeze(0))[0].double().numpy()
    z = threshold_codes(pre, conv["threshold"])
    ref = (z @ sae.W_dec[0].detach().double().numpy().T + sae.b_dec[0].detach().double().numpy()) * norm.std
    assert np.abs(x_hat - (ref + norm.mean)).max() < 1e-3 * np.abs(x).max()  # SAELens = the threshold rule
    assert 0 < conv["jaccard"] <= 1 and abs(conv["l0_threshold"] - sae.k) < sae.k  # BatchTopK differs by design


@pytest.mark.slow
def test_safetensors_export_is_the_cells_own_layout_with_a_card(trained, tmp_path):
    root = RunLayout.at(trained.run_dir).root
    folders = export_cells(root, tmp_path / "st", ("csfm-q*-E08-primary-s4311",), "safetensors")
    assert [f.name for f in folders] == ["csfm-q000-E08-primary-s4311", "csfm-q100-E08-primary-s4311"]
    for folder in folders:
        cell = root / "cells" / folder.name
        assert sorted(p.name for p in folder.iterdir()) == ["README.md", "cfg.json", "sae.safetensors"]
        assert (folder / "sae.safetensors").read_bytes() == (cell / "sae.safetensors").read_bytes()
        assert "| expansion E = N/d | 8 |" in (folder / "README.md").read_text()
    with pytest.raises(FormatExportError, match="not an empty folder"):
        export_cells(root, tmp_path / "st", ("csfm-*",), "safetensors")
