"""Which cells the heavy parts of the audit revisit: a stratified sample of (depth, E) points, every model at
each, so that model orders can be compared across evaluation seeds (docs/protocol.md §11.1)."""

from __future__ import annotations

import pandas as pd

from raybench.core.config import Protocol


def sample_points(protocol: Protocol, n_points: int) -> list[tuple[float, int]]:
    """n_points (q, E) pairs spread over the grid: depths and expansions each walked evenly, offset so the points
    differ in both (deterministic)."""
    depths = sorted(round(float(q), 6) for q in protocol.grid.depths)
    exps = sorted(int(e) for e in protocol.grid.expansions)
    n = max(1, min(n_points, len(depths) * len(exps)))
    points: list[tuple[float, int]] = []
    for i in range(n):
        q = depths[((2 * i + 1) * len(depths)) // (2 * n)]
        e = exps[((2 * i + 1) * len(exps)) // (2 * n) if n > 1 else len(exps) // 2]
        if (q, e) not in points:
            points.append((q, e))
    return points


def sampled_stacks(ok: pd.DataFrame, points: list[tuple[float, int]]) -> list[pd.DataFrame]:
    """The primary-arm stacks (all ok seeds of one model x depth x E) at the sampled points, in grid order."""
    prim = ok[ok.arm == "primary"]
    out = []
    for (_m, q, e), sub in prim.groupby(["model", "q", "expansion"], sort=False):
        if (round(float(q), 6), int(e)) in points:
            out.append(sub.sort_values("seed"))
    return out
