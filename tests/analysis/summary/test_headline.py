"""The report's top, the terminal's last lines and the model cards name the encoders' weights and the cohort, and
say who leads only as far as the contrasts separate the models (raybench.analysis.summary.headline)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml

from raybench.analysis.stage import render_report
from raybench.core.atomic import write_table
from raybench.core.paths import RunLayout
from tests.fake_run import small_protocol, write_fake_run

MODELS = ("ecg_fm", "ecg_jepa", "st_mem")


def _text(html_text: str, section: str) -> str:
    start = html_text.index(f'id="{section}"')
    end = html_text.index("</section>", start)
    return " ".join(re.sub(r"<[^>]+>", " ", html_text[start:end]).split())


def _contrasts(p_top_two: float, p_rest: float = 0.001) -> pd.DataFrame:
    """ecg_fm > ecg_jepa > st_mem on every metric; ecg_fm vs ecg_jepa at p_top_two, the rest at p_rest."""
    rows = []
    for metric in ("reconstruction", "accessibility", "coverage"):
        for a, b, p in (("ecg_fm", "ecg_jepa", p_top_two), ("ecg_fm", "st_mem", p_rest),
                        ("ecg_jepa", "st_mem", p_rest)):
            rows.append({"metric": metric, "model_a": a, "model_b": b, "diff": 0.01, "ci_low": -0.01,
                         "ci_high": 0.03, "p": p, "p_bh": p})
    return pd.DataFrame(rows)


def _profiles() -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "metric": metric, "auc": auc, "ci_low": auc - .01, "ci_high": auc + .01,
                          "rank1_prob": .5, "mean_rank": i + 1, "published": float("nan")}
                         for metric in ("reconstruction", "accessibility", "coverage")
                         for i, (m, auc) in enumerate(zip(MODELS, (.9, .89, .7), strict=True))])


@pytest.fixture()
def run(tmp_path):
    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells", "profiles", "fidelity_gate_models"))
    write_table(RunLayout.at(root).tables_dir / "profiles.parquet", _profiles())
    return root


@pytest.mark.parametrize(("p", "expected"), [
    (0.48, "ECG-FM and ECG-JEPA lead; not distinguishable (BH p = 0.48 against ECG-FM)"),
    (0.003, "ECG-FM leads, separated from the runner-up ECG-JEPA (BH p = 0.003)"),
], ids=["leader_not_distinguishable", "leader_separated"])
def test_the_summary_names_leaders_only_where_contrasts_separate_them(run, p, expected):
    write_table(RunLayout.at(run).tables_dir / "contrasts.parquet", _contrasts(p))
    summary = _text(render_report(run).read_text(), "summary")
    assert f"Reconstruction: {expected}" in summary, summary
    assert "best ECG-FM" not in summary.replace("Highest AUC", "")


def test_grid_complete_is_kept_apart_from_the_model_claims(run):
    write_table(RunLayout.at(run).tables_dir / "contrasts.parquet", _contrasts(0.48))
    summary = _text(render_report(run).read_text(), "summary")
    ran, found = summary.index("What was run"), summary.index("What it found")
    assert ran < summary.index("PASS") < found < summary.index("Reconstruction:")
    assert "says nothing about how the models compare" in summary[ran:found]


def test_a_fidelity_gate_no_configuration_passes_is_flagged(run):
    layout = RunLayout.at(run)
    gm = pd.read_parquet(layout.tables_dir / "fidelity_gate_models.parquet")
    write_table(layout.tables_dir / "fidelity_gate_models.parquet", gm.assign(n_configs_pass=0))
    text = render_report(run).read_text()
    assert re.search(r"class='badge bad'>No configuration passes the fidelity gate \(0 of \d+", text)


def test_the_report_top_names_random_weights_and_a_synthetic_cohort(run):
    summary = _text(render_report(run).read_text(), "summary")
    assert summary.index("random weights (demo encoders)") < summary.index("What was run")
    assert "Cohort: synthetic" in summary[:summary.index("What was run")]


def test_checkpoints_are_named_with_their_sha256_and_a_real_cohort_by_name_and_size(tmp_path):
    from raybench.analysis.summary.headline import cohort_text, headline, weights

    root = write_fake_run(tmp_path / "run", small_protocol(), cohort_kind="ptbxl", tables=("cells", "profiles"))
    layout = RunLayout.at(root)
    raw = yaml.safe_load(layout.run_yaml.read_text())
    raw["encoders"].update(size="full", checkpoints={"ecg_fm": "/w/ecg_fm.pt"})
    layout.run_yaml.write_text(yaml.safe_dump(raw))
    store = layout.activations_dir / "ecg_fm" / "layer_11"
    store.mkdir(parents=True)
    (store / "index.json").write_text(json.dumps({"size": "full", "checkpoint": "/w/ecg_fm.pt",
                                                  "checkpoint_sha256": "ab" * 32}))
    layout.manifest_dir.mkdir()
    layout.manifest_summary.write_text(json.dumps({"records": 21799}))
    got = weights(layout, raw)
    assert got == {"ecg_fm": f"ecg_fm.pt (sha256 {'ab' * 32})", "ecg_jepa": "random weights (no checkpoint)",
                   "st_mem": "random weights (no checkpoint)"}
    assert cohort_text(layout, raw) == "Cohort: PTB-XL (ptbxl), 21,799 records."
    lines = headline(root)
    assert lines[0].startswith("Encoder weights: ECG-FM: ecg_fm.pt (sha256 abababababab…)") and "PTB-XL" in lines[1]
    assert f"sha256 {'ab' * 32}" in _text(render_report(root).read_text(), "summary")


def test_model_cards_open_with_the_weights_and_the_cohort():
    from raybench.app.export_formats import model_card

    row = {"cell_id": "c", "model": "ecg_fm", "layer": 3, "n_layers": 12, "q": 0.25, "expansion": 4,
           "n_latents": 256, "k": 8, "seed": 1, "arm": "primary", "config_hash": "h"}
    card = model_card(row, {"d": 64}, {"cohort": {"kind": "synth"}}, {}, None, "safetensors", {},
                      "random weights (demo encoders)", "Cohort: synthetic (raybench's generator).")
    assert card.splitlines()[2] == ("**Encoder weights: random weights (demo encoders).** "
                                    "**Cohort: synthetic (raybench's generator).**")
