"""Verdicts by the decision table (docs/protocol.md §11.8), each case with its simulation in the test: noise reads as
noise, nulls hold at the level of training runs, a perfect metric is reliable at 4 x 3, a non-significant validity
result is not a failure, and partial evidence never reads "reliable".

Binomial bounds: under a null of nominal rate p over n simulations, the count k is allowed up to the binomial's
99.9% point (scipy.stats.binom.ppf(0.999, n, p)), so each bound fails by chance at most once in a thousand runs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raybench.analysis.reliability.criteria import NOT_ASSESSED, assess
from raybench.analysis.reliability.evidence import cell_evidence, design, snapshot_evidence, trend_evidence
from raybench.analysis.reliability.nulls import P_PASS, P_WEAK
from raybench.analysis.reliability.verdicts import verdict

NOT_ESTABLISHED = "not established"
CLASSES = ("signal", "stability", "validity")


def class_states(crit):
    """The evidence classes' states (imported here so that the simulations above run on any version)."""
    from raybench.analysis.reliability.verdicts import class_states as states

    return states(crit)


def _bound(n: int, rate: float) -> int:
    return int(stats.binom.ppf(0.999, n, rate))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(stats.spearmanr(a, b).statistic)


def _partial(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    """Spearman partial correlation of x and y given z."""
    rxy, rxz, ryz = _spearman(x, y), _spearman(x, z), _spearman(y, z)
    return (rxy - rxz * ryz) / np.sqrt((1 - rxz ** 2) * (1 - ryz ** 2))


def _panel(rng: np.random.Generator, noise: float) -> dict[str, float]:
    """20 trained members (4 steps x 5 k): GT rises with steps and k, the metric is GT plus `noise`."""
    steps, k = (a.ravel() for a in np.meshgrid([15.0, 40, 100, 250], [4.0, 8, 12, 16, 24], indexing="ij"))
    gt = np.log(steps) + 0.5 * np.log(k) + 0.1 * rng.normal(size=20)
    metric = gt + noise * rng.normal(size=20)
    return {"rho_gt_mcc": _spearman(metric, gt), "rho_gt_f1": _spearman(metric, gt) - 0.05, "n_gt": 20,
            "rho_gt_mcc_step": _partial(metric, gt, steps)}


def _perfect(rng: np.random.Generator, v: int) -> dict[str, float]:
    """A perfect metric on v variants x 3 seeds: cells, snapshots, a rise through training, tracking GT."""
    effect = np.arange(v, dtype=float)[:, None, None, None]
    m = cell_evidence(effect + 1e-3 * rng.normal(size=(v, 25, 3, 1)))
    steps = np.arange(7.0)
    m.update(snapshot_evidence(effect + 0.1 * np.log1p(steps) + 1e-3 * rng.normal(size=(v, 2, 3, 7)), steps))
    m.update(trend_evidence([np.linspace(0, 1, 9) + 1e-3 * rng.normal(size=9) for _ in range(v * 6)]))
    m.update(_panel(rng, 0.02))
    return m


def test_no_evidence_is_not_assessed():
    assert verdict({}) == ("not assessed", "no class has evidence")
    assert all(c.state == NOT_ASSESSED for c in assess({}).values())
    # winners alone never decide, and a reseed sd without a spread to compare is no evidence
    assert verdict({"winners": 1, "winners_p": 0.03, "n_seeds": 3, "reseed_mrd_1": 0.01})[0] == "not assessed"


def test_a_significant_decline_is_unreliable():
    got, rule = verdict({"rho_step": -0.7, "p_rise": 0.999, "p_decline": 0.0004, "share_cells": 0.4,
                         "share_cells_p": 1e-4})
    assert got == "unreliable" and "training" in rule


def test_ground_truth_fails_only_on_evidence_against():
    assert assess({"rho_gt_mcc": -0.6, "rho_gt_f1": 0.05, "n_gt": 24})["ground_truth"].state == "fail"
    assert assess({"rho_gt_mcc": 0.05, "rho_gt_f1": 0.9, "n_gt": 24})["ground_truth"].state == "pass"
    assert assess({"rho_gt_mcc": 0.5, "rho_gt_f1": 0.1, "n_gt": 24})["ground_truth"].state == "weak"  # p ~ 0.006
    assert assess({"rho_gt_mcc": 0.2, "rho_gt_f1": -0.1, "n_gt": 24})["ground_truth"].state == NOT_ESTABLISHED
    # tracking only through the training step, or a negative control tracking too: weak; as well: fail
    assert assess({"rho_gt_mcc": 0.9, "n_gt": 20, "rho_gt_mcc_step": 0.1})["ground_truth"].state == "weak"
    assert assess({"rho_gt_mcc": 0.9, "n_gt": 20, "out_tracks": 1.0, "rho_gt_out": 0.8})["ground_truth"].state == (
        "weak")
    got, rule = verdict({"rho_gt_mcc": 0.86, "n_gt": 20, "out_tracks": 1.0, "rho_gt_out": 0.91})
    assert got == "unreliable" and "negative control" in rule
    assert assess({"rho_gt_mcc": 0.9, "n_gt": 20, "saturated": True})["ground_truth"].state == "weak"


def test_pure_noise_reads_no_signal_and_weak_at_most_at_its_nominal_rate_over_200_grids():
    """Pure i.i.d. noise on the demo's shapes (6 models x 25 points x 3 seeds; 6 x 2 x 3 x 7 snapshots; 36 series
    of 9 snapshots; 24 panel members). Nothing may read better than weak; weak needs the leading signal
    criterion below p = 0.02 (nominal rate 0.02: at most 11 of 200); unreliable needs a significant decline or a
    significantly negative rho (each p < 0.02: at most 18 of 200 at rate 0.04)."""
    rng = np.random.default_rng(6)
    counts: dict[str, int] = {}
    for _ in range(200):
        m = cell_evidence(rng.normal(size=(6, 25, 3, 1)))
        m.update(snapshot_evidence(rng.normal(size=(6, 2, 3, 7)), np.arange(7.0)))
        m.update(trend_evidence(list(rng.normal(size=(36, 9)))))
        gt = rng.normal(size=(3, 24))
        m.update(rho_gt_mcc=_spearman(gt[0], gt[2]), rho_gt_f1=_spearman(gt[1], gt[2]), n_gt=24)
        got = verdict(m)[0]
        counts[got] = counts.get(got, 0) + 1
    assert set(counts) <= {"no signal", "weak", "unreliable"}, counts
    assert counts.get("weak", 0) <= _bound(200, P_WEAK), counts
    assert counts.get("unreliable", 0) <= _bound(200, 2 * P_WEAK), counts


@pytest.mark.parametrize("case", ["persistent run offsets", "model x seed effect across the 25 points"])
def test_signal_class_holds_its_nominal_rate_with_run_level_structure_over_300_grids(case):
    """No model effect. Snapshots: each run (model, point, seed) carries an offset of sd 1, its snapshots jitter
    with sd 1. Final cells: a (model, seed) effect of sd 0.35 shared by all 25 points (block-averaged seed variance
    4x that of independent points, as in the demo) under cell noise of sd 1. The signal class may pass at most at
    its nominal rate 0.001 (at most 3 of 300) and pass or read weak at most at 0.02 (at most 15 of 300)."""
    rng = np.random.default_rng(7)
    passes = weak = 0
    for _ in range(300):
        if case == "persistent run offsets":
            y = rng.normal(size=(6, 2, 3, 1)) + rng.normal(size=(6, 2, 3, 7))
            m = snapshot_evidence(y, np.arange(7.0))
        else:
            m = cell_evidence(0.35 * rng.normal(size=(6, 1, 3, 1)) + rng.normal(size=(6, 25, 3, 1)))
        states = [c.state for k, c in assess(m).items()
                  if k in ("share_snapshots", "share_cells", "rank_agreement", "snr") and c.state != NOT_ASSESSED]
        passes += all(s == "pass" for s in states)  # the class passes: every assessed signal criterion passes
        weak += states[0] != "fail" and not all(s == "pass" for s in states)  # its leading criterion not failing
    assert passes <= _bound(300, P_PASS), (passes, weak)
    assert passes + weak <= _bound(300, P_WEAK), (passes, weak)


@pytest.mark.parametrize("variants", [6, 4])
def test_a_perfect_metric_is_reliable_at_6x3_and_4x3(variants):
    """At 4 x 3 the exact rank-agreement null cannot reach 0.001 (a perfect agreement has p = 1/576): its smallest
    attainable p is the cut, so a perfect metric passes."""
    m = _perfect(np.random.default_rng(8), variants)
    crit = assess(m)
    assert crit["rank_agreement"].state == "pass", crit["rank_agreement"]
    if variants == 4:
        assert m["rank_p_min"] == pytest.approx(1 / 576) and m["rank_p"] == pytest.approx(1 / 576)
    assert class_states(crit) == {"signal": "pass", "stability": "pass", "validity": "pass"}
    assert verdict(m)[0] == "reliable"


def test_a_strong_model_effect_with_rho_040_over_20_members_is_not_unreliable():
    rng = np.random.default_rng(9)
    m = _perfect(rng, 6)
    gt = rng.normal(size=20)
    while True:  # a metric whose Spearman rho with ground truth is 0.40 over 20 members (one-sided p ~ 0.04)
        metric = 0.4 * gt + rng.normal(size=20)
        if round(_spearman(metric, gt), 2) == 0.40:
            break
    m.update(rho_gt_mcc=_spearman(metric, gt), rho_gt_f1=_spearman(metric, gt) - 0.1, n_gt=20, rho_gt_mcc_step=0.4)
    assert assess(m)["ground_truth"].state == NOT_ESTABLISHED
    got, rule = verdict(m)
    assert got == "weak" and "not established" in rule


@pytest.mark.parametrize("missing", list(CLASSES))
def test_each_class_missing_in_turn_is_incomplete_never_reliable(missing):
    m = _perfect(np.random.default_rng(10), 6)
    drop = {"signal": ("share_cells", "share_snapshots", "rank_rho", "snr"), "stability": ("rho_step",),
            "validity": ("n_gt",)}[missing]
    got, rule = verdict({k: v for k, v in m.items() if k not in drop})
    assert got == "incomplete" and f"{missing} not assessed" in rule and "raybench" in rule
    from raybench.analysis.reliability.verdicts import CLASSES as classes

    assert tuple(classes) == CLASSES


def test_cheap_evidence_alone_is_never_reliable():
    """What a plain grid assesses (final cells only): a perfect metric reads incomplete, naming stability and
    validity and the command that assesses them."""
    m = cell_evidence(np.arange(6.0)[:, None, None, None] + 1e-3 * np.random.default_rng(11).normal(size=(6, 25, 3,
                                                                                                          1)))
    got, rule = verdict(m)
    assert got == "incomplete" and "stability not assessed" in rule and "validity not assessed" in rule
    assert "raybench reliability --run-dir" in rule


@pytest.mark.parametrize("alone", [{"snr": 3.0, "snr_p": 1e-5},
                                   {"reseed_mrd_1": 0.01, "reseed_mrd_3": 0.005, "sd_variant": 0.1},
                                   {"rho_gt_mcc": 0.95, "rho_gt_f1": 0.9, "n_gt": 20}])
def test_one_criterion_alone_is_never_reliable(alone):
    got, rule = verdict(alone)
    assert got == "incomplete" and "not assessed" in rule


def _pairs(u: np.ndarray, e: np.ndarray) -> np.ndarray:
    """y[V, B, P, 1] of seed pairs (a, b): u_a + u_b + pair noise e, u [V, 1, S] shared across the points."""
    cols = [u[:, :, a] + u[:, :, b] for a, b in itertools.combinations(range(u.shape[2]), 2)]
    return (np.stack(cols, axis=2) + e)[..., None]


@pytest.mark.parametrize("pair_sd", [0.0, 1.0])
def test_reproducibilitys_pair_aware_null_holds_its_nominal_rate(pair_sd):
    """Reproducibility is scored on the 3 seed pairs of 3 seeds, so pairs share seed effects. No model effect, a
    seed effect of sd 1 shared across 25 points, pair noise of sd `pair_sd` (0: the worst case). Over 300 grids the
    pair-aware share p falls below 0.02 at most at rate 0.02 (<= 15) and below 0.001 at most at 0.001 (<= 3); the
    rank agreement's pair-aware null likewise. The same data read as independent seeds rejects far more often
    (what the old null did), so the test can see an inflated null."""
    rng = np.random.default_rng(12)
    p_aware, p_rank, p_naive = [], [], []
    for _ in range(300):
        y = _pairs(rng.normal(size=(6, 1, 3)), pair_sd * rng.normal(size=(6, 25, 3)))
        m = cell_evidence(y, pairs=True)
        p_aware.append(m["share_cells_p"])
        p_rank.append(m["rank_p"])
        p_naive.append(cell_evidence(y)["share_cells_p"])
    p_aware, p_rank, p_naive = map(np.array, (p_aware, p_rank, p_naive))
    assert (p_aware < P_WEAK).sum() <= _bound(300, P_WEAK) and (p_aware < P_PASS).sum() <= _bound(300, P_PASS)
    assert (p_rank < P_WEAK).sum() <= _bound(300, P_WEAK)
    if pair_sd == 0.0:
        assert (p_naive < P_WEAK).sum() > 3 * _bound(300, P_WEAK)


def _grid(rng: np.random.Generator, model_step: float, e_effect: float, noise: float) -> pd.DataFrame:
    rows = [(f"m{m}", q, e, s, model_step * m + e_effect * i + noise * rng.normal())
            for m, q, (i, e), s in itertools.product(range(6), (0.0, 0.25, 0.5, 0.75, 1.0),
                                                     enumerate((1, 4, 8, 16, 32)), (1, 2, 3))]
    return pd.DataFrame(rows, columns=["model", "q", "expansion", "seed", "value"])


@pytest.mark.parametrize("seed", range(3))
def test_a_small_model_effect_under_large_block_effects_is_seen(seed):
    y, models = design(_grid(np.random.default_rng(seed), 0.01, 0.3, 0.05))
    assert y.shape == (6, 25, 3, 1) and models[0] == "m0"
    ev = cell_evidence(y)
    assert ev["share_cells_p"] < 0.02
    assert verdict(ev)[0] in ("incomplete", "weak")
