"""Input-harmonization audit at the final layer: does the model order depend on how inputs are prepared?

Protocols (each model's own preprocessing still runs last, so it always gets its native input shape):
- native:   the stored activations (the main extraction);
- lead:     only I, II, V1-V6 are supplied; III, aVR, aVL, aVF are rebuilt from I and II;
- temporal: the whole record is mapped to 2,500 points (10 s -> 250 Hz) and presented at the rate at which
            those points fill the model's input window, so every model sees the whole 10 s in its own input
            length (a model with a 5-s window sees the record time-compressed, as in the published protocol);
- joint:    lead, then temporal.
The final layer is re-encoded for the train selection subset and the test split (one Ray task per model,
waveforms read once and shared through the object store; cached under <run>/secondary/harmonization/).
Per model x protocol: train-selected dense coordinate per concept, held-out |r| and coverage, linear CKA to
native on test, patient-bootstrap differences to native with BH over the model comparisons and, separately
(as published), over every concept-level comparison (harmonization_concept_contrasts), and rank
agreement (Spearman, Kendall) of the model order between native and each protocol.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.estimators import (
    bootstrap_counts,
    draw_corr,
    feature_concept_corr,
    gather_columns,
    linear_cka,
    reconstruct_limb_leads,
    temporal_harmonize,
)
from raybench.cohorts.panel import concept_families
from raybench.core.models import WINDOW_SECONDS
from raybench.core.sufficient_stats import paired_corr, patient_stats

if TYPE_CHECKING:
    from raybench.core.config import Protocol, RunConfig
    from raybench.encoders.base import ECGEncoder, EncoderSpec

log = logging.getLogger(__name__)

PROTOCOLS = ("native", "lead", "temporal", "joint")
CACHE_VERSION = 1
CONCEPT_CONTRAST_COLUMNS = ["model", "protocol", "concept", "family", "delta", "ci_low", "ci_high", "p_value",
                            "n_draws", "q_value_bh"]


def window_seconds(encoder: ECGEncoder, record_seconds: float) -> float:
    """The input window of an encoder in seconds (unknown plugin models: the whole record)."""
    explicit = getattr(encoder, "input_seconds", None)
    if explicit:
        return float(explicit)
    found = WINDOW_SECONDS.get((encoder.name, encoder.profile))
    if found is None:
        log.warning("harmonization: no input window known for %s (%s); assuming the whole record (%.1f s). "
                    "Set `input_seconds` on the adapter to fix this.", encoder.name, encoder.profile, record_seconds)
        return record_seconds
    return found


def harmonized_input(encoder: ECGEncoder, signal: np.ndarray, fs: float, protocol: str, window: float,
                     canonical_samples: int) -> np.ndarray:
    """One record [12, T] at fs -> the encoder's native input under a harmonization protocol."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown harmonization protocol {protocol!r}; choose from {PROTOCOLS}")
    x = np.asarray(signal, dtype=np.float32)
    if protocol in ("lead", "joint"):
        x = reconstruct_limb_leads(x)
    if protocol in ("temporal", "joint"):
        x, fs = temporal_harmonize(x, window, canonical_samples)
    out = np.asarray(encoder.preprocess(x, fs), dtype=np.float32)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{encoder.name}: {protocol} input is not finite")
    return out


# ---------------------------------------------------------------- Ray tasks

def read_signals(data_root: str, rows: list[dict]) -> list[np.ndarray]:
    """Waveforms [12, T] float32 of manifest rows (path, fs, n_samples), in order."""
    from raybench.cohorts.waveforms import read_record

    return [read_record(data_root, r["path"], expect_fs=float(r["fs"]), expect_samples=int(r["n_samples"])).signal
            for r in rows]


def encode_model(spec: EncoderSpec, layer: int, chunks: list[list[np.ndarray]], fs: float, protocols: tuple[str, ...],
                 canonical_samples: int, batch: int, fingerprint: str) -> dict[str, np.ndarray]:
    """Final-layer states [n, d] of every record under each non-native protocol (one model, one process)."""
    import ray
    import torch

    from raybench.encoders.actor import encode_states
    from raybench.encoders.base import build_encoder

    torch.set_num_threads(1)
    chunks = [ray.get(c) if isinstance(c, ray.ObjectRef) else c for c in chunks]  # refs nested in a list stay refs
    encoder = build_encoder(spec)
    if encoder.fingerprint() != fingerprint:
        raise RuntimeError(f"{spec.name}: encoder fingerprint {encoder.fingerprint()} differs from the native "
                           f"activation store's {fingerprint}; the harmonized states would come from other weights. "
                           "Re-encode the run (raybench encode) or pass the same checkpoint/size/profile.")
    signals = [s for chunk in chunks for s in chunk]
    seconds = signals[0].shape[-1] / fs
    window = window_seconds(encoder, seconds)
    out = {}
    for protocol in protocols:
        states = []
        for start in range(0, len(signals), batch):
            x = np.stack([harmonized_input(encoder, s, fs, protocol, window, canonical_samples)
                          for s in signals[start:start + batch]])
            states.append(encode_states(encoder, x, [layer])[:, 0])
        out[protocol] = np.concatenate(states).astype(np.float32)
    return out


# ---------------------------------------------------------------- analysis (pure)

def harmonization_tables(feats: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
                         concepts: dict[str, tuple[np.ndarray, np.ndarray]], test_codes: dict[str, np.ndarray],
                         names: tuple[str, ...], layers: dict[str, int], counts: np.ndarray, threshold: float,
                         ci: tuple[float, float]) -> dict[str, pd.DataFrame]:
    """feats[model][protocol] = (selection-subset states, test states); concepts[model] = (y_sel, y_test);
    test_codes[model] = patient codes into the columns of counts [draws, P]."""
    from scipy.stats import spearmanr

    from raybench.analysis.inference.stats import benjamini_hochberg, kendall_tau, paired_p

    fams = concept_families(names)
    rows, concept_rows, contrast_rows, concept_tests = [], [], [], []
    n_pat = counts.shape[1]
    for model in sorted(feats):
        y_sel, y_te = concepts[model]
        boot_abs, obs_abs = {}, {}
        native_test = feats[model]["native"][1]
        for protocol, (x_sel, x_te) in feats[model].items():
            r_sel = feature_concept_corr(x_sel, y_sel)
            sel = np.abs(r_sel).argmax(axis=0)  # single_coordinate_r, keeping the train r of the pick
            r = paired_corr(gather_columns(x_te, sel), y_te)
            r_train = r_sel[sel, np.arange(len(sel))]
            boot_abs[protocol] = np.abs(draw_corr(counts, patient_stats(test_codes[model], n_pat, x_te[:, sel], y_te)))
            obs_abs[protocol] = np.abs(r)
            rows.append({"model": model, "protocol": protocol, "layer": layers[model],
                         "accessibility": float(np.abs(r).mean()),
                         "median_abs_r": float(np.median(np.abs(r))),
                         "sign_consistency": float(np.mean(r_train * r > 0)),
                         "coverage": float((np.abs(r) >= threshold).mean()),
                         "cka_to_native": linear_cka(native_test, x_te), "n_selection": int(x_sel.shape[0]),
                         "n_test": int(x_te.shape[0])})
            concept_rows.append(pd.DataFrame({"model": model, "protocol": protocol, "concept": list(names),
                                              "family": fams, "selected": sel, "train_r": r_train, "test_r": r,
                                              "test_abs_r": np.abs(r)}))
        for protocol in (p for p in feats[model] if p != "native"):
            obs = next(r for r in rows if r["model"] == model and r["protocol"] == protocol)
            nat = next(r for r in rows if r["model"] == model and r["protocol"] == "native")
            for metric, f in (("accessibility", lambda a: a.mean(axis=1)),
                              ("coverage", lambda a: (a >= threshold).mean(axis=1))):
                diff = f(boot_abs[protocol]) - f(boot_abs["native"])
                contrast_rows.append({"model": model, "protocol": protocol, "metric": metric,
                                      "delta": obs[metric] - nat[metric],
                                      "ci_low": float(np.percentile(diff, ci[0])),
                                      "ci_high": float(np.percentile(diff, ci[1])),
                                      "p_value": paired_p(diff), "n_draws": int(diff.size)})
            # concept level (published: |r| protocol - |r| native per concept, BH over every concept test)
            delta = boot_abs[protocol] - boot_abs["native"]  # [draws, C]
            lo, hi = np.percentile(delta, ci, axis=0)
            concept_tests += [{"model": model, "protocol": protocol, "concept": c, "family": fams[j],
                               "delta": float(obs_abs[protocol][j] - obs_abs["native"][j]), "ci_low": float(lo[j]),
                               "ci_high": float(hi[j]), "p_value": paired_p(delta[:, j]), "n_draws": len(delta)}
                              for j, c in enumerate(names)]
    summary = pd.DataFrame(rows)
    by_concept = pd.DataFrame(concept_tests, columns=CONCEPT_CONTRAST_COLUMNS[:-1])
    by_concept["q_value_bh"] = benjamini_hochberg(by_concept["p_value"].to_numpy()) if len(by_concept) else []
    contrasts = pd.DataFrame(contrast_rows, columns=["model", "protocol", "metric", "delta", "ci_low", "ci_high",
                                                     "p_value", "n_draws"])
    contrasts["q_value_bh"] = np.nan
    for _, idx in contrasts.groupby("metric").groups.items():
        contrasts.loc[idx, "q_value_bh"] = benjamini_hochberg(contrasts.loc[idx, "p_value"].to_numpy())
    rank_rows = []
    for protocol in [p for p in PROTOCOLS if p != "native" and p in set(summary["protocol"])]:
        for metric in ("accessibility", "coverage"):
            wide = summary.pivot_table(index="model", columns="protocol", values=metric)
            a, b = wide["native"].to_numpy(), wide[protocol].to_numpy()
            ok = len(a) >= 2 and np.ptp(a) > 0 and np.ptp(b) > 0
            rank_rows.append({"protocol": protocol, "metric": metric,
                              "spearman_rho": float(spearmanr(a, b).statistic) if ok else np.nan,
                              "kendall_tau": kendall_tau(a, b) if len(a) >= 2 else np.nan, "n_models": len(a)})
    ranks = pd.DataFrame(rank_rows, columns=["protocol", "metric", "spearman_rho", "kendall_tau", "n_models"])
    return {"harmonization": summary, "harmonization_contrasts": contrasts, "harmonization_rank": ranks,
            "harmonization_concepts": pd.concat(concept_rows, ignore_index=True),
            "harmonization_concept_contrasts": by_concept}


# ---------------------------------------------------------------- driver

def _subset(rng_seed: int, ids: np.ndarray, cap: int | None) -> np.ndarray:
    if cap is None or len(ids) <= cap:
        return ids
    return np.sort(np.random.default_rng(rng_seed).choice(ids, size=cap, replace=False))


def run_harmonization(root: str | Path, protocol: Protocol, cfg: RunConfig, scfg: SecondaryConfig
                      ) -> dict[str, pd.DataFrame]:
    """Re-encode the final layer under each protocol (cached), then write the harmonization tables + figure."""
    import ray

    from raybench.cohorts.manifest import load_manifest
    from raybench.core.atomic import atomic_path, write_table
    from raybench.core.paths import RunLayout
    from raybench.encoders.base import EncoderSpec
    from raybench.encoders.store import ActivationStore, StoreError
    from raybench.sae.data import selection_ecg_ids

    layout = RunLayout.at(root)
    manifest, info = load_manifest(layout.manifest)
    names = tuple(info.concepts)
    if not names:
        log.warning("harmonization skipped: the manifest has no concepts")
        return {}
    store = ActivationStore(layout.activations_dir)
    by_id = manifest.set_index("ecg_id")
    protocols = tuple(p for p in PROTOCOLS if p in scfg.harmonization_protocols)
    extra = tuple(p for p in protocols if p != "native")
    # the records: train selection subset (capped) and test patients (capped), common to every model
    sel_ids = _subset(scfg.harmonization_subset_seed, selection_ecg_ids(manifest, protocol.eval),
                      scfg.harmonization_train_records)
    patients = np.array(sorted(manifest.loc[manifest["split"] == "test", "patient_id"].astype(str).unique()))
    patients = np.sort(_subset(scfg.harmonization_subset_seed + 1, patients, scfg.harmonization_test_patients))
    test_ids = manifest.loc[(manifest["split"] == "test") & manifest["patient_id"].astype(str).isin(patients),
                            "ecg_id"].to_numpy(np.int64)
    models, layers, native, fps = [], {}, {}, {}
    for model in protocol.grid.models:
        try:
            n_layers = store.model_dims((model,))[model].n_layers
            layer = n_layers - 1
            idx = store.index(model, layer)
        except (IndexError, StoreError):
            log.warning("harmonization: no final-layer activation store for %s; skipped", model)
            continue
        ids = {s: store.ecg_ids(model, layer, s) for s in ("train", "test")}
        pos_sel = np.flatnonzero(np.isin(ids["train"], sel_ids))
        pos_te = np.flatnonzero(np.isin(ids["test"], test_ids))
        native[model] = (ids["train"][pos_sel], ids["test"][pos_te],
                         np.asarray(store.load(model, layer, "train"))[pos_sel],
                         np.asarray(store.load(model, layer, "test"))[pos_te])
        models.append(model)
        layers[model] = layer
        fps[model] = idx["fingerprint"]
    if not models:
        log.warning("harmonization skipped: no model has a final-layer store")
        return {}
    all_ids = np.unique(np.concatenate([np.concatenate(native[m][:2]) for m in models]))
    cache_dir = layout.root / "secondary" / "harmonization"
    enc = cfg.encoders
    todo, cached = [], {}
    for model in models:
        key = {"version": CACHE_VERSION, "manifest_hash": info.manifest_hash, "fingerprint": fps[model],
               "layer": layers[model], "protocols": list(extra), "canonical_samples": scfg.canonical_samples,
               "ids_hash": _ids_hash(all_ids)}
        path = cache_dir / f"{model}.npz"
        if path.exists():
            with np.load(path, allow_pickle=False) as z:
                if json.loads(str(z["key"])) == key:
                    cached[model] = {p: z[p] for p in extra}
                    continue
        todo.append((model, key, path))
    if todo and extra:
        rows = [dict(path=by_id.at[i, "path"], fs=by_id.at[i, "fs"], n_samples=by_id.at[i, "n_samples"])
                for i in all_ids]
        fs_set = sorted({float(r["fs"]) for r in rows})
        if len(fs_set) != 1:
            raise ValueError(f"harmonization needs one sampling rate across records, got {fs_set}")
        reader = ray.remote(num_cpus=1)(read_signals)
        step = max(1, -(-len(rows) // 4))
        chunk_refs = [reader.remote(str(info.root), rows[i:i + step]) for i in range(0, len(rows), step)]
        encoder_task = ray.remote(num_cpus=1)(encode_model)
        refs = {}
        for model, key, path in todo:
            spec = EncoderSpec(name=model, size=enc.size, checkpoint=enc.checkpoints.get(model), profile=enc.profile,
                               init_seed=enc.init_seed)
            refs[model] = (encoder_task.remote(spec, layers[model], chunk_refs, fs_set[0], extra,
                                               scfg.canonical_samples, scfg.harmonization_batch, fps[model]),
                           key, path)
        for model, (ref, key, path) in refs.items():
            states = ray.get(ref)
            cached[model] = states
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:
                np.savez(fh, key=np.array(json.dumps(key)), ecg_ids=all_ids, **states)
    feats, concepts, codes = {}, {}, {}
    code_of = {p: i for i, p in enumerate(patients)}
    for model in models:
        sel_m, te_m, x_sel, x_te = native[model]
        where = {i: j for j, i in enumerate(all_ids)}
        feats[model] = {"native": (x_sel, x_te)}
        for p in extra:
            arr = cached[model][p]
            feats[model][p] = (arr[[where[i] for i in sel_m]], arr[[where[i] for i in te_m]])
        concepts[model] = (by_id.loc[sel_m, list(names)].to_numpy(np.float64),
                           by_id.loc[te_m, list(names)].to_numpy(np.float64))
        codes[model] = np.array([code_of[str(p)] for p in by_id.loc[te_m, "patient_id"]], dtype=np.int64)
    counts = bootstrap_counts(len(patients), scfg.draws(protocol), scfg.harmonization_bootstrap_seed(protocol),
                              protocol.inference.chunk_draws, protocol.inference.stream)
    tables = harmonization_tables(feats, concepts, codes, names, layers, counts, protocol.eval.coverage_threshold,
                                  (protocol.inference.ci_low, protocol.inference.ci_high))
    for name, df in tables.items():
        write_table(layout.tables_dir / f"{name}.parquet", df)
    return tables


def _ids_hash(ids: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]
