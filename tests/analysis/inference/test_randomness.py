"""Evaluation randomness on disk (issue 11, item 10): after an analysis, run_dir/randomness/ holds the selection
subset, the streams and seeds of both bootstraps and the permutation floor, and every reported number they
enter can be re-derived from the run folder alone."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.atlas.run import analyze_run
from raybench.analysis.inference import bootstrap as bs
from raybench.analysis.inference import packed_stats, streams
from raybench.analysis.inference import randomness as rnd
from raybench.analysis.inference import stats as st
from raybench.analysis.inference.metrics import reproducibility, trapezoid_auc
from raybench.core.atomic import read_json, write_json, write_table
from raybench.core.config import EvalProtocol, GridProtocol, InferenceProtocol, Protocol
from raybench.core.paths import RunLayout
from raybench.core.sufficient_stats import patient_stats

MODELS = ("csfm", "ecg_jepa")
CONCEPTS = ["qrs_duration", "hr_ventricular", "t_amp_global"]
D_MODEL, TOP = 12, 6


def _protocol(stream: str) -> Protocol:
    return Protocol(
        name="test",
        grid=GridProtocol(models=MODELS, depths=(0.0, 1.0), expansions=(1, 4), seeds=(4311, 4312, 4313),
                          sensitivity_depth=None),
        eval=EvalProtocol(selection_records=32, repro_top=TOP, repro_permutations=20),
        inference=InferenceProtocol(patient_draws=120, crossed_draws=300, chunk_draws=50, seed=20260714,
                                    stream=stream),
    )


@pytest.fixture(scope="module")
def manifest_run(tmp_path_factory) -> Path:
    """A real synthetic manifest (selection subset, test patients) shared by both streams' runs."""
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort

    root = tmp_path_factory.mktemp("manifest")
    layout = RunLayout.at(root)
    generate_synth_cohort(layout.cohort_dir, 120, 48, 5)
    build_synth_manifest(layout.cohort_dir, layout.manifest_dir, concepts="none")
    return root


def _fake_cells(root: Path, protocol: Protocol, n_patients: int) -> None:
    """Cells with per-patient statistics over n_patients sorted test patients; patient 0 has no evaluated
    record (as a patient without a complete case)."""
    rng = np.random.default_rng(1)
    layout = RunLayout.at(root)
    per = rng.integers(1, 3, size=n_patients)
    per[0] = 0
    patient = np.repeat(np.arange(n_patients), per)
    y = rng.normal(size=(len(patient), len(CONCEPTS)))
    g = protocol.grid
    rows = []
    for m, q, e, s in itertools.product(g.models, g.depths, g.expansions, g.seeds):
        cid = f"{m}-q{q:.2f}-E{e}-s{s}-primary"
        cdir = layout.cell_dir(cid)
        cdir.mkdir(parents=True)
        a = (0.5 + 0.2 * q + 0.1 * e) * y + rng.normal(size=y.shape)
        err = rng.gamma(2.0, 0.05 * (1 + (m == "csfm")), size=len(patient))
        np.savez(cdir / "patient_stats.npz", **patient_stats(patient, n_patients, a, y, err,
                                                           rng.gamma(2.0, 1.0, size=len(patient)) + err))
        cols = rng.normal(size=(D_MODEL, TOP + 2))
        np.savez(cdir / "decoder_top.npz", columns=cols / np.linalg.norm(cols, axis=0), indices=np.arange(TOP + 2))
        write_json(cdir / "metrics.json", {"concepts": CONCEPTS})
        layer = int(q * 11)
        rows.append({"cell_id": cid, "model": m, "layer": layer, "n_layers": 12, "q": q, "realized_depth": layer / 11,
                     "arm": "primary", "expansion": e, "n_latents": D_MODEL * e, "k": 2, "seed": s, "status": "ok",
                     "val_r2": 0.95, "test_r2": 0.95, "val_dead_fraction": 0.01 * e, "val_mean_l0": 2.0,
                     "gate_pass": True, "test_accessibility": 0.3, "test_coverage": 0.5, "train_seconds": 1.0,
                     "config_hash": "x", "cell_dir": str(cdir.relative_to(root))})
    write_table(layout.cells_table, pd.DataFrame(rows))


@pytest.fixture(scope="module", params=["published", "chunked"])
def analyzed(request, manifest_run, tmp_path_factory, ray_cluster):
    import shutil

    from raybench.cohorts.manifest import load_manifest
    from raybench.sae.data import test_patients

    stream = request.param
    root = tmp_path_factory.mktemp(f"run-{stream}")
    shutil.copytree(RunLayout.at(manifest_run).manifest_dir, RunLayout.at(root).manifest_dir)
    manifest, _ = load_manifest(RunLayout.at(root).manifest)
    protocol = _protocol(stream)
    _fake_cells(root, protocol, len(test_patients(manifest)))
    out = analyze_run(root, protocol, num_workers=2, cohort_kind="synth")
    return root, protocol, out, manifest


def test_randomness_files_exist_and_name_the_streams(analyzed):
    root, protocol, _, manifest = analyzed
    folder = RunLayout.at(root).randomness_dir
    for name in ("randomness.json", "selection_ecg_ids.npy", "patients_drawn.npy", "patient_draws_head.npy",
                 "crossed_draws.npz", "floor_seeds.csv"):
        assert (folder / name).exists(), name
        assert (folder / name).stat().st_size < 200_000, name  # small files
    rec = rnd.read_randomness(root)
    inf = protocol.inference
    assert rec["stream"] == inf.stream and rec["generators"] == rnd.GENERATORS[inf.stream]
    assert rec["patient_bootstrap"]["seed"] == inf.seed and rec["patient_bootstrap"]["draws"] == inf.patient_draws
    assert rec["crossed_bootstrap"]["depth_units"] == [0.0, 1.0]
    assert rec["crossed_bootstrap"]["seed_units"] == [4311, 4312, 4313]
    # the selection subset is the one the cells use, via raybench.sae.data.selection_ecg_ids
    from raybench.sae.data import selection_ecg_ids

    sel = np.load(folder / "selection_ecg_ids.npy")
    np.testing.assert_array_equal(sel, selection_ecg_ids(manifest, protocol.eval))
    assert rec["selection_subset"]["records"] == sel.size == 32 and rec["selection_subset"]["seed"] == 20260714
    assert set(sel) <= set(manifest.loc[manifest.split == "train", "ecg_id"])


def test_first_patient_draws_rederive_and_are_the_ones_used(analyzed):
    root, protocol, _, _ = analyzed
    layout, inf = RunLayout.at(root), protocol.inference
    rec = rnd.read_randomness(root)
    head = np.load(layout.randomness_dir / "patient_draws_head.npy")
    drawn = np.load(layout.randomness_dir / "patients_drawn.npy")
    np.testing.assert_array_equal(rnd.patient_draws_from_record(rec, len(head)), head)  # from the JSON alone
    if inf.stream == "published":
        assert 0 not in drawn  # the patient without a record is not drawn (published: unique evaluated patients)
    else:
        np.testing.assert_array_equal(drawn, np.arange(rec["patient_bootstrap"]["test_patients"]))

    # the bootstrap's first draws are exactly these counts: recompute one cell's metrics from them
    cells = pd.read_parquet(layout.cells_table)
    path = layout.root / cells.cell_dir.iloc[0] / "patient_stats.npz"
    stats = packed_stats.load_packed_stats([path], [cells.cell_id.iloc[0]], len(CONCEPTS),
                                           protocol.eval.coverage_threshold)
    full = np.zeros((len(head), stats.n_patients))
    full[:, drawn] = head
    from_file = packed_stats.metrics_from_weighted(full @ stats.y_matrix, full @ stats.cell_blocks[0],
                                                   stats.cell_group, len(CONCEPTS), stats.threshold)
    used = bs.patient_bootstrap(stats, inf.patient_draws, inf.seed, inf.chunk_draws, stream=inf.stream)
    np.testing.assert_allclose(used[:len(head)], from_file, rtol=0, atol=1e-12)
    other = dict(rec, patient_bootstrap=dict(rec["patient_bootstrap"], seed=inf.seed + 1))
    assert not np.array_equal(rnd.patient_draws_from_record(other, len(head)), head)


def test_crossed_table_recomputes_from_the_saved_draws(analyzed):
    root, protocol, out, _ = analyzed
    layout = RunLayout.at(root)
    rec = rnd.read_randomness(root)
    with np.load(layout.randomness_dir / "crossed_draws.npz") as z:
        di, si = z["depth_idx"].astype(np.int64), z["seed_idx"].astype(np.int64)
    rdi, rsi = rnd.crossed_draws_from_record(rec)
    np.testing.assert_array_equal(di, rdi)
    np.testing.assert_array_equal(si, rsi)
    # reconstruction R^2 per cell from its statistics -> unit AUCs -> the crossed table's interval
    cells = pd.read_parquet(layout.cells_table)
    units = np.zeros((len(MODELS), 2, 3))
    cb = rec["crossed_bootstrap"]
    for (m, q, s), sub in cells.groupby(["model", "q", "seed"]):
        r2 = []
        for e in protocol.grid.expansions:
            with np.load(layout.root / sub[sub.expansion == e].cell_dir.iloc[0] / "patient_stats.npz") as z:
                r2.append(1.0 - z["sse"].sum() / z["sst"].sum())
        units[MODELS.index(m), cb["depth_units"].index(q), cb["seed_units"].index(s)] = trapezoid_auc(
            np.array(r2), protocol.grid.expansions)
    if rec["stream"] == "published":
        draws = bs.crossed_values_published(units, di, si)
    else:
        draws = bs.crossed_values(units, streams.index_counts(di, 2), streams.index_counts(si, 3))
    lo, hi = st.percentile_ci(draws, protocol.inference.ci_low, protocol.inference.ci_high)
    got = out["crossed"][out["crossed"].metric == "reconstruction"].set_index("model")
    for i, m in enumerate(MODELS):
        assert got.loc[m, "ci_low"] == pytest.approx(lo[i], abs=1e-12)
        assert got.loc[m, "ci_high"] == pytest.approx(hi[i], abs=1e-12)


def test_reproducibility_recomputes_from_the_floor_seeds(analyzed):
    root, protocol, out, _ = analyzed
    layout = RunLayout.at(root)
    floors = pd.read_csv(layout.randomness_dir / "floor_seeds.csv")
    assert len(floors) == len(MODELS) * 2 * 2 * 3  # models x depths x E x seed pairs
    assert set(floors.stream) == {protocol.inference.stream}
    cells = pd.read_parquet(layout.cells_table)
    for (m, q, e), blk in floors.groupby(["model", "q", "expansion"]):
        sub = cells[(cells.model == m) & (cells.q == q) & (cells.expansion == e)].sort_values("seed")
        decs = []
        for cdir in sub.cell_dir:
            with np.load(layout.root / cdir / "decoder_top.npz") as z:
                decs.append(z["columns"])
        seeds = blk.generator_seed.tolist()
        if protocol.inference.stream == "published":
            r = reproducibility(decs, protocol.eval.repro_top, protocol.eval.repro_permutations, 0, seeds)
        else:
            assert len(set(seeds)) == 1  # one generator per block, drawn across its pairs
            r = reproducibility(decs, protocol.eval.repro_top, protocol.eval.repro_permutations, seeds[0])
        row = out["reproducibility"].set_index(["model", "q", "expansion"]).loc[(m, q, e)]
        assert row.random_floor == pytest.approx(r["random_floor"], abs=1e-15)
        assert row.matched_cosine == pytest.approx(r["matched_cosine"], abs=1e-15)


def test_randomness_json_holds_no_record_identifiers(analyzed):
    root, _, _, manifest = analyzed
    text = (RunLayout.at(root).randomness_dir / "randomness.json").read_text()
    rec = read_json(RunLayout.at(root).randomness_dir / "randomness.json")
    assert len(rec["patient_bootstrap"]["test_patients_sha256"]) == 64
    for pid in manifest.loc[manifest.split == "test", "patient_id"].astype(str).unique()[:20]:
        assert f'"{pid}"' not in text


def test_secondary_seeds_are_saved(tmp_path):
    from raybench.analysis.secondary import SecondaryConfig
    from raybench.analysis.secondary.estimators import random_directions
    from raybench.core.config import demo_protocol, paper_protocol

    path = rnd.write_secondary_randomness(tmp_path, paper_protocol(), SecondaryConfig(), "ptbxl")
    rec = read_json(path)
    assert rec["random_dictionaries"]["seeds"] == list(range(920000, 920020))  # the published 20 dictionaries
    # the published scripts' own bootstrap seeds (docs/protocol.md §9.5)
    assert rec["harmonization_bootstrap"]["stream"] == "published"
    assert rec["harmonization_bootstrap"]["seed"] == 20260715
    assert rec["intervention_bootstrap"]["seed"] == 20260722 and rec["intervention_rotation_seed"] == 20260720
    mimic = read_json(rnd.write_secondary_randomness(tmp_path, paper_protocol(), SecondaryConfig(), "mimic"))
    assert mimic["intervention_bootstrap"]["seed"] == 20260724 and mimic["harmonization_bootstrap"]["seed"] == 20260715
    # the MIMIC workers' design (issue 42): subsets from 976000, no random rotation; PTB-XL keeps 960000
    assert (mimic["intervention_subset_seed"], mimic["intervention_rotation_seed"]) == (976000, None)
    assert rec["intervention_subset_seed"] == 960000
    first = random_directions(6, 3, rec["random_dictionaries"]["seeds"][0])  # re-derivable from the file alone
    np.testing.assert_array_equal(first, random_directions(6, 3, 920000))
    demo = read_json(rnd.write_secondary_randomness(tmp_path, demo_protocol(), SecondaryConfig.demo(), "synth"))
    for name in ("harmonization_bootstrap", "intervention_bootstrap"):  # raybench's rule: the run's own draws
        assert demo[name]["stream"] == "chunked" and demo[name]["seed"] == 20240614
    assert demo["intervention_rotation_seed"] is None  # the demo design has no random rotation
