"""Parity of the `paper` preset's evaluation randomness with the published protocol code (issue 11, item 4).

The fixtures were written by make_fixtures_inference.py running the published code itself (see README.md):
the patient bootstrap, the crossed bootstrap, the Hungarian stability and permutation floor, the AUC weights
and the random dictionaries.  raybench's functions, fed the fixtures' inputs, must reproduce them:

- exactly (bitwise) for the random draws themselves, the floor seeds, the random directions, and every
  statistic whose arithmetic is the same (crossed-bootstrap CIs, paired p and BH q, AUC weights);
- to 1e-12 where only the summation order differs (float64);
- within half a float32 ulp where the published code stored float32 (patient-bootstrap distributions), and
  2e-7 where it computed in float32 (decoder cosines for the matching, the floor and the subspace overlap).

Each group also shows that a changed seed (or raybench's own chunked stream) does not reproduce them.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.inference import bootstrap as bs
from raybench.analysis.inference import stats as st
from raybench.analysis.inference import streams
from raybench.analysis.inference.metrics import (
    auc_weights,
    matched_cosine,
    reproducibility,
    subspace_overlap,
    trapezoid_auc,
)
from raybench.analysis.inference.packed_stats import pack_patient_stats
from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.estimators import batch_topk_codes, random_directions
from raybench.core.config import demo_protocol, paper_protocol
from raybench.core.sufficient_stats import patient_stats
from raybench.sae import data as sae_data

HERE = Path(__file__).resolve().parent
SEED = 20260714
THR = 0.20
C = 4


def _npz(name: str) -> dict[str, np.ndarray]:
    with np.load(HERE / name, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _json(name: str) -> dict:
    return json.loads((HERE / name).read_text())


PB = _npz("inference_patient_bootstrap.npz")
CB, CBJ = _npz("inference_crossed_bootstrap.npz"), _json("inference_crossed_bootstrap.json")
RP, RPJ = _npz("inference_reproducibility.npz"), _json("inference_reproducibility.json")
RD = _npz("inference_random_dictionaries.npz")
AUC = _json("inference_auc_weights.json")


def test_paper_preset_uses_the_published_streams():
    inf = paper_protocol().inference
    assert inf.stream == "published" and inf.seed == SEED == int(PB["seed"]) == CBJ["seed"]
    assert (inf.patient_draws, inf.crossed_draws) == (2000, 10000)
    assert paper_protocol().eval.repro_permutations == RPJ["random_permutations"] == 100
    assert paper_protocol().eval.repro_top == 256
    assert demo_protocol().inference.stream == "chunked"  # raybench's stream stays an option
    scfg = SecondaryConfig()
    assert (scfg.random_seed, scfg.random_dictionaries) == (int(RD["seeds"][0]), len(RD["seeds"])) == (920000, 20)


# ---------------------------------------------------------------- patient bootstrap


def _patient_stats(case: str):
    """raybench's per-patient statistics of the fixture's records over all sorted test patients."""
    rec = PB["record_patient"]
    patients = sae_data.test_patients(pd.DataFrame({"split": "test", "patient_id": rec}))
    code = {p: i for i, p in enumerate(patients)}
    idx = PB[f"{case}_eval_idx"]
    codes = np.array([code[p] for p in rec[idx]])
    sums = patient_stats(codes, len(patients), PB["z"][idx], PB["y"][idx], PB["sse"][idx], PB["sst"][idx])
    return patients, pack_patient_stats([(f"parity-{case}", sums)], ["cell"], C, THR)


def test_patient_order_is_the_published_one():
    patients, stats = _patient_stats("all")
    assert list(patients) == PB["all_patients"].tolist()  # ids sorted as strings, e.g. "10071.0" < "9941.0"
    assert [float(p) for p in patients] != sorted(float(p) for p in patients)  # string order != numeric order
    assert stats.n_patients == len(patients) and stats.active.all()


@pytest.mark.parametrize("chunk", [100, 250, 7])
def test_patient_draws_are_the_published_draws(chunk):
    n = int(PB["all_draws"])
    counts = np.concatenate(list(streams.patient_draws(40, n, SEED, chunk, "published")))
    np.testing.assert_array_equal(counts[:20], PB["all_first_weights"])
    np.testing.assert_array_equal(counts.sum(axis=0), PB["all_weights_sum_per_patient"])


def test_patient_draws_with_another_seed_or_stream_differ():
    n = int(PB["all_draws"])
    for seed, stream in ((SEED + 1, "published"), (SEED, "chunked")):
        counts = np.concatenate(list(streams.patient_draws(40, n, seed, 250, stream)))
        assert not np.array_equal(counts[:20], PB["all_first_weights"])


def _assert_float32_equal(ours: np.ndarray, published: np.ndarray) -> None:
    """The published run stores each draw as float32: equal up to that rounding (half an ulp) + 1e-12."""
    tol = np.spacing(np.abs(published).astype(np.float32)).astype(np.float64) / 2 + 1e-12
    assert np.all(np.abs(ours - published.astype(np.float64)) <= tol)


@pytest.mark.parametrize("case", ["all", "cc"])
def test_patient_bootstrap_reproduces_the_published_distributions(case, ray_cluster):
    _, stats = _patient_stats(case)
    n = int(PB[f"{case}_draws"])
    assert int(stats.active.sum()) == len(PB[f"{case}_patients"])  # cc: patients without an evaluated record drop
    one = bs.patient_bootstrap(stats, n, SEED, 250, num_workers=1, stream="published")
    two = bs.patient_bootstrap(stats, n, SEED, 250, num_workers=2, stream="published")
    np.testing.assert_array_equal(one, two)  # the worker count does not matter, bit for bit
    # nor the chunk size, to rounding: a BLAS may round a row of a GEMM differently with the number of rows
    np.testing.assert_allclose(bs.patient_bootstrap(stats, n, SEED, 64, num_workers=2, stream="published"), one,
                               rtol=1e-13, atol=1e-15)
    for k, key in enumerate(("recon_R2", "semantic_alignment")):
        _assert_float32_equal(one[:, 0, k], PB[f"{case}_{key}"])
        assert stats.point[0, k] == pytest.approx(float(PB[f"{case}_observed_{key}"]), abs=1e-12)
    np.testing.assert_array_equal(one[:, 0, 2], PB[f"{case}_concept_coverage_020"].astype(np.float64))
    np.testing.assert_allclose(stats.point_r[0], PB[f"{case}_observed_concept_correlation"], atol=1e-12)
    counts = np.concatenate(list(streams.patient_draws(stats, n, SEED, 250, "published")))
    np.testing.assert_array_equal(counts[:20][:, stats.active], PB[f"{case}_first_weights"])
    assert np.all(counts[:, ~stats.active] == 0)

    other = bs.patient_bootstrap(stats, n, SEED + 1, 250, num_workers=2, stream="published")
    with pytest.raises(AssertionError):
        _assert_float32_equal(other[:, 0, 0], PB[f"{case}_recon_R2"])


# ---------------------------------------------------------------- crossed bootstrap


def _units(column: str) -> np.ndarray:
    """Per (model, depth, seed) common-scale AUC [M, D, S] of the fixture's cell values [M, D, E, S]."""
    return trapezoid_auc(CB[column], CB["expansions"], axis=2)


def test_crossed_first_draws_are_the_published_draws():
    di, si = streams.published_crossed_indices(SEED, 50, len(CB["depths"]), len(CB["seeds"]))
    np.testing.assert_array_equal(np.sort(CB["depths"])[di], CB["first_depth_draws"])
    np.testing.assert_array_equal(np.sort(CB["seeds"])[si], CB["first_seed_draws"])
    d2, s2 = streams.published_crossed_indices(SEED + 1, 50, len(CB["depths"]), len(CB["seeds"]))
    assert not np.array_equal(np.sort(CB["depths"])[d2], CB["first_depth_draws"])


def _crossed_tables(seed: int, stream: str = "published") -> tuple[dict, dict]:
    n = CBJ["bootstrap_samples"]
    di, si = streams.crossed_draw_indices(seed, n, max(1, n // 4), len(CB["depths"]), len(CB["seeds"]), stream)
    models = CB["models"].tolist()
    profile, pairs = {}, {}
    for metric, column in CBJ["metric_columns"].items():
        units = _units(column)
        draws = bs.crossed_values_published(units, di, si)
        point = bs.crossed_values(units, np.ones((1, units.shape[1])), np.ones((1, units.shape[2])))[0]
        lo, hi = st.percentile_ci(draws)
        for i, m in enumerate(models):
            profile[(metric, m)] = (point[i], lo[i], hi[i])
        rows = []
        for a, b in itertools.combinations(range(len(models)), 2):  # published order: MODEL_ORDER pairs
            diff = draws[:, a] - draws[:, b]
            dlo, dhi = st.percentile_ci(diff)
            rows.append(((metric, models[a], models[b]), (point[a] - point[b], float(dlo), float(dhi),
                                                          st.paired_p(diff))))
        q = st.benjamini_hochberg([r[1][3] for r in rows])
        pairs.update({key: (*vals, float(qq)) for (key, vals), qq in zip(rows, q, strict=True)})
    return profile, pairs


def test_crossed_bootstrap_reproduces_the_published_inference():
    profile, pairs = _crossed_tables(SEED)
    for r in CBJ["profile"]:
        point, lo, hi = profile[(r["metric"], r["model"])]
        assert point == pytest.approx(float(r["observed_multiscale_auc"]), abs=1e-12)  # summation order only
        assert (lo, hi) == (float(r["ci_low"]), float(r["ci_high"]))  # same arithmetic: bitwise
    for r in CBJ["pairs"]:
        diff, lo, hi, p, q = pairs[(r["metric"], r["model_left"], r["model_right"])]
        assert diff == pytest.approx(float(r["observed_difference"]), abs=1e-12)
        assert (lo, hi) == (float(r["ci_low"]), float(r["ci_high"]))
        # exact, also for coverage, whose quantized AUCs tie between models in many draws
        assert (p, q) == (float(r["p_two_sided"]), float(r["q_bh"]))


def test_crossed_bootstrap_with_another_seed_or_stream_differs():
    for seed, stream in ((SEED + 1, "published"), (SEED, "chunked")):
        profile, _ = _crossed_tables(seed, stream)
        assert any(profile[(r["metric"], r["model"])][1] != float(r["ci_low"]) for r in CBJ["profile"])


def test_crossed_bootstrap_tasks_deliver_the_published_values(ray_cluster):
    units = np.stack([_units(c) for c in CBJ["metric_columns"].values()])[:, 0]  # 4 "models" x D x S
    n = CBJ["bootstrap_samples"]
    di, si = streams.published_crossed_indices(SEED, n, units.shape[1], units.shape[2])
    ref = bs.crossed_values_published(units, di, si)
    for chunk, workers in ((500, 1), (333, 2)):
        np.testing.assert_array_equal(bs.crossed_bootstrap(units, n, SEED, chunk, workers, stream="published"), ref)
    holed = units.copy()
    holed[1, 2, 0] = np.nan  # a missing cell: the weighted mean (the published code refuses such a grid)
    got = bs.crossed_bootstrap(holed, n, SEED, 500, 2, stream="published")
    np.testing.assert_allclose(got, bs.crossed_values(holed, streams.index_counts(di, 5), streams.index_counts(si, 3)),
                               atol=1e-12)


# ---------------------------------------------------------------- reproducibility


def _decoders(block: int) -> list[np.ndarray]:
    """Each seed's decoder columns as raybench's decoder_top holds them: alive, by firing rate (descending)."""
    out = []
    for s in RPJ["seeds"]:
        f = RP[f"b{block}_s{s}_firing"].astype(np.float64)
        alive = np.flatnonzero(f > 0)
        out.append(RP[f"b{block}_s{s}_w_dec"][:, alive[np.argsort(-f[alive], kind="stable")]])
    return out


def _pair_seeds(blk: dict) -> list[int]:
    model = {v: k for k, v in streams.PUBLISHED_MODEL_NAMES.items()}[blk["model"]]
    return [streams.floor_seed(model, blk["layer"], blk["relative_depth"], blk["expansion_E"], "primary", a, b)
            for a, b in itertools.combinations(RPJ["seeds"], 2)]


def test_floor_seeds_are_the_published_seeds():
    for blk in RPJ["blocks"]:
        rows = [r for r in RPJ["pairs"] if r["model"] == blk["model"] and float(r["expansion_E"]) == blk["expansion_E"]]
        assert _pair_seeds(blk) == [int(r["floor_seed"]) for r in rows]
    blk = RPJ["blocks"][0]
    assert streams.floor_seed("ecg_fm", 3, 0.25, 1, "primary", 4311, 4312) == streams.floor_seed(
        "ECG-FM", 3, 0.25, 1.0, "fixed_k_over_d", 4311, 4312)  # raybench ids map onto the published names
    assert streams.floor_seed("ecg_fm", 3, 0.25, 1, "primary", 4312, 4311) != _pair_seeds(blk)[0]


def test_reproducibility_reproduces_the_published_stability():
    # float32 tolerance: the published code normalizes the decoders and forms their cosines in float32
    tol = 2e-7
    for b, blk in enumerate(RPJ["blocks"]):
        rows = [r for r in RPJ["pairs"] if r["model"] == blk["model"] and float(r["expansion_E"]) == blk["expansion_E"]]
        summary = next(r for r in RPJ["layer_scale"] if r["model"] == blk["model"]
                       and float(r["expansion_E"]) == blk["expansion_E"])
        got = reproducibility(_decoders(b), RPJ["top_features"], RPJ["random_permutations"], 0, _pair_seeds(blk))
        assert got["n_columns"] == int(rows[0]["top_active_features"])
        assert got["matched_cosine"] == pytest.approx(float(summary["matched_cosine_mean"]), abs=tol)
        assert got["excess"] == pytest.approx(float(summary["stability_above_random_mean"]), abs=tol)
        assert got["subspace_overlap"] == pytest.approx(float(summary["subspace_overlap_mean"]), abs=tol)
        assert got["random_floor"] == pytest.approx(np.mean([float(r["random_pairing_floor_mean"]) for r in rows]),
                                                    abs=tol)
        for p, r in zip(got.get("pairs", []), rows, strict=False):  # per seed pair where raybench reports them
            assert p[3] == pytest.approx(float(r["random_pairing_floor_mean"]), abs=tol)

        wrong = reproducibility(_decoders(b), RPJ["top_features"], RPJ["random_permutations"], 0,
                                [s + 1 for s in _pair_seeds(blk)])
        chunked = reproducibility(_decoders(b), RPJ["top_features"], RPJ["random_permutations"], 0)
        for other in (wrong, chunked):
            assert abs(other["random_floor"] - got["random_floor"]) > 100 * tol


def test_matching_and_overlap_in_float64_are_identical():
    a, b = RP["f64_a"], RP["f64_b"]
    assert matched_cosine(a, b) == pytest.approx(float(RP["f64_matched"].mean()), abs=1e-12)
    an, bn = a / np.linalg.norm(a, axis=0), b / np.linalg.norm(b, axis=0)
    assert subspace_overlap(an, bn) == pytest.approx(float(RP["f64_overlap"]), abs=1e-12)


# ---------------------------------------------------------------- AUC weights


def test_auc_weights_are_the_published_trapezoid():
    e = AUC["expansions"]
    np.testing.assert_allclose(auc_weights(e), AUC["weights_inference"], rtol=0, atol=1e-15)
    np.testing.assert_allclose(auc_weights(e), AUC["weights_stability"], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(trapezoid_auc(np.eye(len(e)), e, axis=0), AUC["weights_inference"])  # bitwise
    assert not np.allclose(auc_weights([1, 2, 4, 8, 16]), AUC["weights_inference"])


# ---------------------------------------------------------------- random dictionaries


def test_random_directions_are_the_published_dictionaries():
    n_lat, d = RD["directions"].shape[1:]
    for seed, published in zip(RD["seeds"], RD["directions"], strict=True):
        np.testing.assert_array_equal(random_directions(n_lat, d, int(seed)), published)  # bitwise float32
    assert not np.array_equal(random_directions(n_lat, d, int(RD["seeds"][0]) + 1), RD["directions"][0])


def test_random_dictionary_codes_are_the_published_codes():
    n_lat, d = RD["directions"].shape[1:]
    for i, published in enumerate(RD["codes"]):
        got = batch_topk_codes(RD["acts"], random_directions(n_lat, d, int(RD["seeds"][i])), int(RD["k"]),
                               int(RD["batch"])).toarray()
        np.testing.assert_array_equal(got != 0, published != 0)  # the same kept entries per frozen batch
        # float32 products (torch may order the dot products differently): values to float32 precision
        np.testing.assert_allclose(got, published, rtol=1e-6, atol=1e-7)
