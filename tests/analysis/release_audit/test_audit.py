"""Release audit: counts, exact missing/failed cells, blocks, layer and k realization, run.yaml protocol."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from fake_run import write_fake_run

from raybench.analysis.completeness import cell_label, expected_cells
from raybench.analysis.release_audit.run import audit_cells, release_audit
from raybench.core.config import GridProtocol, Protocol, demo_protocol
from raybench.core.paths import RunLayout
from raybench.core.run_state import run_protocol


def _tiny() -> Protocol:
    """2 models x 2 depths x 1 E x 2 seeds = 8 cells in 4 blocks; sensitivity at q=1: 2 x 1 x 2 = 4 cells."""
    grid = GridProtocol(models=("a", "b"), depths=(0.0, 1.0), expansions=(4,), seeds=(1, 2), sensitivity_depth=1.0)
    return dataclasses.replace(demo_protocol(), grid=grid)


def test_complete_demo_run_passes(tmp_path):
    write_fake_run(tmp_path)
    result = release_audit(tmp_path, demo_protocol())
    assert (result.primary.ok_cells, result.primary.expected_cells) == (450, 450)
    assert (result.primary.complete_blocks, result.primary.expected_blocks) == (75, 75)
    assert (result.sensitivity.ok_cells, result.sensitivity.expected_blocks) == (90, 15)
    assert result.summary.startswith("450/450 cells, 75/75 blocks")
    assert result.passed and not result.problems
    saved = json.loads((RunLayout.at(tmp_path).tables_dir / "audit.json").read_text())
    assert saved["passed"] is True and saved["summary"] == result.summary


def test_names_exactly_the_missing_and_failed_cells(tmp_path):
    p = demo_protocol()
    gone = [("ecg_fm", 0.25, 8, 4312, "primary"), ("st_mem", 0.25, 8, 4312, "primary"),
            ("csfm", 1.0, 32, 4313, "primary"), ("hubert_ecg", 0.5, 4, 4311, "sensitivity")]
    bad = {("ecg_jepa", 0.0, 1, 4311, "primary"): "CUDA out of memory"}
    write_fake_run(tmp_path, drop=gone, fail=bad)
    r = release_audit(tmp_path, p)
    assert sorted(r.primary.missing) == sorted(cell_label(*k) for k in gone[:3])
    assert r.sensitivity.missing == [cell_label(*gone[3])]
    assert r.primary.failed == [{"cell": cell_label(*next(iter(bad))), "cell_id": "ecg_jepa-q000-E01-primary-s4311",
                                 "reason": "CUDA out of memory"}]
    # failed cells stay in the denominator; the two drops at (0.25, 8, 4312) share one block
    assert (r.primary.ok_cells, r.primary.expected_cells) == (446, 450)
    assert (r.primary.complete_blocks, r.primary.expected_blocks) == (72, 75)
    blocks = {b["block"]: b for b in r.primary.incomplete_blocks}
    assert blocks["q0.25/E8/s4312"]["missing"] == ["ecg_fm", "st_mem"]
    assert blocks["q0.00/E1/s4311"]["failed"] == ["ecg_jepa"]
    assert (r.sensitivity.ok_cells, r.sensitivity.complete_blocks) == (89, 14)
    assert not r.passed and r.summary.startswith("446/450 cells, 72/75 blocks") and r.summary.endswith("INCOMPLETE")


def test_hand_checked_tiny_grid():
    p = _tiny()
    keys = expected_cells(p.grid)
    assert len(keys) == 12 and sum(k[4] == "sensitivity" for k in keys) == 4
    rows = [{"model": m, "q": q, "expansion": e, "seed": s, "arm": arm, "status": "ok", "n_layers": 5,
             "layer": 0 if q == 0 else 4, "n_latents": 16 * e, "k": 2 if arm == "primary" else 1}
            for m, q, e, s, arm in keys if not (m == "b" and q == 0.0 and s == 2)]
    rows[0]["status"] = "failed: diverged"
    r = audit_cells(pd.DataFrame(rows), p)
    assert (r.primary.ok_cells, r.primary.expected_cells, r.primary.complete_blocks) == (6, 8, 2)
    assert r.primary.missing == ["b-q000-E04-primary-s2"]
    assert r.primary.failed[0]["reason"] == "diverged" and r.sensitivity.complete
    assert not r.problems


def test_layer_k_duplicates_and_unexpected_are_problems():
    p = _tiny()
    base = {"expansion": 4, "seed": 1, "status": "ok", "n_layers": 5, "n_latents": 64}
    rows = [
        {**base, "model": "a", "q": 1.0, "arm": "primary", "layer": 3, "k": 2, "cell_id": "wrong-layer"},
        {**base, "model": "b", "q": 1.0, "arm": "primary", "layer": 4, "k": 8, "cell_id": "wrong-k"},
        {**base, "model": "b", "q": 1.0, "arm": "primary", "layer": 4, "k": 2, "cell_id": "dup"},
        {**base, "model": "zz", "q": 1.0, "arm": "primary", "layer": 4, "k": 2, "cell_id": "stray"},
    ]
    probs = audit_cells(pd.DataFrame(rows), p).problems
    assert any(s.startswith("wrong-layer: depth q=1 with 5 layers must realize as layer 4") for s in probs)
    assert any(s.startswith("wrong-k: primary arm with N=64 (d=16) needs k=2, table has k=8") for s in probs)
    assert any("two ok rows for b-q100-E04-primary-s1" in s for s in probs)
    assert any(s.startswith("unexpected cell stray") for s in probs)
    assert len(probs) == 4


def test_retried_cell_counts_once_ok_row_wins():
    p = _tiny()
    rows = [{"model": m, "q": q, "expansion": e, "seed": s, "arm": arm, "status": "ok", "n_layers": 5,
             "layer": 0 if q == 0 else 4, "n_latents": 16 * e, "k": 2 if arm == "primary" else 1}
            for m, q, e, s, arm in expected_cells(p.grid)]
    retry = {**rows[3], "status": "failed: preempted"}
    for table in ([retry, *rows], [*rows, retry]):
        r = audit_cells(pd.DataFrame(table), p)
        assert r.passed and r.primary.ok_cells == 8 and not r.problems
        assert len(r.notes) == 1 and "preempted" in r.notes[0]


def test_cell_label_is_the_sae_stage_cell_id():
    from raybench.sae.cells import CellSpec

    for model, q, e, seed, arm in [("ecg_fm", 0.25, 8, 4312, "primary"), ("st_mem", 1.0, 32, 4311, "sensitivity"),
                                   ("x", 0.0, 1, 7, "primary")]:
        spec = CellSpec(model, q, 3, 12, 768, arm, e, 768 * e, 96, seed)
        assert cell_label(model, q, e, seed, arm) == spec.cell_id


def test_no_cells_table_counts_everything_missing(tmp_path):
    r = release_audit(tmp_path, _tiny())
    assert r.primary.ok_cells == 0 and len(r.primary.missing) == 8 and r.primary.complete_blocks == 0


def test_bad_schema_is_a_clear_error():
    with pytest.raises(ValueError, match="lacks column"):
        audit_cells(pd.DataFrame({"model": ["a"]}), _tiny())


def test_protocol_from_run_yaml(tmp_path):
    assert run_protocol(tmp_path) is None
    write_fake_run(tmp_path, models=("x", "y"))
    p = run_protocol(tmp_path)
    assert p.grid.models == ("x", "y") and p.name == "demo"
    r = release_audit(tmp_path, p)
    assert r.passed and r.primary.expected_cells == 2 * 5 * 5 * 3
