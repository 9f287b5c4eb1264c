"""Activation store: layout, completeness checks, atomic finalize, crash leftovers, quarantine merge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from raybench.core.paths import RunLayout
from raybench.encoders.store import ActivationStore, StoreError, store_bytes


def _write(store: ActivationStore, model="m", layer=2, d=8, capacity=None, rows=None, fingerprint="fp",
           manifest_hash="mh"):
    capacity = capacity or {"train": 5, "val": 2, "test": 3}
    rows = rows if rows is not None else capacity
    rng = np.random.default_rng(0)
    data = {}
    with store.writer(model, layer, n_layers=4, d=d, manifest_hash=manifest_hash, fingerprint=fingerprint,
                      capacity=capacity) as w:
        start = 0
        for split, n in rows.items():
            ids = np.arange(start, start + n, dtype=np.int64) * 3 + 1
            x = rng.standard_normal((n, d)).astype(np.float32)
            # two appends per split: rows land contiguously in call order
            w.append(split, ids[:1], x[:1])
            w.append(split, ids[1:], x[1:])
            data[split] = (ids, x)
            start += n
        final = w.finalize()
    return final, data


def test_roundtrip_layout_and_index(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    final, data = _write(store)
    assert final == RunLayout.at(tmp_path).activation_dir("m", 2)
    assert sorted(p.name for p in final.iterdir()) == sorted(
        ["index.json", "train.npy", "train_ecg_ids.npy", "val.npy", "val_ecg_ids.npy", "test.npy", "test_ecg_ids.npy"])
    idx = store.index("m", 2)
    assert idx["splits"] == {"train": 5, "val": 2, "test": 3}
    assert (idx["model"], idx["layer"], idx["n_layers"], idx["d"], idx["dtype"]) == ("m", 2, 4, 8, "float32")
    assert (idx["manifest_hash"], idx["fingerprint"]) == ("mh", "fp")
    for split, (ids, x) in data.items():
        arr = store.load("m", 2, split)
        assert isinstance(arr, np.memmap) and arr.dtype == np.float32 and arr.flags.c_contiguous
        np.testing.assert_array_equal(arr, x)
        np.testing.assert_array_equal(store.ecg_ids("m", 2, split), ids)
        assert np.array_equal(np.load(final / f"{split}.npy", mmap_mode="r"), x)
    assert not isinstance(store.load("m", 2, "val", mmap=False), np.memmap)
    assert store.is_complete("m", 2, "mh", "fp")
    assert not store.is_complete("m", 2, "other", "fp")
    assert not store.is_complete("m", 2, "mh", "other")
    assert not store.is_complete("m", 3, "mh", "fp")
    assert not list(final.parent.glob(".*"))  # no temp folders left behind
    with pytest.raises(StoreError, match="split 'holdout'"):
        store.load("m", 2, "holdout")


def test_the_store_answers_which_models_and_layers_it_holds(tmp_path):
    from raybench.core.config import ModelDims

    store = ActivationStore(tmp_path / "activations")
    assert store.models() == [] and store.layers("m") == [] and store.model_dims() == {}
    _write(store, "m", layer=3, d=8)
    _write(store, "m", layer=0, d=8)
    _write(store, "other", layer=1, d=6)
    (store.model_dir("m") / "layer_05").mkdir()  # no index.json: not a store
    (store.model_dir("m") / ".layer_02.123.abcd.tmp").mkdir()  # a writer's temp folder
    (store.root / "empty").mkdir()
    assert store.models() == ["m", "other"]
    assert store.layers("m") == [0, 3] and store.layers("other") == [1]
    assert store.model_dims() == {"m": ModelDims(n_layers=4, d=8), "other": ModelDims(n_layers=4, d=6)}
    assert store.model_dims(["other"]) == {"other": ModelDims(n_layers=4, d=6)}
    with pytest.raises(StoreError, match="no activation store for model 'empty'.*raybench encode"):
        store.model_dims(["m", "empty"])


def test_bytes_per_record_close_to_raw_float32(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    final, _ = _write(store, d=768, capacity={"train": 300, "val": 60, "test": 60})
    per_record = (store_bytes(final) - (final / "index.json").stat().st_size) / 420
    raw = 768 * 4
    assert raw <= per_record <= 1.10 * raw
    # arrays are exactly header + raw data
    assert (final / "train.npy").stat().st_size - 300 * raw < 256


def test_unused_capacity_is_trimmed(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    _, data = _write(store, capacity={"train": 6, "val": 3}, rows={"train": 4, "val": 0})
    assert store.index("m", 2)["splits"] == {"train": 4, "val": 0}
    np.testing.assert_array_equal(store.load("m", 2, "train"), data["train"][1])
    assert store.load("m", 2, "val").shape == (0, 8)
    assert store.is_complete("m", 2, "mh", "fp")


def test_writer_rejects_bad_rows(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    with store.writer("m", 0, n_layers=1, d=4, manifest_hash="h", fingerprint="f", capacity={"train": 2}) as w:
        with pytest.raises(StoreError, match="more than the 2 rows"):
            w.append("train", np.arange(3), np.zeros((3, 4), np.float32))
        with pytest.raises(StoreError, match="expected"):
            w.append("train", np.arange(2), np.zeros((2, 5), np.float32))
        with pytest.raises(StoreError, match="not declared"):
            w.append("val", np.arange(1), np.zeros((1, 4), np.float32))


def test_exception_leaves_nothing(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), \
            store.writer("m", 1, n_layers=2, d=4, manifest_hash="h", fingerprint="f", capacity={"train": 3}) as w:
        w.append("train", np.arange(2), np.ones((2, 4), np.float32))
        raise RuntimeError("boom")
    assert list((tmp_path / "activations" / "m").iterdir()) == []
    assert not store.is_complete("m", 1, "h", "f")


def test_finalize_replaces_stale_store(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    _write(store, fingerprint="old")
    assert store.is_complete("m", 2, "mh", "old")
    _, data = _write(store, fingerprint="new", capacity={"train": 2})
    assert not store.is_complete("m", 2, "mh", "old")
    assert store.is_complete("m", 2, "mh", "new")
    assert sorted(p.name for p in store.layer_dir("m", 2).iterdir()) == ["index.json", "train.npy",
                                                                         "train_ecg_ids.npy"]
    assert not list(store.model_dir("m").glob(".*"))


def test_truncated_or_corrupt_store_is_not_complete(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    final, _ = _write(store)
    path = final / "train.npy"
    size = path.stat().st_size
    os.truncate(path, size - 4)
    assert not store.is_complete("m", 2, "mh", "fp")
    os.truncate(path, size)
    assert store.is_complete("m", 2, "mh", "fp")
    (final / "val_ecg_ids.npy").unlink()
    assert not store.is_complete("m", 2, "mh", "fp")
    (final / "index.json").write_text("{not json")
    assert not store.is_complete("m", 2, "mh", "fp")


def test_killed_writer_never_looks_complete_and_is_cleaned(tmp_path):
    """A writer process killed mid-write leaves only a hidden temp folder; the next writer removes it."""
    code = textwrap.dedent(f"""
        import sys, time, numpy as np
        from raybench.encoders.store import ActivationStore
        store = ActivationStore.for_run({str(tmp_path)!r})
        w = store.writer("m", 2, n_layers=4, d=8, manifest_hash="mh", fingerprint="fp", capacity={{"train": 10}})
        w.append("train", np.arange(5), np.ones((5, 8), np.float32))
        print("written", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = ActivationStore.for_run(tmp_path)
    leftovers = list(store.model_dir("m").glob(".layer_02.*.tmp"))
    assert len(leftovers) == 1 and not (leftovers[0] / "index.json").exists()
    assert not store.layer_dir("m", 2).exists()
    assert not store.is_complete("m", 2, "mh", "fp")
    _write(store)
    assert store.is_complete("m", 2, "mh", "fp")
    assert not leftovers[0].exists()


def test_live_writer_temp_folder_is_kept(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    w1 = store.writer("m", 2, n_layers=4, d=8, manifest_hash="mh", fingerprint="fp", capacity={"train": 1})
    _write(store)  # a second writer in this (live) process must not delete w1's folder
    assert w1.tmp_dir.exists()
    w1.abort()
    assert not w1.tmp_dir.exists()


def test_quarantine_merge(tmp_path):
    store = ActivationStore.for_run(tmp_path)
    a = pd.DataFrame({"ecg_id": [5, 2], "split": ["train", "val"], "path": ["r/5", "r/2"],
                      "reason": ["nan_lead", "unreadable"], "detail": ["x", "y"]})
    path = store.add_quarantine("m", a)
    b = pd.DataFrame({"ecg_id": [5, 9], "split": ["train", "test"], "path": ["r/5", "r/9"],
                      "reason": ["flat_lead", "missing_header"], "detail": ["z", "w"]})
    store.add_quarantine("m", b)
    got = pd.read_csv(path)
    assert got["ecg_id"].tolist() == [2, 5, 9]
    assert got["reason"].tolist() == ["unreadable", "flat_lead", "missing_header"]
    assert path == tmp_path / "activations" / "m" / "quarantine.csv"


def test_index_written_last(tmp_path, monkeypatch):
    """If writing index.json fails, the store is not renamed into place."""
    import raybench.encoders.store as store_mod

    def fail(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(store_mod, "write_json", fail)
    store = ActivationStore.for_run(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        _write(store)
    assert not store.layer_dir("m", 2).exists()
    assert not list(store.model_dir("m").iterdir())
