"""The provenance audit on a run folder: one Ray task per model x depth (docs/protocol.md §12).

    run_provenance(root, cfg) -> {table name: DataFrame}

Each task loads the activation store of its layer, joins the manifest (provenance columns, the diagnostic
target, patients), audits every provenance variable (audit.run_audit) and, when the grid has the calibration
cell of that model x depth (E = eval.calibration_expansion, lowest seed), scores its SAE latents
(features.py). Writes tables/provenance_{recover,stress,controls,verdicts,gates,features,odds}.parquet (+ .csv) and
the figures (figures.py); a variable that fails is a verdict row "failed" with a persistable reason (for a
credentialed cohort only the exception type: raybench.core.privacy). Every output is aggregate.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.core.config import ProvenanceConfig, RunConfig
from raybench.core.errors import RaybenchError

log = logging.getLogger(__name__)

KEYS = ["model", "q", "layer", "variable"]
TABLES = ("provenance_recover", "provenance_stress", "provenance_controls", "provenance_verdicts",
          "provenance_gates", "provenance_features", "provenance_odds")
FAILED = "failed"
# the columns a table is written with when no row has any (an empty table still says what it would hold)
COLUMNS = {
    "provenance_recover": ("lpi_bits", "ci_low", "ci_high", "prior_bits", "lpi_fraction", "conditional_auroc",
                           "accuracy", "groups", "groups_dropped", "folds", "dropped"),
    "provenance_stress": ("stage", "rank", "level", "odds_ratio", "auroc_exposed", "auroc_control"),
    "provenance_controls": ("rank", "control", "folds", "g_after", "g_reduction", "removed_variance",
                            "variance_rel_error", "cos_u", "orthogonal"),
    "provenance_verdicts": ("verdict", "reason", "g", "g_ci_low", "g_ci_high", "kappa", "groups_dropped",
                            "dropped"),
    "provenance_gates": ("rank", "gate", "criterion", "estimate", "ci_low", "ci_high", "passed", "note"),
    "provenance_features": ("cell_id", "kind", "latent", "lpi_bits", "lpi_rank", "concept", "concept_r_test",
                            "concept_bits", "flagged"),
    "provenance_odds": ("group", "reference", "odds_ratio"),
}


class ProvenanceError(RaybenchError, ValueError):
    """The run folder cannot be audited (no manifest, no activations); the message says which and the fix."""


def target_column(manifest: pd.DataFrame, root: Path) -> np.ndarray | None:
    """Each manifest row's diagnostic superclasses: the manifest's own column, else (a manifest written before
    it existed) derived from the cohort's ptbxl_database.csv; None when the cohort has neither."""
    from raybench.cohorts.diagnostics import COLUMN, database_superclasses

    if COLUMN in manifest.columns:
        return manifest[COLUMN].astype(str).to_numpy()
    db_path = root / "ptbxl_database.csv"
    if not db_path.exists():
        return None
    db = pd.read_csv(db_path, dtype=str, keep_default_na=False)
    if "scp_codes" not in db.columns:
        return None
    db["ecg_id"] = pd.to_numeric(db["ecg_id"], errors="coerce")
    labels = pd.Series(database_superclasses(db, root), index=db["ecg_id"])
    return labels.reindex(manifest["ecg_id"].to_numpy()).fillna("").astype(str).to_numpy()


def audit_block(root: str, model: str, q: float, layer: int, pcfg: ProvenanceConfig, cell_dir: str | None,
                credentialed: bool) -> dict[str, list[dict]]:
    """Every provenance variable of one model x depth -> rows of each table (keys included)."""
    from raybench.analysis.provenance_audit.audit import Inputs, run_audit
    from raybench.analysis.provenance_audit.metadata import variable_labels, variable_strata
    from raybench.cohorts.diagnostics import target_labels
    from raybench.cohorts.manifest import load_manifest
    from raybench.core.paths import RunLayout
    from raybench.core.privacy import failure_text
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(root)
    manifest, info = load_manifest(layout.manifest)
    sup = target_column(manifest, info.root)
    store = ActivationStore(layout.activations_dir)
    by_id = manifest.assign(_target=sup if sup is not None else "").set_index("ecg_id")
    x, ids = {}, {}
    for split in ("train", "val", "test"):
        x[split] = np.asarray(store.load(model, layer, split, mmap=False), dtype=np.float64)
        ids[split] = np.asarray(store.ecg_ids(model, layer, split), dtype=np.int64)
    rows: dict[str, list[dict]] = {t: [] for t in TABLES}
    y = {s: target_labels(by_id.loc[ids[s], "_target"].to_numpy(), pcfg.target) for s in ids}
    patients = {s: by_id.loc[ids[s], "patient_id"].astype(str).to_numpy() for s in ids}
    meta = block_metadata(pcfg, info.root, ids, patients)
    codes_cache: dict[str, object] = {}
    for vi, var in enumerate(pcfg.variables):
        key = {"model": model, "q": float(q), "layer": int(layer), "variable": var}
        try:
            try:
                labels = variable_labels(by_id, var, pcfg.device_grouping)
                strata = variable_strata(by_id, var, pcfg.device_grouping)
            except KeyError as missing:
                raise ProvenanceError(f"the manifest has no column {missing}; provenance.variables names manifest "
                                      "columns (device, site), pairs (site+device) or within-strata audits "
                                      "(device|site)") from None
            if sup is None:
                rows["provenance_verdicts"].append({**key, "verdict": "not audited", "reason": (
                    "the cohort carries no diagnostic labels (no scp_codes): the target y is undefined")})
                continue
            u = _by_split(labels, by_id.index, ids)
            st = None if strata is None else _by_split(strata, by_id.index, ids)
            seed_key = (zlib.crc32(model.encode()), int(layer), vi)
            res = run_audit(Inputs(x, u, y, patients, meta, st, var), pcfg, seed_key)
            if res.recover:
                rows["provenance_recover"].append({**key, **res.recover})
            for name, part in (("provenance_stress", res.stress), ("provenance_controls", res.controls),
                               ("provenance_gates", res.gates), ("provenance_odds", res.odds)):
                rows[name] += [{**key, **r} for r in part]
            rows["provenance_verdicts"].append({**key, **res.verdict})
            if cell_dir is not None and res.recover and strata is None:
                rows["provenance_features"] += [{**key, "cell_id": Path(cell_dir).name, **r}
                                                for r in _features(root, model, layer, cell_dir, u, res.groups, ids,
                                                                   info, pcfg, codes_cache)]
        except Exception as err:  # one variable failing must not lose the others
            log.error("provenance audit %s layer %d %s failed: %s", model, layer, var, err)
            rows["provenance_verdicts"].append({**key, "verdict": FAILED,
                                                "reason": failure_text(err, credentialed)})
    rows["provenance_verdicts"] = apply_strata(rows["provenance_verdicts"])
    return rows


def _by_split(labels: np.ndarray, index: pd.Index, ids: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    lab = pd.Series(labels, index=index)
    return {s: lab.loc[ids[s]].to_numpy().astype(str) for s in ids}


def block_metadata(pcfg: ProvenanceConfig, root: Path, ids: dict[str, np.ndarray],
                   patients: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The metadata comparator's features per split: the user's CSV when `provenance.metadata_csv` is set, else
    PTB-XL's ptbxl_database.csv, else None (the gate is then not evaluated)."""
    from raybench.analysis.provenance_audit.metadata import csv_metadata, ptbxl_metadata

    if pcfg.metadata_csv:
        try:
            return {s: csv_metadata(Path(pcfg.metadata_csv), ids[s], patients[s]) for s in ids}
        except ValueError as err:
            raise ProvenanceError(str(err)) from None
    meta = {s: ptbxl_metadata(root, ids[s]) for s in ids}
    return None if any(v is None for v in meta.values()) else meta


def apply_strata(verdicts: list[dict]) -> list[dict]:
    """Each variable audited also within strata (`device` beside `device|site`, same model and layer): its
    reliance verdict stands only when the within-stratum row reads reliance (verdict.within_strata)."""
    from raybench.analysis.provenance_audit.verdict import within_strata

    by_key = {(r["model"], r["layer"], r["variable"]): r for r in verdicts}
    out = []
    for r in verdicts:
        for (m, layer, var), inner in by_key.items():
            if (m, layer) == (r["model"], r["layer"]) and "|" in var and var.split("|")[0] == r["variable"]:
                r = within_strata(r, inner, var.split("|")[1])
        out.append(r)
    return out


def _features(root: str, model: str, layer: int, cell_dir: str, u: dict[str, np.ndarray],
              groups: dict[str, str], ids: dict[str, np.ndarray], info: object, pcfg: ProvenanceConfig,
              cache: dict) -> list[dict]:
    """Latent rows of the calibration cell for one variable, on the audit's provenance groups (codes computed
    once per block)."""
    import json

    from raybench.analysis.provenance_audit.features import feature_rows, univariate_lpi
    from raybench.analysis.secondary.estimators import sae_codes
    from raybench.encoders.store import ActivationStore
    from raybench.sae.cell_files import load_cell_sae

    labels = sorted(set(groups.values()))
    if len(labels) < 2:
        return []
    if "codes" not in cache:
        import torch

        torch.set_num_threads(1)
        store = ActivationStore(Path(root) / "activations")
        sae, norm = load_cell_sae(cell_dir)
        cache["codes"] = {s: sae_codes(sae, norm, np.asarray(store.load(model, layer, s, mmap=False)), 1024)
                          for s in ("train", "test")}
    codes = cache["codes"]
    code = {g: labels.index(label) for g, label in groups.items()}
    m_tr, m_te = np.isin(u["train"], list(groups)), np.isin(u["test"], list(groups))
    lpi = univariate_lpi(codes["train"][m_tr], np.array([code[g] for g in u["train"][m_tr]]),
                         codes["test"][m_te], np.array([code[g] for g in u["test"][m_te]]), len(labels))
    metrics = json.loads((Path(cell_dir) / "metrics.json").read_text())
    selected = np.asarray(metrics.get("selected", []), dtype=np.int64)
    r_test = np.asarray(metrics.get("r_test", []), dtype=np.float64)
    concepts = tuple(getattr(info, "concepts", ()))[: len(selected)]
    return feature_rows(lpi, pcfg.top_latents, selected[: len(concepts)], r_test[: len(concepts)], concepts,
                        pcfg.flag_bits)


def blocks(root: Path, cfg: RunConfig) -> list[tuple[str, float, int, str | None]]:
    """(model, q, layer, calibration cell folder or None) of every model with activations x primary depth."""
    from raybench.core.paths import RunLayout
    from raybench.core.protocol import layer_for_depth
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(root)
    store = ActivationStore(layout.activations_dir)
    models = [m for m in cfg.protocol.grid.models if store.layers(m)]
    if not models:
        raise ProvenanceError(f"no activation store under {layout.activations_dir}; run `raybench encode` first")
    dims = store.model_dims(models)
    cells = pd.read_parquet(layout.cells_table) if layout.cells_table.exists() else None
    out = []
    for model in models:
        for q in cfg.protocol.grid.depths:
            layer = layer_for_depth(q, dims[model].n_layers)
            if layer not in store.layers(model):
                continue
            cell = None
            if cells is not None:
                c = cells[(cells.model == model) & (cells.layer == layer) & (cells.arm == "primary")
                          & (cells.expansion == cfg.protocol.eval.calibration_expansion) & (cells.status == "ok")]
                if len(c):
                    cell = str(layout.root / c.sort_values("seed").iloc[0]["cell_dir"])
            out.append((model, float(q), int(layer), cell))
    return out


def write_tables(tables_dir: Path, rows: dict[str, list[dict]]) -> dict[str, pd.DataFrame]:
    """Every table, sorted by its keys; an empty one still carries its columns (KEYS + COLUMNS), so a reader sees
    what it would hold."""
    from raybench.core.atomic import write_table

    tables = {}
    for name in TABLES:
        df = pd.DataFrame(rows.get(name, []))
        if len(df):
            df = df.sort_values([c for c in KEYS if c in df.columns], kind="stable").reset_index(drop=True)
        else:
            df = pd.DataFrame({c: pd.Series(dtype=object if c in ("model", "variable") else float)
                               for c in (*KEYS, *COLUMNS[name])})
        tables[name] = df
        write_table(tables_dir / f"{name}.parquet", df)
    return tables


def run_provenance(root: str | Path, cfg: RunConfig) -> dict[str, pd.DataFrame]:
    """Audit every model x depth as Ray tasks and write the tables (figures: figures.py, drawn at render);
    returns the tables."""
    import ray

    from raybench.core.paths import RunLayout
    from raybench.core.privacy import is_credentialed
    from raybench.infra.ray_session import init_ray

    t0 = time.perf_counter()
    layout = RunLayout.at(root)
    if not layout.manifest.exists():
        raise ProvenanceError(f"{layout.manifest} not found: build the manifest first (`raybench grid`)")
    pcfg = cfg.provenance
    pcfg.validate()
    if pcfg.metadata_csv:  # resolved here: the Ray workers may run elsewhere
        path = Path(pcfg.metadata_csv).expanduser().resolve()
        if not path.is_file():
            raise ProvenanceError(f"{path}: provenance.metadata_csv not found; give the CSV's path (ecg_id or "
                                  "patient_id, age, sex, recording_year) or leave it unset")
        pcfg = replace(pcfg, metadata_csv=str(path))
    todo = blocks(layout.root, cfg)
    init_ray(cfg.resources)
    task = ray.remote(num_cpus=1)(audit_block)
    refs = [task.remote(str(layout.root), m, q, layer, pcfg, cell, is_credentialed(cfg)) for m, q, layer, cell in todo]
    rows: dict[str, list[dict]] = {t: [] for t in TABLES}
    for part in ray.get(refs):
        for name in TABLES:
            rows[name] += part[name]
    tables = write_tables(layout.tables_dir, rows)
    log.info("provenance audit: %d blocks in %.1fs", len(todo), time.perf_counter() - t0)
    return tables
