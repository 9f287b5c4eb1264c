"""The secondary analyses end to end on a tiny real run folder, and the ladder's order on planted data."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.api import RenderInputs
from raybench.analysis.inference.stats import benjamini_hochberg
from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.figures import draw_secondary_figures
from raybench.core.config import GridProtocol, SAEProtocol, demo_run
from raybench.core.paths import RunLayout

MODELS = ("ecg_fm", "ecg_jepa")
SCFG = SecondaryConfig(random_dictionaries=5, bootstrap_draws=200, candidate_subsets=3,
                       harmonization_train_records=48, harmonization_batch=32)


def _config(root: Path):
    cfg = demo_run(str(root))
    grid = GridProtocol(models=MODELS, depths=(0.5, 1.0), expansions=(8,), seeds=(4311, 4312),
                        sensitivity_depth=None)
    sae = SAEProtocol(steps=60, batch_size=32, aux_k=32, checkpoint_every=1000)
    return dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, grid=grid, sae=sae))


def _build_run(root: Path):
    """Synthetic cohort -> manifest -> 2 demo encoders -> E = 8 cells (few steps) -> cells table."""
    import torch

    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.core.atomic import write_table
    from raybench.encoders.base import EncoderSpec
    from raybench.encoders.extract import extract_models
    from raybench.encoders.store import ActivationStore
    from raybench.sae.cell_files import save_cell
    from raybench.sae.cells import build_cells, group_stacks
    from raybench.sae.cells_table import collect_cells_table
    from raybench.sae.data import load_cell_data
    from raybench.sae.evaluate import evaluate_cell
    from raybench.sae.freshness import expected_provenance
    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack

    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the machine is shared
    cfg = _config(root)
    layout = RunLayout.at(root)
    cohort = generate_synth_cohort(layout.cohort_dir, 150, 60, 11)
    build_synth_manifest(cohort, layout.manifest_dir, num_cpus=1)
    # one encoder actor for both models (the demo config's two cost a second torch process; the stores are the
    # same bytes: tests/encoders/test_extract.py)
    encoders = dataclasses.replace(cfg.encoders, min_actors=1, max_actors=1)
    extract_models(layout.manifest, root, [EncoderSpec(name=m, size="demo") for m in MODELS], encoders,
                   depths=cfg.protocol.grid.depths, progress=False, cpu_threads=1)
    protocol = cfg.protocol
    cells = build_cells(protocol, ActivationStore.for_run(root).model_dims(MODELS))
    stamps = expected_provenance(root, cfg.config_hash(), cells)  # what the grid records in each cell
    for stack in group_stacks(cells).values():
        c0 = stack[0]
        data = load_cell_data(root, c0.model, c0.layer, protocol.eval)
        cfgs = [SAECellConfig.from_protocol(protocol.sae, c.d, c.n_latents, c.k, c.seed) for c in stack]
        res = train_stack(data.acts["train"], cfgs)
        for i, c in enumerate(stack):
            ev = evaluate_cell(res.sae, res.normalizer, data.acts, data.concepts, data.test_patient_codes,
                               data.selection_idx, protocol.eval, index=i, n_patients=len(data.test_patients))
            save_cell(layout.cell_dir(c.cell_id), res.sae.single(i), {**asdict(cfgs[i]), **c.to_dict()}, ev,
                      stamps[c.cell_id], normalizer=res.normalizer)
    write_table(layout.cells_table, collect_cells_table(cfg, cells, {}))
    return cfg


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ray_cluster):
    from raybench.analysis.secondary.run import run_secondary

    root = tmp_path_factory.mktemp("secondary_run")
    cfg = _build_run(root)
    tables = run_secondary(root, cfg.protocol, cfg, SCFG, strict=True)
    draw_secondary_figures(RenderInputs(root, cfg.protocol))  # what the analyze stage's render step draws
    return root, cfg, tables


@pytest.mark.slow
def test_three_analyses_write_tables_and_figures(tiny_run):
    root, cfg, tables = tiny_run
    layout = RunLayout.at(root)
    for name in ("calibration", "calibration_depth", "calibration_paired", "calibration_margin", "calibration_order",
                 "calibration_ranges", "calibration_concepts", "harmonization", "harmonization_contrasts",
                 "harmonization_rank", "harmonization_concepts", "intervention", "intervention_contrasts",
                 "intervention_concepts", "intervention_designs"):
        assert name in tables, name
        assert (layout.tables_dir / f"{name}.parquet").exists() and (layout.tables_dir / f"{name}.csv").exists()
        pd.testing.assert_frame_equal(pd.read_parquet(layout.tables_dir / f"{name}.parquet"), tables[name])
    for stem in ("calibration_ladder", "harmonization_final_layer", "intervention_selectivity"):
        for ext in ("png", "svg"):
            assert (layout.figures_dir / f"{stem}.{ext}").stat().st_size > 1000

    cal = tables["calibration"]
    assert set(cal["model"]) == set(MODELS)
    assert set(cal["method"]) == {"dense_ridge", "sae_ridge", "sae_top16", "sae_top4", "dense_single", "sae_single",
                                  "random_single"}
    # the summary is the mean over depths and concepts of the unit (seed / dictionary) mean of each concept's |r|
    per = tables["calibration_concepts"].assign(
        covered=lambda d: (d.test_abs_r >= cfg.protocol.eval.coverage_threshold).astype(float))
    unit_mean = per.groupby(["model", "q", "method", "concept"])[["test_abs_r", "covered"]].mean()
    want = unit_mean.groupby(["model", "method"]).mean()
    got = cal.set_index(["model", "method"]).loc[want.index]
    np.testing.assert_allclose(got.accessibility, want.test_abs_r, rtol=1e-12)
    np.testing.assert_allclose(got.coverage, want.covered, rtol=1e-12)
    assert (cal.loc[cal["method"] == "random_single", "n_units"] == SCFG.random_dictionaries).all()
    assert (cal.loc[cal["method"] == "sae_single", "n_units"] == 2).all()
    concepts = tables["calibration_concepts"]
    assert len(concepts) == 2 * 2 * (2 + 2 * 4 + SCFG.random_dictionaries) * concepts["concept"].nunique()

    # the ranges over models the paper quotes (issue 42 item 5), from the per-model margins
    ranges, margin = tables["calibration_ranges"].set_index("quantity"), tables["calibration_margin"]
    assert list(tables["calibration_ranges"].columns) == ["quantity", "low", "high", "n_models"]
    assert ranges.at["sae_ridge_retention", "low"] == margin["sae_ridge_retention"].min()
    assert ranges.at["sae_minus_random_by_depth", "high"] == margin["max_depth_margin"].max()
    assert ranges.at["sae_single_win_rate", "low"] == margin["win_rate"].min()
    assert (ranges["n_models"] == len(MODELS)).all()

    harm = tables["harmonization"]
    assert set(harm["protocol"]) == {"native", "lead", "temporal", "joint"}
    # the published model-level outputs: median |r| and sign consistency of the single coordinates (item 5)
    hc = tables["harmonization_concepts"]
    by = hc.groupby(["model", "protocol"])
    want_median = by["test_abs_r"].median()
    want_sign = by.apply(lambda g: float(np.mean(g["train_r"] * g["test_r"] > 0)), include_groups=False)
    got = harm.set_index(["model", "protocol"])
    np.testing.assert_allclose(got["median_abs_r"], want_median.loc[got.index], rtol=1e-12)
    np.testing.assert_array_equal(got["sign_consistency"], want_sign.loc[got.index])
    assert ((harm["sign_consistency"] >= 0) & (harm["sign_consistency"] <= 1)).all()
    native = harm[harm["protocol"] == "native"]
    assert np.allclose(native["cka_to_native"], 1.0)
    # ECG-FM keeps 5 s of the 10-s record natively: the temporal protocols give it another input
    moved = harm[(harm["model"] == "ecg_fm") & harm["protocol"].isin(["temporal", "joint"])]
    assert len(moved) == 2 and (moved["cka_to_native"] < 1 - 1e-6).all(), moved
    con = tables["harmonization_contrasts"]
    assert len(con) == 2 * 3 * 2
    for _, g in con.groupby("metric"):  # BH within each metric, across models and protocols
        np.testing.assert_allclose(g["q_value_bh"], benjamini_hochberg(g["p_value"].to_numpy()))
    assert set(tables["harmonization_rank"]["protocol"]) == {"lead", "temporal", "joint"}
    # ECG-JEPA reads only I, II, V1-V6: rebuilding the other limb leads cannot change its input
    jepa = harm[harm["model"] == "ecg_jepa"].set_index("protocol")
    assert jepa.at["lead", "cka_to_native"] == pytest.approx(1.0, abs=1e-6)

    inter = tables["intervention"]  # the published design: 4 methods x 2 candidate arms x k in (1, 5)
    assert set(inter["method"]) == set(SCFG.intervention_methods) == {"dense", "pca", "sae", "random_rotation"}
    ok_rows = inter.dropna(subset=["off_all_rms"])  # off_max_abs (item 5): at least the off-target RMS
    assert len(ok_rows) and (ok_rows["off_max_abs"] >= ok_rows["off_all_rms"] - 1e-12).all()
    assert "off_max_abs" in tables["intervention_concepts"].columns
    assert (inter["concepts_total"] == len(cfg_concepts(root))).all()
    assert set(zip(inter["arm"], inter["k"], strict=True)) == {(a, k) for a in ("matched", "full") for k in (1, 5)}
    keys = ["model", "arm", "k", "method"]
    eligible = tables["intervention_concepts"].groupby(keys).primary_eligible.sum()
    assert inter.set_index(keys).concepts_eligible.to_dict() == eligible.to_dict()
    icon = tables["intervention_contrasts"]
    assert len(icon) == len(MODELS) * 2 * 2 * 3 * 4  # models x arms x k x comparisons x metrics
    assert set(icon["comparison"]) == {"sae_minus_dense", "sae_minus_pca", "sae_minus_random_rotation"}
    for _, g in icon.groupby("metric"):  # one BH family per metric over every model x arm x k x comparison
        np.testing.assert_allclose(g["q_value_bh"], benjamini_hochberg(g["p_value"].to_numpy()))
    designs = tables["intervention_designs"]
    assert len(designs) == len(MODELS) * 2 * (SCFG.candidate_subsets + 1) * 2 * len(cfg_concepts(root))
    assert set(designs["status"]) <= {"eligible", "below_effect_floor", "nonpositive_validation_effect"}
    ok = designs[designs["status"] == "eligible"]
    # the common effect is the capped smallest dense / PCA / SAE full-clamp effect, and each dose reaches exactly it
    capped = np.minimum(SCFG.effect_cap, ok[["dense_unit_effect", "pca_unit_effect", "sae_unit_effect"]].min(axis=1))
    np.testing.assert_allclose(ok["common_effect"], capped, rtol=1e-12)
    for method in ("dense", "pca", "sae"):
        np.testing.assert_allclose(ok[f"{method}_dose"] * ok[f"{method}_unit_effect"], ok["common_effect"], rtol=1e-9)
    rot = ok.dropna(subset=["random_rotation_dose"])  # the rotation joins only where a dose <= 1 reaches it
    assert (rot["random_rotation_dose"] <= SCFG.max_dose + 1e-10).all()
    np.testing.assert_allclose(rot["random_rotation_dose"] * rot["random_rotation_unit_effect"], rot["common_effect"],
                               rtol=1e-9)


def cfg_concepts(root: Path) -> tuple[str, ...]:
    from raybench.cohorts.manifest import load_manifest

    return load_manifest(RunLayout.at(root).manifest)[1].concepts


@pytest.mark.slow
def test_rerun_is_byte_identical_and_uses_the_cache(tiny_run):
    from raybench.analysis.secondary.run import run_secondary

    root, cfg, _ = tiny_run
    layout = RunLayout.at(root)
    before = {p.name: p.read_bytes() for p in sorted(layout.figures_dir.glob("*")) if p.name.startswith(
        ("calibration", "harmonization", "intervention"))}
    tables_before = {p.name: p.read_bytes() for p in sorted(layout.tables_dir.glob("*.csv"))}
    cache = sorted((layout.root / "secondary" / "harmonization").glob("*.npz"))
    assert [p.stem for p in cache] == sorted(MODELS)
    stamps = [p.stat().st_mtime_ns for p in cache]
    run_secondary(root, cfg.protocol, cfg, SCFG, strict=True)
    draw_secondary_figures(RenderInputs(root, cfg.protocol))
    after = {p.name: p.read_bytes() for p in sorted(layout.figures_dir.glob("*")) if p.name in before}
    assert after == before
    assert {p.name: p.read_bytes() for p in sorted(layout.tables_dir.glob("*.csv"))} == tables_before
    assert [p.stat().st_mtime_ns for p in cache] == stamps


@pytest.mark.slow
def test_demo_intervention_design_is_sae_against_dense(tiny_run):
    """SecondaryConfig.demo()'s design (raybench's): dense and SAE, the matched arm, k = 5; the same estimators."""
    from raybench.analysis.secondary import calibration_cells
    from raybench.analysis.secondary.estimators import bootstrap_counts
    from raybench.analysis.secondary.intervention import intervene_model

    root, cfg, tables = tiny_run
    demo = dataclasses.replace(SecondaryConfig.demo(), candidate_subsets=SCFG.candidate_subsets,
                               bootstrap_draws=SCFG.bootstrap_draws, complete_case_train=True)
    cells = calibration_cells(root, cfg.protocol)
    model, sub = next(iter(cells[cells["layer"] == cells["n_layers"] - 1].groupby("model")))
    paper = tables["intervention_contrasts"]
    counts = bootstrap_counts(len(_test_patients(root, cfg)), 200, 7, 100, "chunked")
    out = intervene_model(root, cfg.protocol.eval, demo, model, int(sub["layer"].iloc[0]),
                          [(int(s), d) for s, d in zip(sub["seed"], sub["cell_dir"], strict=True)], counts, (2.5, 97.5),
                          demo.rotation_seed)
    con = out["intervention_contrasts"]
    assert list(con["comparison"].unique()) == ["sae_minus_dense"] and set(con["arm"]) == {"matched"}
    assert set(con["k"]) == {5} and len(con) == 4
    assert set(out["intervention"]["method"]) == {"dense", "sae"}
    same = paper[(paper["model"] == model) & (paper["arm"] == "matched") & (paper["k"] == 5)
                 & (paper["comparison"] == "sae_minus_dense")].set_index("metric")
    mine = con.set_index("metric")
    # the paper design's gate also needs a positive PCA effect, so its eligible concepts are a subset
    assert (mine["concepts_paired"] >= same.loc[mine.index, "concepts_paired"]).all()


@pytest.mark.slow
def test_mimic_design_runs_the_published_mimic_workers_design(tiny_run):
    """Issue 42 item 2: on MIMIC-IV-ECG (intervention_design("mimic"), mimic=True) dense vs SAE at k = 5 in the
    matched arm over every record, each seed marked by its quality gate; a failed gate empties the primary set."""
    from raybench.analysis.secondary import calibration_cells
    from raybench.analysis.secondary.estimators import bootstrap_counts
    from raybench.analysis.secondary.intervention import intervene_model

    root, cfg, _ = tiny_run
    cells = calibration_cells(root, cfg.protocol)
    model, sub = next(iter(cells[cells["layer"] == cells["n_layers"] - 1].groupby("model")))
    units = [(int(s), d) for s, d in zip(sub["seed"], sub["cell_dir"], strict=True)]
    counts = bootstrap_counts(len(_test_patients(root, cfg)), 100, 7, 100, "chunked")
    from raybench.analysis.secondary.intervention_design import quality_pass
    from raybench.sae.cell_files import load_cell_metrics

    scfg = SCFG.intervention_design("mimic")
    assert (scfg.intervention_methods, scfg.intervention_ks, scfg.subset_seed) == (("dense", "sae"), (5,), 976000)
    for _, cell_dir in units:  # the default gate is the cell's own (these few-step SAEs fail it)
        metrics = load_cell_metrics(cell_dir)
        assert quality_pass(metrics, 64, scfg.quality_gate, 0.9, 48) == metrics["gate_pass"]
    scfg = dataclasses.replace(scfg, quality_gate="matched_live_capacity", min_validation_r2=-1.0,
                               min_live_latents=1)
    out = intervene_model(root, cfg.protocol.eval, scfg, model, int(sub["layer"].iloc[0]), units, counts,
                          (2.5, 97.5), 0, mimic=True)
    designs, summary = out["intervention_designs"], out["intervention"]
    assert len(designs) == len(units) * SCFG.candidate_subsets * designs["concept"].nunique()
    assert set(designs["k"]) == {5} and set(designs["arm"]) == {"matched"} and designs["sae_quality_pass"].all()
    assert set(summary["method"]) == {"dense", "sae"} and "off_max_abs" in summary.columns
    assert list(out["intervention_contrasts"]["comparison"].unique()) == ["sae_minus_dense"]
    strict = dataclasses.replace(scfg, min_live_latents=10**6)
    failed = intervene_model(root, cfg.protocol.eval, strict, model, int(sub["layer"].iloc[0]), units, counts,
                             (2.5, 97.5), 0, mimic=True)
    assert not failed["intervention"]["sae_quality_pass"].any()
    assert (failed["intervention"]["concepts_eligible"] == 0).all()
    assert failed["intervention_contrasts"]["p_value"].isna().all()


def _test_patients(root: Path, cfg) -> tuple[str, ...]:
    from raybench.cohorts.manifest import load_manifest
    from raybench.sae.data import evaluation_test_patients

    manifest, info = load_manifest(RunLayout.at(root).manifest)
    return evaluation_test_patients(manifest, info, cfg.protocol.eval)


# ---------------------------------------------------------------- a failed analysis is visible

def test_failed_analysis_leaves_no_stale_outputs_and_fails_the_audit(tmp_path, monkeypatch):
    """A failure used to be only logged: the previous run's tables stayed, were rendered and the audit passed."""
    import json

    from fake_run import small_protocol, write_fake_run

    import raybench.analysis.secondary.calibration as calibration
    import raybench.analysis.secondary.harmonization as harmonization
    import raybench.analysis.secondary.intervention as intervention
    import raybench.infra.ray_session
    from raybench.analysis.release_audit.run import release_audit
    from raybench.analysis.secondary.run import run_secondary
    from raybench.analysis.stage import render_report
    from raybench.core.atomic import write_table
    from raybench.core.config import demo_run

    protocol = small_protocol()
    root = write_fake_run(tmp_path / "run", protocol, tables=("cells",), secondary=True)  # an earlier run's tables
    cfg = dataclasses.replace(demo_run(str(root)), protocol=protocol)
    layout = RunLayout.at(root)
    layout.figures_dir.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "svg"):
        (layout.figures_dir / f"calibration_ladder.{ext}").write_bytes(b"stale figure")
    assert release_audit(root, protocol).passed

    def boom(*args, **kwargs):
        raise RuntimeError("ladder exploded\nat the last step")

    def harmonize(root_, protocol_, cfg_, scfg_):
        df = pd.DataFrame({"model": ["ecg_fm"], "fresh": [1.0]})
        write_table(layout.tables_dir / "harmonization.parquet", df)
        return {"harmonization": df}

    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)
    monkeypatch.setattr(calibration, "run_calibration", boom)
    monkeypatch.setattr(harmonization, "run_harmonization", harmonize)
    monkeypatch.setattr(intervention, "run_intervention", lambda *args: {})  # skipped: inputs missing
    tables = run_secondary(root, protocol, cfg, SCFG)
    assert set(tables) == {"harmonization"}
    left = sorted(p.name for p in [*layout.tables_dir.iterdir(), *layout.figures_dir.iterdir()])
    assert not [n for n in left if n.startswith(("calibration", "intervention"))], left
    assert "fresh" in pd.read_parquet(layout.tables_dir / "harmonization.parquet")
    record = json.loads((layout.tables_dir / "secondary_failures.json").read_text())
    assert record == {"failures": [{"analysis": "calibration", "type": "RuntimeError",
                                    "reason": "RuntimeError: at the last step"}]}

    audit = release_audit(root, protocol)
    assert not audit.passed and audit.summary.endswith("1 problem(s): INCOMPLETE")
    assert any("calibration" in p and "RuntimeError: at the last step" in p for p in audit.problems)
    text = render_report(root).read_text()
    assert "Secondary analyses failed (1)" in text and "RuntimeError: at the last step" in text
    assert 'id="calibration"' in text and "This analysis failed in the last run" in text
    start = text.index('<section id="calibration"')
    calibration_section = text[start:text.index("</section>", start)]
    # the earlier run's outputs are gone (the paper comparison may still name the published sae_top4 row)
    assert "sae_top4" not in calibration_section and "fig-calibration_ladder" not in text

    monkeypatch.setattr(calibration, "run_calibration", lambda *args: {})
    run_secondary(root, protocol, cfg, SCFG)  # the rerun succeeds: the failure is cleared
    assert json.loads((layout.tables_dir / "secondary_failures.json").read_text()) == {"failures": []}
    assert release_audit(root, protocol).passed
    assert "Secondary analyses failed" not in render_report(root).read_text()


# ---------------------------------------------------------------- the ladder's order on planted data

def test_ladder_order_on_planted_sparse_activations():
    """x is a sparse non-negative mix of 24 orthonormal atoms (d = 32, ~4 active) and an SAE with k = 2 codes
    it lossily; concepts 0-3 are single atoms, 4-7 dense mixtures of all atoms (both linear in x). Dense ridge
    must lead, the ridge ladder must shrink with the code it reads, and learned coordinates beat random ones."""
    import torch

    from raybench.analysis.secondary.calibration import ladder
    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    d, m, n, ntr = 32, 24, 2000, 1400
    atoms = np.linalg.qr(rng.normal(size=(d, d)))[0][:m]
    s = (rng.random((n, m)) < 4 / m) * rng.exponential(1.0, size=(n, m))
    x = (s @ atoms + 0.02 * rng.normal(size=(n, d))).astype(np.float32)
    y = np.concatenate([s[:, :4], s @ rng.normal(size=(m, 4))], axis=1) + 0.1 * rng.normal(size=(n, 8))
    y = ((y - y[:ntr].mean(0)) / y[:ntr].std(0)).astype(np.float32)
    acts, concepts = {"train": x[:ntr], "test": x[ntr:]}, {"train": y[:ntr], "test": y[ntr:]}
    cfgs = [SAECellConfig(d=d, n_latents=8 * d, k=2, seed=seed, steps=300, batch_size=128, lr=3e-3, beta1=0.9,
                          beta2=0.99, aux_k=64, aux_coef=1 / 32, dead_after_batches=5) for seed in (1, 2)]
    res = train_stack(acts["train"], cfgs)
    saes = [(c.seed, res.sae.single(i), res.normalizer) for i, c in enumerate(cfgs)]
    r = ladder(acts, concepts, np.arange(800), saes, SecondaryConfig(random_dictionaries=4), 256)

    def mean_abs(method: str) -> float:
        return float(np.mean([np.abs(v).mean() for (mm, _), v in r.items() if mm == method]))

    ladder_means = [mean_abs(mm) for mm in ("dense_ridge", "sae_ridge", "sae_top16", "sae_top4")]
    assert ladder_means == sorted(ladder_means, reverse=True), ladder_means
    assert ladder_means[0] > 0.95 and ladder_means[0] - ladder_means[-1] > 0.05
    assert mean_abs("sae_single") > mean_abs("random_single") + 0.1, (mean_abs("sae_single"), mean_abs("random_single"))
    assert sorted(u for mm, u in r if mm == "random_single") == [0, 1, 2, 3]
    assert sorted(u for mm, u in r if mm == "sae_single") == [1, 2]


def test_ladder_order_flags_each_step_by_hand():
    from raybench.analysis.secondary.calibration import ladder_order

    acc = {"a": (0.7, 0.5, 0.4, 0.3, 0.25, 0.2), "b": (0.4, 0.2, 0.22, 0.2, 0.1, 0.1)}
    methods = ("dense_ridge", "sae_ridge", "sae_top16", "sae_top4", "sae_single", "random_single")
    summary = pd.DataFrame([{"model": m, "method": k, "accessibility": v}
                            for m, vals in acc.items() for k, v in zip(methods, vals, strict=True)])
    order = ladder_order(summary).set_index("model")
    assert bool(order.loc["a", "all_hold"]) and not bool(order.loc["b", "all_hold"])
    assert not bool(order.loc["b", "sae_ridge_ge_sae_top16"]) and bool(order.loc["b", "dense_ridge_ge_sae_ridge"])
    assert not bool(order.loc["b", "sae_single_gt_random_single"]), "ties with random are not a win"
    assert order.loc["b", "margin_sae_ridge_sae_top16"] == pytest.approx(-0.02)


def test_the_run_configs_secondary_section_decides_what_runs(tmp_path, monkeypatch):
    """run_secondary without explicit settings takes the run config's `secondary` section (raybench analyze)."""
    from fake_run import small_protocol, write_fake_run

    import raybench.analysis.secondary.calibration as calibration
    import raybench.analysis.secondary.harmonization as harmonization
    import raybench.infra.ray_session
    from raybench.analysis.secondary.run import run_secondary
    from raybench.core.config import demo_run

    protocol = small_protocol()
    root = write_fake_run(tmp_path / "run", protocol, tables=("cells",))
    ran: list[str] = []
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)
    monkeypatch.setattr(calibration, "run_calibration", lambda *a: ran.append("calibration") or {})
    monkeypatch.setattr(harmonization, "run_harmonization", lambda *a: ran.append("harmonization") or {})
    cfg = dataclasses.replace(demo_run(str(root)), protocol=protocol,
                              secondary=dataclasses.replace(SecondaryConfig.demo(), analyses=("harmonization",)))
    run_secondary(root, protocol, cfg)
    assert ran == ["harmonization"]
