"""Devices nested in sites (docs/protocol.md §12.1, §12.5): a device audited within its site (`device|site`), and a
pooled device verdict of reliance that stands only when it holds within site. Each test plants its own cohort
(nested_inputs: 16 dimensions, one record per patient, the run's own split, 20 controls: a few seconds each)."""

from __future__ import annotations

from dataclasses import replace

from provenance_fixtures import nested_inputs

from raybench.analysis.provenance_audit.audit import run_audit
from raybench.analysis.provenance_audit.run import apply_strata
from raybench.analysis.provenance_audit.verdict import NO_RELIANCE
from raybench.core.config import ProvenanceConfig

CFG = ProvenanceConfig(folds=1, ranks=(1,), random_controls=20, draws=100, min_cell_records=20)


def audit_rows(inp, labels, cfg=CFG) -> dict[str, dict]:
    """The verdict rows of device, site and device|site on one embedding, after the within-site rule."""
    rows = []
    for i, var in enumerate(("device", "site", "device|site")):
        col, _, stratum = var.partition("|")
        res = run_audit(replace(inp, u=labels[col], strata=labels[stratum] if stratum else None, variable=var),
                        cfg, (i,))
        rows.append({"model": "m", "layer": 0, "variable": var, **res.verdict})
    return {r["variable"]: r for r in apply_strata(rows)}


def test_a_device_nested_in_a_site_tied_to_the_diagnosis_is_not_read_as_device_reliance():
    # no device artifact and no device-diagnosis association within a site: only the site carries the diagnosis
    rows = audit_rows(*nested_inputs(seed=1))
    assert not rows["device"]["verdict"].startswith("reliance"), rows["device"]["reason"]
    assert rows["device|site"]["verdict"] == NO_RELIANCE, rows["device|site"]["reason"]
    assert rows["device|site"]["groups"] == 4 and rows["device|site"]["stratified_by"] == "yes"
    if rows["device"]["verdict"].startswith("confounded"):  # the pooled audit did see a G: it names the site audit
        assert rows["device"]["verdict"] == "confounded with site" and "(device|site)" in rows["device"]["reason"]


def test_a_real_device_artifact_inside_one_site_reads_reliance_within_site():
    inp, labels = nested_inputs(seed=2, device_assoc=0.6, test_device_assoc=0.1, device_artifact=3.0)
    rows = audit_rows(inp, labels)
    within = rows["device|site"]
    assert within["verdict"].startswith("reliance"), within["reason"]
    assert within["g_ci_low"] > CFG.epsilon
    assert within["kappa_pair"] == "site0/B vs site0/A" and within["kappa"] > 3  # the association sits in site 0
    if rows["device"]["verdict"].startswith("reliance"):  # the pooled row stands, and says it holds within site
        assert "holds within site" in rows["device"]["reason"]
