"""SAEs exported for other tools: the exact normalization fold, the BatchTopK-to-threshold conversion, SAELens
loading it, the model card's bootstrap CIs, and the command's options."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from fake_run import small_protocol, write_fake_run

from raybench.app.cli import main
from raybench.app.export_formats import (
    CELL_ID,
    FormatExportError,
    batchtopk_threshold,
    cell_cis,
    export_cells,
    fold_normalization,
    measure_conversion,
    per_record_topk,
    select_cells,
    threshold_codes,
    write_saelens,
)
from raybench.core.atomic import write_json, write_table
from raybench.core.paths import RunLayout
from raybench.core.sufficient_stats import paired_corr
from raybench.sae.cells import build_cells
from raybench.sae.model import Normalizer, StackedBatchTopKSAE


def random_sae(d=16, n=64, k=4, seed=3):
    sae = StackedBatchTopKSAE.from_seeds([seed], d, n, k)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(1, n, generator=g) * 0.1)
        sae.b_dec.copy_(torch.randn(1, d, generator=g) * 0.1)
    rng = np.random.default_rng(seed)
    norm = Normalizer(rng.normal(size=d).astype(np.float32) * 3, (0.5 + rng.random(d)).astype(np.float32))
    return sae, norm


def reference(sae, norm, x, threshold):
    """raybench's own arithmetic with the threshold rule: normalize, pre-activations, JumpReLU, decode, undo."""
    with torch.no_grad():
        pre = sae.pre_activations(torch.from_numpy(norm.apply(x)).unsqueeze(0))[0].double().numpy()
    z = threshold_codes(pre, threshold)
    x_hat = (z @ sae.W_dec[0].detach().double().numpy().T + sae.b_dec[0].detach().double().numpy()) * norm.std
    return z, x_hat + norm.mean


def test_fold_is_exact_in_float64():
    sae, norm = random_sae()
    w = fold_normalization(sae.W_enc[0].detach().numpy(), sae.b_enc[0].detach().numpy(),
                           sae.W_dec[0].detach().numpy(), sae.b_dec[0].detach().numpy(), norm.mean, norm.std)
    assert all(v.flags["C_CONTIGUOUS"] and v.dtype == np.float32 for v in w.values())
    x = np.random.default_rng(0).normal(size=(9, 16)) * 2
    pre_folded = np.maximum((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0)
    z, x_hat = reference(sae, norm, x.astype(np.float32), 0.0)
    assert np.abs(pre_folded - z).max() < 1e-4
    assert np.abs(z @ w["W_dec"] + w["b_dec"] - x_hat).max() < 1e-4


def test_threshold_is_the_mean_smallest_kept_entry_and_topk_is_per_record():
    pre = [np.array([[0.0, 3.0, 1.0], [2.0, 0.5, 0.0]]), np.array([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]])]
    # batch 1 keeps the 2*1 largest: 3, 2 -> min 2; batch 2 keeps 4 (and a 0, not a kept activation) -> 4
    assert batchtopk_threshold(pre, 1) == 3.0
    with pytest.raises(FormatExportError, match="dead"):
        batchtopk_threshold([np.zeros((2, 3))], 1)
    p = np.array([[0.5, 3.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    assert per_record_topk(p, 2).tolist() == [[0.0, 3.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]]
    assert threshold_codes(p, 1.0).tolist() == [[0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]]


def test_conversion_on_the_batch_it_was_fitted_on_drops_only_the_boundary_entry():
    sae, norm = random_sae()
    x = np.random.default_rng(1).normal(size=(32, 16)).astype(np.float32) * norm.std + norm.mean
    from raybench.app.export_formats import _pre

    theta = batchtopk_threshold(_pre(sae, norm, x, 32), sae.k)
    c = measure_conversion(sae, norm, theta, x, 32)
    assert c.l0_batchtopk == sae.k and c.l0_threshold * 32 == 32 * sae.k - 1  # pre > theta drops the min itself
    assert 0.9 < c.jaccard < 1.0 and c.n_records == 32 and -1 < c.r2_topk <= 1


def test_saelens_loads_the_export_and_reconstructs_as_the_threshold_rule(tmp_path):
    sae_lens = pytest.importorskip("sae_lens")
    sae, norm = random_sae(d=24, n=96, k=6)
    rng = np.random.default_rng(2)
    train = (rng.normal(size=(256, 24)) * norm.std + norm.mean).astype(np.float32)
    held_out = (rng.normal(size=(64, 24)) * norm.std + norm.mean).astype(np.float32)
    from raybench.app.export_formats import _pre

    theta = batchtopk_threshold(_pre(sae, norm, train, 64), sae.k)
    write_saelens(tmp_path, sae, norm, theta, {"model_name": "demo", "hook_name": "layer_03"})
    loaded = sae_lens.SAE.load_from_disk(tmp_path)
    assert type(loaded).__name__ == "JumpReLUSAE" and json.loads((tmp_path / "cfg.json").read_text())[
        "normalize_activations"] == "none"
    with torch.no_grad():
        z = loaded.encode(torch.from_numpy(held_out)).double().numpy()
        x_hat = loaded.decode(torch.from_numpy(z).float()).double().numpy()
    z_ref, x_ref = reference(sae, norm, held_out, theta)
    assert ((z > 0) == (z_ref > 0)).all()
    assert np.abs(z - z_ref).max() < 1e-4 and np.abs(x_hat - x_ref).max() < 1e-4


def test_cell_cis_point_is_the_plain_metric_and_inside_its_interval(tmp_path):
    rng = np.random.default_rng(5)
    p, c = 30, 3
    a = rng.normal(size=(p, c))
    y = a * 0.5 + rng.normal(size=(p, c))
    corr = np.stack([a, y, a * a, y * y, a * y], axis=-1)  # one record per patient
    sse, sst = rng.random(p), 1 + rng.random(p)
    np.savez(tmp_path / "s.npz", n=np.ones(p), sse=sse, sst=sst, corr=corr)
    cis = cell_cis(tmp_path / "s.npz", 400, 7, 100, threshold=0.2)
    r = np.abs(paired_corr(a, y))
    assert cis["test_r2"][0] == pytest.approx(1 - sse.sum() / sst.sum())
    assert cis["test_accessibility"][0] == pytest.approx(r.mean())
    assert cis["test_coverage"][0] == pytest.approx((r >= 0.2).mean())
    for point, lo, hi in cis.values():
        assert lo <= point + 1e-12 and point - 1e-12 <= hi and lo < hi


def test_select_cells_and_command_options(tmp_path):
    cells = pd.DataFrame({"cell_id": ["a-q100-E08-primary-s1", "a-q100-E08-primary-s2", "b-q000-E01-primary-s1"],
                          "status": ["ok", "failed", "ok"]})
    assert select_cells(cells, ("a-q100-E08-*",)) == ["a-q100-E08-primary-s1"]
    assert select_cells(cells, ("b-q000-E01-primary-s1", "a-*")) == ["a-q100-E08-primary-s1",
                                                                     "b-q000-E01-primary-s1"]
    with pytest.raises(FormatExportError, match="matches no ok cell"):
        select_cells(cells, ("c-*",))
    res = CliRunner().invoke(main, ["export", "--run-dir", str(tmp_path), "--to", str(tmp_path / "o"),
                                    "--format", "saelens"])
    assert res.exit_code == 2 and "needs --cells" in res.output
    res = CliRunner().invoke(main, ["export", "--run-dir", str(tmp_path), "--to", str(tmp_path / "o"),
                                    "--cells", "a-*"])
    assert res.exit_code == 2 and "--format saelens|safetensors only" in res.output


def _write_cell(folder: Path, d: int = 4, n: int = 8, k: int = 2) -> None:
    """The cell files the safetensors export reads (weights, cfg.json, metrics.json, patient_stats.npz)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"W_enc": rng.normal(size=(n, d)).astype(np.float32), "b_enc": np.zeros(n, np.float32),
               "W_dec": rng.normal(size=(d, n)).astype(np.float32), "b_dec": np.zeros(d, np.float32),
               "norm_mean": np.zeros(d, np.float32), "norm_std": np.ones(d, np.float32)},
              str(folder / "sae.safetensors"))
    write_json(folder / "cfg.json", {"d": d, "n_latents": n, "k": k})
    write_json(folder / "metrics.json", {"val_r2": 0.9})
    p = 6
    np.savez(folder / "patient_stats.npz", n=np.ones(p), sse=rng.random(p), sst=1 + rng.random(p),
             corr=rng.normal(size=(p, 2, 5)))


def test_cell_ids_match_what_the_grid_writes():
    from raybench.core.config import ModelDims

    cells = build_cells(small_protocol(), {m: ModelDims(d=16, n_layers=12) for m in small_protocol().grid.models})
    assert cells and all(CELL_ID.fullmatch(c.cell_id) for c in cells)
    for bad in ("../x-q100-E08-primary-s1", "a/b-q100-E08-primary-s1", ".-q100-E08-primary-s1", "x", "",
                "/abs-q100-E08-primary-s1", "ecg_fm-q100-E08-primary-s1/../.."):
        assert not CELL_ID.fullmatch(bad), bad


@pytest.mark.parametrize("field", ["cell_id", "cell_dir"])
def test_cells_table_cannot_steer_the_export_outside_its_folders(tmp_path, field):
    """A cells.parquet edited to name `../` paths: refused, naming the cell, and nothing is written or read
    outside --to and the run's cells/ folder."""
    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))
    layout = RunLayout.at(root)
    cells = pd.read_parquet(layout.cells_table)
    first = cells.index[cells.status == "ok"][0]
    good = cells.loc[first, "cell_id"]
    _write_cell(root / cells.loc[first, "cell_dir"])
    (folder,) = export_cells(root, tmp_path / "a" / "ok", (good,), "safetensors")
    assert folder == tmp_path / "a" / "ok" / good and (folder / "sae.safetensors").is_file()

    if field == "cell_id":
        bad = cells.loc[first, "cell_id"] = "../../escaped-q100-E08-primary-s1"
        pattern = bad
    else:
        _write_cell(tmp_path / "elsewhere")  # a cell folder outside the run
        bad = cells.loc[first, "cell_dir"] = "cells/../../elsewhere"
        pattern = good
    write_table(layout.cells_table, cells)
    with pytest.raises(FormatExportError, match=r"cells\.parquet: .*" + re.escape(repr(bad))):
        export_cells(root, tmp_path / "a" / "b" / "to", (pattern,), "safetensors")
    assert not list(tmp_path.rglob("escaped*")) and not (tmp_path / "a" / "b" / "to").exists()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b", "ok"]
    assert not list((tmp_path / "a" / "b").iterdir())
