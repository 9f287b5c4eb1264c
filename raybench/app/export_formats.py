"""`raybench export --format saelens|safetensors --cells ...`: trained SAEs in layouts other tools load.

One folder per cell, each with a model card (README.md: encoder, layer, depth, E, k, seed, training split,
test metrics with patient-bootstrap 95% CIs, config hash, raybench version).

safetensors (raybench's own layout, documented):
    sae.safetensors   W_enc [N, d], b_enc [N], W_dec [d, N] (unit columns), b_dec [d], norm_mean [d], norm_std [d]
    cfg.json          the cell's cfg.json (hyperparameters, shapes, the normalization and decode rules)
  codes: z = BatchTopK_k(ReLU(((x - norm_mean) / norm_std - b_dec) W_enc^T + b_enc)), x_hat = (z W_dec^T +
  b_dec) * norm_std + norm_mean, with x a raw activation of the cell's (model, layer) store.

saelens (SAELens' on-disk layout: `SAE.load_from_disk(folder)`), architecture `jumprelu`:
    sae_weights.safetensors   W_enc [d, N], b_enc [N], W_dec [N, d], b_dec [d], threshold [N]
    cfg.json                  architecture, d_in, d_sae, dtype, device, apply_b_dec_to_input, normalize_activations,
                              metadata (model_name, hook_name, raybench's cell and conversion)
  * Activation normalization is folded into the weights exactly, so the SAELens SAE takes raw activations and
    `normalize_activations` is "none": with s = norm_std, m = norm_mean,
        W_enc' = W_enc^T / s[:, None],  b_dec' = b_dec * s + m,  W_dec' = W_dec^T * s[None, :],  b_enc' = b_enc.
    Then (x - b_dec') W_enc' + b_enc' equals raybench's pre-activation of x, and z W_dec' + b_dec' its
    de-normalized reconstruction.
  * BatchTopK is a batch-level rule (the B*k largest pre-activations of a batch), which no per-record
    architecture reproduces. The export uses the usual conversion to a JumpReLU with one global threshold:
    theta = the mean, over the train split in batches of eval.eval_batch records (the evaluation's frozen
    order), of the smallest pre-activation BatchTopK keeps in the batch; every latent gets threshold theta
    (SAELens keeps z_j = pre_j when pre_j > theta). A record then gets a number of active latents that varies
    around k, instead of a batch-average of exactly k. `measure_conversion` states how far the two are apart
    on held-out records (reconstruction R^2 of both, mean L0, agreement of the active sets); the model card
    records it. SAELens' `topk` architecture (exactly k per record) is the other option; the measured
    agreement decides (see the card), and jumprelu with a global threshold is the documented inference rule of
    BatchTopK SAEs.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from raybench import __version__
from raybench.core.atomic import atomic_dir
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout

FORMATS = ("saelens", "safetensors")
# CellSpec.cell_id (raybench/sae/cells.py): <model>-q<depth x 100, 3 digits>-E<expansion, 2+ digits>-<arm>-s<seed>.
# It names a folder under --to, so no slash and no leading dot can pass.
CELL_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*-q\d{3}-E\d{2,}-(?:primary|sensitivity)-s\d+")


class FormatExportError(RaybenchError):
    """The requested cells cannot be exported in that format; the message names the cell and the fix."""


@dataclass(frozen=True)
class Conversion:
    """How the SAELens export's threshold rule compares with BatchTopK on held-out (test) records."""

    threshold: float
    n_records: int
    r2_batchtopk: float
    r2_threshold: float
    l0_batchtopk: float
    l0_threshold: float
    jaccard: float  # mean over records of |active_BatchTopK & active_threshold| / |union|
    max_abs_diff: float  # of the reconstructions, raw activation units
    r2_topk: float  # SAELens' other option: exactly k per record (architecture topk)
    jaccard_topk: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


# ---------------------------------------------------------------- math (pure)

def fold_normalization(w_enc: np.ndarray, b_enc: np.ndarray, w_dec: np.ndarray, b_dec: np.ndarray,
                       mean: np.ndarray, std: np.ndarray) -> dict[str, np.ndarray]:
    """raybench weights (W_enc [N, d], W_dec [d, N], z-scoring mean/std [d]) -> SAELens weights on raw inputs."""
    s = np.asarray(std, dtype=np.float64)
    m = np.asarray(mean, dtype=np.float64)
    out = {"W_enc": np.asarray(w_enc, np.float64).T / s[:, None], "b_enc": np.asarray(b_enc, np.float64),
           "W_dec": np.asarray(w_dec, np.float64).T * s[None, :], "b_dec": np.asarray(b_dec, np.float64) * s + m}
    # C order: a transposed product keeps Fortran order, and safetensors writes the buffer as it lies
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def batchtopk_threshold(pre: Iterable[np.ndarray], k: int) -> float:
    """Global JumpReLU threshold of a BatchTopK SAE: the mean over batches of the smallest kept pre-activation
    (each batch [B, N] keeps its B*k largest entries; only positive ones, as ReLU precedes the selection)."""
    mins = []
    for p in pre:
        flat = np.asarray(p, dtype=np.float64).ravel()
        m = min(p.shape[0] * k, flat.size)
        kept = np.partition(flat, flat.size - m)[flat.size - m:]
        kept = kept[kept > 0]
        if kept.size:
            mins.append(kept.min())
    if not mins:
        raise FormatExportError("no positive pre-activation in any batch: the SAE is dead; nothing to convert")
    return float(np.mean(mins))


def threshold_codes(pre: np.ndarray, threshold: float) -> np.ndarray:
    """JumpReLU with one threshold: pre where pre > threshold, else 0 (pre is already ReLU'd)."""
    return np.where(pre > threshold, pre, 0.0)


# ---------------------------------------------------------------- a cell

def _cell_arrays(cell_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    from raybench.sae.cell_files import load_cell_sae

    cfg = json.loads((cell_dir / "cfg.json").read_text())
    sae, normalizer = load_cell_sae(cell_dir)
    return sae, normalizer, cfg


def _pre(sae, normalizer, x: np.ndarray, batch: int) -> Iterator[np.ndarray]:
    """Pre-activations [B, N] of x in frozen-order batches (one batch in memory at a time)."""
    with torch.no_grad():
        for start in range(0, x.shape[0], batch):
            xb = torch.from_numpy(np.asarray(normalizer.apply(x[start:start + batch]), np.float32)).unsqueeze(0)
            yield sae.pre_activations(xb)[0].double().numpy()


def measure_conversion(sae, normalizer, threshold: float, x: np.ndarray, batch: int) -> Conversion:
    """BatchTopK (frozen-order batches, as evaluation) vs the global threshold on records x [n, d] (raw)."""
    from raybench.sae.evaluate import encode_split

    codes = encode_split(sae, normalizer, x, batch)
    z_b = np.zeros((codes.n, sae.n_latents))
    z_b[codes.rows, codes.cols] = codes.vals
    pre = np.concatenate(list(_pre(sae, normalizer, x, batch)))
    z_t = threshold_codes(pre, threshold)
    w = sae.W_dec[0].detach().double().numpy()  # [d, N]
    b = sae.b_dec[0].detach().double().numpy()
    xn = np.asarray(normalizer.apply(x), np.float64)
    sst = ((xn - xn.mean(0)) ** 2).sum()
    rec_b = z_b @ w.T + b
    rec_t = z_t @ w.T + b
    z_k = per_record_topk(pre, sae.k)
    rec_k = z_k @ w.T + b
    a_b, a_t = z_b > 0, z_t > 0
    std = np.asarray(normalizer.std, np.float64)
    return Conversion(threshold=threshold, n_records=int(x.shape[0]),
                      r2_batchtopk=float(1 - ((rec_b - xn) ** 2).sum() / sst),
                      r2_threshold=float(1 - ((rec_t - xn) ** 2).sum() / sst),
                      l0_batchtopk=float(a_b.sum(1).mean()), l0_threshold=float(a_t.sum(1).mean()),
                      jaccard=jaccard(a_b, a_t), max_abs_diff=float(np.abs((rec_b - rec_t) * std).max()),
                      r2_topk=float(1 - ((rec_k - xn) ** 2).sum() / sst), jaccard_topk=jaccard(a_b, z_k > 0))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over rows of |a & b| / |a | b| (1 where both are empty)."""
    union = (a | b).sum(1)
    return float(np.where(union > 0, (a & b).sum(1) / np.maximum(union, 1), 1.0).mean())


def per_record_topk(pre: np.ndarray, k: int) -> np.ndarray:
    """TopK per record: the k largest (positive) pre-activations of each row, the rest 0."""
    idx = np.argpartition(-pre, k - 1, axis=1)[:, :k]
    out = np.zeros_like(pre)
    rows = np.arange(pre.shape[0])[:, None]
    out[rows, idx] = pre[rows, idx]
    return np.where(out > 0, out, 0.0)


def write_saelens(folder: Path, sae, normalizer, threshold: float, metadata: dict[str, Any]) -> None:
    """sae_weights.safetensors + cfg.json of a JumpReLU SAE on raw activations (the module doc's conversion)."""
    from safetensors.numpy import save_file

    weights = fold_normalization(sae.W_enc[0].detach().numpy(), sae.b_enc[0].detach().numpy(),
                                 sae.W_dec[0].detach().numpy(), sae.b_dec[0].detach().numpy(),
                                 normalizer.mean, normalizer.std)
    weights["threshold"] = np.full(sae.n_latents, threshold, dtype=np.float32)
    save_file(weights, str(folder / "sae_weights.safetensors"))
    cfg = {"architecture": "jumprelu", "d_in": int(sae.d), "d_sae": int(sae.n_latents), "dtype": "float32",
           "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "none",
           "metadata": {"hook_head_index": None, "prepend_bos": False, "context_size": 1, **metadata}}
    (folder / "cfg.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def cell_cis(stats_path: Path, n_draws: int, seed: int, chunk_draws: int, threshold: float,
             ci: tuple[float, float] = (2.5, 97.5)) -> dict[str, tuple[float, float, float]]:
    """Test R^2, accessibility and coverage of one cell with patient-bootstrap percentile CIs, from its
    patient_stats.npz (raybench.core.sufficient_stats) and the run's chunked patient stream
    (raybench.analysis.inference.streams.patient_counts): metric -> (point, low, high)."""
    from raybench.analysis.inference.stats import percentile_ci
    from raybench.analysis.inference.streams import n_chunks, patient_counts
    from raybench.core.sufficient_stats import pearson_from_parts

    with np.load(stats_path) as f:
        n, sse, sst, corr = (f[k].astype(np.float64) for k in ("n", "sse", "sst", "corr"))
    p = n.size
    counts = np.concatenate([patient_counts(seed, n_draws, chunk_draws, p, c)
                             for c in range(n_chunks(n_draws, chunk_draws))])

    def metrics(w: np.ndarray) -> np.ndarray:  # w [D, P] patient weights -> [D, 3]
        r2 = 1.0 - (w @ sse) / (w @ sst)
        r = np.abs(pearson_from_parts((w @ n)[:, None], np.einsum("dp,pck->dck", w, corr)))
        return np.column_stack([r2, r.mean(1), (r >= threshold).mean(1)])

    point = metrics(np.ones((1, p)))[0]
    lo, hi = percentile_ci(metrics(counts), *ci)
    return {name: (float(point[i]), float(lo[i]), float(hi[i]))
            for i, name in enumerate(("test_r2", "test_accessibility", "test_coverage"))}


def select_cells(cells: pd.DataFrame, patterns: tuple[str, ...]) -> list[str]:
    """Ok cell ids matching any pattern (a cell id or a glob such as `ecg_fm-q100-E08-*`), in table order."""
    ok = cells[cells["status"] == "ok"]
    ids = [c for c in ok["cell_id"].astype(str) if any(fnmatch.fnmatchcase(c, p) for p in patterns)]
    if not ids:
        raise FormatExportError(f"--cells {','.join(patterns)} matches no ok cell of tables/cells.parquet; give cell "
                                "ids or globs such as ecg_fm-q100-E08-primary-*")
    return ids


def checked_cell(layout: RunLayout, cell_id: str, cell_dir: str, dest: Path) -> Path:
    """The cell's folder, after checking what tables/cells.parquet says (a table can be edited, or come from
    elsewhere): the id is one raybench writes, so `dest / cell_id` stays in `dest`, and the folder lies under
    the run's cells/."""
    fix = "restore the run's tables/cells.parquet (or rerun `raybench grid`), then export again"
    if not CELL_ID.fullmatch(cell_id) or (dest / cell_id).resolve().parent != dest.resolve():
        raise FormatExportError(f"{layout.cells_table}: cell_id {cell_id!r} is not a raybench cell id "
                                f"(<model>-qNNN-ENN-<arm>-s<seed>, no path separators): {fix}")
    folder = (layout.root / cell_dir).resolve()
    if layout.cells_dir.resolve() not in folder.parents:
        raise FormatExportError(f"{layout.cells_table}: cell {cell_id} has cell_dir {cell_dir!r}, outside the run's "
                                f"cells/ folder: {fix}")
    return folder


def model_card(row: dict[str, Any], cfg: dict[str, Any], run: dict[str, Any], cis: dict[str, tuple],
               conversion: Conversion | None, fmt: str, metrics: dict[str, Any], weights: str = "not recorded",
               cohort: str = "Cohort: not recorded.") -> str:
    """README.md of an exported cell; `weights` (the encoder's, raybench.analysis.summary.headline.weights) and
    `cohort` (headline.cohort_text) open it, so a card of a random-weight or synthetic run says so first."""
    lines = [f"# raybench SAE {row['cell_id']}", "",
             f"**Encoder weights: {weights}.** **{cohort}**", "",
             f"A BatchTopK sparse autoencoder trained by raybench {__version__} (ECG-InterpBench protocol) on frozen "
             f"{row['model']} activations, exported in the `{fmt}` layout.", "",
             "| field | value |", "|---|---|"]
    fields = [("encoder", row["model"]), ("layer", f"{row['layer']} of {row['n_layers']}"),
              ("relative depth q", row["q"]), ("expansion E = N/d", row["expansion"]), ("d", cfg.get("d")),
              ("N latents", row["n_latents"]), ("k (batch-average active latents)", row["k"]),
              ("seed", row["seed"]), ("arm", row["arm"]),
              ("training data", f"train split of the {run.get('cohort', {}).get('kind', '?')} cohort "
               "(patient-level split, docs/protocol.md §3); selection on the train selection subset, metrics on "
               "the test split"),
              ("steps x batch", f"{cfg.get('steps')} x {cfg.get('batch_size')}"),
              ("config hash", row.get("config_hash")), ("manifest hash", metrics.get("manifest_hash")),
              ("encoder fingerprint", metrics.get("encoder_fingerprint")), ("raybench version", __version__)]
    lines += [f"| {k} | {v} |" for k, v in fields]
    lines += ["", "## Test metrics (patient-bootstrap 95% CIs)", "", "| metric | value | 95% CI |", "|---|---|---|"]
    lines += [f"| {k} | {v[0]:.4f} | {v[1]:.4f} – {v[2]:.4f} |" for k, v in cis.items()]
    lines += [f"| validation R² | {metrics.get('val_r2', float('nan')):.4f} | |",
              f"| validation dead fraction | {metrics.get('val_dead_fraction', float('nan')):.4f} | |"]
    lines += ["", "## Use", ""]
    if fmt == "saelens":
        lines += ["```python", "from sae_lens import SAE", "sae = SAE.load_from_disk('<this folder>')",
                  "z = sae.encode(x)  # x: raw activations [n, d] of the encoder layer above", "```", "",
                  "The train-split z-scoring is folded into the weights (raw activations in, raw reconstructions "
                  "out; `normalize_activations: none`). BatchTopK is replaced by a JumpReLU with one global "
                  "threshold (the mean smallest kept pre-activation over train batches; export_formats.py)."]
        if conversion is not None:
            c = conversion
            lines += ["", f"Measured on {c.n_records} held-out test records: threshold {c.threshold:.5f}; "
                      f"reconstruction R² {c.r2_batchtopk:.4f} (BatchTopK, as evaluated) vs {c.r2_threshold:.4f} "
                      f"(threshold); mean L0 {c.l0_batchtopk:.2f} vs {c.l0_threshold:.2f}; mean Jaccard of the "
                      f"active sets {c.jaccard:.3f}; largest reconstruction difference {c.max_abs_diff:.4g}. "
                      f"SAELens' per-record `topk` (k = {row['k']}) would give R² {c.r2_topk:.4f} and Jaccard "
                      f"{c.jaccard_topk:.3f} against BatchTopK."]
    else:
        lines += ["`sae.safetensors` and `cfg.json` are raybench's cell files (layout in "
                  "raybench/app/export_formats.py): z-score x with norm_mean / norm_std, encode with BatchTopK, "
                  "decode and de-normalize (the rules are spelled out in cfg.json)."]
    return "\n".join(lines) + "\n"


def export_cells(run_dir: str | Path, dest: str | Path, patterns: tuple[str, ...], fmt: str) -> list[Path]:
    """Write one folder per selected cell into `dest` (a new or empty folder) in `fmt`; returns the folders."""
    from raybench.analysis.summary.headline import cohort_text
    from raybench.analysis.summary.headline import weights as encoder_weights
    from raybench.core.run_state import read_run_yaml, run_protocol
    from raybench.sae.cell_files import load_cell_metrics
    from raybench.sae.data import load_cell_data

    if fmt not in FORMATS:
        raise FormatExportError(f"--format {fmt}: choose one of {FORMATS}")
    layout = RunLayout.at(run_dir)
    protocol = run_protocol(layout.root)
    if protocol is None or not layout.cells_table.exists():
        raise FormatExportError(f"{layout.root} has no run.yaml protocol or no tables/cells.parquet: export a "
                                "finished run folder")
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FormatExportError(f"--to {dest} exists and is not an empty folder: export to a new folder")
    run = read_run_yaml(layout.root) or {}
    cells = pd.read_parquet(layout.cells_table)
    rows = cells.set_index("cell_id")
    inf = protocol.inference
    weights, cohort = encoder_weights(layout, run), cohort_text(layout, run)
    out = []
    with atomic_dir(dest) as tmp:
        for cell_id in select_cells(cells, patterns):
            row = {"cell_id": cell_id, **rows.loc[cell_id].to_dict()}
            cell_dir = checked_cell(layout, cell_id, str(row["cell_dir"]), tmp)
            sae, normalizer, cfg = _cell_arrays(cell_dir)
            metrics = load_cell_metrics(cell_dir)
            cis = cell_cis(cell_dir / "patient_stats.npz", inf.patient_draws, inf.seed, inf.chunk_draws,
                           protocol.eval.coverage_threshold, (inf.ci_low, inf.ci_high))
            folder = tmp / cell_id
            folder.mkdir()
            conversion = None
            if fmt == "safetensors":
                shutil.copyfile(cell_dir / "sae.safetensors", folder / "sae.safetensors")
                shutil.copyfile(cell_dir / "cfg.json", folder / "cfg.json")
            else:
                data = load_cell_data(layout.root, str(row["model"]), int(row["layer"]), protocol.eval)
                batch = protocol.eval.eval_batch
                threshold = batchtopk_threshold(_pre(sae, normalizer, data.acts["train"], batch), sae.k)
                conversion = measure_conversion(sae, normalizer, threshold, data.acts["test"], batch)
                write_saelens(folder, sae, normalizer, threshold, {
                    "model_name": str(row["model"]), "hook_name": f"layer_{int(row['layer']):02d}",
                    "raybench": {"cell_id": cell_id, "version": __version__, "config_hash": row.get("config_hash"),
                                 "k": int(sae.k), "conversion": conversion.as_dict(),
                                 "input": "raw activations of the store activations/<model>/layer_NN "
                                          "(token-mean-pooled encoder states)"}})
            (folder / "README.md").write_text(model_card(row, cfg, run, cis, conversion, fmt, metrics,
                                                         weights.get(str(row["model"]), "not recorded"), cohort))
            out.append(Path(dest) / cell_id)
    return out
