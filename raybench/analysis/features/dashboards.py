"""Feature dashboards as data: what each concept's selected latent responds to, on the test split.

For one cell per model (FeaturesConfig: by default E = protocol.eval.calibration_expansion, the final depth,
the lowest seed) the cell's saved SAE is applied to the test split exactly as evaluation applies it
(raybench.sae.evaluate.encode_split: the same BatchTopK batches), so the activations behind each r are those
that produced r_test in the cell's metrics.json. For every concept's selected latent j*(c) a view keeps its
activation on every test record, the concept's raw value, r, the firing rate and the records to draw; the
latents that fire most often but reach |r| >= eval.coverage_threshold with no concept are listed as well.
Drawing is render.py's; this module holds no pictures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from raybench.core.config import FeaturesConfig, Protocol
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout
from raybench.core.sufficient_stats import paired_corr, pearson_from_sums


class FeaturesError(RaybenchError, ValueError):
    """No dashboard can be drawn for the requested model, concept or cell; the message says what to choose."""


def weak_r_note(r: float, threshold: float) -> str | None:
    """The caveat a dashboard carries when its latent barely tracks the concept (|r| below the coverage threshold,
    docs/protocol.md §7): its top records then say little about the concept."""
    if abs(r) >= threshold:
        return None
    return (f"weak: |r| = {abs(r):.2f} is below the coverage threshold {threshold:.2f}, so this latent barely tracks "
            "the concept; its records show little about it")


@dataclass(frozen=True)
class Choice:
    """Which cell per model and how many records a dashboard shows (FeaturesConfig, resolved)."""

    expansion: int
    depth: float
    seed: int | None
    top: int = 3
    contrast: int = 2
    unexplained: int = 8

    @classmethod
    def resolve(cls, features: FeaturesConfig, protocol: Protocol, **overrides: Any) -> Choice:
        """FeaturesConfig with E = protocol.eval.calibration_expansion when unset; `overrides` set when not None."""
        base = {"expansion": features.expansion or protocol.eval.calibration_expansion, "depth": features.depth,
                "seed": features.seed, "top": features.top_records, "contrast": features.contrast_records,
                "unexplained": features.unexplained}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass(frozen=True)
class Pick:
    """A record a dashboard draws: why (top / median / zero), which record, its activation and concept value."""

    kind: str
    ecg_id: int
    activation: float
    value: float


@dataclass
class ConceptView:
    concept: str
    latent: int
    r: float  # test r of the latent with the (standardized) concept, as in metrics.json r_test
    firing_rate: float  # fraction of test records on which the latent is non-zero
    picks: list[Pick]


@dataclass
class ModelView:
    """One model's dashboard cell and, per concept, its selected latent on the test split."""

    model: str
    cell: dict[str, Any]  # cell_id, layer, q, expansion, seed, k, n_latents
    ecg_ids: np.ndarray  # [n] test records (ascending)
    activations: np.ndarray  # [n, C] selected latent of each concept
    values: np.ndarray  # [n, C] raw concept values (NaN: missing), standardized when the manifest has no raw ones
    concepts: list[ConceptView] = field(default_factory=list)
    unexplained: pd.DataFrame = field(default_factory=pd.DataFrame)

    def concept(self, name: str) -> tuple[int, ConceptView]:
        for i, view in enumerate(self.concepts):
            if view.concept == name:
                return i, view
        raise FeaturesError(f"{self.model}: no concept {name!r} in this run; choose one of "
                            f"{[v.concept for v in self.concepts]}")


UNEXPLAINED_COLUMNS = ["latent", "firing_rate", "best_concept", "best_r", "ecg_id", "activation"]


def choose_cell(cells: pd.DataFrame, model: str, choice: Choice) -> pd.Series:
    """The ok primary cell of `model` at the choice's E and depth (its seed, or the lowest seed)."""
    ok = cells[(cells["model"] == model) & (cells["arm"] == "primary") & (cells["status"] == "ok")
               & (cells["expansion"] == choice.expansion)]
    at = ok[np.isclose(ok["q"].astype(float), choice.depth)]
    if choice.seed is not None:
        at = at[at["seed"] == choice.seed]
    if at.empty:
        have = sorted({(float(q), int(e), int(s)) for q, e, s in zip(ok["q"], ok["expansion"], ok["seed"],
                                                                       strict=True)})
        raise FeaturesError(
            f"{model}: no ok primary cell at E = {choice.expansion}, depth q = {choice.depth}"
            + (f", seed {choice.seed}" if choice.seed is not None else "")
            + f" in tables/cells.parquet (ok cells at this E: {have or 'none'}); choose another cell with "
            "--expansion/--depth/--seed or `features:` in the run config")
    return at.sort_values("seed", kind="stable").iloc[0]


def pick_records(activation: np.ndarray, ecg_ids: np.ndarray, top: int, contrast: int) -> list[tuple[str, int]]:
    """Rows to draw as (kind, row): the `top` largest activations; `contrast` firing records whose activation is
    nearest the median activation of the firing records; `contrast` records of smallest activation (non-firing
    ones when there are). Ties go to the lower ecg_id; a record is drawn once."""
    a = np.asarray(activation, dtype=np.float64)
    ids = np.asarray(ecg_ids)
    out: list[tuple[str, int]] = []
    taken: set[int] = set()

    def take(kind: str, order: np.ndarray, n: int) -> None:
        for row in order:
            if n == 0:
                return
            if int(row) not in taken:
                taken.add(int(row))
                out.append((kind, int(row)))
                n -= 1

    take("top", np.lexsort((ids, -a)), top)
    firing = np.flatnonzero(a > 0)
    if firing.size:
        dist = np.abs(a[firing] - np.median(a[firing]))
        take("median", firing[np.lexsort((ids[firing], dist))], contrast)
    take("zero", np.lexsort((ids, a)), contrast)
    return out


def latent_concept_r(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int, n_latents: int,
                     y: np.ndarray) -> np.ndarray:
    """Pearson r [N, C] of every latent's code (sparse entries rows, cols, vals of an [n, N] code) with y [n, C]."""
    y = np.asarray(y, dtype=np.float64)
    vals = np.asarray(vals, dtype=np.float64)
    z = sp.csr_matrix((vals, (rows, cols)), shape=(n, n_latents))
    sa = np.bincount(cols, weights=vals, minlength=n_latents)[:, None]
    saa = np.bincount(cols, weights=vals ** 2, minlength=n_latents)[:, None]
    return pearson_from_sums(n, sa, y.sum(0)[None, :], saa, (y ** 2).sum(0)[None, :], np.asarray(z.T @ y))


def unexplained_latents(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int, n_latents: int,
                        y: np.ndarray, names: tuple[str, ...], selected: np.ndarray, ecg_ids: np.ndarray,
                        threshold: float, limit: int) -> pd.DataFrame:
    """The `limit` most frequently firing latents that no concept explains: |r| < threshold with every concept
    and selected for none. Columns UNEXPLAINED_COLUMNS (best_r: the signed r of the closest concept; ecg_id,
    activation: the record it fires on most strongly, ties to the lower ecg_id)."""
    counts = np.bincount(cols, minlength=n_latents)
    r = latent_concept_r(rows, cols, vals, n, n_latents, y) if len(names) else np.zeros((n_latents, 0))
    best = np.argmax(np.abs(r), axis=1) if len(names) else np.zeros(n_latents, dtype=np.int64)
    best_r = r[np.arange(n_latents), best] if len(names) else np.zeros(n_latents)
    keep = (counts > 0) & (np.abs(best_r) < threshold)
    keep[np.asarray(selected, dtype=np.int64)] = False
    cand = np.flatnonzero(keep)
    cand = cand[np.lexsort((cand, -counts[cand]))][:limit]
    out = []
    for j in cand:
        mask = cols == j
        rr, vv = rows[mask], vals[mask]
        i = np.lexsort((np.asarray(ecg_ids)[rr], -vv))[0]
        out.append({"latent": int(j), "firing_rate": float(counts[j] / n),
                    "best_concept": names[best[j]] if len(names) else "", "best_r": float(best_r[j]),
                    "ecg_id": int(ecg_ids[rr[i]]), "activation": float(vv[i])})
    return pd.DataFrame(out, columns=UNEXPLAINED_COLUMNS)


def model_view(root: str | Path, protocol: Protocol, model: str, choice: Choice,
               cells: pd.DataFrame | None = None) -> ModelView:
    """The dashboard data of one model: its chosen cell's selected latents on the test split."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.sae.cell_files import load_cell_metrics, load_cell_sae
    from raybench.sae.data import load_cell_data
    from raybench.sae.evaluate import encode_split

    layout = RunLayout.at(root)
    if cells is None:
        if not layout.cells_table.exists():
            raise FeaturesError(f"{layout.cells_table} not found: run `raybench grid` (or train) first")
        cells = pd.read_parquet(layout.cells_table)
    row = choose_cell(cells, model, choice)
    cell_dir = layout.root / str(row["cell_dir"])
    sae, normalizer = load_cell_sae(cell_dir)
    metrics = load_cell_metrics(cell_dir)
    data = load_cell_data(layout.root, model, int(row["layer"]), protocol.eval)
    names = data.concept_names
    selected = np.asarray(metrics.get("selected", []), dtype=np.int64)
    if len(names) == 0:
        raise FeaturesError(f"{layout.manifest}: the manifest has no concepts, so no latent is selected")
    if selected.shape != (len(names),):
        raise FeaturesError(f"{cell_dir}/metrics.json selects {selected.size} latents for {len(names)} concepts: "
                            "the cell was trained on another manifest; rerun the grid")
    ids = np.asarray(data.ecg_ids["test"], dtype=np.int64)
    codes = encode_split(sae, normalizer, data.acts["test"], protocol.eval.eval_batch)
    act = codes.dense_columns(selected)
    r = paired_corr(act, data.concepts["test"])
    manifest, _ = load_manifest(layout.manifest, verify=False)
    by_id = manifest.set_index("ecg_id")
    values = np.column_stack([
        by_id.loc[ids, f"raw_{c}"].to_numpy(np.float64) if f"raw_{c}" in by_id.columns
        else data.concepts["test"][:, i].astype(np.float64) for i, c in enumerate(names)])
    view = ModelView(model=model, ecg_ids=ids, activations=act, values=values,
                     cell={"cell_id": str(row["cell_id"]), "layer": int(row["layer"]), "q": float(row["q"]),
                           "expansion": int(row["expansion"]), "seed": int(row["seed"]), "k": int(row["k"]),
                           "n_latents": int(row["n_latents"])})
    for c, name in enumerate(names):
        picks = [Pick(kind, int(ids[i]), float(act[i, c]), float(values[i, c]))
                 for kind, i in pick_records(act[:, c], ids, choice.top, choice.contrast)]
        view.concepts.append(ConceptView(name, int(selected[c]), float(r[c]), float((act[:, c] > 0).mean()), picks))
    view.unexplained = unexplained_latents(codes.rows, codes.cols, codes.vals, codes.n, sae.n_latents,
                                           data.concepts["test"], names, selected, ids,
                                           protocol.eval.coverage_threshold, choice.unexplained)
    return view
