"""Helpers of the provenance-audit tests: planted embeddings with known reliance, and a small run folder
(cohort -> manifest -> in-process demo-encoder activations) without Ray Data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raybench.analysis.provenance_audit.audit import SPLITS, Inputs


def planted_inputs(n_patients: int = 1000, assoc: float = 0.95, test_assoc: float | None = 0.5,
                   signal: float = 3.0, artifact: float = 3.0, aligned: float = 0.0, d: int = 64,
                   seed: int = 0, meta: bool = True) -> Inputs:
    """Two devices A/B per patient (2 records each), a binary diagnosis with its own direction (`signal`) and
    P(y=1 | device B) = (1 + assoc) / 2 (test split: `test_assoc`, the deployment association); the device
    shows in a second direction (`artifact`), which also carries `aligned` x y; coordinates are mixed by a
    random rotation so no axis is a feature by itself. Splits are patient-disjoint (60/20/20). `meta`: age, sex and
    recording year per patient, unrelated to the device (the metadata comparator has nothing to explain)."""
    rng = np.random.default_rng(seed)
    u_p = rng.integers(0, 2, n_patients)
    split_p = rng.choice(3, n_patients, p=[0.6, 0.2, 0.2])
    a = np.where(split_p == 2, assoc if test_assoc is None else test_assoc, assoc)
    y_p = (rng.random(n_patients) < 0.5 + a / 2 * (2 * u_p - 1)).astype(np.int64)
    pid = np.repeat(np.arange(n_patients), 2)
    u, y, split = u_p[pid], y_p[pid], np.array(SPLITS)[split_p][pid]
    x = rng.standard_normal((len(pid), d))
    x[:, 0] += signal * y
    x[:, 1] += artifact * u + aligned * y
    x = x @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    names = np.array(["A", "B"])
    m = np.column_stack([rng.uniform(20, 90, n_patients), rng.integers(0, 2, n_patients),
                         rng.integers(1990, 2000, n_patients)])[pid]
    return Inputs({s: x[split == s] for s in SPLITS}, {s: names[u[split == s]] for s in SPLITS},
                  {s: y[split == s] for s in SPLITS}, {s: pid[split == s].astype(str) for s in SPLITS},
                  {s: m[split == s] for s in SPLITS} if meta else None)


def confounded_inputs(n_patients: int = 3000, era: float = 3.0, signal: float = 2.0, d: int = 32,
                      seed: int = 0) -> Inputs:
    """u tied to y only through a metadata covariate: a recording year m per patient sets the device (u = 1 after
    a changeover, with some overlap) and the diagnosis prevalence (P(y=1) = sigmoid(2 m)); the embedding carries
    the diagnosis (`signal`) and the era (`era` x m: a drift of the recordings over time), no device artifact.
    Metadata features: year (m), age and sex (noise). Splits as planted_inputs."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal(n_patients)
    u_p = (m + 0.5 * rng.standard_normal(n_patients) > 0).astype(np.int64)
    y_p = (rng.random(n_patients) < 1 / (1 + np.exp(-2.0 * m))).astype(np.int64)
    split_p = rng.choice(3, n_patients, p=[0.6, 0.2, 0.2])
    pid = np.repeat(np.arange(n_patients), 2)
    u, y, split = u_p[pid], y_p[pid], np.array(SPLITS)[split_p][pid]
    x = rng.standard_normal((len(pid), d))
    x[:, 0] += signal * y
    x[:, 1] += era * m[pid]
    x = x @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    meta = np.column_stack([1990 + 5 * m[pid], rng.uniform(20, 90, len(pid)), rng.integers(0, 2, len(pid))])
    names = np.array(["A", "B"])
    return Inputs({s: x[split == s] for s in SPLITS}, {s: names[u[split == s]] for s in SPLITS},
                  {s: y[split == s] for s in SPLITS}, {s: pid[split == s].astype(str) for s in SPLITS},
                  {s: meta[split == s] for s in SPLITS})


def encode_in_process(root: Path, model: str, layers: list[int]) -> None:
    """Activation stores of `model` (demo size) at `layers` for every manifest record, without Ray Data."""
    import torch

    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.waveforms import read_record
    from raybench.core.paths import RunLayout
    from raybench.encoders.base import EncoderSpec, build_encoder
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(root)
    manifest, info = load_manifest(layout.manifest)
    enc = build_encoder(EncoderSpec(name=model, size="demo"))
    states = {}
    for split in SPLITS:
        rows = manifest[manifest.split == split]
        xs = [enc.preprocess(read_record(info.root, r.path).signal, float(r.fs)) for r in rows.itertuples()]
        with torch.no_grad():
            out = [enc.layer_states(torch.from_numpy(np.stack(xs[i:i + 32]))) for i in range(0, len(xs), 32)]
        states[split] = (rows.ecg_id.to_numpy(np.int64), torch.cat(out, dim=1).numpy())
    store = ActivationStore(layout.activations_dir)
    for layer in layers:
        with store.writer(model, layer, n_layers=enc.n_layers, d=enc.d, manifest_hash=info.manifest_hash,
                          fingerprint=enc.fingerprint(), capacity={s: len(states[s][0]) for s in SPLITS}) as w:
            for split in SPLITS:
                w.append(split, states[split][0], states[split][1][layer].astype(np.float32))
            w.finalize()


def nested_inputs(n_patients: int = 4000, site_prevalence: tuple[float, float] = (0.25, 0.75),
                  device_assoc: float = 0.0, test_device_assoc: float | None = None, device_artifact: float = 0.0,
                  site_artifact: float = 2.0, signal: float = 2.0, d: int = 16, seed: int = 0,
                  ) -> tuple[Inputs, dict[str, dict[str, np.ndarray]]]:
    """Devices nested in sites (PTB-XL's layout): site 0 (60% of patients) records on devices A and B, site 1 on C
    and D, one record per patient. The diagnosis is tied to the site (P(y=1) = `site_prevalence` per site) and
    shows in its own direction (`signal`); the embedding carries the site (`site_artifact`, as a site's recording
    chain would). Within site 0 only: device B raises P(y=1) by `device_assoc` (test split: `test_device_assoc`,
    the deployment association) and shows in a third direction (`device_artifact`). Age, sex and year: noise.
    Returns the Inputs of `device` (no strata) and the labels {column: {split: labels}} of device and site."""
    rng = np.random.default_rng(seed)
    site = (rng.random(n_patients) < 0.4).astype(np.int64)
    dev = rng.integers(0, 2, n_patients)  # within site: A/B (site 0) or C/D (site 1)
    split_p = rng.choice(3, n_patients, p=[0.6, 0.2, 0.2])
    assoc = np.where(split_p == 2, device_assoc if test_device_assoc is None else test_device_assoc, device_assoc)
    p = np.asarray(site_prevalence)[site] + np.where(site == 0, assoc * (dev - 0.5), 0.0)
    y = (rng.random(n_patients) < np.clip(p, 0.02, 0.98)).astype(np.int64)
    x = rng.standard_normal((n_patients, d))
    x[:, 0] += signal * y
    x[:, 1] += site_artifact * site
    x[:, 2] += device_artifact * ((site == 0) & (dev == 1))
    x = x @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    split = np.array(SPLITS)[split_p]
    device = np.array(["A", "B", "C", "D"])[site * 2 + dev]
    site_name = np.array(["site0", "site1"])[site]
    meta = np.column_stack([rng.uniform(20, 90, n_patients), rng.integers(0, 2, n_patients),
                            rng.integers(1990, 2000, n_patients)])
    by = {s: split == s for s in SPLITS}
    inp = Inputs({s: x[m] for s, m in by.items()}, {s: device[m] for s, m in by.items()},
                 {s: y[m] for s, m in by.items()}, {s: np.arange(n_patients)[m].astype(str) for s, m in by.items()},
                 {s: meta[m] for s, m in by.items()})
    return inp, {"device": {s: device[m] for s, m in by.items()}, "site": {s: site_name[m] for s, m in by.items()}}


def age_confounded_inputs(n_patients: int = 3000, d: int = 16, seed: int = 0, meta: bool = True) -> Inputs:
    """A pure age confound: older patients are recorded on device B (with overlap) and are less often NORM; the
    ECG shows age (a direction scaled by standardized age) and the diagnosis, and no device artifact. Metadata
    (`meta`): age, sex and recording year (sex and year noise). One record per patient, splits 60/20/20."""
    rng = np.random.default_rng(seed)
    age = rng.standard_normal(n_patients)
    u = (age + 0.7 * rng.standard_normal(n_patients) > 0).astype(np.int64)
    y = (rng.random(n_patients) < 1 / (1 + np.exp(2.0 * age))).astype(np.int64)
    x = rng.standard_normal((n_patients, d))
    x[:, 0] += 1.5 * y
    x[:, 1] += 2.5 * age
    x = x @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    m = np.column_stack([60 + 12 * age, rng.integers(0, 2, n_patients), rng.integers(1990, 2000, n_patients)])
    split = np.array(SPLITS)[rng.choice(3, n_patients, p=[0.6, 0.2, 0.2])]
    by = {s: split == s for s in SPLITS}
    names = np.array(["A", "B"])
    return Inputs({s: x[b] for s, b in by.items()}, {s: names[u[b]] for s, b in by.items()},
                  {s: y[b] for s, b in by.items()}, {s: np.arange(n_patients)[b].astype(str) for s, b in by.items()},
                  {s: m[b] for s, b in by.items()} if meta else None)


def diagnosis_aligned_inputs(n_patients: int = 6000, assoc: float = 0.6, d: int = 4, seed: int = 0) -> Inputs:
    """The device artifact lies along the diagnosis direction itself: device B shifts the one direction that also
    carries the diagnosis, and P(y=1 | B) = (1 + assoc) / 2. Neither head can tell the two apart, so both lose
    AUROC when the association reverses and neither loses more (few noise dimensions: the two heads agree
    closely). Noise metadata; one record per patient."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 2, n_patients)
    y = (rng.random(n_patients) < 0.5 + assoc / 2 * (2 * u - 1)).astype(np.int64)
    x = rng.standard_normal((n_patients, d))
    x[:, 0] += 1.5 * y + 1.5 * u
    x = x @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    m = np.column_stack([rng.uniform(20, 90, n_patients), rng.integers(0, 2, n_patients),
                         rng.integers(1990, 2000, n_patients)])
    split = np.array(SPLITS)[rng.choice(3, n_patients, p=[0.6, 0.2, 0.2])]
    by = {s: split == s for s in SPLITS}
    names = np.array(["A", "B"])
    return Inputs({s: x[b] for s, b in by.items()}, {s: names[u[b]] for s, b in by.items()},
                  {s: y[b] for s, b in by.items()}, {s: np.arange(n_patients)[b].astype(str) for s, b in by.items()},
                  {s: m[b] for s, b in by.items()})
