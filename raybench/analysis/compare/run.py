"""Two finished runs of one protocol -> the comparison tables (docs/protocol.md §8.9).

`load_profiles` reads one run: its profiles table (the point values) and a fresh patient bootstrap of its cells'
patient_stats.npz through the analysis' own machinery (packed_stats.py, bootstrap.py, summary_weights.py), so
the draws of each model's common-scale AUC are built exactly as tables.py builds the profiles' intervals. Runs do
not keep their draws (randomness/ holds only the first few), and the two cohorts are independent samples, so each
run is redrawn from its own seed (`run_seed`): draw i of A and draw i of B are independent resamples, and their
pairing only forms draws of between-run statistics.

`compute` is pure given two `RunProfiles`: leaders, rank agreement and AUC differences; `write_tables` writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from raybench.analysis.inference import stats as st
from raybench.analysis.inference.packed_stats import METRIC_NAMES
from raybench.core.atomic import write_table
from raybench.core.config import Protocol, to_dict
from raybench.core.errors import RaybenchError

TIE_RTOL = 1e-12
"""Two AUCs within this relative distance count as tied (leaders, ranks, rank correlations): the same value
reached through other floating-point sums must not make a leader."""

COLUMNS: dict[str, list[str]] = {
    "runs": ["role", "run", "cohort_kind", "protocol", "n_models", "n_cells", "n_patients", "n_concepts", "draws",
             "seed"],
    "protocol": ["field", "run_a", "run_b", "blocking"],
    "leaders": ["metric", "leader_a", "auc_a", "leader_b", "auc_b", "leader_preserved", "rank_in_b_of_leader_a",
                "rank_in_a_of_leader_b", "preserved_prob"],
    "rank_agreement": ["metric", "n_models", "kendall_tau", "kendall_ci_low", "kendall_ci_high", "spearman",
                       "spearman_ci_low", "spearman_ci_high"],
    "auc_differences": ["metric", "model", "auc_a", "ci_low_a", "ci_high_a", "rank_a", "auc_b", "ci_low_b",
                        "ci_high_b", "rank_b", "diff", "ci_low", "ci_high", "p", "p_bh"],
}

BLOCKING_FIELDS: tuple[str, ...] = ("grid.models", "grid.depths", "grid.expansions", "eval.coverage_threshold")
"""Protocol fields that define what a profile AUC is: runs that differ in one measure different things."""


class CompareError(RaybenchError):
    """Two runs that cannot be compared, or a run without what the comparison reads; the message says the fix."""


@dataclass(frozen=True)
class CompareConfig:
    """How the comparison draws and summarizes.

    draws: patient-bootstrap draws per run (None: the smaller of the two runs' inference.patient_draws).
    seed: the comparison's own seed; run A draws from run_seed(seed, 0), run B from run_seed(seed, 1).
    ci_low, ci_high: percentile interval bounds (docs/protocol.md §8.2).
    """

    draws: int | None = None
    seed: int = 20260801
    ci_low: float = 2.5
    ci_high: float = 97.5

    def validate(self) -> CompareConfig:
        if self.draws is not None and self.draws < 2:
            raise CompareError(f"--draws must be at least 2, got {self.draws}")
        if not 0 <= self.ci_low < self.ci_high <= 100:
            raise CompareError(f"interval bounds must satisfy 0 <= low < high <= 100, got {self.ci_low}, "
                               f"{self.ci_high}")
        return self


@dataclass(frozen=True)
class RunProfiles:
    """One run as the comparison sees it: model profiles (point [metrics, M]) and their bootstrap draws
    [metrics, draws, M], metrics in METRIC_NAMES order, models in `models` order."""

    name: str
    protocol: Protocol
    cohort_kind: str
    models: tuple[str, ...]
    point: np.ndarray
    draws: np.ndarray
    n_cells: int
    n_patients: int
    n_concepts: int
    seed: int


# ---------------------------------------------------------------- protocol check (before anything is read)


def _flat(obj: object, prefix: str = "") -> dict[str, object]:
    """A nested dict as {dotted.key: value}."""
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def protocol_differences(a: Protocol, b: Protocol) -> pd.DataFrame:
    """Every protocol field whose value differs between the runs; `blocking` for those in BLOCKING_FIELDS.
    Model order does not matter (the comparison aligns models by name), only the set."""
    fa, fb = _flat(to_dict(a)), _flat(to_dict(b))
    rows = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        same = sorted(va) == sorted(vb) if key == "grid.models" and va and vb else va == vb
        if not same:
            rows.append((key, str(va), str(vb), key in BLOCKING_FIELDS))
    return pd.DataFrame(rows, columns=COLUMNS["protocol"])


def check_comparable(diffs: pd.DataFrame, name_a: str, name_b: str) -> None:
    """Refuse runs whose protocols differ in a field that defines the profiles, naming each and the fix."""
    bad = diffs[diffs.blocking.astype(bool)]
    if bad.empty:
        return
    what = "; ".join(f"{r.field}: {r.run_a} in {name_a}, {r.run_b} in {name_b}" for r in bad.itertuples())
    raise CompareError(f"the runs follow different protocols ({what}); compare two runs of one protocol: rerun "
                       f"{name_b} with {name_a}'s values of these fields (`raybench config` of {name_a}'s run.yaml "
                       "as the config of `raybench grid`)")


def check_metrics(name_a: str, table_a: pd.DataFrame, name_b: str, table_b: pd.DataFrame) -> None:
    """The two runs' profiles tables must hold the same metrics (an older raybench may have written fewer)."""
    ma, mb = set(table_a.metric), set(table_b.metric)
    if ma != mb or ma != set(METRIC_NAMES):
        raise CompareError(f"metrics differ: {sorted(ma)} in {name_a}, {sorted(mb)} in {name_b} (the comparison "
                           f"reads {list(METRIC_NAMES)}); rerun `raybench analyze` on both so each writes every metric")


def check_same_models(a: RunProfiles, b: RunProfiles) -> None:
    """Both runs must have a profile for the same models (an incomplete grid may drop one)."""
    if set(a.models) != set(b.models):
        only_a, only_b = sorted(set(a.models) - set(b.models)), sorted(set(b.models) - set(a.models))
        raise CompareError(f"models with a profile differ: only in {a.name} {only_a}, only in {b.name} {only_b}; "
                           "finish the missing cells (`raybench grid` on the run) so every model has a profile")


# ---------------------------------------------------------------- math (pure)


def run_seed(seed: int, role: int) -> int:
    """The patient-bootstrap seed of run `role` (0 = A, 1 = B): independent children of one SeedSequence."""
    return int(np.random.SeedSequence([int(seed), int(role)]).generate_state(1, dtype=np.uint32)[0])


def snap_ties(values: np.ndarray) -> np.ndarray:
    """Rows [n, M] with values within TIE_RTOL of a larger one in the same row set equal to it, so exact-equality
    tie rules see them as ties."""
    v = np.array(values, dtype=np.float64, ndmin=2)
    order = np.argsort(-v, axis=1, kind="stable")
    s = np.take_along_axis(v, order, axis=1)
    for j in range(1, s.shape[1]):
        close = np.abs(s[:, j - 1] - s[:, j]) <= TIE_RTOL * np.maximum(1.0, np.abs(s[:, j - 1]))
        s[:, j] = np.where(close, s[:, j - 1], s[:, j])
    out = np.empty_like(v)
    np.put_along_axis(out, order, s, axis=1)
    return out


def top_mask(values: np.ndarray) -> np.ndarray:
    """[n, M] -> boolean [n, M]: the models tied at the highest value of each row (TIE_RTOL)."""
    v = snap_ties(values)
    return v == v.max(axis=1, keepdims=True)


def high_ranks(values: np.ndarray) -> np.ndarray:
    """[n, M] -> ranks, 1 = highest, tied models share their average rank (TIE_RTOL)."""
    return rankdata(-snap_ties(values), method="average", axis=1)


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall tau-b of each row pair of x, y [n, M] (scipy.stats.kendalltau's tie handling); NaN for a row with
    every value tied."""
    x, y = snap_ties(x), snap_ties(y)
    i, j = np.triu_indices(x.shape[1], k=1)
    sx, sy = np.sign(x[:, i] - x[:, j]), np.sign(y[:, i] - y[:, j])
    s = np.sum(sx * sy, axis=1)
    den = np.sqrt(np.sum(sx != 0, axis=1) * np.sum(sy != 0, axis=1).astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, s / np.where(den > 0, den, 1.0), np.nan)


def spearman_rho(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman rho (Pearson r of average ranks) of each row pair of x, y [n, M]; NaN for a constant row."""
    rx, ry = high_ranks(x), high_ranks(y)
    rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
    den = np.sqrt(np.sum(rx * rx, axis=1) * np.sum(ry * ry, axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, np.sum(rx * ry, axis=1) / np.where(den > 0, den, 1.0), np.nan)


def _names(models: tuple[str, ...], mask: np.ndarray) -> str:
    return "|".join(m for m, on in zip(models, mask, strict=True) if on)


def leader_rows(metric: str, models: tuple[str, ...], pa: np.ndarray, pb: np.ndarray, da: np.ndarray,
                db: np.ndarray) -> tuple:
    """One `leaders` row: the leader(s) of each run (ties joined by '|'), whether they share a model, the best
    rank of each run's leader(s) in the other, and the share of independent draw pairs whose leaders share one."""
    ta, tb = top_mask(pa)[0], top_mask(pb)[0]
    ra, rb = high_ranks(pa)[0], high_ranks(pb)[0]
    prob = float(np.mean(np.any(top_mask(da) & top_mask(db), axis=1)))
    return (metric, _names(models, ta), float(pa[0][ta][0]), _names(models, tb), float(pb[0][tb][0]),
            bool(np.any(ta & tb)), float(rb[ta].min()), float(ra[tb].min()), prob)


def agreement_row(metric: str, pa: np.ndarray, pb: np.ndarray, da: np.ndarray, db: np.ndarray, lo: float,
                  hi: float) -> tuple:
    """One `rank_agreement` row: tau-b and rho of the two runs' AUC vectors, each with its interval over the
    draw pairs."""
    return (metric, pa.shape[1], float(kendall_tau_b(pa, pb)[0]), *_ci(kendall_tau_b(da, db), lo, hi),
            float(spearman_rho(pa, pb)[0]), *_ci(spearman_rho(da, db), lo, hi))


def difference_rows(metric: str, models: tuple[str, ...], pa: np.ndarray, pb: np.ndarray, da: np.ndarray,
                    db: np.ndarray, lo: float, hi: float) -> list[tuple]:
    """The `auc_differences` rows of one metric: each run's AUC, interval and rank; B - A with its interval over
    the draw pairs, p (docs/protocol.md §8.3's formula) and Benjamini-Hochberg over the metric's models."""
    (alo, ahi), (blo, bhi) = st.percentile_ci(da, lo, hi), st.percentile_ci(db, lo, hi)
    ra, rb = high_ranks(pa)[0], high_ranks(pb)[0]
    rows = []
    for i, m in enumerate(models):
        d = db[:, i] - da[:, i]
        dlo, dhi = st.percentile_ci(d, lo, hi)
        rows.append((metric, m, pa[0, i], alo[i], ahi[i], ra[i], pb[0, i], blo[i], bhi[i], rb[i],
                     pb[0, i] - pa[0, i], float(dlo), float(dhi), st.paired_p(d)))
    p_bh = st.benjamini_hochberg([r[-1] for r in rows])
    return [(*r, float(p)) for r, p in zip(rows, p_bh, strict=True)]


def compute(run_a: RunProfiles, run_b: RunProfiles, config: CompareConfig = CompareConfig()) -> dict[str, pd.DataFrame]:
    """The comparison tables (COLUMNS) of two runs of one protocol; models aligned by name in run A's order,
    draw i of A paired with draw i of B (the first `n` of each, n the smaller count); diff = B - A."""
    config.validate()
    diffs = protocol_differences(run_a.protocol, run_b.protocol)
    check_comparable(diffs, run_a.name, run_b.name)
    check_same_models(run_a, run_b)
    models = run_a.models
    col_b = [run_b.models.index(m) for m in models]
    n = min(run_a.draws.shape[1], run_b.draws.shape[1])
    lo, hi = config.ci_low, config.ci_high
    leaders, agree, differ = [], [], []
    for k, metric in enumerate(METRIC_NAMES):
        pa, pb = run_a.point[k][None, :], run_b.point[k][col_b][None, :]
        da, db = run_a.draws[k, :n], run_b.draws[k, :n][:, col_b]
        leaders.append(leader_rows(metric, models, pa, pb, da, db))
        agree.append(agreement_row(metric, pa, pb, da, db, lo, hi))
        differ += difference_rows(metric, models, pa, pb, da, db, lo, hi)
    runs = [("a", run_a.name, run_a.cohort_kind, run_a.protocol.name, len(run_a.models), run_a.n_cells,
             run_a.n_patients, run_a.n_concepts, n, run_a.seed),
            ("b", run_b.name, run_b.cohort_kind, run_b.protocol.name, len(run_b.models), run_b.n_cells,
             run_b.n_patients, run_b.n_concepts, n, run_b.seed)]
    out = {"runs": runs, "protocol": diffs, "leaders": leaders, "rank_agreement": agree, "auc_differences": differ}
    return {name: v if isinstance(v, pd.DataFrame) else pd.DataFrame(v, columns=COLUMNS[name])
            for name, v in out.items()}


def _ci(draws: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """Percentile interval of the finite draws (NaN: a draw where one run ties every model)."""
    finite = draws[np.isfinite(draws)]
    if finite.size == 0:
        return math.nan, math.nan
    a, b = st.percentile_ci(finite, lo, hi)
    return float(a), float(b)


def write_tables(tables: dict[str, pd.DataFrame], out_dir: Path) -> list[Path]:
    """Each table as <out_dir>/tables/<name>.parquet and .csv -> the parquet paths."""
    paths = []
    for name, df in tables.items():
        path = out_dir / "tables" / f"{name}.parquet"
        write_table(path, df.reset_index(drop=True))
        paths.append(path)
    return paths


# ---------------------------------------------------------------- one run from its folder (I/O, Ray)


def read_profiles_table(root: Path) -> pd.DataFrame:
    """tables/profiles.parquet of a run, refused when absent."""
    path = root / "tables" / "profiles.parquet"
    if not path.exists():
        raise CompareError(f"{path}: no profiles table; run `raybench analyze --run-dir {root}` first")
    return pd.read_parquet(path)


def load_profiles(root: Path, name: str, protocol: Protocol, cohort_kind: str, n_draws: int, seed: int,
                  num_workers: int | None = None) -> RunProfiles:
    """A run's model profiles: point values as in its profiles table (checked), draws [metrics, n_draws, M] from a
    patient bootstrap of its ok cells (seed `seed`, one generator over the evaluated patients: streams.py's
    published convention), weighted into common-scale AUCs as tables.py weights them. Refused when the cells'
    statistics no longer give the table's values (tables older than the cells)."""
    from raybench.analysis.inference.bootstrap import packed_patient_bootstrap, patient_bootstrap
    from raybench.analysis.inference.packed_stats import load_packed_stats, read_cell_stats
    from raybench.analysis.inference.summary_weights import depth_auc_weights, profile_weights
    from raybench.analysis.run_inputs import read_cells, read_concepts, rounded_q, select_ok
    from raybench.core.paths import RunLayout

    table = read_profiles_table(root)
    layout = RunLayout.at(root)
    grid, inf, ev = protocol.grid, protocol.inference, protocol.eval
    ok, _ = select_ok(read_cells(layout), protocol)
    concepts = read_concepts(layout, ok)
    paths = [layout.root / str(c) / "patient_stats.npz" for c in ok.cell_dir]
    ids = list(ok.cell_id)
    dtype = np.dtype(inf.gemm_dtype).type
    if num_workers is None:
        stats, draws = packed_patient_bootstrap(read_cell_stats(paths, ids), ids, len(concepts),
                                                ev.coverage_threshold, n_draws, seed, inf.chunk_draws,
                                                stream="published", dtype=dtype)
    else:
        stats = load_packed_stats(paths, ids, len(concepts), ev.coverage_threshold, put=True, dtype=dtype)
        draws = patient_bootstrap(stats, n_draws, seed, inf.chunk_draws, num_workers, stream="published")
    models = [m for m in grid.models if m in set(ok.model)]
    depths = sorted(rounded_q(q) for q in grid.depths)
    per_depth = depth_auc_weights(ok, "primary", models, [int(e) for e in grid.expansions], depths)
    if not per_depth:
        raise CompareError(f"{root}: no model has a depth with ok cells at every expansion; nothing to compare")
    w_prof, kept = profile_weights(per_depth, models)
    point = stats.point.T @ w_prof  # [3, M]
    prof_draws = np.einsum("dck,cm->kdm", draws, w_prof)
    check_table(root, table, point, kept)
    return RunProfiles(name=name, protocol=protocol, cohort_kind=cohort_kind, models=tuple(kept),
                       point=point, draws=prof_draws, n_cells=len(ok), n_patients=int(np.sum(stats.active)),
                       n_concepts=len(concepts), seed=seed)


def check_table(root: Path, table: pd.DataFrame, point: np.ndarray, models: list[str]) -> None:
    """The run's profiles table holds the AUCs its cells give (else it is stale: analyze again)."""
    auc = table.set_index(["metric", "model"])["auc"]
    for k, metric in enumerate(METRIC_NAMES):
        for i, m in enumerate(models):
            have = auc.get((metric, m))
            if have is None or not np.isclose(float(have), point[k, i], rtol=1e-9, atol=1e-12):
                raise CompareError(f"{root}/tables/profiles.parquet: {metric} of {m} is {have}, its cells give "
                                   f"{point[k, i]:.6g}; the tables are older than the cells: run "
                                   f"`raybench analyze --run-dir {root}` again")
