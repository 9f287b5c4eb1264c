"""Resuming a stack from an earlier experiment's pickle-free checkpoint: found by JSON alone, loaded without pickle."""

from __future__ import annotations

import pickle

import torch
from pyarrow import fs as pafs

from raybench.sae.trial_state import save_trial_state
from raybench.sae.tune_experiments import RESUME_KEY, earlier_checkpoints, earlier_state, experiment_dirs, stack_key


def _checkpoint(folder, ids, step):
    folder.mkdir(parents=True)
    save_trial_state(folder, {"cell_ids": ids, "state": {"step": step, "w": torch.full((2,), float(step))}})


def test_the_newest_checkpoint_of_each_stack_is_found_from_json_and_loaded_without_pickle(tmp_path, monkeypatch):
    tune = tmp_path / "tune"
    ids, other = ["csfm-a-s1", "csfm-a-s2"], ["csfm-b-s1"]
    _checkpoint(tune / "grid-h" / "trial_0" / "checkpoint_000001", ids, 10)
    _checkpoint(tune / "grid-h-2" / "trial_0" / "checkpoint_000000", ids, 20)  # the newest of the stack
    _checkpoint(tune / "grid-h-2" / "trial_1" / "checkpoint_000000", other, 5)
    half = tune / "grid-h-2" / "trial_2" / "checkpoint_000003"  # cut short by a kill: no tensors
    half.mkdir(parents=True)
    (half / "state.json").write_text('{"format": 1, "state": {"dict": [["cell_ids", ["x"]]]}}')
    for folder in (tune / "grid-h", tune / "grid-h-2"):  # Tune's own pickles, planted to run code
        (folder / "tuner.pkl").write_bytes(pickle.dumps(print))
    _checkpoint(tune / "grid-other" / "trial_0" / "checkpoint_000000", ids, 99)  # another config's experiment

    monkeypatch.setattr(pickle, "loads", lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpickled")))
    monkeypatch.setattr(pickle, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpickled")))
    fs = pafs.LocalFileSystem()
    experiments = experiment_dirs(fs, str(tune), "grid-h")
    assert [e.n for e in experiments] == [1, 2]
    found = earlier_checkpoints(fs, experiments)
    assert found == {stack_key(ids): str(tune / "grid-h-2" / "trial_0" / "checkpoint_000000"),
                     stack_key(other): str(tune / "grid-h-2" / "trial_1" / "checkpoint_000000")}

    config = {RESUME_KEY: found, "remote_uri": None}
    state = earlier_state(config, ids)
    assert state["step"] == 20 and torch.equal(state["w"], torch.full((2,), 20.0))
    assert earlier_state(config, ids[:1]) is None  # another set of cells: not this checkpoint
    assert earlier_state({RESUME_KEY: {stack_key(other): str(half)}}, other) is None  # unreadable: step 0


def test_a_deeply_nested_planted_state_json_is_skipped_with_a_warning_naming_it(tmp_path, caplog):
    """json.loads raises RecursionError (not a ValueError) on deep nesting: uncaught, it stopped every rerun."""
    tune = tmp_path / "tune"
    ids = ["csfm-a-s1"]
    _checkpoint(tune / "grid-h" / "trial_0" / "checkpoint_000001", ids, 10)
    planted = tune / "grid-h" / "trial_1" / "checkpoint_000009"
    _checkpoint(planted, ["csfm-b-s1"], 1)
    (planted / "state.json").write_text("[" * 200_000 + "]" * 200_000)
    fs = pafs.LocalFileSystem()
    with caplog.at_level("WARNING", logger="raybench.sae.tune_experiments"):
        found = earlier_checkpoints(fs, experiment_dirs(fs, str(tune), "grid-h"))
    assert found == {stack_key(ids): str(tune / "grid-h" / "trial_0" / "checkpoint_000001")}
    assert f"skipping {planted / 'state.json'}: nested deeper" in caplog.text
    assert earlier_state({RESUME_KEY: {stack_key(["csfm-b-s1"]): str(planted)}}, ["csfm-b-s1"]) is None
