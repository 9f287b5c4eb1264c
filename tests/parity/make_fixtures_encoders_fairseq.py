"""Parity fixtures for the two fairseq-signals encoders, ECG-FM and CARDIAC-FM (issue 12, item 1).

Runs the UPSTREAM code, full size, on two 12-lead records and stores the numbers only:

  * a real PTB-XL record (given with --record, e.g. /path/to/ptbxl-sample/records500/00000/00001_hr), written
    out as the PhysioNet 2021 challenge distributes PTB-XL (HRnnnnn.hea + MATLAB v4 .mat `val`, int16, gain
    1000/mV, lead names I..aVR..V6): the form both ECG-FM's pipeline (fairseq-signals
    scripts/preprocess/ecg/physionet2021_*.py -> preprocess.py) and the published protocol's adapter
    (benchmark_v1/adapters/ecg_fm.py `load_12lead_waveform`) read;
  * a synthetic record at 257 Hz, 2,571 samples (tests/parity/synthetic_ecg.py), in the same format - a rate
    at which int(T * 500 / fs) = 5001 differs from round() = 5002, so the resampling length is pinned.

Weights: `tests/parity/weights.py::det_state_dict` under the published checkpoints' key names (torch's legacy
weight-norm names `weight_g`/`weight_v`); the upstream models load them through their own checkpoint
loaders (`build_model_from_checkpoint`, the protocol's `try_load_model`).

Per model and profile:
  native     ECG-FM: fairseq-signals' preprocess.py (`extract_wfdb`, `preprocess_mat`, `segment_mat` with 5-s
             segments; segment 0), its `FileECGDataset` + collator, `build_model_from_checkpoint`,
             `extract_features`; every transformer layer's output (forward hooks) pooled by fairseq-signals'
             `ECGTransformerFinetuningModel.get_logits(..., aggregate=True)` (sum / non-zero count - the rule
             ECG-FM's scripts/embs.py applies).
             CARDIAC-FM: the same with CARDIAC-FM's vendored fairseq-signals (cardiac_fm/fairseq) and a 10-s
             segment; the model is CARDIAC-FM's own `MMCL` (cardiac_fm/model.py; its MRI encoder stubbed), and
             every layer is pooled by `MMCL.forward_ecg` itself (given that layer's tokens and an identity
             projection); the contrastive embedding is `MMCL.forward_ecg` with the real projection.
  published  the protocol's adapters benchmark_v1/adapters/{ecg_fm,cardiac_fm}.py: `prepare_inputs`,
             `extract_activations` (hooks on every layer), pooled as scripts/build_probe_features.py:113 does
             (`values.mean(axis=1, dtype=np.float32)`); `pooled` (CARDIAC-FM: the projection) as returned.

The upstream packages need generator-side shims only (no upstream code is copied): Python 3.11 refuses
fairseq-signals' dataclass defaults (a wrapper marks them hashable, as Python <= 3.10 accepted them), and
fairseq-signals' text/multimodal modules import `transformers` names the wav2vec2 path never uses (stubbed),
and its checkpoint loader patches an omegaconf helper by its pre-2.1 name (aliased to the current one).

Usage (a scratch venv with --system-site-packages plus hydra-core and omegaconf; see tests/parity/README.md):

    python tests/parity/make_fixtures_encoders_fairseq.py ECG_FM_DIR FAIRSEQ_SIGNALS_DIR CARDIAC_FM_DIR \\
        INTERPBENCH_DIR --record /path/to/ptbxl-sample/records500/00000/00001_hr [--out DIR]

Writes encoders_fairseq_{native,published}_inputs.npz, encoders_fairseq_states.npz, encoders_fairseq.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LEADS = ["I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"]
SEEDS = {"ecg_fm": 1201, "cardiac_fm": 1202, "mri_projection": 1299}
SYNTH = {"fs": 257, "n": 2571, "seed": 1203}
N_LAYERS = 12
# the model options of fairseq-signals' examples/w2v_cmsc/config/pretraining/w2v_cmsc_rlm.yaml (ECG-FM's
# pretraining config); everything else comes from the upstream dataclass defaults
ECG_FM_MODEL_OPTIONS = {"_name": "wav2vec2_cmsc", "apply_mask": True, "mask_prob": 0.65, "quantize_targets": True,
                        "final_dim": 256, "dropout_input": 0.1, "dropout_features": 0.1, "feature_grad_mult": 0.1,
                        "encoder_embed_dim": 768, "in_d": 12}
RECORDS = ("HR00001", "HR00002")  # ecg_ids 1 (real) and 2 (synthetic) in the challenge naming


# ----------------------------------------------------------------------------- shims (worker side)

def install_shims() -> None:
    """Python 3.11 dataclass rule + a `transformers` stub; see the module docstring."""
    import dataclasses
    import importlib.abc
    import importlib.machinery
    import types

    orig = dataclasses.dataclass

    def compat(cls=None, /, **kw):
        def wrap(c):
            for val in list(vars(c).values()):
                if dataclasses.is_dataclass(val) and not isinstance(val, type) and type(val).__hash__ is None:
                    type(val).__hash__ = object.__hash__
            return orig(c, **kw)
        return wrap if cls is None else wrap(cls)

    dataclasses.dataclass = compat

    class AnyMeta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return AnyMeta(name, (Dummy,), {})

    class Dummy(metaclass=AnyMeta):
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) else self

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Dummy()

    def module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return AnyMeta(name, (Dummy,), {})

    class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname == "transformers" or fullname.startswith("transformers."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__ = []
            m.__getattr__ = module_getattr
            return m

        def exec_module(self, module):
            pass

    sys.modules.pop("transformers", None)
    sys.meta_path.insert(0, StubFinder())

    # fairseq-signals' load_checkpoint_to_cpu swaps omegaconf._utils.is_primitive_type for the duration of
    # OmegaConf.create (a pre-2.1 name; omegaconf 2.1+ calls it is_primitive_type_annotation)
    from omegaconf import _utils

    if not hasattr(_utils, "is_primitive_type"):
        _utils.is_primitive_type = _utils.is_primitive_type_annotation


def legacy_names(state) -> dict:
    """torch parametrizations weight-norm names -> the legacy `weight_g`/`weight_v` the published files use."""
    out = {}
    for k, v in state.items():
        k = k.replace(".parametrizations.weight.original0", ".weight_g")
        k = k.replace(".parametrizations.weight.original1", ".weight_v")
        out[k] = v
    return out


def det_weights(state, seed: int, prefix: str = "") -> dict:
    sys.path.insert(0, str(HERE))
    from weights import det_state_dict

    shapes = {prefix + k: tuple(v.shape) for k, v in legacy_names(state).items()}
    return det_state_dict(shapes, seed)


# ----------------------------------------------------------------------------- native worker

def upstream_native_inputs(pre, work: Path, challenge: Path, seconds: int):
    """fairseq-signals' preprocess.py on the challenge records -> FileECGDataset -> collated net_input."""
    import pandas as pd
    from fairseq_signals.data.ecg.raw_ecg_dataset import FileECGDataset

    leads = pre.process_str_list_arg(",".join(str(i) for i in range(12))).astype(int)
    leads = leads.sort_values().drop_duplicates().map(pre.IND_TO_LEAD)
    leads_to_load = pd.DataFrame({"global_order": np.arange(len(leads))}, index=leads)
    for d in ("org", "preprocessed", "segmented"):
        (work / d).mkdir(parents=True, exist_ok=True)
    names = []
    for i, rec in enumerate(RECORDS):
        org, prep, seg = (work / d / f"{rec}.mat" for d in ("org", "preprocessed", "segmented"))
        pre.extract_wfdb(pd.Series({"path": str(challenge / rec), "idx": i, "save_path": str(org)}), leads_to_load)
        pre.preprocess_mat(pd.Series({"path": str(org), "save_path": str(prep)}), 500, True, "zero")
        files = pre.segment_mat(pd.Series({"path": str(prep), "save_path": str(seg)}), seconds, 500)
        names.append(Path(files[0]).name)  # segment 0
    manifest = work / "test.tsv"
    manifest.write_text(f"{work / 'segmented'}\n" + "".join(f"{n}\t{seconds * 500}\n" for n in names))
    ds = FileECGDataset(manifest_path=str(manifest), sample_rate=500, pad=True, shuffle=False)
    return ds.collator([ds[i] for i in range(len(names))])["net_input"]


def capture_layers(blocks):
    captured, handles = {}, []
    for i, block in enumerate(blocks):
        def hook(_m, _inp, out, i=i):
            x = out[0] if isinstance(out, tuple) else out
            captured[i] = x.transpose(0, 1).detach().clone()
        handles.append(block.register_forward_hook(hook))
    return captured, handles


def write_ecg_fm_checkpoint(path: Path, seed: int):
    """A fairseq-signals checkpoint as its trainer writes it (cfg as a plain container), with det weights."""
    import torch
    from fairseq_signals.models import build_model
    from omegaconf import OmegaConf

    model = build_model(dict(ECG_FM_MODEL_OPTIONS), task=None)
    # the model cfg interpolates task.{normalize,filter,data} (models/pretraining_model.py:24-26); the
    # trainer resolves them against the task cfg (w2v_cmsc_rlm.yaml: normalize false, filter default false)
    root = OmegaConf.create({"model": model.cfg, "task": {"normalize": False, "filter": False, "data": "/data"}})
    model_cfg = OmegaConf.to_container(root.model, resolve=True, enum_to_str=True)
    model_cfg["_name"] = ECG_FM_MODEL_OPTIONS["_name"]
    weights = det_weights(model.state_dict(), seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"args": None, "cfg": {"model": model_cfg, "task": {"_name": "ecg_pretraining"}}, "model": weights,
                "criterion": None, "task_state": {},
                "optimizer_history": [{"criterion_name": "Wav2Vec2WithCMSCCriterion", "optimizer_name": "FairseqAdam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}],
                "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}}}, path)
    return model_cfg


def worker_ecg_fm_native(a) -> None:
    fairseq = Path(a.fairseq_signals)
    install_shims()
    sys.path[:0] = [str(fairseq), str(fairseq / "scripts" / "preprocess" / "ecg")]
    import preprocess as pre  # fairseq-signals scripts/preprocess/ecg/preprocess.py
    import torch
    from fairseq_signals.models import build_model_from_checkpoint
    from fairseq_signals.models.ecg_transformer import ECGTransformerFinetuningModel

    work = Path(a.work)
    net_input = upstream_native_inputs(pre, work / "ecg_fm_native", work / "challenge" / "g1", 5)
    ckpt = work / "ws" / "ECG-FM" / "ckpts" / "mimic_iv_ecg_physionet_pretrained.pt"
    model_cfg = write_ecg_fm_checkpoint(ckpt, SEEDS["ecg_fm"])
    model = build_model_from_checkpoint(str(ckpt)).eval()
    captured, _ = capture_layers(model.encoder.layers)
    with torch.no_grad():
        res = model.extract_features(source=net_input["source"], padding_mask=net_input["padding_mask"])
        assert torch.equal(captured[N_LAYERS - 1], res["x"])
        pooled = torch.stack([ECGTransformerFinetuningModel.get_logits(
            None, {"encoder_out": captured[i], "padding_mask": res["padding_mask"]}, aggregate=True)
            for i in range(N_LAYERS)], dim=1)  # [B, L, D]
    np.savez(work / "ecg_fm_native.npz", inputs=net_input["source"].numpy(), states=pooled.numpy())
    (work / "ecg_fm_model_cfg.json").write_text(json.dumps(model_cfg, sort_keys=True, default=str))


def worker_cardiac_fm_native(a) -> None:
    import types

    root = Path(a.cardiac_fm) / "cardiac_fm"
    fairseq = root / "fairseq"
    install_shims()
    sys.path[:0] = [str(fairseq), str(fairseq / "scripts" / "preprocess" / "ecg")]
    import fairseq_signals.models as fs_models
    import preprocess as pre  # CARDIAC-FM's vendored fairseq-signals preprocess.py
    import torch
    from torch import nn

    # CARDIAC-FM's model.py imports `from fairseq.fairseq_signals.models import ...` (its vendored copy) and
    # an MRI `utils` module the repository does not ship: alias the former, stub the latter (the MRI encoder
    # plays no part in the ECG branch).
    sys.modules.setdefault("fairseq", types.ModuleType("fairseq")).__path__ = []
    sys.modules["fairseq.fairseq_signals"] = sys.modules["fairseq_signals"]
    sys.modules["fairseq.fairseq_signals.models"] = fs_models

    class MRIStub(nn.Module):
        def __init__(self, *a, **k):
            super().__init__()
            for name in ("mri_encoder1", "mri_encoder2"):
                sub = nn.Module()
                sub.fenc = nn.Module()
                setattr(self, name, sub)

    utils = types.ModuleType("utils")
    utils.Dense4012FrameRNN = utils.Dense4012FrameRNN_3slices = utils.Three_plus_three_cnn_lstm = MRIStub
    sys.modules["utils"] = utils
    sys.path.insert(0, str(root))
    from model import MMCL  # cardiac_fm/model.py

    work = Path(a.work)
    net_input = upstream_native_inputs(pre, work / "cardiac_fm_native", work / "challenge" / "g1", 10)
    ecg_ckpt = work / "cardiac_ecg_fm_init.pt"
    write_ecg_fm_checkpoint(ecg_ckpt, SEEDS["ecg_fm"])
    mri_ckpt = work / "mri_stub.pt"
    torch.save({"model_state_dict": {}}, mri_ckpt)
    model = MMCL(mri_ckpt=str(mri_ckpt), ecg_ckpt=str(ecg_ckpt))
    state = model.state_dict()
    ecg = {k: v for k, v in state.items() if k.startswith(("ecg_encoder.", "ecg_projection."))}
    mri = {k: v for k, v in state.items() if k.startswith("mri_projection.")}
    assert set(ecg) | set(mri) == set(state), sorted(set(state) - set(ecg) - set(mri))[:5]
    weights = det_weights(ecg, SEEDS["cardiac_fm"]) | det_weights(mri, SEEDS["mri_projection"])
    model.load_state_dict(weights, strict=True)
    model.eval()
    stage1 = work / "ws" / "CARDIAC-FM" / "checkpoints" / "hf" / "model_epoch_8.pth"
    stage1.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"module." + k: v for k, v in model.state_dict().items()}, stage1)  # nn.DataParallel's names

    captured, _ = capture_layers(model.ecg_encoder.encoder.layers)
    ecgs = {"net_input": {"source": net_input["source"], "padding_mask": net_input["padding_mask"]}}
    with torch.no_grad():
        projection = model.forward_ecg(ecgs)  # upstream contrastive embedding (before F.normalize)
        pooled = []
        for i in range(N_LAYERS):
            tokens = captured[i]
            layer = types.SimpleNamespace(
                ecg_encoder=types.SimpleNamespace(extract_features=lambda tokens=tokens, **kw: {"x": tokens}),
                ecg_projection=nn.Identity())
            pooled.append(MMCL.forward_ecg(layer, ecgs))
        pooled = torch.stack(pooled, dim=1)
    np.savez(work / "cardiac_fm_native.npz", inputs=net_input["source"].numpy(), states=pooled.numpy(),
             projection=projection.numpy())


# ----------------------------------------------------------------------------- published worker

def worker_published(a) -> None:
    work = Path(a.work)
    ws = work / "ws"
    fs_link = ws / "fairseq-signals"
    if not fs_link.exists():
        fs_link.symlink_to(Path(a.fairseq_signals).resolve())
    os.environ["ECG_INTERPBENCH_WORKSPACE"] = str(ws)
    os.environ["PTBXL_ROOT"] = str(work / "challenge")
    install_shims()
    sys.path.insert(0, str(Path(a.interpbench)))
    from benchmark_v1.adapters import cardiac_fm as pub_cfm
    from benchmark_v1.adapters import ecg_fm as pub_ecg

    ids = [str(int(r[2:])) for r in RECORDS]
    batch, meta = pub_ecg.prepare_inputs(ids)
    batch_c, _ = pub_cfm.prepare_inputs(ids)
    assert batch is not None and np.array_equal(batch, batch_c), meta
    out = {"inputs": batch}
    for name, mod in (("ecg_fm", pub_ecg), ("cardiac_fm", pub_cfm)):
        act = mod.extract_activations(batch, list(range(N_LAYERS)), device="cpu")
        # scripts/build_probe_features.py:112-113: 3-D layer values -> values.mean(axis=1, dtype=np.float32)
        out[f"{name}_states"] = np.stack([act["layers"][i].mean(axis=1, dtype=np.float32)
                                          for i in range(N_LAYERS)], axis=1)
        out[f"{name}_pooled"] = act["pooled"]
        out[f"{name}_status"] = np.array(act["model_status"])
    np.savez(work / "published.npz", **out)


# ----------------------------------------------------------------------------- main

def write_challenge_record(folder: Path, name: str, digital: np.ndarray, fs: float) -> None:
    """HRnnnnn.hea + MATLAB v4 `val` (int16 [12, T], column-major = WFDB format 16 at byte offset 24), gain
    1000/mV, baseline 0: the PhysioNet 2021 challenge layout of PTB-XL."""
    from scipy.io import savemat

    folder.mkdir(parents=True, exist_ok=True)
    digital = np.asarray(digital, dtype=np.int16)
    savemat(folder / f"{name}.mat", {"val": digital}, format="4")
    lines = [f"{name} 12 {fs:g} {digital.shape[1]}"]
    for lead, row in zip(LEADS, digital, strict=True):
        checksum = (int(row.astype(np.int64).sum()) + 32768) % 65536 - 32768
        lines.append(f"{name}.mat 16+24 1000/mV 16 0 {int(row[0])} {checksum} 0 {lead}")
    (folder / f"{name}.hea").write_text("\n".join(lines) + "\n")


def real_record_digital(record: str) -> tuple[np.ndarray, float]:
    import wfdb

    rec = wfdb.rdrecord(record, physical=False)
    canon = {lead.upper(): lead for lead in LEADS}
    names = [canon[n.strip().upper()] for n in rec.sig_name]
    if sorted(names) != sorted(LEADS) or rec.fs != 500:
        raise SystemExit(f"{record}: expected a 12-lead 500 Hz PTB-XL record, got {rec.sig_name} at {rec.fs} Hz")
    if any(g != 1000 for g in rec.adc_gain) or any(b != 0 for b in rec.baseline):
        raise SystemExit(f"{record}: expected gain 1000/mV and baseline 0 (PTB-XL), got {rec.adc_gain} {rec.baseline}")
    d = rec.d_signal.T
    return d[[names.index(lead) for lead in LEADS]], float(rec.fs)


def git_head(path: str) -> str:
    return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run_worker(kind: str, a, work: Path) -> None:
    cmd = [sys.executable, str(Path(__file__).resolve()), a.ecg_fm, a.fairseq_signals, a.cardiac_fm, a.interpbench,
           "--record", a.record, "--worker", kind, "--work", str(work)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    subprocess.run(cmd, check=True, env=env, cwd=str(work))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ecg_fm", help="checkout of bowang-lab/ECG-FM")
    p.add_argument("fairseq_signals", help="checkout of Jwoo5/fairseq-signals")
    p.add_argument("cardiac_fm", help="checkout of lst627/CARDIAC-FM")
    p.add_argument("interpbench", help="checkout of the protocol's code (2027-kdd-ECG-InterpBench)")
    p.add_argument("--record", required=True, help="a 500-Hz PTB-XL record, path without extension")
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--worker", choices=["ecg_fm_native", "cardiac_fm_native", "published"], help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    a = p.parse_args()
    for field in ("ecg_fm", "fairseq_signals", "cardiac_fm", "interpbench", "record"):
        setattr(a, field, str(Path(getattr(a, field)).resolve()))
    if a.worker:
        import torch

        torch.set_num_threads(1)
        {"ecg_fm_native": worker_ecg_fm_native, "cardiac_fm_native": worker_cardiac_fm_native,
         "published": worker_published}[a.worker](a)
        return

    import wfdb

    sys.path.insert(0, str(HERE))
    from synthetic_ecg import synthetic_ecg_digital

    out = Path(a.out)
    with tempfile.TemporaryDirectory(prefix="fx-fairseq-") as tmp:
        work = Path(tmp)
        challenge = work / "challenge" / "g1"
        real, fs = real_record_digital(a.record)
        write_challenge_record(challenge, RECORDS[0], real, fs)
        synth = synthetic_ecg_digital(SYNTH["fs"], SYNTH["n"], SYNTH["seed"])
        write_challenge_record(challenge, RECORDS[1], synth, SYNTH["fs"])
        for name, digital in zip(RECORDS, (real, synth), strict=True):  # the challenge files read back exactly
            back, fields = wfdb.rdsamp(str(challenge / name))
            assert fields["sig_name"] == LEADS and np.array_equal(back.T, digital / 1000.0), name
        for kind in ("ecg_fm_native", "cardiac_fm_native", "published"):
            print(f"running {kind} ...", flush=True)
            run_worker(kind, a, work)
        ecg_nat = np.load(work / "ecg_fm_native.npz")
        cfm_nat = np.load(work / "cardiac_fm_native.npz")
        pub = np.load(work / "published.npz")
        model_cfg = json.loads((work / "ecg_fm_model_cfg.json").read_text())

    # ECG-FM's 5-s segment 0 is the first half of CARDIAC-FM's 10-s segment (same standardized record):
    # store one native input tensor [R, 12, 5000]
    native = cfm_nat["inputs"].astype(np.float32)
    assert np.array_equal(ecg_nat["inputs"], native[:, :, :2500])
    rel = Path(a.record).resolve()
    dat = rel.with_suffix(".dat")
    np.savez_compressed(out / "encoders_fairseq_native_inputs.npz", inputs=native)
    np.savez_compressed(out / "encoders_fairseq_published_inputs.npz", inputs=pub["inputs"].astype(np.float32))
    np.savez_compressed(
        out / "encoders_fairseq_states.npz",
        ecg_fm_native=ecg_nat["states"].astype(np.float32),
        cardiac_fm_native=cfm_nat["states"].astype(np.float32),
        ecg_fm_published=pub["ecg_fm_states"].astype(np.float32),
        cardiac_fm_published=pub["cardiac_fm_states"].astype(np.float32),
        cardiac_fm_native_projection=cfm_nat["projection"].astype(np.float32),
        cardiac_fm_published_projection=pub["cardiac_fm_pooled"].astype(np.float32),
    )
    meta = {
        "issue": 12,
        "upstream": {"ECG-FM": git_head(a.ecg_fm), "fairseq-signals": git_head(a.fairseq_signals),
                     "CARDIAC-FM": git_head(a.cardiac_fm), "ECG-InterpBench": git_head(a.interpbench)},
        "records": [
            {"ecg_id": 1, "kind": "ptbxl", "path": "/".join(rel.parts[-3:]),
             "dat_sha256": hashlib.sha256(dat.read_bytes()).hexdigest(), "fs": fs},
            {"ecg_id": 2, "kind": "synthetic", "fs": SYNTH["fs"], "n": SYNTH["n"], "seed": SYNTH["seed"]},
        ],
        "seeds": SEEDS,
        "ecg_fm_model_cfg": model_cfg,
        "layers": N_LAYERS,
        "published_status": {k: str(pub[f"{k}_status"]) for k in ("ecg_fm", "cardiac_fm")},
        "versions": {m: __import__(m).__version__ for m in ("numpy", "scipy", "torch", "wfdb", "omegaconf")},
        "command": "python tests/parity/make_fixtures_encoders_fairseq.py ECG-FM fairseq-signals CARDIAC-FM "
                   "2027-kdd-ECG-InterpBench --record /path/to/ptbxl-sample/records500/00000/00001_hr",
    }
    (out / "encoders_fairseq.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    for f in sorted(out.glob("encoders_fairseq*")):
        print(f"{f.name}: {f.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
