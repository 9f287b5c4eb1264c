"""The three planted scenarios give the three verdicts (docs/protocol.md §12), on planted embeddings where the
truth is known: a device direction the encoder carries, a diagnosis direction, and their association."""

from __future__ import annotations

import numpy as np
from provenance_fixtures import planted_inputs

from raybench.analysis.provenance_audit.audit import run_audit
from raybench.analysis.provenance_audit.verdict import CERTIFIED, NO_RELIANCE, NOT_AUDITED, REFUSED
from raybench.config import ProvenanceConfig

CFG = ProvenanceConfig()


def test_planted_shortcut_is_recovered_relied_on_and_removal_certified():
    # development data: strong device-diagnosis association; deployment (test) data: weaker
    res = run_audit(planted_inputs(assoc=0.95, test_assoc=0.5), CFG, (1,))
    v = res.verdict
    assert res.recover["lpi_bits"] > 0.3 and res.recover["ci_low"] > 0.2  # the device is decodable
    assert v["g_ci_low"] > CFG.epsilon  # G clearly > 0
    assert v["verdict"] == CERTIFIED and v["certified_rank"] == 1, v["reason"]
    assert v["g_after_p1"] < 0.3 * v["g"]  # the removal takes most of the excess vulnerability away
    assert v["g_reduction_p1"] > v["control_max_reduction_p1"]
    assert v["utility_change_p1_ci_low"] > -CFG.delta
    stages = {r["stage"] for r in res.stress}
    assert stages == {"before", "removed_p1", "removed_p2"}
    assert len(res.controls) == CFG.random_controls * len(CFG.ranks)
    assert max(c["energy_rel_error"] for c in res.controls) < 1e-2  # controls matched in removed energy


def test_no_association_means_no_reliance():
    res = run_audit(planted_inputs(assoc=0.0, test_assoc=0.0), CFG, (2,))
    assert res.recover["lpi_bits"] > 0.3  # decodable, yet not relied on: decodability is not reliance
    assert res.verdict["verdict"] == NO_RELIANCE, res.verdict["reason"]
    assert -CFG.epsilon <= res.verdict["g_ci_low"] and res.verdict["g_ci_high"] <= CFG.epsilon


def test_artifact_aligned_with_the_task_signal_refuses_the_remedy():
    # the diagnosis' own signal is weak and it also shows in the device direction
    res = run_audit(planted_inputs(assoc=0.95, test_assoc=0.5, signal=1.5, aligned=2.5), CFG, (3,))
    v = res.verdict
    assert v["g_ci_low"] > CFG.epsilon
    assert v["verdict"] == REFUSED, v["reason"]
    assert "utility loss beyond delta" in v["reason"]
    assert v["utility_change_p1_ci_low"] < -CFG.delta


def test_a_single_provenance_group_is_not_audited_and_says_why():
    inp = planted_inputs(n_patients=300)
    for s in inp.u:
        inp.u[s][:] = "A"
        inp.u[s][:3] = "B"  # a device with 3 records per split: too small
    res = run_audit(inp, CFG, (4,))
    assert res.verdict["verdict"] == NOT_AUDITED
    assert "too small to audit" in res.verdict["reason"] and "B: 3 train" in res.verdict["reason"]
    assert not res.recover and not res.stress


def test_the_audit_is_deterministic():
    a = run_audit(planted_inputs(n_patients=300, seed=5), CFG, (9,))
    b = run_audit(planted_inputs(n_patients=300, seed=5), CFG, (9,))
    assert a.verdict == b.verdict or all(
        (a.verdict[k] == b.verdict[k]) or (np.isnan(a.verdict[k]) and np.isnan(b.verdict[k])) for k in a.verdict)
