"""Parity fixtures for the ViT-style encoders (CSFM, ECG-JEPA, ST-MEM) from their upstream code (issue 12).

Runs the upstream model code and preprocessing, and the published protocol's adapters, on three fixed
12-lead records and stores what they compute; `tests/parity/test_parity_vit.py` compares raybench with it.
Run it in a scratch environment outside this project (numpy, scipy, torch, wfdb, neurokit2, einops, timm,
h5py, pandas, scikit-learn, pyyaml; omegaconf and hydra-core only because the protocol's 12-lead loader
refuses to run without them). It imports the checkouts given on the command line, vendors none of their
code, and imports nothing from raybench. Weights come from `tests/parity/weights.py` (seed + parameter
name -> tensor), so no checkpoint is stored.

    python make_fixtures_encoders_vit.py --csfm DIR --ecg-jepa DIR --st-mem DIR --interpbench DIR \
        --record PTBXL/records500/00000/00001_hr [--out tests/parity] [--work DIR]

Records: the PTB-XL record given (rewritten as WFDB with the same digital samples), and two synthetic
ECG-like records (257 Hz for 12.5 s: a rate where int() and round() give different lengths and a record
longer than every model's window; 100 Hz for 10 s: upsampling). Every pipeline reads the same digital
samples: WFDB files for the upstream readers, Challenge-format `.hea`/`.mat` files for the protocol's.

Per model and profile, `vit_<model>_<profile>.npz` holds `inputs` [R, C, T] (the preprocessed input as the
reference computes it, float32) and `states` [L, R, d] (the pooled state of every audited layer, float32),
`names` [R]. `vit_records.npz` holds the synthetic records as a reader returns them (float32 mV, [12, T]),
`vit_fixtures.json` the commits, versions, seeds, weight names and shapes and what each reference ran.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PINNED = {
    "csfm": "92eb23afd19cf97a631d990542b9e99e9bffa54f",
    "ecg_jepa": "d937ad2c2c8a1e22856ce7e4a23a30f84a71217c",
    "st_mem": "69ec70246c01fe32b14dea810af812556c06eab0",
    "interpbench": "de4e19d9ee8786eadef9d6530a01d585f933e8fc",
}
REPOS = {"csfm": "guxiao0822/Cardiac-Sensing-FM", "ecg_jepa": "sehunfromdaegu/ECG_JEPA", "st_mem": "bakqui/ST-MEM",
         "interpbench": "JayDuan123/2027-kdd-ECG-InterpBench"}
SEEDS = {"csfm": 1201, "ecg_jepa": 1202, "st_mem": 1203}
MODELS = ("csfm", "ecg_jepa", "st_mem")
LEADS = ["I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"]
GAIN = 1000.0  # digital units per mV, as PTB-XL
# (name, fs, samples, seed, challenge-format ecg_id)
SYNTH = [("synth_257hz", 257, 3212, 257, 90257), ("synth_100hz", 100, 1000, 100, 90100)]
REAL = ("ptbxl_00001", 1)


def load_weights_module():
    spec = importlib.util.spec_from_file_location("vit_parity_weights", HERE / "weights.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_file_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def git_head(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def synth_ecg(fs: int, n: int, seed: int) -> np.ndarray:
    """ECG-like [n, 12] mV: P-QRS-T beats at ~69 bpm mixed per lead, baseline wander, 50 Hz hum, noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / fs
    beats = np.arange(0.35, t[-1] + 1.0, 60 / 69)
    beats = beats + rng.normal(0, 0.01, beats.size)
    waves = {"P": (-0.18, 0.15, 0.025), "Q": (-0.03, -0.12, 0.010), "R": (0.0, 1.2, 0.012),
             "S": (0.03, -0.3, 0.012), "T": (0.26, 0.3, 0.05)}
    comp = np.zeros((len(waves), n))
    for b in beats:
        for i, (off, amp, width) in enumerate(waves.values()):
            comp[i] += amp * np.exp(-0.5 * ((t - b - off) / width) ** 2)
    mix = rng.uniform(-0.4, 1.3, (12, len(waves)))
    sig = mix @ comp
    sig += 0.3 * np.sin(2 * np.pi * 0.15 * t + rng.uniform(0, 2 * np.pi, (12, 1)))
    if fs > 100:
        sig += 0.03 * np.sin(2 * np.pi * 50 * t)
    sig += 0.01 * rng.standard_normal(sig.shape)
    return sig.T


def write_records(work: Path, record: Path) -> list[dict]:
    """WFDB copies (lead names spelled aVR/aVL/aVF) and Challenge-format `.hea`/`.mat` pairs of all records."""
    import scipy.io
    import wfdb

    wdir, cdir = work / "wfdb", work / "challenge" / "g1"
    wdir.mkdir(parents=True, exist_ok=True)
    cdir.mkdir(parents=True, exist_ok=True)
    rec = wfdb.rdrecord(str(record), physical=False)
    assert list(rec.adc_gain) == [GAIN] * 12 and list(rec.baseline) == [0] * 12, "expected PTB-XL's gain/baseline"
    names = [str(s).upper().replace("AVR", "aVR").replace("AVL", "aVL").replace("AVF", "aVF") for s in rec.sig_name]
    assert names == LEADS, names
    entries = [{"name": REAL[0], "fs": int(rec.fs), "digital": rec.d_signal.astype(np.int16), "ecg_id": REAL[1],
                "source": f"{record.parent.parent.name}/{record.parent.name}/{record.name}",
                "dat_sha256": hashlib.sha256(record.with_suffix(".dat").read_bytes()).hexdigest()}]
    for name, fs, n, seed, ecg_id in SYNTH:
        digital = np.round(synth_ecg(fs, n, seed) * GAIN).astype(np.int16)
        entries.append({"name": name, "fs": fs, "digital": digital, "ecg_id": ecg_id,
                        "source": f"synthetic seed {seed}"})
    for e in entries:
        d = e["digital"]
        wfdb.wrsamp(e["name"], fs=e["fs"], units=["mV"] * 12, sig_name=LEADS, d_signal=d, fmt=["16"] * 12,
                    adc_gain=[GAIN] * 12, baseline=[0] * 12, write_dir=str(wdir))
        base = f"HR{e['ecg_id']:05d}"
        scipy.io.savemat(cdir / f"{base}.mat", {"val": d.T.astype(np.int16)})
        lines = [f"{base} 12 {e['fs']} {d.shape[0]}"]
        lines += [f"{base}.mat 16+24 {GAIN:g}/mV 16 0 {int(d[0, i])} 0 0 {lead}" for i, lead in enumerate(LEADS)]
        (cdir / f"{base}.hea").write_text("\n".join(lines) + "\n")
        e["wfdb"] = str(wdir / e["name"])
        e["hea"], e["mat"] = str(cdir / f"{base}.hea"), str(cdir / f"{base}.mat")
        e["physical"] = wfdb.rdsamp(e["wfdb"])[0]  # float64 [T, 12], what the upstream readers see
        assert np.array_equal(e["physical"], d / GAIN)
    return entries


def published_index(entries: list[dict]) -> dict:
    return {f"HR{e['ecg_id']:05d}": {"hea": Path(e["hea"]), "mat": Path(e["mat"])} for e in entries}


@contextlib.contextmanager
def on_path(path: Path):
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))


def hook_outputs(blocks, fn=lambda module, inputs, output: output):
    """Register forward hooks that keep fn(module, inputs, output) per block; returns (store, handles)."""
    store: dict[int, object] = {}
    handles = []
    for i, block in enumerate(blocks):
        def hook(module, inputs, output, i=i):
            store[i] = fn(module, inputs, output).detach().clone()
        handles.append(block.register_forward_hook(hook))
    return store, handles


def save_ckpt(work: Path, name: str, obj: dict) -> Path:
    import torch

    path = Path(work) / name
    torch.save(obj, path)
    return path


def pooled_published(captured: dict, depth: int) -> np.ndarray:
    """Token means of the protocol's captured layer arrays as its feature builder takes them
    (scripts/build_probe_features.py:112-113, extract_external_model_activations.py:109-110)."""
    return np.stack([np.asarray(captured[i], dtype=np.float32).mean(axis=1, dtype=np.float32) for i in range(depth)])


def shapes_of(state) -> dict:
    return {k: list(v.shape) for k, v in state.items()}


# ------------------------------------------------------------------ per model


def run_csfm(args, entries, weights) -> dict:
    import torch
    from torch import nn

    root = Path(args.csfm)
    prep = load_file_module("csfm_upstream_preprocess", root / "utils" / "preprocess.py")
    with on_path(root):
        from network.model import CSFM_model
    model = CSFM_model("Tiny").eval()
    sd = weights.det_state_dict(model.state_dict(), SEEDS["csfm"])
    model.load_state_dict(sd, strict=True)
    n_params = int(sum(v.numel() for k, v in sd.items() if not k.startswith("mlp_head.")))
    model.mlp_head = nn.Identity()  # README "Extract Features"

    # native preprocessing: utils/preprocess.py preprocess_ecg; its crop start (np.random.randint(0, T - 2500))
    # is fixed at the centre, (T - 2500) // 2, the deterministic stand-in raybench documents
    crops = []

    def centre_randint(low, high=None, *a, **k):
        assert low == 0 and high is not None
        crops.append([int(low), int(high), int(high) // 2])
        return int(high) // 2

    native_inputs = []
    for e in entries:
        crops_before = len(crops)
        orig = np.random.randint
        np.random.randint = centre_randint
        try:
            x = prep.preprocess_ecg(e["physical"].T.copy(), e["fs"])
        finally:
            np.random.randint = orig
        e.setdefault("csfm_crop", crops[crops_before:])
        native_inputs.append(x.astype(np.float32))
    native_inputs = np.stack(native_inputs)

    captured = {}
    orig_forward = model.transformer.forward

    def forward_keep(x, mask=None):
        normed, inter = orig_forward(x, mask=mask, return_intermediate=True)
        captured["inter"] = [h.detach().clone() for h in inter]
        return normed

    model.transformer.forward = forward_keep
    with torch.no_grad():
        rep = model(torch.from_numpy(native_inputs), torch.arange(12), task="cls")
    model.transformer.forward = orig_forward
    native_states = torch.stack([h[:, 0] for h in captured["inter"][:-1]] + [rep]).numpy()

    # published: the protocol's adapter, its loader and extract_activations, on a checkpoint in the published
    # layout (flat, `encoder.`-prefixed, head included)
    with on_path(Path(args.interpbench)):
        from benchmark_v1.adapters import csfm as pub
    pub.CSFM_ROOT = root
    pub.CSFM_CHECKPOINT = save_ckpt(args.work, "csfm_tiny.pth", {f"encoder.{k}": v for k, v in sd.items()})
    index = published_index(entries)
    pub_inputs = np.stack([pub.load_waveform(str(e["ecg_id"]), index) for e in entries]).astype(np.float32)
    out = pub.extract_activations(pub_inputs, list(range(pub.CSFM_DEPTH)), device="cpu")
    pub_states = pooled_published(out["layers"], pub.CSFM_DEPTH)
    pub.CSFM_CHECKPOINT.unlink()
    return {"native": (native_inputs, native_states), "published": (pub_inputs, pub_states),
            "meta": {"upstream_params": n_params, "weights": shapes_of(sd), "crops": {e["name"]: e["csfm_crop"]
                                                                                    for e in entries},
                     "native": "utils/preprocess.py preprocess_ecg (crop start fixed at the centre); "
                               "network/model.py CSFM_model('Tiny'): Transformer.forward(return_intermediate=True) "
                               "block outputs [:, 0] for layers 0-4, model(ts, arange(12), task='cls') with "
                               "mlp_head = Identity for layer 5",
                     "published": "benchmark_v1/adapters/csfm.py load_waveform + extract_activations (hooks), "
                                  "token mean as scripts/build_probe_features.py:113",
                     "model_status": out["model_status"]}}


def run_ecg_jepa(args, entries, weights) -> dict:
    import torch

    root = Path(args.ecg_jepa)
    with on_path(root):
        import ecg_data
        from ecg_jepa import ecg_jepa
        from models import load_encoder
        from pos_encoding import get_2d_sincos_pos_embed

    # native preprocessing: ecg_data.get_ecg_data (one record per directory) + downsample_waves(., 2500)
    native_inputs = []
    for e in entries:
        d = Path(args.work) / "jepa" / e["name"]
        d.mkdir(parents=True, exist_ok=True)
        for suffix in (".hea", ".dat"):
            (d / (e["name"] + suffix)).write_bytes(Path(e["wfdb"] + suffix).read_bytes())
        waves = ecg_data.get_ecg_data(str(d), reduced_lead=True)
        native_inputs.append(ecg_data.downsample_waves(waves, 2500)[0].astype(np.float32))
    native_inputs = np.stack(native_inputs)

    # names and shapes of the encoder models.load_encoder builds (its parameters, models.py:9-20); the weights
    # are then loaded by load_encoder itself, strictly, so a wrong name or shape here would fail there
    probe = ecg_jepa(encoder_embed_dim=768, encoder_depth=12, encoder_num_heads=16, predictor_embed_dim=384,
                     predictor_depth=6, predictor_num_heads=12, c=8, pos_type="sincos", mask_scale=(0, 0),
                     leads=list(range(8))).encoder
    sd = weights.det_state_dict(probe.state_dict(), SEEDS["ecg_jepa"])
    n_params = int(sum(v.numel() for v in sd.values()))
    ckpt = save_ckpt(args.work, "multiblock_epoch100.pth", {"encoder": sd})
    with on_path(root):
        encoder, _ = load_encoder(str(ckpt), leads=list(range(8)))
    encoder.eval()
    store, handles = hook_outputs(encoder.encoder_blocks.blocks)
    with torch.no_grad():
        rep = encoder.representation(torch.from_numpy(native_inputs))
    for h in handles:
        h.remove()
    native_states = torch.stack([torch.mean(store[i], dim=1) for i in range(11)] + [rep]).numpy()

    with on_path(Path(args.interpbench)):
        from benchmark_v1.adapters import ecg_jepa as pub
    pub.ECG_JEPA_ROOT = root
    pub.ECG_JEPA_CHECKPOINT = ckpt
    index = published_index(entries)
    pub_inputs = np.stack([pub.load_reduced_waveform(str(e["ecg_id"]), index) for e in entries]).astype(np.float32)
    out = pub.extract_encoder_activations(pub_inputs, list(range(pub.ECG_JEPA_DEPTH)), device="cpu")
    pub_states = pooled_published(out["layers"], pub.ECG_JEPA_DEPTH)
    ckpt.unlink()
    table = get_2d_sincos_pos_embed(768, 8, 50)
    rows = [0, 1, 49, 50, 399]
    return {"native": (native_inputs, native_states), "published": (pub_inputs, pub_states),
            "extra": {"pos_embed_rows": np.asarray(rows), "pos_embed": table[rows].astype(np.float32)},
            "meta": {"upstream_params": n_params, "weights": shapes_of(sd),
                     "native": "ecg_data.get_ecg_data + downsample_waves(., 2500); models.load_encoder: block "
                               "outputs (hooks) torch.mean(dim=1) for layers 0-10, encoder.representation for 11",
                     "published": "benchmark_v1/adapters/ecg_jepa.py load_reduced_waveform + "
                                  "extract_encoder_activations (hooks), token mean as build_probe_features.py:113",
                     "model_status": out["model_status"]}}


def run_st_mem(args, entries, weights) -> dict:
    import pandas as pd
    import torch
    import yaml
    from einops import rearrange

    root = Path(args.st_mem)
    # util/misc.py imports `inf` from torch._six, which torch 2 removed; only that name is provided
    sys.modules.setdefault("torch._six", types.SimpleNamespace(inf=float("inf")))
    process = load_file_module("stmem_process_ecg", root / "data" / "process_ecg.py")
    pkl = Path(args.work) / "stmem_pkl"
    process.run(argparse.Namespace(input_dir=str(Path(args.work) / "wfdb"), output_dir=str(pkl),
                                   index_path=str(pkl / "index.csv")))
    cfg = yaml.safe_load((root / "configs" / "downstream" / "st_mem.yaml").read_text())["dataset"]
    cfg = {**cfg, "index_dir": str(pkl), "ecg_dir": str(pkl), "test_csv": "index.csv"}
    cfg.pop("label_col")
    with on_path(root):
        from models.encoder.st_mem_vit import st_mem_vit_base
        from util.dataset import build_dataset
    dataset = build_dataset(cfg, "test")
    index = pd.read_csv(pkl / "index.csv")
    by_name = {Path(f).stem: i for i, f in enumerate(index["FILE_NAME"])}
    native_inputs = np.stack([dataset[by_name[f"{e['name']}_0"]][1].numpy() for e in entries])  # middle n_crop

    model = st_mem_vit_base(num_leads=12).eval()
    sd = weights.det_state_dict(model.state_dict(), SEEDS["st_mem"])
    model.load_state_dict(sd, strict=True)
    n_params = int(sum(v.numel() for v in sd.values()))
    store, handles = hook_outputs([getattr(model, f"block{i}") for i in range(12)])
    with torch.no_grad():
        rep = model.forward_encoding(torch.from_numpy(native_inputs))
    for h in handles:
        h.remove()

    def patch_mean(h):  # st_mem_vit.py:116-120
        h = rearrange(h, "b (c n) p -> b c n p", c=12)
        return torch.mean(h[:, :, 1:-1, :], dim=(1, 2))

    native_states = torch.stack([patch_mean(store[i]) for i in range(11)] + [rep]).numpy()

    with on_path(Path(args.interpbench)):
        from benchmark_v1.adapters import st_mem as pub
    pub.ST_MEM_ROOT = root
    pub.ST_MEM_CHECKPOINT = save_ckpt(args.work, "encoder.pth", {"epoch": 800, "model": sd})
    index_pub = published_index(entries)
    pub_inputs = np.stack([pub.load_waveform(str(e["ecg_id"]), index_pub) for e in entries]).astype(np.float32)
    out = pub.extract_activations(pub_inputs, list(range(pub.ST_MEM_DEPTH)), device="cpu")
    pub_states = pooled_published(out["layers"], pub.ST_MEM_DEPTH)
    pub.ST_MEM_CHECKPOINT.unlink()
    return {"native": (native_inputs, native_states), "published": (pub_inputs, pub_states),
            "meta": {"upstream_params": n_params, "weights": shapes_of(sd),
                     "native": "data/process_ecg.py run (first 10-s window) + util/dataset.py build_dataset with "
                               "configs/downstream/st_mem.yaml eval_transforms (n_crop 3: the middle crop); "
                               "st_mem_vit_base: block outputs (hooks) patch-token mean (st_mem_vit.py:116-120) "
                               "for layers 0-10, forward_encoding for 11",
                     "published": "benchmark_v1/adapters/st_mem.py load_waveform + extract_activations (hooks), "
                                  "token mean as build_probe_features.py:113",
                     "model_status": out["model_status"]}}


RUNNERS = {"csfm": run_csfm, "ecg_jepa": run_ecg_jepa, "st_mem": run_st_mem}


def run_one(args) -> None:
    import torch

    torch.set_num_threads(2)
    entries = write_records(Path(args.work), Path(args.record))
    result = RUNNERS[args.model](args, entries, load_weights_module())
    names = np.asarray([e["name"] for e in entries])
    out = Path(args.out)
    for profile in ("native", "published"):
        inputs, states = result[profile]
        arrays = {"inputs": inputs.astype(np.float32), "states": np.asarray(states, dtype=np.float32), "names": names}
        if profile == "native":
            arrays.update(result.get("extra", {}))
        np.savez_compressed(out / f"vit_{args.model}_{profile}.npz", **arrays)
    (Path(args.work) / f"meta_{args.model}.json").write_text(json.dumps(result["meta"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csfm", required=True, help="Cardiac-Sensing-FM checkout")
    parser.add_argument("--ecg-jepa", required=True, help="ECG_JEPA checkout")
    parser.add_argument("--st-mem", required=True, help="ST-MEM checkout")
    parser.add_argument("--interpbench", required=True, help="2027-kdd-ECG-InterpBench checkout (published adapters)")
    parser.add_argument("--record", required=True, help="a PTB-XL record path without suffix (…/00001_hr)")
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)  # one model, in a child process
    parser.add_argument("--allow-other-commit", action="store_true")
    args = parser.parse_args()
    if args.model:
        run_one(args)
        return 0

    commits = {k: git_head(Path(getattr(args, k))) for k in PINNED}
    other = {k: c for k, c in commits.items() if c != PINNED[k]}
    if other and not args.allow_other_commit:
        raise SystemExit(f"checkouts not at the pinned commits: {other} (pass --allow-other-commit)")
    with contextlib.ExitStack() as stack:
        work = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        base = [sys.executable, str(Path(__file__).resolve()), "--csfm", args.csfm, "--ecg-jepa", args.ecg_jepa,
                "--st-mem", args.st_mem, "--interpbench", args.interpbench, "--record", args.record, "--out", args.out]
        for model in MODELS:  # one process per model: the checkouts reuse module names (models, utils, util)
            subprocess.run(base + ["--work", str(work / model), "--model", model], check=True)
        entries = write_records(work / "records", Path(args.record))
        synth = [e for e in entries if e["name"] != REAL[0]]
        np.savez_compressed(Path(args.out) / "vit_records.npz", names=np.asarray([e["name"] for e in synth]),
                            fs=np.asarray([e["fs"] for e in synth]),
                            **{e["name"]: (e["digital"].T / GAIN).astype(np.float32) for e in synth})
        import neurokit2
        import scipy
        import torch
        import wfdb

        meta = {m: json.loads((work / m / f"meta_{m}.json").read_text()) for m in MODELS}
        fixture = {
            "commits": {k: {"repo": REPOS[k], "commit": c} for k, c in commits.items()},
            "versions": {"python": sys.version.split()[0], "numpy": np.__version__, "scipy": scipy.__version__,
                         "torch": torch.__version__, "wfdb": wfdb.__version__, "neurokit2": neurokit2.__version__},
            "command": "python tests/parity/make_fixtures_encoders_vit.py --csfm CSFM --ecg-jepa ECG_JEPA "
                       "--st-mem ST-MEM --interpbench INTERPBENCH --record PTBXL/records500/00000/00001_hr",
            "seeds": SEEDS,
            "records": [{k: e[k] for k in ("name", "fs", "source", "ecg_id", "dat_sha256") if k in e}
                        | {"samples": int(e["digital"].shape[0])} for e in entries],
            "gain_per_mv": GAIN,
            "models": meta,
        }
        (Path(args.out) / "vit_fixtures.json").write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
