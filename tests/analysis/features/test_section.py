"""The report's "Feature dashboards" section (raybench.analysis.features.section) escapes every value it takes from
figures/dashboards/index.json and run.yaml: a run folder can come from someone else, and report.html is opened
in a browser."""

from __future__ import annotations

import html
import json

from raybench.analysis.api import Context
from raybench.analysis.features.figures import INDEX
from raybench.analysis.features.section import features_body
from raybench.core.paths import RunLayout

EVIL = "<img src=x onerror=alert(1)>"


def _index() -> dict:
    pick = {"kind": "top", "ecg_id": EVIL, "image": "r.png", "activation": 1.0, "value": 2.0}
    unexplained = {"latent": EVIL, "firing_rate": 0.1, "best_concept": "qt", "best_r": 0.1, "ecg_id": EVIL,
                   "activation": 1.0, "image": "u.png"}
    concept = {"concept": "qt", "latent": EVIL, "r": 0.5, "firing_rate": 0.2, "panel": "p.png", "picks": [pick]}
    model = {"model": "m", "label": "M", "cell": {"cell_id": "m-q100-E08-primary-s1"}, "n_test": EVIL,
             "concepts": [concept], "unexplained": [unexplained]}
    return {"models": [model], "choice": {"expansion": EVIL, "depth": EVIL, "seed": EVIL}, "skipped": {}}


def test_values_from_the_index_and_run_yaml_are_escaped(tmp_path):
    layout = RunLayout.at(tmp_path)
    layout.dashboards_dir.mkdir(parents=True)
    (layout.dashboards_dir / INDEX).write_text(json.dumps(_index()))
    run = {"cohort": {"kind": "ptbxl"}, "protocol": {"eval": {"coverage_threshold": EVIL}}}
    body = features_body(Context(layout=layout, tables={}, figures={}, run=run, audit=None))
    assert EVIL not in body and body.count("<img ") == 3  # the panel, the pick's and the unexplained latent's images
    # every place a value lands: pick (alt, caption), latent, n_test, unexplained latent (table, caption), its record
    # (table, alt, caption), the chosen cell (E, depth, seed) and run.yaml's coverage threshold
    assert body.count(html.escape(EVIL)) == 13


def test_dashboards_name_weights_and_cohort_and_flag_a_weak_latent(tmp_path):
    layout = RunLayout.at(tmp_path)
    layout.dashboards_dir.mkdir(parents=True)
    index = _index()
    weak = {**index["models"][0]["concepts"][0], "concept": "st_slope", "r": -0.09}
    index["models"][0]["concepts"].append(weak)
    (layout.dashboards_dir / INDEX).write_text(json.dumps(index))
    run = {"cohort": {"kind": "synth", "records": 1500, "patients": 500}, "encoders": {"size": "demo"},
           "protocol": {"grid": {"models": ["m"]}, "eval": {"coverage_threshold": 0.2}}}
    body = features_body(Context(layout=layout, tables={}, figures={}, run=run, audit=None))
    top = body[:body.index("<p class='intro'>")]
    assert "random weights (demo encoders)" in top and "Cohort: synthetic" in top
    assert body.count("Weak: |r| = 0.09 is below the coverage threshold 0.20") == 1  # st_slope only, not qt (0.5)
