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

from raybench.analysis.secondary.intervention import rotation_seeds
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
