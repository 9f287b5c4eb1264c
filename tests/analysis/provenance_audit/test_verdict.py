"""Verify: the verdict ladder from the gates and the removal at the fixed rank."""

from __future__ import annotations

import pytest

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit.verdict import (
    CERTIFIED,
    INCONCLUSIVE,
    NEGATIVE,
    NO_RELIANCE,
    NOT_ATTRIBUTABLE,
    NOT_EXCLUDED,
    REFUSED_CONTROLS,
    REFUSED_UTILITY,
    Removal,
    decide,
)

EPS = DELTA = 0.01


def gate(name: str, est: float, lo: float, hi: float, passed: bool | None = True) -> gt.Gate:
    return gt.Gate(name, "", est, lo, hi, passed)


def gates(g: tuple[float, float, float], **failing: bool | None) -> dict[str, gt.Gate]:
    est, lo, hi = g
    out = {gt.G_GATE: gate(gt.G_GATE, est, lo, hi, est >= EPS and lo > 0)}
    for name in gt.VALIDITY:
        out[name] = gate(name, 0.5, 0.4, 0.6, failing.get(name, True))
    return out


def removal(reduction_lo: float = 0.02, control_max: float = 0.0, utility_low: float = -0.002) -> Removal:
    return Removal(1, gate(gt.REDUCE_GATE, 0.05, reduction_lo, 0.08, reduction_lo > 0), control_max, utility_low)


@pytest.mark.parametrize(("g", "expected"), [
    ((0.001, -0.005, 0.008), NO_RELIANCE),
    ((-0.065, -0.08, -0.05), NEGATIVE),
    ((-0.02, -0.04, -0.003), NEGATIVE),
    ((0.008, 0.004, 0.05), INCONCLUSIVE),
    ((0.02, -0.003, 0.05), INCONCLUSIVE),
    ((-0.01, -0.04, 0.02), INCONCLUSIVE),
])
def test_the_g_interval_alone(g, expected):
    verdict, reason = decide(gates(g), removal(), EPS, DELTA)
    assert verdict == expected, reason


def test_a_confidently_negative_g_is_not_inconclusive():
    verdict, reason = decide(gates((-0.065, -0.08, -0.05)), removal(), EPS, DELTA)
    assert verdict == NEGATIVE != INCONCLUSIVE and "[-0.080, -0.050]" in reason


@pytest.mark.parametrize(("rm", "expected", "words"), [
    (removal(), CERTIFIED, "beats every random control"),
    (removal(control_max=0.06), REFUSED_CONTROLS, "random controls' largest 0.060"),
    (removal(reduction_lo=-0.01), REFUSED_CONTROLS, "G reduction 0.050 [-0.010"),
    (removal(utility_low=-0.02), REFUSED_UTILITY, "lower bound -0.020 <= -0.01"),
    (None, REFUSED_CONTROLS, "no removal was possible"),
])
def test_the_remedy(rm, expected, words):
    verdict, reason = decide(gates((0.05, 0.03, 0.07)), rm, EPS, DELTA)
    assert verdict == expected and words in reason, reason


def test_a_failed_validity_gate_is_not_attributable_and_an_unevaluated_one_is_never_a_pass():
    verdict, reason = decide(gates((0.05, 0.03, 0.07), **{gt.METADATA_GATE: False}), removal(), EPS, DELTA)
    assert verdict == NOT_ATTRIBUTABLE and gt.METADATA_GATE in reason
    verdict, reason = decide(gates((0.05, 0.03, 0.07), **{gt.METADATA_GATE: None}), removal(), EPS, DELTA)
    assert verdict == NOT_EXCLUDED == "reliance - confounding by age/sex/year not excluded", reason
    assert f"{gt.METADATA_GATE} not evaluated" in reason and repr(CERTIFIED) in reason  # what the remedy would be
    verdict, _ = decide(gates((0.05, 0.03, 0.07), **{gt.CONTROL_GATE: None}), removal(), EPS, DELTA)
    assert verdict == f"reliance - {gt.CONTROL_GATE} not evaluated"
