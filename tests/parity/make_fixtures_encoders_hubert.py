"""Write the HuBERT-ECG parity fixtures by running the upstream code (issue 12, item 1).

    python tests/parity/make_fixtures_encoders_hubert.py /path/to/HuBERT-ECG \\
        /path/to/ptbxl-sample/records500/00000/00022_hr --protocol /path/to/2027-kdd-ECG-InterpBench [--out DIR]

Upstreams (imported from where they lie; nothing of them is copied into this repository):
  * Edoar-do/HuBERT-ECG (pinned below): `code/hubert_ecg.py` (the model), `code/utils.py::ecg_preprocessing`
    (biosppy FIR band-pass -> FFT resample to 500 Hz -> min-max scaling), `code/dataset.py::ECGDataset` in
    encode mode with `downsampling_factor=5` (first 5 s, flatten, decimate) - the native profile.
  * JayDuan123/2027-kdd-ECG-InterpBench (pinned below): `benchmark_v1/adapters/hubert_ecg.py`
    (`load_flattened_waveform`, `extract_activations`, which loads the model with
    `AutoModel.from_pretrained(..., trust_remote_code=True)` from a HuggingFace folder) - the published profile.
    Its folder is laid out here in a temporary workspace: config.json (auto_map to `hubert_ecg`), the upstream
    `code/hubert_ecg.py` as the remote code, and the deterministic weights.

Weights: `weights.det_state_dict(upstream HuBERTECG state dict, SEED)` (beside this file) at the base size of
upstream's `code/pretrain.py` (largeness base, downsampling_factor 5, vocab_sizes [100]); the tests rebuild the same.

Records: the given PTB-XL record at 500 Hz, the same record's 100-Hz file (records100/..._lr, found beside
it), and a synthetic 6-s record at 201 Hz (`synthetic_record`, integer ADC counts at 1000 / mV, so both
sides read identical values; upstream resamples to int(1,206 * (500 / 201)) = 2,999 samples, where
int(1,206 * 500 / 201) would give 3,000).
Native: all three. Published: the 500-Hz record and the synthetic one, written as the PhysioNet-challenge
`.hea` + `.mat` (`val` = ADC counts) the published loader reads.

Written (into tests/parity/ unless --out): `encoders_hubert_native.npz`, `encoders_hubert_published.npz`
(per record: the preprocessed input and the token-mean pooled state of each of the 12 layers, float32) and
`encoders_hubert.json` (commits, versions, command, config, records). Needs, in a scratch environment:
transformers 4.46.3 (upstream's pin; its forward override returns no hidden states under transformers 5),
biosppy 2.2.3 and the other modules `code/utils.py` / `code/dataset.py` import, wfdb, scipy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HUBERT_COMMIT = "affe1f94d06d61a346fa7520be441af5642616b4"
PROTOCOL_COMMIT = "de4e19d9ee8786eadef9d6530a01d585f933e8fc"
SEED = 1212
# code/pretrain.py, largeness "base", downsampling_factor 5; vocab_sizes as code/pretraining.sh
BASE = dict(ensemble_length=1, vocab_sizes=[100], hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072, classifier_proj_size=256, layerdrop=0.1, conv_kernel=(10, 3, 3, 2, 2),
            conv_stride=(4, 2, 2, 2, 2), conv_dim=(512,) * 5, mask_time_length=1)
LEADS = ["I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"]  # the published adapter's order
SYNTH_FS, SYNTH_SECONDS, SYNTH_GAIN = 201, 6, 1000.0


def synthetic_record(fs: int = SYNTH_FS, seconds: int = SYNTH_SECONDS) -> np.ndarray:
    """[12, fs * seconds] int16 ADC counts (gain 1000 / mV) of a deterministic ECG-like signal."""
    t = np.arange(fs * seconds) / fs
    k = np.arange(12)[:, None]
    beat = np.exp(-(((t % 0.85) - 0.3) ** 2) / 2e-4)  # narrow QRS-like bumps at 70.6 bpm
    wave = ((0.4 + 0.08 * k) * beat * np.where(k % 3 == 2, -1.0, 1.0)
            + 0.15 * np.sin(2 * np.pi * (0.25 + 0.02 * k) * t + k)  # baseline wander
            + 0.05 * np.sin(2 * np.pi * (7.0 + k) * t)
            + 0.02 * np.cos(2 * np.pi * 60.0 * t + 0.3 * k))  # mains
    return np.round(wave * SYNTH_GAIN).astype(np.int16)


def read_wfdb(base: str) -> tuple[np.ndarray, np.ndarray, float, list[str]]:
    """(physical [12, T] float64 mV, ADC counts [12, T] int16, fs, lead names) of a WFDB record."""
    import wfdb

    rec = wfdb.rdrecord(base, physical=False)
    counts = np.asarray(rec.d_signal, dtype=np.int16).T
    physical = wfdb.rdrecord(base).p_signal.T
    return physical, counts, float(rec.fs), list(rec.sig_name)


def upstream_native(code: Path, signal_mv: np.ndarray, fs: float, work: Path, name: str) -> np.ndarray:
    """ecg_preprocessing -> np.save -> ECGDataset(encode=True, downsampling_factor=5)[0] (float32 [6000])."""
    import pandas as pd
    from dataset import ECGDataset
    from utils import ecg_preprocessing

    ecg = ecg_preprocessing(np.asarray(signal_mv, dtype=np.float64), fs)
    np.save(work / f"{name}.npy", ecg)
    csv = work / f"{name}.csv"
    pd.DataFrame({"filename": [f"{name}.npy"]}).to_csv(csv, index=False)
    data = ECGDataset(str(csv), str(work), downsampling_factor=5, pretrain=False, encode=True)
    x, filename = data[0]
    assert filename == f"{name}.npy"
    return x.numpy()


def pooled_states(model, x: np.ndarray) -> np.ndarray:
    """[B, n] inputs -> [B, 12, 768]: hidden_states[i + 1].mean(tokens), as upstream's classifier pools."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(np.ascontiguousarray(x)).float(), output_hidden_states=True, return_dict=True)
    return torch.stack([h.mean(dim=1) for h in out.hidden_states[1:]], dim=1).numpy().astype(np.float32)


def write_challenge_record(folder: Path, record_name: str, counts: np.ndarray, fs: float) -> dict[str, Path]:
    """A PhysioNet-challenge style record (what the published loader globs: g*/HR*.hea + .mat with `val`)."""
    from scipy.io import savemat

    folder.mkdir(parents=True, exist_ok=True)
    n = counts.shape[1]
    lines = [f"{record_name} 12 {int(fs)} {n}"]
    for lead, row in zip(LEADS, counts, strict=True):
        lines.append(f"{record_name}.mat 16+24 1000/mV 16 0 {int(row[0])} 0 0 {lead}")
    hea, mat = folder / f"{record_name}.hea", folder / f"{record_name}.mat"
    hea.write_text("\n".join(lines) + "\n")
    savemat(mat, {"val": counts.astype(np.int16)})
    return {"hea": hea, "mat": mat}


def git_commit(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hubert_ecg", type=Path, help="checkout of Edoar-do/HuBERT-ECG")
    ap.add_argument("record", help="a PTB-XL 500-Hz record path without extension (records500/.../NNNNN_hr)")
    ap.add_argument("--protocol", type=Path, required=True, help="checkout of the published protocol code")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--allow-other-commit", action="store_true")
    args = ap.parse_args()
    commits = {"hubert_ecg": git_commit(args.hubert_ecg), "protocol": git_commit(args.protocol)}
    if not args.allow_other_commit and (commits["hubert_ecg"], commits["protocol"]) != (HUBERT_COMMIT,
                                                                                          PROTOCOL_COMMIT):
        raise SystemExit(f"upstream commits {commits} differ from the pinned ones; --allow-other-commit to proceed")

    work = Path(tempfile.mkdtemp(prefix="hubert-parity-"))
    os.environ["HF_HOME"] = str(work / "hf")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["ECG_INTERPBENCH_WORKSPACE"] = str(work / "workspace")
    code = args.hubert_ecg.resolve() / "code"
    sys.path[:0] = [str(code), str(args.protocol.resolve())]
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    import scipy
    import torch
    import transformers
    from hubert_ecg import HuBERTECG, HuBERTECGConfig
    from safetensors.torch import save_file
    from weights import det_state_dict

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    config = HuBERTECGConfig(**BASE)
    model = HuBERTECG(config).eval()
    state = det_state_dict(model.state_dict(), SEED)
    model.load_state_dict(state, strict=True)
    names = sorted(state)

    # ---- native: the record at 500 Hz, its 100-Hz file, the synthetic 201-Hz record
    rec500 = args.record
    rec100 = rec500.replace("records500", "records100")[: -len("_hr")] + "_lr"
    mv500, counts500, fs500, leads500 = read_wfdb(rec500)
    if [name.upper() for name in leads500] != [name.upper() for name in LEADS]:
        raise SystemExit(f"{rec500}: leads {leads500} are not in the standard order")
    mv100, _, fs100, _ = read_wfdb(rec100)
    synth = synthetic_record()
    native_inputs = {
        "ptbxl_500hz": (mv500, fs500),
        "ptbxl_100hz": (mv100, fs100),
        "synthetic": (synth.astype(np.float64) / SYNTH_GAIN, float(SYNTH_FS)),
    }
    native = {}
    for key, (sig, fs) in native_inputs.items():
        native[f"{key}/input"] = upstream_native(code, sig, fs, work, key)
    batch = np.stack([native[f"{key}/input"] for key in native_inputs])
    states = pooled_states(model, batch)
    for i, key in enumerate(native_inputs):
        native[f"{key}/states"] = states[i]

    # ---- published: the protocol's adapter, end to end (its loader and its extract_activations)
    ckpt = work / "workspace" / "HuBERT-ECG" / "checkpoints" / "hubert-ecg-base"
    ckpt.mkdir(parents=True)
    shutil.copy(code / "hubert_ecg.py", ckpt / "hubert_ecg.py")  # the remote code, in the temporary workspace only
    cfg = config.to_dict() | {"architectures": ["HuBERTECG"],
                              "auto_map": {"AutoConfig": "hubert_ecg.HuBERTECGConfig",
                                           "AutoModel": "hubert_ecg.HuBERTECG"}}
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt / "model.safetensors"),
              metadata={"format": "pt"})

    from benchmark_v1.adapters import hubert_ecg as published

    loaded, status = published.try_load_model("cpu")
    if loaded is None:
        raise SystemExit(f"published loader failed: {status}")
    got = loaded.state_dict()
    if sorted(got) != names or any(not torch.equal(got[k], state[k]) for k in names):
        raise SystemExit("the published loader did not load the deterministic weights unchanged")
    record_name = Path(rec500).name.split("_")[0]
    ecg_ids = {"ptbxl_500hz": int(record_name), "synthetic": 99999}
    index = {f"HR{ecg_ids['ptbxl_500hz']:05d}": write_challenge_record(work / "g1", f"HR{ecg_ids['ptbxl_500hz']:05d}",
                                                                       counts500, fs500),
             "HR99999": write_challenge_record(work / "g1", "HR99999", synth, SYNTH_FS)}
    pub = {}
    for key, ecg_id in ecg_ids.items():
        pub[f"{key}/input"] = published.load_flattened_waveform(str(ecg_id), index)
    batch = np.stack([pub[f"{key}/input"] for key in ecg_ids])
    out = published.extract_activations(batch, list(range(12)), device="cpu")
    for i, key in enumerate(ecg_ids):
        # scripts/build_probe_features.py:112-113: values.mean(axis=1, dtype=np.float32) of each layer file
        pub[f"{key}/states"] = np.stack([out["layers"][layer][i].mean(axis=0, dtype=np.float32)
                                         for layer in range(12)])

    args.out.mkdir(parents=True, exist_ok=True)
    for name, arrays in (("native", native), ("published", pub)):
        arrays = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
        for k, v in arrays.items():
            if not np.all(np.isfinite(v)):
                raise SystemExit(f"{name} {k}: non-finite values")
        np.savez_compressed(args.out / f"encoders_hubert_{name}.npz", **arrays)
    meta = {
        "upstream": {"Edoar-do/HuBERT-ECG": commits["hubert_ecg"],
                     "JayDuan123/2027-kdd-ECG-InterpBench": commits["protocol"]},
        "versions": {"numpy": np.__version__, "scipy": scipy.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "biosppy": _version("biosppy")},
        "command": "python tests/parity/make_fixtures_encoders_hubert.py HuBERT-ECG "
                   f"ptbxl-sample/{Path(rec500).relative_to(Path(rec500).parents[2])} --protocol "
                   "2027-kdd-ECG-InterpBench",
        "seed": SEED,
        "config": {k: v for k, v in config.to_dict().items() if not k.startswith("_")},
        "parameter_names": names,
        "native_records": {"ptbxl_500hz": f"{Path(rec500).name} (500 Hz)", "ptbxl_100hz": f"{Path(rec100).name} "
                           "(100 Hz)", "synthetic": "synthetic_record() / 1000 mV (201 Hz, 6 s)"},
        "published_records": {"ptbxl_500hz": f"{Path(rec500).name} ADC counts as challenge .mat",
                              "synthetic": "synthetic_record() ADC counts as challenge .mat (201 Hz)"},
        "ptbxl_record": str(Path(rec500).relative_to(Path(rec500).parents[2])),
    }
    (args.out / "encoders_hubert.json").write_text(json.dumps(meta, indent=1, default=list) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    for name in ("native", "published"):
        print(f"wrote {args.out / f'encoders_hubert_{name}.npz'} "
              f"({(args.out / f'encoders_hubert_{name}.npz').stat().st_size // 1024} KB)")


def _version(module: str) -> str:
    from importlib.metadata import version

    try:
        return version(module)
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
