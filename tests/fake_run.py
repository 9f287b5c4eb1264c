"""A small deterministic fake run folder: every analysis table with the real schemas, plus run.yaml.

Used by the figure, report, audit and notebook tests (and any other test that needs finished tables
without training anything). Values are plausible shapes from a fixed RNG, not results.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from raybench.analysis.completeness import cell_label, expected_cells
from raybench.analysis.published import model_values
from raybench.core.atomic import write_table, write_text
from raybench.core.config import GridProtocol, Protocol, demo_run, k_for, layer_for_depth, to_dict
from raybench.core.paths import RunLayout

N_LAYERS = {"csfm": 12, "cardiac_fm": 12, "ecg_fm": 12, "ecg_jepa": 8, "hubert_ecg": 12, "st_mem": 12}
D_MODEL = 768
METRICS = ("reconstruction", "accessibility", "coverage")
FAMILIES = {"RATE_RHYTHM": 5, "INTERVAL": 8, "AXIS": 4, "AMPLITUDE": 17, "ST_T": 15}
PUBLISHED = model_values("table_s1", "auc")  # docs/protocol.md §10.1, only to fill the fake `published` column
TABLES = ("cells", "profiles", "contrasts", "curves", "rank_stability", "crossed", "depth_scale", "sensitivity",
          "reproducibility", "concepts", "arm", "missing",
          # the paper analyses (raybench.analysis.atlas.paper_analyses)
          "fidelity_gate", "fidelity_gate_models", "crossed_contrasts", "arm_rank_agreement", "arm_differences",
          "arm_auc_differences", "reproducibility_pairs", "reproducibility_auc", "dead_fraction", "dead_fraction_auc",
          "dead_fraction_rank_stability")
Key = tuple[str, float, int, int, str]


def write_fake_run(
    root: str | Path,
    protocol: Protocol | None = None,
    *,
    models: Iterable[str] | None = None,
    cohort_kind: str = "synth",
    drop: Iterable[Key] = (),
    fail: dict[Key, str] | None = None,
    tables: Iterable[str] = TABLES,
    secondary: bool = False,
    run_yaml: bool = True,
    seed: int = 0,
    cell_folders: bool = True,
) -> Path:
    """Write a finished-looking run under `root` (demo protocol by default) and return `root`.

    drop: grid keys (model, q, E, seed, arm) with no row in cells; fail: key -> reason (status "failed: reason").
    cell_folders: with the cells table, a placeholder folder per ok cell (the files the commands check exist,
    raybench.analysis.run_folder; their content is not an SAE).
    """
    root = Path(root)
    cfg = demo_run(str(root))
    protocol = protocol or cfg.protocol
    if models is not None:
        protocol = dataclasses.replace(protocol, grid=dataclasses.replace(protocol.grid, models=tuple(models)))
    cfg = dataclasses.replace(cfg, protocol=protocol)
    layout = RunLayout.at(root)
    rng = np.random.default_rng(seed)
    grid = protocol.grid
    models = list(grid.models)
    skill = {m: rng.uniform(0.25, 0.35) for m in models}
    fail = fail or {}
    drop = set(drop)

    out: dict[str, pd.DataFrame] = {}
    out["cells"] = _cells(protocol, skill, rng, drop, fail)
    out["depth_scale"] = _depth_scale(out["cells"])
    out["curves"] = _curves(out["depth_scale"], grid)
    out["profiles"] = _profiles(out["curves"], grid, cohort_kind)
    out["crossed"] = out["profiles"][["model", "metric", "auc", "ci_low", "ci_high", "rank1_prob"]].assign(
        ci_low=lambda d: d.ci_low - 0.01, ci_high=lambda d: d.ci_high + 0.01)
    out["contrasts"] = _contrasts(out["profiles"])
    out["rank_stability"] = _rank_stability(grid, rng)
    out["sensitivity"] = _sensitivity(out["depth_scale"], grid)
    out["reproducibility"] = _reproducibility(grid, rng)
    out["concepts"] = _concepts(models, skill, rng)
    out["arm"] = _arm(out["cells"])
    out["missing"] = pd.DataFrame(
        [(k[4], k[0], k[1], k[2], k[3], "" if k in drop else cell_label(*k),
          "no row in cells table" if k in drop else f"failed: {fail[k]}")
         for k in expected_cells(grid) if k in drop or k in fail],
        columns=["arm", "model", "q", "expansion", "seed", "cell_id", "reason"])
    out.update(_paper_tables(protocol, out, rng, cohort_kind))
    for name in tables:
        write_table(layout.tables_dir / f"{name}.parquet", out[name])
    if cell_folders and "cells" in tables:
        _placeholder_cells(layout, out["cells"])
    if secondary:
        write_table(layout.tables_dir / "calibration.parquet", pd.DataFrame(
            {"model": models, "ridge_dense": rng.uniform(.5, .7, len(models)),
             "sae_top4": rng.uniform(.3, .5, len(models))}))
        write_table(layout.tables_dir / "harmonization.parquet", pd.DataFrame(
            {"model": models, "condition": "joint", "accessibility": rng.uniform(.2, .4, len(models)),
             "cka": rng.uniform(.6, .9, len(models))}))
        write_table(layout.tables_dir / "intervention.parquet", pd.DataFrame(
            {"model": models, "basis": "sae", "off_target_rms": rng.uniform(.1, .3, len(models))}))
        write_table(layout.tables_dir / "harmonization_concept_contrasts.parquet", harmonization_concepts(models, rng))
    if run_yaml:
        raw = to_dict(cfg)
        raw["cohort"]["kind"] = cohort_kind
        if cohort_kind != "synth":
            raw["cohort"]["root"] = "/data/ptbxl"
        raw.update({"config_hash": cfg.config_hash(), "manifest_hash": "0f1e2d3c4b5a6978",
                    "created": "2025-01-01T00:00:00Z",
                    "versions": {"raybench": "0.1.0", "python": "3.11.7", "ray": "2.60.0", "torch": "2.13.0"}})
        write_text(layout.run_yaml, yaml.safe_dump(raw, sort_keys=False))
    return root


PLACEHOLDER_FILES = ("metrics.json", "patient_stats.npz", "sae.safetensors", "cfg.json")  # run_folder.CELL_FILES


def _placeholder_cells(layout: RunLayout, cells: pd.DataFrame) -> None:
    for cell_dir in cells.loc[cells.status == "ok", "cell_dir"]:
        folder = layout.root / cell_dir
        folder.mkdir(parents=True, exist_ok=True)
        for name in PLACEHOLDER_FILES:
            if not (folder / name).exists():
                (folder / name).write_text("{}" if name.endswith(".json") else "placeholder")


def all_keys(protocol: Protocol) -> list[Key]:
    return expected_cells(protocol.grid)


def small_protocol() -> Protocol:
    """The demo protocol on a 3 models x 3 depths x 3 E x 2 seeds grid: same shapes, quicker figures."""
    grid = GridProtocol(models=("ecg_fm", "ecg_jepa", "st_mem"), depths=(0.0, 0.5, 1.0), expansions=(1, 4, 16),
                        seeds=(4311, 4312), sensitivity_depth=0.5)
    return dataclasses.replace(demo_run().protocol, grid=grid)


# ---------------------------------------------------------------- table builders

def _cells(protocol: Protocol, skill: dict[str, float], rng: np.random.Generator, drop: set,
           fail: dict) -> pd.DataFrame:
    rows = []
    for key in expected_cells(protocol.grid):
        if key in drop:
            continue
        model, q, e, s, arm = key
        n_layers = N_LAYERS.get(model, 8)
        layer = layer_for_depth(q, n_layers)
        n_latents = D_MODEL * e
        r2 = 0.97 - 0.004 * np.log2(e) + rng.normal(0, 0.003)
        dead = min(0.95, 0.02 * e ** 1.1 + rng.uniform(0, 0.01))
        acc = skill[model] * (1 - 1.5 * (q - 0.6) ** 2) + 0.01 * np.log2(e) + rng.normal(0, 0.005)
        status = f"failed: {fail[key]}" if key in fail else "ok"
        ok = status == "ok"
        cid = cell_label(*key)
        rows.append({
            "cell_id": cid, "model": model, "layer": layer, "n_layers": n_layers, "q": q,
            "realized_depth": layer / (n_layers - 1), "arm": arm, "expansion": e, "n_latents": n_latents,
            "k": k_for(D_MODEL, n_latents, arm, protocol.sae, protocol.grid), "seed": s, "status": status,
            "val_r2": r2 if ok else np.nan, "test_r2": r2 - 0.002 if ok else np.nan,
            "val_dead_fraction": dead if ok else np.nan, "val_mean_l0": 96.0 if ok else np.nan,
            "gate_pass": bool(ok and r2 >= 0.9 and dead < 0.2), "test_accessibility": acc if ok else np.nan,
            "test_coverage": min(1.0, 2.4 * acc) if ok else np.nan, "train_seconds": 10.0 + e,
            "config_hash": "abcdef0123456789", "cell_dir": f"cells/{cid}",
        })
    df = pd.DataFrame(rows)
    df["gate_pass"] = df["gate_pass"].astype("boolean")  # nullable, as the SAE stage writes it
    return df


def _depth_scale(cells: pd.DataFrame) -> pd.DataFrame:
    prim = cells[(cells.arm == "primary") & (cells.status == "ok")]
    cols = {"reconstruction": "test_r2", "accessibility": "test_accessibility", "coverage": "test_coverage",
            "val_r2": "val_r2", "val_dead_fraction": "val_dead_fraction"}
    g = prim.groupby(["model", "q", "expansion"], sort=True)
    parts = [g[col].mean().rename("value").reset_index().assign(metric=m) for m, col in cols.items()]
    return pd.concat(parts, ignore_index=True)[["model", "q", "expansion", "metric", "value"]]


def _curves(ds: pd.DataFrame, grid) -> pd.DataFrame:
    c = ds[ds.metric.isin(METRICS)].groupby(["model", "metric", "expansion"], sort=True)["value"].mean().reset_index()
    return c.assign(ci_low=c.value - 0.01, ci_high=c.value + 0.01)


def _profiles(curves: pd.DataFrame, grid, cohort_kind: str) -> pd.DataFrame:
    rows = []
    loge = np.log(np.asarray(grid.expansions, dtype=float))
    for (metric, model), g in curves.groupby(["metric", "model"], sort=True):
        v = g.set_index("expansion").loc[list(grid.expansions), "value"].to_numpy()
        auc = float(np.trapezoid(v, loge) / (loge[-1] - loge[0])) if len(v) > 1 else float(v[0])
        pub = PUBLISHED.get(metric, {}).get(model, np.nan) if cohort_kind == "ptbxl" else np.nan
        rows.append({"model": model, "metric": metric, "auc": auc, "ci_low": auc - 0.012, "ci_high": auc + 0.012,
                     "published": pub})
    p = pd.DataFrame(rows)
    p["mean_rank"] = p.groupby("metric")["auc"].rank(ascending=False)
    p["rank1_prob"] = np.where(p.mean_rank == 1, 0.8, 0.2 / max(1, p.model.nunique() - 1))
    return p[["model", "metric", "auc", "ci_low", "ci_high", "rank1_prob", "mean_rank", "published"]]


def _contrasts(profiles: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for metric, g in profiles.groupby("metric", sort=True):
        auc = dict(zip(g.model, g.auc, strict=True))
        for a, b in itertools.combinations(sorted(auc), 2):
            d = auc[a] - auc[b]
            p = float(min(1.0, 0.001 + 0.5 * np.exp(-abs(d) * 200)))
            rows.append({"metric": metric, "model_a": a, "model_b": b, "diff": d, "ci_low": d - 0.01,
                         "ci_high": d + 0.01, "p": p, "p_bh": min(1.0, 1.5 * p)})
    return pd.DataFrame(rows)


def _rank_stability(grid, rng) -> pd.DataFrame:
    rows = [{"metric": m, "expansion_a": a, "expansion_b": b,
             "kendall_tau": float(np.clip(1 - 0.1 * abs(np.log2(b) - np.log2(a)) + rng.normal(0, .05), -1, 1))}
            for m in METRICS for a, b in itertools.combinations(grid.expansions, 2)]
    return pd.DataFrame(rows)


def _sensitivity(ds: pd.DataFrame, grid) -> pd.DataFrame:
    d = ds[ds.metric.isin(METRICS)]
    by_q = d.groupby(["model", "metric", "q"])["value"].mean().reset_index()
    by_e = d.groupby(["model", "metric", "expansion"])["value"].mean().reset_index()
    parts = [by_q.assign(factor="depth", level=by_q.q.map(lambda v: f"{v:g}"))[["model", "metric", "factor",
                                                                                   "level", "value"]],
             by_e.assign(factor="scale", level=by_e.expansion.map(str))[["model", "metric", "factor", "level",
                                                                           "value"]]]
    return pd.concat(parts, ignore_index=True)


def _reproducibility(grid, rng) -> pd.DataFrame:
    rows = []
    for m, q, e in itertools.product(grid.models, grid.depths, grid.expansions):
        mc = float(rng.uniform(.5, .8) - 0.03 * np.log2(e))
        fl = float(rng.uniform(.05, .1))
        rows.append({"model": m, "q": q, "expansion": e, "matched_cosine": mc, "random_floor": fl,
                     "excess": mc - fl, "subspace_overlap": float(rng.uniform(.3, .7))})
    return pd.DataFrame(rows)


def _concepts(models, skill, rng) -> pd.DataFrame:
    rows = []
    for m in models:
        for fam, n in FAMILIES.items():
            for i in range(n):
                rows.append({"model": m, "concept": f"{fam.lower()}_{i}", "family": fam,
                             "auc": float(np.clip(skill[m] + rng.normal(0, .08), 0, 1))})
    return pd.DataFrame(rows)


def _arm(cells: pd.DataFrame) -> pd.DataFrame:
    ok = cells[cells.status == "ok"]
    sens = ok[ok.arm == "sensitivity"]
    if sens.empty:
        return pd.DataFrame(columns=["model", "expansion", "metric", "primary", "sensitivity", "diff"])
    q = sens.q.iloc[0]
    prim = ok[(ok.arm == "primary") & (ok.q == q)]
    rows = []
    for metric, col in (("reconstruction", "test_r2"), ("accessibility", "test_accessibility"),
                        ("coverage", "test_coverage")):
        a = prim.groupby(["model", "expansion"])[col].mean()
        b = sens.groupby(["model", "expansion"])[col].mean() * 0.97
        for (m, e), v in a.items():
            if (m, e) in b.index:
                rows.append({"model": m, "expansion": e, "metric": metric, "primary": v, "sensitivity": b[(m, e)],
                             "diff": b[(m, e)] - v})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- paper analyses (shapes from the pure functions)

def _paper_tables(protocol: Protocol, out: dict[str, pd.DataFrame], rng: np.random.Generator,
                  cohort_kind: str) -> dict[str, pd.DataFrame]:
    from raybench.analysis.atlas import paper_analyses as pa
    from raybench.analysis.completeness import attach, counts, finish, grid_frame, sum_of

    g = protocol.grid
    models, es, seeds = list(g.models), [int(e) for e in g.expansions], sorted(int(s) for s in g.seeds)
    cells = out["cells"]
    ok = cells[cells.status == "ok"].astype({"q": float, "expansion": int, "seed": int})
    grid = grid_frame([(k[4], k[0], k[1], k[2], k[3]) for k in expected_cells(g)], ok)
    prim_grid = grid[grid.arm == "primary"]
    res: dict[str, pd.DataFrame] = {}
    res["fidelity_gate"], res["fidelity_gate_models"] = pa.fidelity_gate(ok, grid, 0.90, 0.20)
    prim = ok[ok.arm == "primary"].assign(value=ok.val_dead_fraction)
    curve = pa.dead_fraction_curve(prim, "test")
    res["dead_fraction"] = attach(curve, counts(prim_grid, ["model", "expansion"]),
                                  {"model": "model", "expansion": "expansion"})
    rs = pa.scale_rank_stability(curve, models, higher_better=False).assign(split="test")
    res["dead_fraction_rank_stability"] = sum_of(rs, counts(prim_grid, ["expansion"]), "expansion",
                                                 ("expansion_a", "expansion_b"))
    auc = curve.groupby("model", sort=True)["value"].mean()
    res["dead_fraction_auc"] = attach(pd.DataFrame({"model": auc.index, "split": "test", "auc": auc.to_numpy(),
                                                    "ci_low": auc.to_numpy() - .01, "ci_high": auc.to_numpy() + .01}),
                                      counts(prim_grid, ["model"]), {"model": "model"})
    prof = out["profiles"]
    parts = []
    for metric, sub in prof.groupby("metric", sort=True):
        point = sub.auc.to_numpy()
        draws = point + rng.normal(0, 0.01, size=(200, len(point)))
        parts.append(pa.pairwise_contrasts(metric, list(sub.model), point, draws, 2.5, 97.5))
    res["crossed_contrasts"] = sum_of(pd.concat(parts, ignore_index=True), counts(prim_grid, ["model"]), "model",
                                      ("model_a", "model_b"))
    if g.sensitivity_depth is not None:
        at = ok[ok.q == g.sensitivity_depth].rename(columns={"test_r2": "reconstruction", "test_accessibility":
                                                             "accessibility", "test_coverage": "coverage",
                                                             "val_dead_fraction": "dead_fraction"})
        metrics = {"reconstruction": True, "accessibility": True, "coverage": True, "dead_fraction": False}
        arm = pa.arm_tables(at, metrics, models, es, seeds, pa.paired_seed_draws(0, 200, len(seeds)), 2.5, 97.5)
        sub = grid[grid.q == g.sensitivity_depth]
        res["arm_rank_agreement"] = attach(arm["arm_rank_agreement"], counts(sub, ["expansion"]),
                                           {"expansion": "expansion"})
        res["arm_differences"] = attach(arm["arm_differences"], counts(sub, ["model", "expansion"]),
                                        {"model": "model", "expansion": "expansion"})
        res["arm_auc_differences"] = attach(arm["arm_auc_differences"], counts(sub, ["model"]), {"model": "model"})
    rep = out["reproducibility"]
    pairs = [(r.model, r.q, r.expansion, a, b, r.matched_cosine + d, r.random_floor, r.excess + d,
              r.subspace_overlap) for r in rep.itertuples() for (a, b), d in
             zip(pa.seed_pairs(seeds), rng.normal(0, .01, len(pa.seed_pairs(seeds))), strict=True)]
    cols = pa.PAPER_COLUMNS["reproducibility_pairs"][:9]
    res["reproducibility_pairs"] = attach(pd.DataFrame(pairs, columns=cols),
                                          counts(prim_grid, ["model", "q", "expansion"]),
                                          {"model": "model", "q": "q", "expansion": "expansion"})
    rows = []
    for measure in pa.REPRO_MEASURES:
        mean = rep.groupby("model", sort=True)[measure].mean()
        pub = pa.PUBLISHED_REPRODUCIBILITY[measure]
        rows += [(m, measure, v, v - .02, v + .02, 1.0 / len(mean),
                  pub.get(m, np.nan) if cohort_kind == "ptbxl" else np.nan) for m, v in mean.items()]
    res["reproducibility_auc"] = attach(pd.DataFrame(rows, columns=pa.PAPER_COLUMNS["reproducibility_auc"][:7]),
                                        counts(prim_grid, ["model"]), {"model": "model"})
    for name in ("arm_rank_agreement", "arm_differences", "arm_auc_differences"):
        res.setdefault(name, pd.DataFrame(columns=pa.PAPER_COLUMNS[name]))
    return {n: finish(df)[pa.PAPER_COLUMNS[n]] for n, df in res.items()}


def harmonization_concepts(models, rng) -> pd.DataFrame:
    from raybench.analysis.inference.stats import benjamini_hochberg
    from raybench.analysis.secondary.harmonization import CONCEPT_CONTRAST_COLUMNS

    rows = [(m, p, f"{fam.lower()}_{i}", fam, d, d - .01, d + .01, float(min(1.0, 0.002 + abs(d) * 40)), 200)
            for m in models for p in ("lead", "temporal", "joint") for fam, n in FAMILIES.items() for i in range(n)
            for d in [float(rng.normal(0, .01))]]
    df = pd.DataFrame(rows, columns=CONCEPT_CONTRAST_COLUMNS[:-1])
    df["q_value_bh"] = benjamini_hochberg(df.p_value.to_numpy())
    return df
