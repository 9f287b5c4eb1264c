"""One fold assignment for every variable, dealt over all patients before any group is chosen, and groups kept or
left out by the per-fold support rule with the cause named (docs/protocol.md §12.1). Own small cohorts."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from provenance_fixtures import planted_inputs

from raybench.analysis.provenance_audit import groups as gp
from raybench.analysis.provenance_audit.audit import SPLITS, Inputs, outer_folds, run_audit
from raybench.core.config import ProvenanceConfig

CFG = ProvenanceConfig(folds=3, ranks=(1,), random_controls=5, draws=30, min_cell_records=5, min_group_records=8)


def test_two_variables_of_one_run_get_identical_fold_assignments():
    inp = planted_inputs(n_patients=400, assoc=0.5, test_assoc=None, d=8, seed=11)
    device = {s: inp.u[s].copy() for s in SPLITS}
    for s in SPLITS:
        device[s][:4] = "C"  # a device with a handful of records: left out of the device audit, not of the other
    site = {s: np.where(inp.patients[s].astype(int) % 3 == 0, "north", "south") for s in SPLITS}
    a = run_audit(replace(inp, u=device), CFG, (1,))
    b = run_audit(replace(inp, u=site, variable="site"), CFG, (2,))
    assert "C: " in a.verdict["dropped"] and a.verdict["verdict"] != "not audited"
    assert b.verdict["groups_dropped"] == 0
    expected = outer_folds(inp.patients, 3, CFG.seed)  # dealt over every patient of the run
    for s in SPLITS:
        np.testing.assert_array_equal(a.fold_ids[s], expected[s])
        np.testing.assert_array_equal(b.fold_ids[s], expected[s])
    assert a.verdict["fold_hash"] == b.verdict["fold_hash"] == a.recover["fold_hash"]
    # dropping one patient's records moves no other patient
    fewer = {s: inp.patients[s][1:] if s == "train" else inp.patients[s] for s in SPLITS}
    again = outer_folds(fewer, 3, CFG.seed)
    np.testing.assert_array_equal(again["train"], expected["train"][1:])


def _largest_device_inputs(seed: int = 0) -> Inputs:
    """Devices A and B (balanced diagnosis) and BIG, the largest, whose records are all NORM but two patients'."""
    rng = np.random.default_rng(seed)
    dev = np.array(["A"] * 150 + ["B"] * 150 + ["BIG"] * 400)
    y = np.r_[rng.integers(0, 2, 300), np.ones(400, dtype=np.int64)]
    y[[300, 301]] = 0
    split = np.array(SPLITS)[rng.choice(3, len(dev), p=[0.6, 0.2, 0.2])]
    x = rng.standard_normal((len(dev), 4)) + y[:, None]
    by = {s: split == s for s in SPLITS}
    return Inputs({s: x[m] for s, m in by.items()}, {s: dev[m] for s, m in by.items()}, {s: y[m] for s, m in
                  by.items()}, {s: np.arange(len(dev))[m].astype(str) for s, m in by.items()})


def test_the_largest_device_left_out_is_named_with_its_per_fold_cause():
    inp = _largest_device_inputs()
    res = run_audit(inp, replace(CFG, folds=5), (3,))
    note = res.verdict["dropped"]
    found = re.fullmatch(r"BIG: (\d) non-NORM records in test fold (\d) \(minimum 5\)", note)
    assert found, note
    assert res.verdict["groups"] == 2 and res.verdict["verdict"] != "not audited"  # A and B are still audited
    in_fold = np.concatenate([(res.fold_ids[s] == int(found[2]) - 1) & (inp.u[s] == "BIG") for s in SPLITS])
    y = np.concatenate([inp.y[s] for s in SPLITS])
    assert in_fold.sum() > 50 and (y[in_fold] == 0).sum() == int(found[1])  # the cause is true of that fold


def test_the_support_rule_names_the_failing_set_and_fold():
    roles = gp.Roles.of(np.repeat([0, 1, 2], 4), (12, 0, 0))
    rule = gp.Rule(min_records=1, min_cell=2, target="MI")
    member = np.ones(12, dtype=bool)
    y = np.r_[[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]  # fold 1 trains on fold 3 alone: no non-MI record
    assert rule.cause(member, y, roles) == "0 non-MI records in the training set of fold 1 (minimum 2)"
    y = np.r_[[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert rule.cause(member, y, roles) == "1 non-MI records in test fold 1 (minimum 2)"
    y = np.r_[[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert rule.cause(member, y, roles) is None
    assert gp.Rule(5, 2, "MI").cause(member, y, roles) == "4 records in test fold 1 (minimum 5)"
    split = gp.Roles.of(None, (4, 0, 2))  # the run's own split: train, val, test sizes
    assert rule.cause(np.ones(6, dtype=bool), np.array([1, 1, 0, 0, 1, 1]), split) == \
        "0 non-MI records in the test split (minimum 2)"


def test_records_without_a_value_are_no_group():
    values = np.array(["A", "nan", "", "B", "None"])
    np.testing.assert_array_equal(gp.missing(values), [False, True, True, False, True])
    sel = gp.select_groups(values, None, np.zeros(5, dtype=np.int64), gp.Roles.of(None, (5, 0, 0)),
                           gp.Rule(0, 0, "NORM"))
    assert "nan" not in sel.groups and "" not in sel.groups and sel.notes["(no value)"] == "3 records without a value"


@pytest.mark.slow  # builds the demo's synthetic cohort and manifest (about 10 s of CPU)
def test_the_demo_cohorts_largest_device_is_audited_or_named_with_its_per_fold_cause(tmp_path):
    from raybench.analysis.provenance_audit.audit import selection
    from raybench.cohorts.diagnostics import COLUMN, target_labels
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.core.config import CohortConfig

    demo = CohortConfig()  # `raybench grid`'s cohort: 1500 records, 500 patients
    generate_synth_cohort(tmp_path / "cohort", demo.records, demo.patients, demo.seed)
    build_synth_manifest(tmp_path / "cohort", tmp_path / "manifest", concepts="none")
    man, _ = load_manifest(tmp_path / "manifest")
    by = {s: man[man.split == s] for s in SPLITS}
    u = {s: by[s].device.astype(str).to_numpy() for s in SPLITS}
    pat = {s: by[s].patient_id.astype(str).to_numpy() for s in SPLITS}
    inp = Inputs({s: np.zeros((len(u[s]), 1)) for s in SPLITS}, u,
                 {s: target_labels(by[s][COLUMN].astype(str).to_numpy(), "NORM") for s in SPLITS}, pat)
    cfg = ProvenanceConfig()
    sel = selection(inp, outer_folds(pat, cfg.folds, cfg.seed), cfg)
    largest = man[man.split == "train"].device.astype(str).value_counts().index[0]  # 332 train records
    if sel.groups.get(largest) != largest:
        assert re.match(r"\d+ (non-)?NORM records in (test fold \d|the training set of fold \d)|\d+ records in test "
                        r"fold \d", sel.notes[largest]), sel.notes[largest]
