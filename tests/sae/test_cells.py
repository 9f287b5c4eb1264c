"""The cell grid: 450 primary + 90 sensitivity cells in 75 blocks, stable ids, stacks of seeds."""

from __future__ import annotations

from dataclasses import replace

from raybench.core.config import MODELS, ModelDims, audited_depths, audited_layers, paper_protocol
from raybench.sae.cells import build_cells, group_stacks


def _dims():
    return {m: ModelDims(n_layers=6 if m == "csfm" else 12, d=768) for m in MODELS}


def test_grid_counts_and_k_rule():
    cells = build_cells(paper_protocol(), _dims())
    primary = [c for c in cells if c.arm == "primary"]
    sens = [c for c in cells if c.arm == "sensitivity"]
    assert len(primary) == 450 and len(sens) == 90
    assert {c.k for c in primary} == {96}
    assert sorted({c.k for c in sens}) == [12, 48, 96, 192, 384]
    assert len({c.cell_id for c in cells}) == len(cells)
    blocks = {(c.q, c.expansion, c.seed) for c in primary}
    assert len(blocks) == 75
    stacks = group_stacks(cells)
    assert len(stacks) == 180 and all(len(s) == 3 for s in stacks.values())


def test_realized_depth_and_layers():
    cells = build_cells(paper_protocol(), _dims())
    csfm = {c.q: (c.layer, c.realized_depth) for c in cells if c.model == "csfm"}
    assert csfm[0.5] == (3, 3 / 5) and csfm[1.0] == (5, 1.0)
    assert audited_layers(paper_protocol(), 12) == [0, 3, 6, 8, 11]
    # the sensitivity depth (0.75 in the paper) is one of the primary depths: held once
    assert audited_depths(paper_protocol()) == [0.0, 0.25, 0.5, 0.75, 1.0]
    p = paper_protocol()
    extra = replace(p, grid=replace(p.grid, depths=(0.0, 1.0), sensitivity_depth=0.5))
    assert audited_depths(extra) == [0.0, 0.5, 1.0] and audited_layers(extra, 12) == [0, 6, 11]
    assert audited_depths(replace(p, grid=replace(p.grid, depths=(1.0,), sensitivity_depth=None))) == [1.0]
