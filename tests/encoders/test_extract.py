"""Ray Data extraction vs the plain loop; GPU request fallback; resume without rework; quarantine."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.cloudpickle
import torch
from torch import nn

from raybench.core.config import MODELS, EncoderConfig
from raybench.encoders.base import ECGEncoder, EncoderSpec, freeze, register_encoder
from raybench.encoders.extract import (
    ExtractionError,
    extract_activations,
    extract_models,
    read_manifest_records,
)
from raybench.encoders.reference import plain_loop_activations
from raybench.encoders.store import ActivationStore

# Ray workers cannot import this test module: ship its encoder classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LEADS12 = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]


class TinyConvEncoder(ECGEncoder):
    """Conv + mean-pool stack: 4 audited states of width 16; native input = per-lead z-scored 1000 samples."""

    name = "tiny_conv"
    n_layers = 4
    d = 16

    def __init__(self, fail_flag: str | None = None, keeper: str | None = None):
        super().__init__()
        self.inp = nn.Conv1d(12, self.d, kernel_size=7, padding=3)
        self.blocks = nn.ModuleList(nn.Conv1d(self.d, self.d, kernel_size=5, padding=2) for _ in range(3))
        self.fail_flag = fail_flag
        self.keeper = keeper  # a named actor that gets this actor's handle before the crash (keeps it referenced)
        self.calls = 0

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        x = signal[:, :1000]
        x = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
        return x.astype(np.float32)

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.fail_flag and os.path.exists(self.fail_flag) and self.calls >= 2:
            if self.keeper:
                ray.get(ray.get_actor(self.keeper).keep.remote(ray.get_runtime_context().current_actor))
            raise RuntimeError("simulated crash mid-stream")
        h = torch.relu(self.inp(x))
        states = [h.mean(-1)]
        for block in self.blocks:
            h = torch.relu(block(h)) + h
            states.append(h.mean(-1))
        return torch.stack(states)


@register_encoder("tiny_conv")
def build_tiny(spec: EncoderSpec, fail_flag: str | None = None, keeper: str | None = None) -> ECGEncoder:
    torch.manual_seed(spec.init_seed)
    model = TinyConvEncoder(fail_flag, keeper)
    model.profile = spec.profile
    return freeze(model)


class TinyConvLate(TinyConvEncoder):
    """A second model for the one-pipeline path: another name and native input (the last 800 samples)."""

    name = "tiny_conv_late"

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        return super().preprocess(signal[:, -800:], fs)


@register_encoder("tiny_conv_late")
def build_tiny_late(spec: EncoderSpec) -> ECGEncoder:
    torch.manual_seed(spec.init_seed + 1)
    model = TinyConvLate()
    model.profile = spec.profile
    return freeze(model)


def write_cohort(root: Path, n: int = 24, fs: int = 100, n_samples: int = 1000, bad: bool = True,
                 seed: int = 0) -> Path:
    """WFDB records + a manifest parquet (with root/hash metadata) under `root`; returns the manifest path."""
    rng = np.random.default_rng(seed)
    rec_dir = root / "data" / "records"
    rec_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    t = np.arange(n_samples) / fs
    splits = ["train", "val", "test"]
    for i in range(n):
        ecg_id = 10 + 3 * i  # gaps on purpose: ids are not row numbers
        name = f"{ecg_id:05d}"
        sig = (np.sin(2 * np.pi * rng.uniform(0.8, 2.0) * t)[:, None] * rng.uniform(0.2, 1.5, 12)
               + 0.05 * rng.standard_normal((n_samples, 12)))
        length = n_samples
        if bad and i == 5:
            sig[100:200, 3] = np.nan  # NaN lead
        if bad and i == 9:
            length = n_samples - 100  # truncated record
            sig = sig[:length]
        if not (bad and i == 14):  # i == 14: missing files
            wfdb_write(rec_dir, name, fs, sig)
        rows.append({"ecg_id": ecg_id, "patient_id": str(100 + i // 2), "split": splits[(i * 7) % 3],
                     "site": 0, "device": "dev", "path": f"records/{name}", "fs": fs, "n_samples": n_samples,
                     "hr": float(i)})
    return write_manifest(root / "manifest.parquet", pd.DataFrame(rows), root / "data")


def wfdb_write(folder: Path, name: str, fs: int, sig: np.ndarray) -> None:
    import wfdb

    wfdb.wrsamp(name, fs=fs, units=["mV"] * 12, sig_name=LEADS12, p_signal=sig, fmt=["16"] * 12,
                adc_gain=[1000.0] * 12, baseline=[0] * 12, write_dir=str(folder))


def write_manifest(path: Path, df: pd.DataFrame, root: Path) -> Path:
    from raybench.cohorts.manifest import write_manifest as write

    write(path, df, root.resolve(), [], "none")
    return path


CFG = EncoderConfig(size="demo", batch_size=4, num_gpus=0.0)  # the CPU path (auto would take the logical GPU)
SPEC = EncoderSpec("tiny_conv")


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    return write_cohort(tmp_path_factory.mktemp("cohort"))


def _assert_matches_plain(run: Path, manifest: Path, spec: EncoderSpec, builder=None, layers=None, atol=1e-6):
    store = ActivationStore.for_run(run)
    ref = plain_loop_activations(manifest, spec, layers=layers, builder=builder)
    for layer, by_split in ref.items():
        for split, want in by_split.items():
            got = store.load(spec.name, layer, split)
            assert got.shape == want.shape, (layer, split)
            np.testing.assert_allclose(got, want, atol=atol, rtol=0)
    return ref


@pytest.fixture(scope="module")
def per_model_run(ray_cluster, cohort, tmp_path_factory):
    """tiny_conv's every layer over `cohort` through the per-model path (extract_activations): (run, summary).
    Read-only: test_one_pipeline_for_several_models_writes_the_per_model_stores compares its bytes."""
    run = tmp_path_factory.mktemp("per_model")
    return run, extract_activations(cohort, run, SPEC, CFG, builder=build_tiny, progress=False)


def test_ray_matches_plain_loop_in_manifest_order_and_quarantines(per_model_run, cohort):
    run, summary = per_model_run
    assert summary["layers"] == [0, 1, 2, 3] and summary["skipped_layers"] == []
    assert summary["quarantined"] == 3 and summary["records"] == 21
    assert summary["quarantine_reasons"] == {"nan_lead": 1, "length_mismatch": 1, "missing_header": 1}
    _assert_matches_plain(run, cohort, SPEC, builder=build_tiny)

    manifest = read_manifest_records(cohort).df
    bad_ids = set(manifest["ecg_id"].iloc[[5, 9, 14]])
    store = ActivationStore.for_run(run)
    for split, part in manifest.groupby("split"):
        want = [i for i in part["ecg_id"] if i not in bad_ids]
        for layer in range(4):
            assert store.ecg_ids("tiny_conv", layer, split).tolist() == want  # manifest order, bad excluded
    idx = store.index("tiny_conv", 2)
    assert idx["manifest_hash"] == read_manifest_records(cohort).manifest_hash
    assert idx["fingerprint"] == build_tiny(SPEC).fingerprint()
    assert idx["input_shape"] == [12, 1000] and idx["n_layers"] == 4 and idx["d"] == 16

    q = pd.read_csv(store.quarantine_path("tiny_conv"))
    assert q["ecg_id"].tolist() == sorted(bad_ids)
    assert set(q["reason"]) == {"nan_lead", "length_mismatch", "missing_header"}
    assert q["detail"].str.len().min() > 10 and q["path"].str.startswith("records/").all()

    # the plain loop agrees with a hand-run of the encoder on one record
    first = manifest.iloc[0]
    from raybench.cohorts.waveforms import read_record

    enc = build_tiny(SPEC)
    x = enc.preprocess(read_record(cohort.parent / "data", first["path"]).signal, 100)
    want = enc.layer_states(torch.from_numpy(x)[None])[:, 0].numpy()
    row = store.ecg_ids("tiny_conv", 0, first["split"]).tolist().index(first["ecg_id"])
    np.testing.assert_allclose([store.load("tiny_conv", la, first["split"])[row] for la in range(4)], want,
                               atol=1e-6)


def _wait_for_free(ray, want: dict[str, float], seconds: float = 60.0) -> dict[str, float]:
    """The cluster's free `want` resources once they are all free (polled), or as they are after `seconds`. The
    cap only matters when a release is slow: an actor still starting when its pipeline ended imports torch
    before it exits (its share was seen held after 10 s at load 50)."""
    import time

    free: dict[str, float] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        free = {k: ray.available_resources().get(k, 0.0) for k in want}
        if all(free[k] >= v - 1e-9 for k, v in want.items()):
            break
        time.sleep(0.2)
    return free


@pytest.mark.timeout(300)
def test_gpu_share_pools_rerun_skips_complete_stores_crash_frees_actors_and_leaves_no_partial_store(ray_cluster,
                                                                                                  tmp_path):
    """One cohort, three pipelines, each property checked as before (this was four tests and seven pipelines):
    - A fractional GPU request schedules on the logical GPU and falls back to CPU (loading then runs in separate
      CPU tasks: the operators do not fuse). The first run asks extract_models for as many GPU-share actors as
      the node has CPUs: MultiEncoderActor runs on CPU only, so a GPU share keeps the per-model path (its device
      label says so), and the pool must leave the loading tasks a CPU (before that fix both actors took one CPU
      each and the stream never began).
    - Complete stores are never redone; a crash mid-stream leaves no store that looks complete; a rerun finishes
      the rest.
    - A failed pipeline's encoder actors are gone when extract_activations raises, even while the caller keeps
      the exception (and its traceback) alive: otherwise the immediate rerun's actor takes the last CPU of this
      2-CPU cluster and its loading tasks never schedule (the suite hung here)."""
    gpu_cfg = EncoderConfig(size="demo", batch_size=4, num_gpus=0.25)
    two_actors = EncoderConfig(size="demo", batch_size=4, num_gpus=0.25, min_actors=2, max_actors=2)
    manifest = write_cohort(tmp_path / "c", n=16, bad=False)
    run = tmp_path / "run"
    store = ActivationStore.for_run(run)
    flag = tmp_path / "fail-now"
    failing = functools.partial(build_tiny, fail_flag=str(flag))  # same weights, crashes while the flag exists
    before = _wait_for_free(ray_cluster, {"CPU": 2.0, "GPU": 1.0})

    [first] = extract_models(manifest, run, [SPEC], two_actors, progress=False, depths=[0.0, 1.0])
    assert first["layers"] == [0, 3] and first["records"] == 16 and first["devices"] == ["cpu (gpu 0 assigned)"]
    _assert_matches_plain(run, manifest, SPEC, builder=build_tiny, layers=[0, 3])
    mtimes = {la: [p.stat().st_mtime_ns for p in sorted(store.layer_dir("tiny_conv", la).iterdir())]
              for la in (0, 3)}
    again = extract_activations(manifest, run, SPEC, gpu_cfg, depths=[0.0, 1.0], builder=failing, progress=False)
    assert again["layers"] == [] and again["skipped_layers"] == [0, 3] and again["records"] == 0

    flag.touch()
    with pytest.raises(ExtractionError, match="simulated crash mid-stream") as kept:
        extract_activations(manifest, run, SPEC, gpu_cfg, builder=failing, progress=False)
    assert "no partial store" in str(kept.value)
    assert {k: ray_cluster.available_resources().get(k, 0.0) for k in before} == before  # while kept is alive
    fp = build_tiny(SPEC).fingerprint()
    mhash = read_manifest_records(manifest).manifest_hash
    assert [store.is_complete("tiny_conv", la, mhash, fp) for la in range(4)] == [True, False, False, True]
    assert not store.layer_dir("tiny_conv", 1).exists() and not store.layer_dir("tiny_conv", 2).exists()
    assert not list(store.model_dir("tiny_conv").glob(".*"))  # the failed writers removed their temp folders

    flag.unlink()
    resumed = extract_activations(manifest, run, SPEC, gpu_cfg, builder=failing, progress=False)  # kept still alive
    assert resumed["layers"] == [1, 2] and resumed["skipped_layers"] == [0, 3] and resumed["records"] == 16
    assert {la: [p.stat().st_mtime_ns for p in sorted(store.layer_dir("tiny_conv", la).iterdir())]
            for la in (0, 3)} == mtimes
    _assert_matches_plain(run, manifest, SPEC, builder=build_tiny)
    # new weights -> new fingerprint: the stores no longer count as complete
    assert not store.is_complete("tiny_conv", 0, mhash, build_tiny(EncoderSpec("tiny_conv", init_seed=1))
                                 .fingerprint())
    del kept


class Keeper:
    """Holds actor handles, as a traceback or a user's variable may: garbage collection cannot end those actors."""

    def __init__(self):
        self.handles = []

    def keep(self, handle) -> None:
        self.handles.append(handle)

    def count(self) -> int:
        return len(self.handles)


@pytest.mark.timeout(300)
def test_a_failed_pipeline_ends_its_actors_even_while_something_holds_them(ray_cluster, tmp_path):
    """The driver kills its encoder actors when the pipeline fails (raybench.encoders.roster) instead of dropping
    its handles and hoping for a garbage collection: here another actor keeps a handle to the crashed encoder
    actor, and its CPU and GPU shares are still free again when extract_activations raises. A credentialed
    cohort's failure text is withheld (raybench.core.privacy)."""
    keeper = ray.remote(num_cpus=0)(Keeper).options(name=f"keeper-{tmp_path.name}").remote()
    manifest = write_cohort(tmp_path / "c", n=8, bad=False)  # two batches: the second crashes
    flag = tmp_path / "fail-now"
    flag.touch()
    failing = functools.partial(build_tiny, fail_flag=str(flag), keeper=f"keeper-{tmp_path.name}")
    before = _wait_for_free(ray_cluster, {"CPU": 2.0, "GPU": 1.0})
    try:
        with pytest.raises(ExtractionError, match="message withheld: credentialed cohort") as err:
            extract_activations(manifest, tmp_path / "run", SPEC, EncoderConfig(size="demo", batch_size=4,
                                num_gpus=0.25), builder=failing, progress=False, credentialed=True)
        assert "simulated crash" not in str(err.value) and ray.get(keeper.count.remote()) >= 1
        assert {k: ray_cluster.available_resources().get(k, 0.0) for k in before} == before
    finally:
        ray.kill(keeper)


@pytest.mark.timeout(120)
def test_an_extraction_that_cannot_get_its_resources_fails_clearly(ray_cluster, tmp_path):
    """With the only (logical) GPU held by someone else, a GPU-share extraction does not wait forever: it fails
    after encoders.stall_timeout_s with a message that says why, and leaves the node as it found it."""
    manifest = write_cohort(tmp_path / "c", n=8, bad=False)
    holder = ray.remote(num_cpus=0, num_gpus=1)(Keeper).remote()
    ray.get(holder.count.remote())  # the GPU is taken
    try:
        # the GPU never frees up, so a short timeout still waits for what cannot come (it was 3 s)
        cfg = EncoderConfig(size="demo", batch_size=4, num_gpus=0.25, stall_timeout_s=1)
        with pytest.raises(ExtractionError, match=r"no progress for 1 s .*could not get its resources"):
            extract_activations(manifest, tmp_path / "run", SPEC, cfg, builder=build_tiny, progress=False)
    finally:
        ray.kill(holder)
    assert _wait_for_free(ray_cluster, {"CPU": 2.0, "GPU": 1.0}) == {"CPU": 2.0, "GPU": 1.0}


def test_an_actor_that_starts_after_its_pipeline_ended_exits(ray_cluster):
    """A pool actor still starting when the driver closed the roster exits at once instead of holding its share;
    the driver's next pipeline signs on the same roster actor (no worker process started per pipeline)."""
    from raybench.encoders.roster import close_roster, open_roster, sign_or_exit

    roster = open_roster()
    assert close_roster(roster) == []

    class Late:
        def __init__(self, roster):
            sign_or_exit(roster)

        def ping(self) -> str:
            return "alive"

    late = ray.remote(num_cpus=0)(Late).remote(roster)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(late.ping.remote(), timeout=60)
    following = open_roster()
    assert following.actor == roster.actor and following.key != roster.key
    on_time = ray.remote(num_cpus=0)(Late).remote(following)
    assert ray.get(on_time.ping.remote(), timeout=60) == "alive"
    assert close_roster(following) == [on_time]
    ray.kill(on_time)


def test_one_pipeline_for_several_models_writes_the_per_model_stores(per_model_run, cohort, tmp_path):
    """extract_models (one Ray Data pipeline, each record read once for every model) writes byte for byte the
    stores, index and quarantine files that extract_activations writes for a model (per_model_run, shared with
    the plain-loop test); a rerun skips complete stores, and a model whose stores are gone is redone alone (its
    columns, the stream's second here, are then the stream's first)."""
    specs = [EncoderSpec("tiny_conv_late"), SPEC]
    out = extract_models(cohort, tmp_path / "one", specs, CFG, progress=False)
    assert [s["model"] for s in out] == ["tiny_conv_late", "tiny_conv"]
    assert all(s["layers"] == [0, 1, 2, 3] and s["records"] == 21 and s["quarantined"] == 3 for s in out)
    one, per_model = tmp_path / "one" / "activations" / "tiny_conv", per_model_run[0] / "activations" / "tiny_conv"
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(per_model) for p in per_model.rglob("*") if p.is_file()) and len(files) > 20
    for f in files:
        assert (one / f).read_bytes() == (per_model / f).read_bytes(), f
    _assert_matches_plain(tmp_path / "one", cohort, specs[0], builder=build_tiny_late)
    store = ActivationStore.for_run(tmp_path / "one")
    assert pd.read_csv(store.quarantine_path("tiny_conv"))["ecg_id"].tolist() == \
        pd.read_csv(store.quarantine_path("tiny_conv_late"))["ecg_id"].tolist()

    again = extract_models(cohort, tmp_path / "one", specs, CFG, progress=False)
    assert [(s["layers"], s["skipped_layers"], s["records"]) for s in again] == [([], [0, 1, 2, 3], 0)] * 2
    import shutil

    shutil.rmtree(store.model_dir("tiny_conv"))
    redo = extract_models(cohort, tmp_path / "one", specs, CFG, progress=False)
    assert [s["layers"] for s in redo] == [[], [0, 1, 2, 3]]
    for f in files:
        assert (one / f).read_bytes() == (per_model / f).read_bytes(), f


def test_actor_cpu_reservation_leaves_a_cpu_for_loading():
    from raybench.encoders.actor import actor_cpus

    assert actor_cpus(0.0, 2, 2) == 1.0  # CPU only: loading is fused into the actor
    assert actor_cpus(0.25, 1, 2) == 1.0
    assert actor_cpus(0.25, 2, 2) == 0.5  # two GPU actors on a 2-CPU node: one CPU stays for loading
    assert actor_cpus(0.25, 4, 16) == 1.0
    assert actor_cpus(1.0, 1, 1) == 0.0


def test_manifest_errors(tmp_path):
    df = pd.DataFrame({"ecg_id": [3, 2], "patient_id": ["a", "b"], "split": ["train", "val"], "path": ["x", "y"],
                       "fs": [100, 100], "n_samples": [1000, 1000]})
    bad_order = write_manifest(tmp_path / "m.parquet", df, tmp_path)
    with pytest.raises(ExtractionError, match="unique and ascending"):
        read_manifest_records(bad_order)
    df.to_parquet(tmp_path / "nometa.parquet")
    with pytest.raises(ExtractionError, match="lacks raybench metadata"):
        read_manifest_records(tmp_path / "nometa.parquet")
    with pytest.raises(ExtractionError, match="raybench manifest"):
        read_manifest_records(tmp_path / "absent.parquet")
    tampered = pq.read_table(bad_order)
    pq.write_table(tampered.set_column(0, "ecg_id", pa.array([2, 3])), tmp_path / "edited.parquet")
    with pytest.raises(ExtractionError, match="does not match its stored hash"):
        read_manifest_records(tmp_path / "edited.parquet")


def test_layer_selection_errors(cohort, tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        extract_activations(cohort, tmp_path, SPEC, CFG, layers=[4], builder=build_tiny, progress=False)
    with pytest.raises(ValueError, match="not both"):
        extract_activations(cohort, tmp_path, SPEC, CFG, layers=[0], depths=[0.5], builder=build_tiny)


def _registered(name: str) -> bool:
    try:
        from raybench.encoders.base import available_encoders

        return name in available_encoders()
    except ImportError:
        return False


def _ptbxl_frame(ptbxl_sample: Path) -> pd.DataFrame:
    """The 100 real records (500 Hz) as manifest rows, splits by ecg_id (the split rule is not under test)."""
    meta = pd.read_csv(ptbxl_sample / "ptbxl_database.csv")
    df = pd.DataFrame({"ecg_id": meta["ecg_id"].astype("int64"), "patient_id": meta["patient_id"].astype(str),
                       "split": np.array(["train", "val", "test"])[meta["ecg_id"] % 3], "site": meta["site"],
                       "device": meta["device"], "path": meta["filename_hr"], "fs": 500, "n_samples": 5000})
    return df.sort_values("ecg_id")


@pytest.fixture(scope="module")
def ptbxl_manifest(ptbxl_sample, tmp_path_factory):
    """A manifest over all 100 real records."""
    return write_manifest(tmp_path_factory.mktemp("ptbxl") / "manifest.parquet", _ptbxl_frame(ptbxl_sample),
                          ptbxl_sample)


# a full-size forward costs 0.2-0.85 s per record and model here (one thread); every record takes the same path, and
# test_every_real_record_goes_through_every_demo_encoder_as_the_plain_loop_does checks all 100 at demo size
FULL_SIZE_PER_SPLIT = 1
# Two full-size networks, one per family (a ViT; a wav2vec2 conv front end + transformer), cheap to build, in one
# pipeline (MultiEncoderActor holding several full-size encoders): every adapter's full-size forward on a real PTB-XL
# record is pinned to upstream's states in tests/parity (test_parity_vit.py: csfm, ecg_jepa, st_mem;
# test_parity_ecg_fm.py: ecg_fm, cardiac_fm; test_parity_hubert.py: hubert_ecg), and every adapter goes through the
# pipeline over the 100 real records at demo size above; the other four full-size builds cost ~15 CPU-s here.
FULL_SIZE_MODELS = ("st_mem", "ecg_fm")


@pytest.fixture(scope="module")
def ptbxl_manifest_few(ptbxl_sample, tmp_path_factory):
    """The first FULL_SIZE_PER_SPLIT real records of each split."""
    df = _ptbxl_frame(ptbxl_sample).groupby("split", group_keys=False).head(FULL_SIZE_PER_SPLIT)
    return write_manifest(tmp_path_factory.mktemp("ptbxl_few") / "manifest.parquet", df, ptbxl_sample)


@pytest.mark.slow
def test_every_real_record_goes_through_every_demo_encoder_as_the_plain_loop_does(ray_cluster, ptbxl_sample,
                                                                                   ptbxl_manifest, tmp_path):
    """Every registered encoder (demo size) over all 100 real records in one Ray Data pipeline (the CPU encode
    stage's path; the per-model path writes the same bytes,
    test_one_pipeline_for_several_models_writes_the_per_model_stores): none is quarantined, every layer's stored
    states are finite, and those of two records per split equal the plain loop's (a plain loop over all 100 costs
    more than the pipeline). The full-size networks get a per-split sample below. (This was two pipelines: six
    synthetic 500-Hz records against the plain loop, and the 100 real records at two depths.)"""
    specs = [EncoderSpec(m, size="demo") for m in MODELS if _registered(m)]
    summaries = extract_models(ptbxl_manifest, tmp_path, specs, EncoderConfig(size="demo", batch_size=25,
                               num_gpus=0.0), progress=False, depths=None)
    store = ActivationStore.for_run(tmp_path)
    for spec, summary in zip(specs, summaries, strict=True):
        assert summary["records"] == 100 and summary["quarantined"] == 0, (spec.name, summary)
        assert summary["layers"] == list(range(summary["n_layers"])), (spec.name, summary["layers"])
        for layer in summary["layers"]:
            for split in ("train", "val", "test"):
                assert np.isfinite(store.load(spec.name, layer, split)).all(), (spec.name, layer, split)
    few = _ptbxl_frame(ptbxl_sample).groupby("split", group_keys=False).head(2)
    sample = write_manifest(tmp_path / "sample.parquet", few, ptbxl_sample)
    for spec, summary in zip(specs, summaries, strict=True):
        ref = plain_loop_activations(sample, spec)
        assert len(ref) == summary["n_layers"], spec.name
        for layer, by_split in ref.items():
            for split, want in by_split.items():
                rows = pd.Index(store.ecg_ids(spec.name, layer, split)).get_indexer(few[few.split == split].ecg_id)
                assert want.shape == (2, summary["d"]) and (rows >= 0).all(), (spec.name, layer, split)
                np.testing.assert_allclose(store.load(spec.name, layer, split)[rows], want, atol=1e-5)


@pytest.mark.slow
def test_full_size_encoders_on_ptbxl_sample(ray_cluster, ptbxl_manifest_few, tmp_path):
    """Published architectures (random init, FULL_SIZE_MODELS) over real records of every split, in one CPU
    pipeline: every record stored, finite, 768-d, in manifest order."""
    specs = [EncoderSpec(m, size="full") for m in FULL_SIZE_MODELS if _registered(m)]
    assert len(specs) == 2
    summaries = extract_models(ptbxl_manifest_few, tmp_path, specs,
                               EncoderConfig(size="full", batch_size=8, num_gpus=0.0), depths=[0.0, 1.0],
                               progress=False)
    store = ActivationStore.for_run(tmp_path)
    ids = read_manifest_records(ptbxl_manifest_few).df.groupby("split")["ecg_id"].apply(list).to_dict()
    for spec, summary in zip(specs, summaries, strict=True):
        model = spec.name
        assert summary["records"] + summary["quarantined"] == 3 * FULL_SIZE_PER_SPLIT, model
        assert summary["quarantined"] == 0, (model, summary["quarantine_reasons"])
        assert len(summary["layers"]) == 2, (model, summary["layers"])
        for layer in summary["layers"]:
            idx = store.index(model, layer)
            assert idx["d"] == 768 and idx["splits"] == {s: len(v) for s, v in ids.items()}, (model, idx)
            for split in ids:
                arr = store.load(model, layer, split)
                assert store.ecg_ids(model, layer, split).tolist() == ids[split], (model, layer, split)
                assert np.isfinite(arr).all() and arr.std() > 0, (model, layer, split)


def test_encode_cli_errors(tmp_path):
    from click.testing import CliRunner

    from raybench.app.cli import main

    res = CliRunner().invoke(main, ["encode", "--run-dir", str(tmp_path)])
    assert res.exit_code != 0 and "no manifest at" in res.output and "raybench manifest" in res.output
    res = CliRunner().invoke(main, ["encode", "--run-dir", "s3://bucket/run"])
    assert res.exit_code != 0 and "local" in res.output
    res = CliRunner().invoke(main, ["encode", "--run-dir", str(tmp_path), "--batch-size", "0"])
    assert res.exit_code != 0 and "batch_size" in res.output


@pytest.mark.slow
def test_encode_cli_end_to_end(ray_cluster, tmp_path):
    from click.testing import CliRunner

    from raybench.app.cli import main

    if not _registered("st_mem"):
        pytest.skip("st_mem not registered yet")
    run = tmp_path / "run"
    write_cohort(run / "manifest", n=6, fs=500, n_samples=5000, bad=False)
    # the demo config with one encoder actor instead of its two (one torch process less; a pool of two is
    # test_gpu_share_pools_rerun_skips_complete_stores_crash_frees_actors_and_leaves_no_partial_store's)
    config = tmp_path / "one_actor.yaml"
    config.write_text("encoders:\n  min_actors: 1\n  max_actors: 1\n")
    args = ["encode", "--run-dir", str(run), "--config", str(config), "--models", "st_mem", "--size", "demo",
            "--batch-size", "4", "--quiet"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    store = ActivationStore.for_run(run)
    layers = sorted(int(p.name.split("_")[1]) for p in store.model_dir("st_mem").glob("layer_*"))
    n_layers = store.index("st_mem", layers[0])["n_layers"]
    from raybench.core.config import layer_for_depth

    assert layers == sorted({layer_for_depth(q, n_layers) for q in (0.0, 0.25, 0.5, 0.75, 1.0)})
    res = CliRunner().invoke(main, args[:-1])
    assert res.exit_code == 0 and "layers written []" in res.output, res.output


def test_checkpoint_sha256_names_the_exact_weights(tmp_path):
    """Recorded in every store's index.json; the report and model cards quote it (issue 39)."""
    import hashlib

    from raybench.encoders.extract import checkpoint_sha256

    ck = tmp_path / "w.pt"
    ck.write_bytes(b"weights")
    assert checkpoint_sha256(str(ck)) == hashlib.sha256(b"weights").hexdigest()
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    first = checkpoint_sha256(str(folder))
    (folder / "config.json").write_text('{"x": 1}')
    assert first and checkpoint_sha256(str(folder)) != first
    assert checkpoint_sha256(None) is None and checkpoint_sha256(str(tmp_path / "nope")) is None
