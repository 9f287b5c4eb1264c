"""Write the SAE parity fixtures by running the protocol's published code (issue 11, items 2, 3 and 9).

    python tests/parity/make_fixtures_sae.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

The upstream checkout (JayDuan123/2027-kdd-ECG-InterpBench, pinned commit below) is imported from
where it lies; nothing of it is copied here. Its modules only need numpy and torch. Written:

- ``sae_trajectory.npz``: the published trainer ``scripts/run_multiscale_sae_task.py::train`` run on
  small inputs, observed through wrappers that record but change nothing (the model's forward,
  ``auxiliary_loss`` and ``torch.nn.utils.clip_grad_norm_``): per-step batch indices, reconstruction
  MSE, AuxK term, pre-clip gradient norm, the float32 initialisation (at d = 16 the float32 column norms
  of W_dec depend on the memory layout) and the final weights and dead counters. Runs:
    ``plain``  the published loop (clip at 1e5, which never fires on z-scored inputs);
    ``clip``   the same loop with ``clip_grad_norm_``'s max_norm lowered (by the wrapper) to the median
               pre-clip norm of ``plain``, so clipping fires on about half the steps: pins where in the
               step the published code clips and over which tensors;
    ``big``    a few steps on 15,149 records x 256 per batch: numpy's other ``choice`` algorithm.
  ``plain`` and ``clip`` run the published loop in float64 (``train(device=torch.float64)``: the
  function only forwards ``device`` to ``.to()``, so the model is initialised in float32 exactly as
  published, then cast). Their inputs are built so that float32 z-scoring is exact (rows come in
  +x/-x pairs: column means are exactly 0; columns are scaled to std 1.0 exactly in float32), so the
  float64 comparison in the tests sees identical arithmetic up to kernel summation order.
- ``sae_selection.npz``: the published selection subset, captured from the published ``main()`` (its
  ``evaluate`` is wrapped to record the first call's indices, the semantic-train subset) on a tiny
  synthetic project laid out like the published one: ``records.csv`` ordered as the published
  activation index orders it (shards sorted by name: test, train, val; ascending ecg_id within a
  split). Cases: 15,149 train records with the default 4,096 limit, and 300 train records with
  ``--semantic-train-limit 64``.
- ``sae_fixtures.json``: the upstream commit, the command, and the parameters of every run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PINNED_COMMIT = "de4e19d9ee8786eadef9d6530a01d585f933e8fc"
TRAJ = dict(seed=4311, n_pairs=150, d=16, n_latents=64, k=2, steps=40, batch_size=32, learning_rate=1e-3)
BIG = dict(seed=4312, n=15149, d=4, n_latents=8, k=1, steps=3, batch_size=256, learning_rate=3e-4)
SELECTION_CASES = (dict(n_train=15149, n_val=3245, n_test=3243, limit=4096, data_seed=1),
                   dict(n_train=300, n_val=50, n_test=60, limit=64, data_seed=2))


def load_upstream(root: Path):
    """The published per-cell script as a module (it puts its own checkout on sys.path)."""
    spec = importlib.util.spec_from_file_location("published_run_multiscale_sae_task",
                                                  root / "scripts" / "run_multiscale_sae_task.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from benchmark_v1.sae_reconciliation.batchtopk_sae import BatchTopKSAE

    return mod, BatchTopKSAE


def exact_zscore_pairs(n_pairs: int, d: int, seed: int) -> np.ndarray:
    """[2 n_pairs, d] float32 rows x_0, -x_0, x_1, -x_1, ...: float32 z-scoring of it is exact."""
    rng = np.random.default_rng(seed)
    atoms = rng.normal(size=(3 * d, d))
    codes = rng.exponential(size=(n_pairs, 3 * d)) * (rng.random((n_pairs, 3 * d)) < 0.2)
    a = codes @ atoms + 0.1 * rng.normal(size=(n_pairs, d))
    x = np.empty((2 * n_pairs, d))
    x[0::2], x[1::2] = a, -a
    x = (x / x.std(axis=0)).astype(np.float32)
    mean = np.mean(x, axis=0, dtype=np.float64)
    std = np.std(x, axis=0, dtype=np.float64).astype(np.float32)
    if not ((mean == 0).all() and (std == 1).all()):
        raise RuntimeError("the +x/-x construction did not give an exact float32 z-score; change the seed")
    return x


class Recorder:
    """Observes the published loop: wraps forward / auxiliary_loss / clip_grad_norm_ and records, changes nothing
    (except clip_grad_norm_'s max_norm when `clip_to` is given)."""

    def __init__(self, sae_cls, x: np.ndarray, clip_to: float | None = None):
        self.sae_cls, self.clip_to = sae_cls, clip_to
        self.row_of = {row.tobytes(): i for i, row in enumerate(x)}
        if len(self.row_of) != len(x):
            raise RuntimeError("input rows must be unique to recover batch indices")
        self.batches, self.mse, self.aux, self.norms, self.init = [], [], [], [], None

    @contextlib.contextmanager
    def active(self):
        import torch

        cls, rec = self.sae_cls, self
        forward, aux_loss, clip = cls.forward, cls.auxiliary_loss, torch.nn.utils.clip_grad_norm_

        def forward_rec(model, acts_raw):
            if rec.init is None:
                rec.init = {k: v.detach().clone() for k, v in model.state_dict().items()}
            raw = acts_raw.detach().cpu().numpy().astype(np.float32)
            rec.batches.append([rec.row_of[r.tobytes()] for r in raw])
            return forward(model, acts_raw)

        def aux_rec(model, acts_norm, recon_norm):
            out = aux_loss(model, acts_norm, recon_norm)
            rec.mse.append(float((recon_norm - acts_norm).square().mean().item()))
            rec.aux.append(float(out.item()) / model.aux_penalty)
            return out

        def clip_rec(params, max_norm, *args, **kwargs):
            total = clip(params, rec.clip_to if rec.clip_to is not None else max_norm, *args, **kwargs)
            rec.norms.append(float(total.item()))
            return total

        cls.forward, cls.auxiliary_loss, torch.nn.utils.clip_grad_norm_ = forward_rec, aux_rec, clip_rec
        try:
            yield self
        finally:
            cls.forward, cls.auxiliary_loss, torch.nn.utils.clip_grad_norm_ = forward, aux_loss, clip


def run_train(mod, sae_cls, x: np.ndarray, p: dict, device, tmp: Path, clip_to: float | None = None) -> dict:
    config = {"seed": p["seed"], "d_hidden": x.shape[1], "N": p["n_latents"], "k": p["k"],
              "learning_rate": p["learning_rate"], "steps": p["steps"], "batch_size": p["batch_size"],
              "task_index": 0, "config_hash": "parity", "checkpoint": str(tmp / f"ckpt-{len(list(tmp.iterdir()))}.pt")}
    rec = Recorder(sae_cls, x, clip_to)
    with rec.active():
        model = mod.train(config, x, np.arange(len(x)), device, 10**9)
    st = {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}
    return {"batches": np.asarray(rec.batches, dtype=np.int16), "mse": np.asarray(rec.mse),
            "aux": np.asarray(rec.aux), "grad_norm": np.asarray(rec.norms),
            "W_enc": st["W_enc"], "b_enc": st["b_enc"], "W_dec": st["W_dec"], "b_dec": st["b_dec"],
            "dead_counter": st["num_batches_not_active"].astype(np.int16),
            "init_W_enc": rec.init["W_enc"].cpu().numpy().astype(np.float32),
            "init_W_dec": rec.init["W_dec"].cpu().numpy().astype(np.float32)}


def trajectories(mod, sae_cls) -> tuple[dict[str, np.ndarray], dict]:
    import torch

    x = exact_zscore_pairs(TRAJ["n_pairs"], TRAJ["d"], seed=0)
    out: dict[str, np.ndarray] = {"x": x}
    with tempfile.TemporaryDirectory() as tmp:
        plain = run_train(mod, sae_cls, x, TRAJ, torch.float64, Path(tmp))
        clip_to = float(np.median(plain["grad_norm"]))
        clip = run_train(mod, sae_cls, x, TRAJ, torch.float64, Path(tmp), clip_to=clip_to)
        rng = np.random.default_rng(3)
        xb = rng.normal(size=(BIG["n"], BIG["d"])).astype(np.float32)
        big = run_train(mod, sae_cls, xb, BIG, "cpu", Path(tmp))
    if not (plain["aux"] > 0).any():
        raise RuntimeError("no dead latents in the plain run: AuxK is not exercised")
    if not 0 < (clip["grad_norm"] > clip_to).sum() < TRAJ["steps"]:
        raise RuntimeError("the clip run should clip on some steps, not all")
    for name, run in (("plain", plain), ("clip", clip)):
        for k, v in run.items():
            if name == "clip" and k.startswith("init_"):
                continue
            out[f"{name}_{k}"] = v
    out["big_batches"] = big["batches"]
    return out, {"plain": TRAJ, "clip": {**TRAJ, "clip_max_norm": clip_to}, "big": BIG}


def write_project(root: Path, case: dict, mod) -> tuple[Path, np.ndarray, np.ndarray]:
    """A tiny published-layout project: activations, records.csv, concepts, registry, one-row task manifest."""
    from benchmark_v1.multiscale_sae import canonical_config_hash

    rng = np.random.default_rng(case["data_seed"])
    sizes = {"train": case["n_train"], "val": case["n_val"], "test": case["n_test"]}
    n = sum(sizes.values())
    ecg_ids = np.cumsum(1 + (rng.random(n) < 0.02) * rng.integers(1, 5, n)).astype(np.int64)  # gaps, like PTB-XL
    split = np.repeat(np.array(list(sizes)), list(sizes.values()))
    rng.shuffle(split)  # splits interleave along ecg_id
    order = np.concatenate([np.flatnonzero(split == s) for s in ("test", "train", "val")])  # shard-name order
    acts = rng.normal(size=(n, 4)).astype(np.float32)
    np.save(root / "acts.npy", acts[order])
    with (root / "records.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ecg_id", "split"])
        w.writerows((int(ecg_ids[i]), split[i]) for i in order)
    with (root / "concepts.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ecg_id", "c_a", "c_b"])
        w.writerows((int(e), float(a), float(b)) for e, (a, b) in zip(ecg_ids, rng.normal(size=(n, 2)), strict=True))
    (root / "registry.csv").write_text("concept_id,family,main\nc_a,f,yes\nc_b,f,yes\n")
    row = {"task_index": 0, "model": "ECG-FM", "model_safe": "ecg_fm", "feature_suffix": "parity", "layer": 0,
           "relative_depth": 0.0, "actual_relative_depth": 0.0, "n_layers": 1, "d_hidden": 4,
           "sparsity_arm": "fixed_k_over_d", "expansion_E": 2, "N": 8, "k": 1, "k_over_d": 0.25, "k_over_N": 0.125,
           "seed": 4311, "steps": 1, "batch_size": 256, "learning_rate": 3e-4,
           "activation_path": str(root / "acts.npy"), "records_path": str(root / "records.csv"),
           "checkpoint": str(root / "cell" / "ckpt.pt"), "metrics": str(root / "cell" / "metrics.json"),
           "concept_metrics": str(root / "cell" / "concept_metrics.csv"),
           "firing_rate": str(root / "cell" / "firing_rate.npy")}
    typed = mod.typed_config({k: str(v) for k, v in row.items()})
    row["config_hash"] = canonical_config_hash(typed)
    with (root / "manifest.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    return root / "manifest.csv", ecg_ids, split


def selection(mod) -> tuple[dict[str, np.ndarray], list[dict]]:
    out: dict[str, np.ndarray] = {}
    meta = []
    split_code = {"train": 0, "val": 1, "test": 2}
    for i, case in enumerate(SELECTION_CASES):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            manifest, ecg_ids, split = write_project(root, case, mod)
            seen: list[np.ndarray] = []
            evaluate = mod.evaluate

            def evaluate_rec(model, acts, indices, *args, _seen=seen, _evaluate=evaluate, **kwargs):
                _seen.append(np.asarray(indices).copy())
                return _evaluate(model, acts, indices, *args, **kwargs)

            argv = sys.argv
            mod.evaluate = evaluate_rec
            sys.argv = ["run_multiscale_sae_task.py", "--manifest", str(manifest), "--task-index", "0",
                        "--device", "cpu", "--concepts", str(root / "concepts.csv"),
                        "--concept-registry", str(root / "registry.csv"),
                        "--semantic-train-limit", str(case["limit"])]
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    mod.main()
            finally:
                mod.evaluate, sys.argv = evaluate, argv
            records = list(csv.DictReader((root / "records.csv").open()))
            rec_ids = np.array([int(r["ecg_id"]) for r in records])
            chosen = np.sort(rec_ids[seen[0]])  # positions in records.csv -> ecg_ids
        if len(chosen) != case["limit"] or not np.isin(chosen, ecg_ids[split == "train"]).all():
            raise RuntimeError("captured selection subset is not a train subset of the requested size")
        out[f"case{i}_ecg_id"] = ecg_ids.astype(np.int32)
        out[f"case{i}_split"] = np.array([split_code[s] for s in split], dtype=np.int8)
        out[f"case{i}_selected_ecg_id"] = chosen.astype(np.int32)
        meta.append({k: v for k, v in case.items()})
    return out, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--allow-other-commit", action="store_true")
    args = ap.parse_args()
    root = args.upstream.resolve()
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    if commit != PINNED_COMMIT and not args.allow_other_commit:
        sys.exit(f"upstream is at {commit}, fixtures are pinned to {PINNED_COMMIT} (--allow-other-commit)")
    import torch

    torch.set_num_threads(1)
    mod, sae_cls = load_upstream(root)
    traj, traj_meta = trajectories(mod, sae_cls)
    sel, sel_meta = selection(mod)
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "sae_trajectory.npz", **traj)
    np.savez_compressed(args.out / "sae_selection.npz", **sel)
    meta = {"upstream": "https://github.com/JayDuan123/2027-kdd-ECG-InterpBench", "commit": commit,
            "command": "python tests/parity/make_fixtures_sae.py <upstream checkout>",
            "numpy": np.__version__, "torch": torch.__version__,
            "trajectory": traj_meta, "selection": {"seed_in_published_code": 20260714, "cases": sel_meta}}
    (args.out / "sae_fixtures.json").write_text(json.dumps(meta, indent=2) + "\n")
    for name in ("sae_trajectory.npz", "sae_selection.npz", "sae_fixtures.json"):
        print(f"{args.out / name}: {(args.out / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
