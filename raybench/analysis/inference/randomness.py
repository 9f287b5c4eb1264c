"""Evaluation randomness on disk: everything the analysis draws at random, saved in the run folder, so every
reported number can be re-computed from the run folder alone (RunLayout.randomness_dir):

    randomness.json          streams, generators, seeds, draw counts and unit orders of the patient bootstrap,
                             the crossed bootstrap and the permutation floor; how the selection subset is drawn
    selection_ecg_ids.npy    the train selection subset single coordinates are chosen on (ecg_ids, ascending)
    patients_drawn.npy       positions, among the sorted test patient ids, of the patients the patient
                             bootstrap draws over (the column order of every count draw)
    patient_draws_head.npy   the first HEAD patient-count draws [HEAD, P] (int32): a check of a re-derivation
    crossed_draws.npz        every crossed draw: depth_idx [draws, D], seed_idx [draws, S] (positions into
                             the depth and seed units listed in randomness.json)
    floor_seeds.csv          per model x depth x E x seed pair: the permutation floor's generator seed
    secondary.json           seeds of the secondary analyses (random dictionaries, subsets, their bootstraps)

`patient_draws_from_record` and `crossed_draws_from_record` re-derive the draws from randomness.json alone.
Record-level files (.npy/.npz) are never exported (raybench.app.export refuses them); randomness.json and
floor_seeds.csv hold no record identifiers (the test patients appear only as a count and a SHA-256).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.analysis.inference.packed_stats import PatientStats
from raybench.analysis.inference.streams import (
    PUBLISHED_ARMS,
    PUBLISHED_MODEL_NAMES,
    chunked_floor_seed,
    crossed_chunk_draws,
    crossed_draw_indices,
    pair_floor_seeds,
    patient_draws,
)
from raybench.core.atomic import atomic_path, write_json, write_text
from raybench.core.config import Protocol
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

HEAD = 8  # patient draws kept verbatim
FLOOR_COLUMNS = ["model", "q", "layer", "expansion", "arm", "seed_i", "seed_j", "stream", "generator_seed"]

GENERATORS = {
    "published": {
        "patient": "rng = numpy.random.default_rng(seed); each draw (in order) is a row of "
                   "rng.multinomial(P, numpy.full(P, 1/P), size=chunk) over the drawn patients (rows do not depend "
                   "on chunk)",
        "crossed": "rng = numpy.random.default_rng(seed); per draw rng.choice(D, size=D, replace=True) then "
                   "rng.choice(S, size=S, replace=True) (positions into depth_units, seed_units)",
        "floor": "per seed pair rng = numpy.random.default_rng(generator_seed), generator_seed = "
                 "int.from_bytes(sha256('MODEL|layer|depth|E|arm|seed_i|seed_j')[:8], 'little') % 2**32; "
                 "permutations drawn with rng.permutation(m), one per pairing",
    },
    "chunked": {
        "patient": "children = numpy.random.SeedSequence(seed).spawn(ceil(draws / chunk_draws)); chunk c is "
                   "numpy.random.default_rng(children[c]).multinomial(P, numpy.full(P, 1/P), size=chunk size)",
        "crossed": "children = numpy.random.SeedSequence([seed, 1]).spawn(ceil(draws / chunk_draws)); chunk c: "
                   "g = default_rng(children[c]); g.integers(0, D, (size, D)) then g.integers(0, S, (size, S))",
        "floor": "one rng = numpy.random.default_rng(generator_seed) per model x depth x E (generator_seed = "
                 "big-endian int of sha256(f'{inference.seed}:{model}:{q:g}:{E}')[:8]) drawn across the seed "
                 "pairs in order; rng.permutation(m) per pairing",
    },
}


def floor_plan(ok: pd.DataFrame, protocol: Protocol) -> pd.DataFrame:
    """The permutation floor's generator seed per (model, depth, E, seed pair) of the primary arm."""
    stream = protocol.inference.stream
    rows = []
    prim = ok[ok.arm == "primary"]
    for (m, q, e), sub in prim.groupby(["model", "q", "expansion"], sort=True):
        seeds = sorted(int(s) for s in sub.seed)
        if len(seeds) < 2:
            continue
        layer = int(sub.layer.iloc[0]) if "layer" in sub else -1
        pairs = pair_floor_seeds(stream, m, layer, q, int(e), "primary", seeds)
        block = chunked_floor_seed(protocol.inference.seed, m, q, int(e))
        for p, (a, b) in enumerate(itertools.combinations(seeds, 2)):
            rows.append((m, float(q), layer, int(e), "primary", a, b, stream,
                         int(pairs[p]) if pairs is not None else int(block)))
    return pd.DataFrame(rows, columns=FLOOR_COLUMNS)


def _selection(layout: RunLayout, protocol: Protocol) -> tuple[dict[str, Any], np.ndarray | None, str | None]:
    """(record, selection ecg_ids, sha256 of the sorted test patient ids) from the run's manifest."""
    if not layout.manifest.exists():
        return {"missing": f"{layout.manifest.relative_to(layout.root)} not found"}, None, None
    from raybench.cohorts.manifest import load_manifest
    from raybench.sae import data

    manifest, info = load_manifest(layout.manifest)
    ids = np.asarray(data.selection_ecg_ids(manifest, protocol.eval), dtype=np.int64)
    n_train = int((manifest["split"] == "train").sum())
    if hasattr(data, "evaluation_test_patients"):  # the patients the cells' statistics use (complete cases)
        patients = data.evaluation_test_patients(manifest, info, protocol.eval)
    else:
        patients = data.test_patients(manifest)
    record = {"file": "selection_ecg_ids.npy", "records": int(ids.size), "train_records": n_train,
              "seed": int(protocol.eval.selection_seed), "target_records": int(protocol.eval.selection_records),
              "function": "raybench.sae.data.selection_ecg_ids(manifest, protocol.eval)",
              "ecg_ids_sha256": hashlib.sha256(np.ascontiguousarray(ids).tobytes()).hexdigest()}
    return record, ids, hashlib.sha256("\n".join(patients).encode()).hexdigest()


def write_randomness(root: str | Path, protocol: Protocol, ok: pd.DataFrame, stats: PatientStats,
                     depth_units: Sequence[float], seed_units: Sequence[int]) -> Path:
    """Write run_dir/randomness/ (see the module docstring) for an analysis of `ok` cells; -> the folder.

    depth_units, seed_units: the crossed bootstrap's units in the order its positions refer to.
    """
    layout = RunLayout.at(root)
    out = layout.randomness_dir
    out.mkdir(parents=True, exist_ok=True)
    inf = protocol.inference
    stream = inf.stream
    selection, sel_ids, patients_sha = _selection(layout, protocol)
    if sel_ids is not None:
        _save_npy(out / "selection_ecg_ids.npy", sel_ids)

    active = np.ones(stats.n_patients, bool) if stats.active is None else np.asarray(stats.active, bool)
    drawn = np.flatnonzero(active) if stream == "published" else np.arange(stats.n_patients)
    _save_npy(out / "patients_drawn.npy", drawn.astype(np.int32))
    head = []
    for part in patient_draws(stats, inf.patient_draws, inf.seed, inf.chunk_draws, stream):
        head.append(part[:, drawn])
        if sum(len(h) for h in head) >= HEAD:
            break
    _save_npy(out / "patient_draws_head.npy", np.concatenate(head)[:HEAD].astype(np.int32))

    cchunk = crossed_chunk_draws(inf.crossed_draws)
    di, si = crossed_draw_indices(inf.seed, inf.crossed_draws, cchunk, len(depth_units), len(seed_units), stream)
    with atomic_path(out / "crossed_draws.npz") as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, depth_idx=di.astype(np.int8), seed_idx=si.astype(np.int8))

    floors = floor_plan(ok, protocol)
    write_text(out / "floor_seeds.csv", floors.to_csv(index=False))

    record = {
        "stream": stream,
        "numpy": np.__version__,
        "generators": GENERATORS[stream],
        "patient_bootstrap": {
            "seed": int(inf.seed), "draws": int(inf.patient_draws), "chunk_draws": int(inf.chunk_draws),
            "test_patients": int(stats.n_patients), "patients_drawn": int(drawn.size),
            "patient_order": "test patient ids sorted as strings (manifest patient_id); patients_drawn.npy "
                             "gives the drawn ones' positions",
            "test_patients_sha256": patients_sha, "head_file": "patient_draws_head.npy", "head_draws": HEAD,
        },
        "crossed_bootstrap": {
            "seed": int(inf.seed), "draws": int(inf.crossed_draws), "chunk_draws": int(cchunk),
            "depth_units": [float(q) for q in depth_units], "seed_units": [int(s) for s in seed_units],
            "file": "crossed_draws.npz",
        },
        "permutation_floor": {
            "permutations": int(protocol.eval.repro_permutations), "top_columns": int(protocol.eval.repro_top),
            "file": "floor_seeds.csv", "pairs": len(floors),
            "published_names": {"models": PUBLISHED_MODEL_NAMES, "arms": PUBLISHED_ARMS},
        },
        "selection_subset": selection,
    }
    write_json(out / "randomness.json", record)
    return out


def write_secondary_randomness(root: str | Path, protocol: Protocol, scfg: Any, cohort: str) -> Path:
    """randomness/secondary.json: the seeds of the secondary analyses (scfg: their SecondaryConfig; cohort:
    cfg.cohort.kind). Each bootstrap's seed is the one its analysis used (docs/protocol.md §9.5)."""
    inf = protocol.inference

    def bootstrap(seed: int) -> dict[str, Any]:
        return {"stream": inf.stream, "seed": int(seed), "draws": int(scfg.draws(protocol)),
                "chunk_draws": int(inf.chunk_draws), "generator": GENERATORS[inf.stream]["patient"]}

    design = scfg.intervention_design(cohort)
    path = RunLayout.at(root).randomness_dir / "secondary.json"
    write_json(path, {
        "analyses": list(scfg.analyses),
        "random_dictionaries": {
            "seeds": [int(scfg.random_seed) + i for i in range(int(scfg.random_dictionaries))],
            "generator": "numpy.random.default_rng(seed).normal(size=(N, d)) cast to float32, rows divided by "
                         "their float32 norm (clipped at 1e-8)"},
        "harmonization_bootstrap": bootstrap(scfg.harmonization_bootstrap_seed(protocol)),
        "intervention_bootstrap": bootstrap(scfg.intervention_bootstrap_seed(protocol, cohort)),
        "harmonization_subset_seed": int(scfg.harmonization_subset_seed),
        # the cohort's design (§9.4; MIMIC-IV-ECG: §9.4.1, subsets from 976000 and no rotation)
        "intervention_subset_seed": int(design.subset_seed),
        # the base of the random rotations' seeds (+ each final layer's group index), when the design holds them (§9.4)
        "intervention_rotation_seed": int(design.rotation_seed) if "random_rotation" in design.intervention_methods
        else None,
    })
    return path


def read_randomness(root: str | Path) -> dict[str, Any]:
    from raybench.core.atomic import read_json

    path = RunLayout.at(root).randomness_dir / "randomness.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found; run `raybench analyze` on this run folder to write it")
    return read_json(path)


def patient_draws_from_record(record: dict[str, Any], n: int | None = None) -> np.ndarray:
    """Re-derive the patient-count draws [n, patients_drawn] from randomness.json alone (default: all)."""
    pb = record["patient_bootstrap"]
    n = pb["draws"] if n is None else min(int(n), pb["draws"])
    drawn = int(pb["patients_drawn"])
    parts, got = [], 0
    for part in patient_draws(drawn, pb["draws"], pb["seed"], pb["chunk_draws"], record["stream"]):
        parts.append(part)
        got += len(part)
        if got >= n:
            break
    return np.concatenate(parts)[:n]


def crossed_draws_from_record(record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Re-derive every crossed draw (depth positions [draws, D], seed positions [draws, S]) from randomness.json."""
    cb = record["crossed_bootstrap"]
    return crossed_draw_indices(cb["seed"], cb["draws"], cb["chunk_draws"], len(cb["depth_units"]),
                                len(cb["seed_units"]), record["stream"])


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)
