"""Parity of the MIMIC-IV-ECG record order, the MIMIC intervention design and the random-rotation seeds with the
published protocol code (issue 42 items 1-3).

mimic_fixtures.json / mimic_inputs.npz are written by make_fixtures_mimic.py running the published scripts on a
simulated MIMIC layout (see README.md). Each test also shows that the rule raybench had before gives other
numbers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.estimators import feature_concept_corr, rank_features
from raybench.analysis.secondary.intervention import candidate_subsets, rotation_seeds
from raybench.analysis.secondary.intervention_design import candidate_pool, masked_corr, pool_subsets, quality_pass
from raybench.analysis.secondary.matched_effect import (
    RECORD_METRICS,
    centroid_intervention,
    common_effect,
    record_metrics,
)
from raybench.cohorts.manifest import RECORD_ORDER
from raybench.cohorts.mimic_pool import published_order
from raybench.cohorts.split import mimic_split
from raybench.core.config import paper_protocol
from raybench.core.models import PUBLISHED_NAMES
from raybench.sae.data import complete_case_selection_ecg_ids, selection_ecg_ids

HERE = Path(__file__).resolve().parent
FIX = json.loads((HERE / "mimic_fixtures.json").read_text())
with np.load(HERE / "mimic_inputs.npz", allow_pickle=False) as _z:
    IN = {k: _z[k] for k in _z.files}
PAPER = paper_protocol()
LIMIT = FIX["order"]["limit"]
SPLITS = np.array(["train", "val", "test"])
CONCEPTS = ("heart_rate_bpm", "qrs_duration_ms", "pr_interval_ms", "qt_like_ms", "r_amp_global_mv",
            "st_amp_global_mv", "t_amp_global_mv")


def pool_manifest(with_order: bool = True) -> pd.DataFrame:
    """The published pool as raybench's manifest holds it: ascending ecg_id, raw concepts, record_order."""
    ids = np.sort(IN["records_ecg_id"])
    at = {int(s): i for i, s in enumerate(IN["study_id"])}
    rows = np.array([at[int(s)] for s in ids])
    subject = IN["subject_id"][rows]
    raw = np.where(IN["missing"][rows] | ~IN["status_ok"][rows][:, None], np.nan, IN["values"][rows])
    raw[:, 0] = 60000.0 / raw[:, 0]  # heart rate from RR (the MIMIC rate concept)
    df = pd.DataFrame({"ecg_id": ids, "patient_id": subject.astype(str),
                       "split": [mimic_split(int(s)) for s in subject],
                       **{f"raw_{c}": raw[:, j] for j, c in enumerate(CONCEPTS)}})
    if with_order:
        df[RECORD_ORDER] = published_order(ids)
    return df


def test_split_and_record_order_are_the_published_records_csv():
    df = pool_manifest()
    published = IN["records_ecg_id"]
    np.testing.assert_array_equal(df.sort_values(RECORD_ORDER)["ecg_id"].to_numpy(), published)
    by_id = dict(zip(df["ecg_id"], df["split"], strict=True))
    assert [by_id[int(e)] for e in published] == list(SPLITS[IN["records_split"]])
    assert not np.array_equal(np.sort(published), published)  # the published order is not ascending study_id


def test_atlas_selection_draws_over_the_published_order():
    eval_cfg = replace(PAPER.eval, selection_records=LIMIT)
    want = IN["atlas_selection_ecg_id"]
    np.testing.assert_array_equal(selection_ecg_ids(pool_manifest(), eval_cfg), want)
    old = selection_ecg_ids(pool_manifest(with_order=False), eval_cfg)  # before: ascending ecg_id
    assert np.isin(old, want).sum() < LIMIT // 2


def test_complete_case_selection_draws_over_the_published_order():
    eval_cfg = replace(PAPER.eval, selection_records=LIMIT)
    want = IN["complete_case_selection_ecg_id"]
    np.testing.assert_array_equal(complete_case_selection_ecg_ids(pool_manifest(), CONCEPTS, eval_cfg), want)
    old = complete_case_selection_ecg_ids(pool_manifest(with_order=False), CONCEPTS, eval_cfg)
    assert np.isin(old, want).sum() < LIMIT // 2


def test_rotation_seeds_are_the_final_layer_group_index():
    rot = FIX["rotation"]
    n_layers = {"cardiac_fm": 12, "csfm": 6, "ecg_fm": 12, "ecg_jepa": 12, "hubert_ecg": 12, "st_mem": 12}
    got = rotation_seeds(20260720, n_layers, PAPER.grid.depths)
    assert rot["random_seed_base"] == 20260720 and rot["groups_at_e8"] == 30
    assert {PUBLISHED_NAMES[m]: s for m, s in got.items()} == rot["rotation_seeds"]
    grid_order = list(PAPER.grid.models)  # the grid's own order must not matter
    assert rotation_seeds(20260720, {m: n_layers[m] for m in reversed(grid_order)}, PAPER.grid.depths) == got
    old = {m: 20260720 + i for i, m in enumerate(sorted(n_layers))}  # before: 20260720 + i
    assert all(old[m] != got[m] for m in n_layers)


# ---------------------------------------------------------------- item 2: the MIMIC intervention design

def test_mimic_design_settings_are_the_published_workers():
    meta = FIX["intervention"]
    design = SecondaryConfig().intervention_design("mimic")
    assert design.subset_seed == meta["seed_base"] == 976000
    assert design.intervention_ks == (meta["k"],) and design.intervention_methods == tuple(meta["methods"])
    assert design.intervention_arms == ("matched",) and design.candidate_subsets == meta["budget_replicates"]
    assert design.min_validation_r2 == meta["min_validation_r2"]
    assert (design.min_live_latents or 768) == meta["min_validation_live_features"]
    assert tuple(meta["metrics"]) == RECORD_METRICS
    assert SecondaryConfig().intervention_design("ptbxl") == SecondaryConfig()  # PTB-XL keeps its design


def test_candidate_subsets_and_pools_match_the_published_draws():
    z = sp.csc_matrix(IN["iv_z_train"])
    n, budget, reps = z.shape[1], IN["iv_subsets_all"].shape[1], len(IN["iv_subsets_all"])
    pool = candidate_pool(z, "train_live")
    np.testing.assert_array_equal(pool, IN["iv_pool"])
    np.testing.assert_array_equal(candidate_pool(z, "all"), np.arange(n))
    got_all = pool_subsets(np.arange(n), n, budget, reps, 976000)
    np.testing.assert_array_equal(np.stack(got_all), IN["iv_subsets_all"])
    np.testing.assert_array_equal(np.stack(pool_subsets(pool, n, budget, reps, 976000)), IN["iv_subsets_live"])
    old = candidate_subsets(n, budget, reps, 960000)  # before: the PTB-XL seed base on MIMIC
    assert not any(np.array_equal(a, b) for a, b in zip(old, got_all, strict=True))


def test_masked_correlations_and_rankings_match_the_published_worker():
    y = IN["iv_y_train"].astype(np.float64)
    dense = masked_corr(IN["iv_x_train"], y)
    sae = masked_corr(sp.csc_matrix(IN["iv_z_train"]), y)
    np.testing.assert_allclose(dense, IN["iv_dense_corr"], rtol=0, atol=1e-6)  # published: float32
    np.testing.assert_allclose(sae, IN["iv_sae_corr"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rank_features(dense), IN["iv_dense_ranking"])
    for r, cand in enumerate(IN["iv_subsets_all"]):
        np.testing.assert_array_equal(rank_features(sae, cand), IN[f"iv_sae_ranking_{r}"])
    old = feature_concept_corr(IN["iv_x_train"], np.nan_to_num(y))  # before: missing values at 0
    assert np.max(np.abs(old - IN["iv_dense_corr"])) > 0.01


def test_designs_and_record_metrics_match_the_published_worker():
    y = IN["iv_y_train"].astype(np.float64)
    fams = ["rate_rhythm", "interval", "interval", "interval", "amplitude", "st_t", "st_t"]  # CONCEPT_SPECS
    x = {s: IN[f"iv_x_{s}"] for s in ("train", "val", "test")}
    z = {s: IN[f"iv_z_{s}"] for s in ("train", "val", "test")}
    k, eye = FIX["intervention"]["k"], np.eye(x["train"].shape[1])
    dense_rank = rank_features(masked_corr(x["train"], y))
    sae_corr = masked_corr(z["train"], y)
    want, status, i = IN["iv_record_metrics"], FIX["intervention"]["design_status"], 0
    n_eligible = 0
    for r, cand in enumerate(IN["iv_subsets_all"]):
        sae_rank = rank_features(sae_corr, cand)
        for t in range(y.shape[1]):
            units = {"dense": centroid_intervention(x["train"][:, dense_rank[:k, t]], y[:, t],
                                                    x["val"][:, dense_rank[:k, t]], x["test"][:, dense_rank[:k, t]],
                                                    eye[dense_rank[:k, t]], IN["iv_coef"], dense_rank[:k, t]),
                     "sae": centroid_intervention(z["train"][:, sae_rank[:k, t]], y[:, t],
                                                  z["val"][:, sae_rank[:k, t]], z["test"][:, sae_rank[:k, t]],
                                                  IN["iv_basis"][sae_rank[:k, t]], IN["iv_coef"], sae_rank[:k, t])}
            common, st = common_effect({m: u.val_effect(t) for m, u in units.items()})
            for m in ("dense", "sae"):
                _, _, m_name, pub_status, pub_common, pub_effect = status[i].split(":")
                assert m_name == m and pub_status == st, (r, t, m)
                assert units[m].val_effect(t) == pytest.approx(float(pub_effect), rel=1e-5, abs=1e-7)
                if st == "eligible":
                    assert common == pytest.approx(float(pub_common), rel=1e-5)
                    got = record_metrics(units[m], t, fams, common / units[m].val_effect(t))
                    np.testing.assert_allclose(got, want[i], rtol=2e-5, atol=2e-7)
                    n_eligible += 1
                else:
                    assert np.isnan(want[i]).all()
                i += 1
    assert i == len(status) and n_eligible >= 8


def test_quality_gate_is_the_published_matched_live_capacity():
    ex = FIX["intervention"]["quality_example"]
    metrics = {"val_r2": 0.93, "val_dead_fraction": 0.85, "gate_pass": False}  # the generator's example
    assert quality_pass(metrics, 6144, "matched_live_capacity", 0.9, 768) is ex["pass"] is True
    assert ex["validation_live_features"] == round(6144 * 0.15)
    assert quality_pass(metrics, 6144, "matched_live_capacity", 0.9, 923) is False
    assert quality_pass(metrics, 6144, "training_metrics", 0.9, 768) is False  # the cell's own gate
