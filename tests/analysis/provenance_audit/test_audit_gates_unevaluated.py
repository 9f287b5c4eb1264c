"""A gate that was not evaluated never counts as passed, and "no reliance" says when the task itself moves with the
association (docs/protocol.md §12.5). Own planted cohorts (16 or 4 dimensions, the run's own split, 20 controls)."""

from __future__ import annotations

from dataclasses import replace

from provenance_fixtures import age_confounded_inputs, diagnosis_aligned_inputs

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit.audit import run_audit
from raybench.analysis.provenance_audit.verdict import CERTIFIED, NO_RELIANCE, NOT_ATTRIBUTABLE, NOT_EXCLUDED
from raybench.core.config import ProvenanceConfig

CFG = ProvenanceConfig(folds=1, ranks=(1,), random_controls=20, draws=100)


def test_an_age_confound_without_metadata_is_never_certified_and_names_the_missing_gate():
    v = run_audit(age_confounded_inputs(seed=3, meta=False), CFG, (1,)).verdict
    assert v["g_ci_low"] > 0, v["reason"]  # the exposed head does lean on the (age-borne) association
    assert CERTIFIED not in v["verdict"]
    assert v["verdict"] == NOT_EXCLUDED == "reliance - confounding by age/sex/year not excluded", v["reason"]
    assert f"{gt.METADATA_GATE} not evaluated" in v["reason"]
    # with the metadata the same cohort is not attributable to the device
    v = run_audit(age_confounded_inputs(seed=3), CFG, (1,)).verdict
    assert v["verdict"] == NOT_ATTRIBUTABLE and gt.METADATA_GATE in v["reason"], v["reason"]


def test_an_artifact_along_the_diagnosis_direction_reads_no_reliance_and_task_sensitive():
    v = run_audit(diagnosis_aligned_inputs(seed=4), replace(CFG, min_cell_records=20), (2,)).verdict
    assert v["verdict"] == f"{NO_RELIANCE}; task sensitive to device (both heads degrade)", v["reason"]
    for head in ("exposed", "control"):  # both drops shown, each beyond epsilon
        assert v[f"drop_{head}_ci_low"] > CFG.epsilon
        assert v[f"drop_{head}"] == v[f"auroc_{head}_aligned"] - v[f"auroc_{head}_reversed"]
        assert f"{head} head AUROC {v[f'auroc_{head}_aligned']:.3f} aligned" in v["reason"]
