"""The SAE atlas on Ray Tune: complete tables, retries, resume after a killed driver, failures kept."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pandas as pd
import pytest

from raybench.core.paths import RunLayout
from raybench.sae.cells_table import CELLS_TABLE_COLUMNS
from raybench.sae.grid import run_grid


@pytest.fixture
def encoded(encoded_small_run):
    """The session's encoded small run (conftest), shared with test_grid_elastic.py: tests train on copies."""
    return encoded_small_run


def _fresh(encoded, tmp_path, **resources):
    """A copy of the encoded run without any training outputs."""
    root = tmp_path / "run"
    shutil.copytree(encoded.run_dir, root, ignore=shutil.ignore_patterns("cells", "tune", "tables"))
    cfg = replace(encoded, run_dir=str(root))
    return replace(cfg, resources=replace(cfg.resources, **resources)) if resources else cfg


def test_grid_trains_every_cell_in_reused_trial_processes_and_retries_a_failing_trial(encoded, tmp_path):
    from raybench.encoders.store import ActivationStore
    from raybench.sae.cells import build_cells, group_trials

    # reused trial processes, one trial at a time: the 6 trials (and the retry) run in 2 process starts, not 7; a
    # process per trial is what test_grid_elastic.py's add/kill scenario runs (run_grid on the test cluster does not
    # reuse unless told)
    cfg = _fresh(encoded, tmp_path, trial_unit="layer", trial_gpus=0.25, max_failures=2, reuse_trial_processes=True,
                 max_concurrent_trials=1)
    cells = build_cells(cfg.protocol, ActivationStore.for_run(cfg.run_dir).model_dims(cfg.protocol.grid.models))
    first_stacks = [stacks[0][0].stack_id for stacks in group_trials(cells, "layer").values()]
    assert len(first_stacks) == 6
    markers = tmp_path / "fail-once"
    markers.mkdir()  # the hook fails a trial's first attempt unless its marker exists: one failing trial is enough
    for stack_id in first_stacks[1:]:  # (a retry is a fresh trial process: one per trial would cost 5 more starts)
        (markers / f"{stack_id}.failed-once").write_text("pre-armed\n")
    table = run_grid(cfg, fail_once_dir=str(markers))
    assert list(table.columns) == CELLS_TABLE_COLUMNS
    assert len(table) == 24 and (table["status"] == "ok").all(), table["status"].tolist()
    # the one trial without a marker failed once (the hook wrote its marker), then its retry succeeded
    assert (markers / f"{first_stacks[0]}.failed-once").read_text() == "injected failure\n"
    assert table["cell_id"].is_unique
    assert pd.read_parquet(RunLayout.at(cfg.run_dir).cells_table).equals(table)
    assert table["val_r2"].notna().all() and table["val_r2"].median() > 0  # 40 steps: fit has begun
    assert table["test_accessibility"].between(0, 1).all()
    # reuse_trial_processes true: a process runs one trial after another (the failed attempt's process is
    # replaced): 6 trials' results come from at most 2 processes, not 6
    layout = RunLayout.at(cfg.run_dir)
    assert len(list(layout.tune_dir.glob("*/*/result.json"))) == 6
    assert len(_trial_pids(layout)) <= 2, _trial_pids(layout)
    # a rerun trains nothing: every cell folder is untouched
    cells = RunLayout.at(cfg.run_dir).cells_dir
    before = {p.name: p.stat().st_mtime_ns for p in cells.iterdir()}
    again = run_grid(cfg)
    assert {p.name: p.stat().st_mtime_ns for p in cells.iterdir()} == before
    assert again.equals(table)


# A trial that exhausts its retries (its cells stay in the table, status `failed: ... injected failure`): tested
# with the release audit's view of it in test_grid_elastic.py (one grid instead of two).


# Killing the driver mid-grid and resuming is tested against an uninterrupted run in test_grid_elastic.py.


def test_a_cell_of_another_config_or_of_stale_activations_is_not_complete_and_is_retrained(encoded, tmp_path):
    """Each cell records the config hash, manifest hash and encoder fingerprint it was trained under; a cell whose
    record differs from the run's current ones is retrained (not passed off as `ok` with the current hash)."""
    import json

    from raybench.sae.freshness import activation_provenance

    cfg = _fresh(encoded, tmp_path, trial_unit="model")
    grid = replace(cfg.protocol.grid, models=("csfm",), depths=(0.0,), expansions=(1,), seeds=(4311,),
                   sensitivity_depth=None)
    cfg = replace(cfg, protocol=replace(cfg.protocol, grid=grid))
    first = run_grid(cfg)
    assert len(first) == 1 and (first["status"] == "ok").all(), first["status"].tolist()
    cell = RunLayout.at(cfg.run_dir).cell_dir(first["cell_id"].iloc[0])
    recorded = json.loads((cell / "metrics.json").read_text())
    store = activation_provenance(cfg.run_dir, "csfm", int(first["layer"].iloc[0]))
    assert store is not None
    assert {k: recorded.get(k) for k in ("config_hash", *store)} == {"config_hash": cfg.config_hash(), **store}

    other = replace(cfg, protocol=replace(cfg.protocol, sae=replace(cfg.protocol.sae, steps=30)))
    assert other.config_hash() != cfg.config_hash()
    second = run_grid(other)  # same run folder, another config: its cell is retrained, not reused
    assert (second["status"] == "ok").all(), second["status"].tolist()
    assert json.loads((cell / "metrics.json").read_text())["config_hash"] == other.config_hash()

    # a cell trained on other activations (re-encoded since) is not complete either
    metrics = json.loads((cell / "metrics.json").read_text())
    (cell / "metrics.json").write_text(json.dumps({**metrics, "encoder_fingerprint": "0123456789abcdef"}))
    from raybench.encoders.store import ActivationStore
    from raybench.sae.cells import build_cells
    from raybench.sae.cells_table import collect_cells_table

    cells = build_cells(other.protocol, ActivationStore.for_run(other.run_dir).model_dims(grid.models))
    assert collect_cells_table(other, cells, {})["status"].str.startswith("failed: ").all()
    third = run_grid(other)
    assert (third["status"] == "ok").all(), third["status"].tolist()
    assert json.loads((cell / "metrics.json").read_text())["encoder_fingerprint"] == store["encoder_fingerprint"]


def _small_grid(cfg):
    """Depth 0, E = 1, two seeds, no sensitivity arm: one 2-seed stack per model."""
    grid = replace(cfg.protocol.grid, depths=(0.0,), expansions=(1,), sensitivity_depth=None)
    return replace(cfg, protocol=replace(cfg.protocol, grid=grid))


def _mtimes(layout: RunLayout, cell_ids) -> dict[str, int]:
    return {c: (layout.cell_dir(c) / "metrics.json").stat().st_mtime_ns for c in cell_ids}


def test_grid_checkpoints_are_tensors_and_json_and_a_rerun_restores_nothing_and_trains_only_what_is_missing(
        encoded, tmp_path):
    """One grid, then reruns on its folder (one test: each property needs the same finished first grid).

    Checkpoints are pickle-free. Tune's experiment state (tuner.pkl, trial pickles) travels with the run folder,
    and any owner stamp beside it can be copied: a rerun must resume from raybench's own pickle-free state and
    unpickle nothing it finds. No Tune experiment is restored: what is still missing (a cell deleted after a
    finished grid, stacks added since) runs as a new experiment, and finished cells are not retrained."""
    import json
    import pickle

    from safetensors import safe_open

    # a 2-seed stack per model; a rerun's trials run one after another in one reused process
    cfg = _small_grid(_fresh(encoded, tmp_path, trial_unit="stack", reuse_trial_processes=True,
                             max_concurrent_trials=1))
    layout = RunLayout.at(cfg.run_dir)
    first = run_grid(cfg, only_models=("csfm",))
    assert len(first) == 2 and (first["status"] == "ok").all(), first["status"].tolist()
    checkpoints = sorted(layout.tune_dir.glob("grid-*/*/checkpoint_*"))
    assert checkpoints
    for ck in checkpoints:
        assert sorted(p.name for p in ck.iterdir()) == ["state.json", "state.safetensors"], "no pickle"
        json.loads((ck / "state.json").read_text())
        with safe_open(str(ck / "state.safetensors"), framework="pt") as f:
            assert list(f.keys())

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').write('ran')",)

    (exp,) = layout.tune_dir.glob("grid-*")
    planted = exp.with_name(f"{exp.name}-7")  # the newest experiment of the config, as a copied folder would be
    shutil.copytree(exp, planted)
    for folder in (exp, planted):  # a forged owner stamp (copied, or written by hand) beside a malicious pickle
        (folder / "raybench_owner.json").write_text(json.dumps(
            {"owner": "raybench", "experiment": folder.name, "config_hash": cfg.config_hash(), "token": "0" * 32}))
        (folder / "tuner.pkl").write_bytes(pickle.dumps(Payload()))
    gone = first["cell_id"].iloc[0]
    shutil.rmtree(layout.cell_dir(gone))
    kept = _mtimes(layout, [c for c in first["cell_id"] if c != gone])

    table = run_grid(cfg)  # the deleted cell and ecg_fm run as a new experiment
    assert not marker.exists(), "a planted tuner.pkl was unpickled"
    assert len(table) == 4 and (table["status"] == "ok").all(), table["status"].tolist()
    assert layout.cell_dir(gone).exists()
    assert _mtimes(layout, kept) == kept, "finished cells were retrained"
    assert sorted(p.name for p in layout.tune_dir.glob("grid-*") if p.is_dir()) == sorted(
        [exp.name, planted.name, f"{exp.name}-8"]), "the rerun is a new experiment after the newest"

    gone = table.loc[table["model"] == "ecg_fm", "cell_id"].iloc[-1]
    shutil.rmtree(layout.cell_dir(gone))
    kept = _mtimes(layout, [c for c in table["cell_id"] if c != gone])
    again = run_grid(cfg)
    assert not marker.exists(), "a planted tuner.pkl was unpickled"
    assert (again["status"] == "ok").all(), again["status"].tolist()
    assert layout.cell_dir(gone).exists() and _mtimes(layout, kept) == kept


@pytest.mark.parametrize("sampler,grad_clip", [("epoch", None), ("per_step", 0.05)])
def test_trial_checkpoints_hold_no_pickle_and_resume_exactly(tmp_path, sampler, grad_clip):
    """In-trial checkpoints are safetensors + JSON (nothing unpickled on resume) and resume bit-identically."""
    import json

    import numpy as np
    import torch

    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack
    from raybench.sae.trial_state import load_trial_state, save_trial_state

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(600, 16)) * rng.uniform(0.5, 3.0, size=16)).astype(np.float32)
    cfgs = [SAECellConfig(d=16, n_latents=64, k=3, seed=s, steps=20, batch_size=32, lr=3e-3, beta1=0.9, beta2=0.99,
                          aux_k=8, aux_coef=1 / 32, dead_after_batches=3, sampler=sampler, grad_clip=grad_clip)
            for s in (31, 32)]
    full = train_stack(x, cfgs)
    saved = {}

    def on_checkpoint(step: int, st: dict) -> None:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        save_trial_state(folder, {"cell_ids": ["a", "b"], "state": st})
        saved[step] = (folder, st)

    train_stack(x, cfgs, on_checkpoint=on_checkpoint, checkpoint_every=7)
    folder, original = saved[14]
    assert sorted(p.name for p in folder.iterdir()) == ["state.json", "state.safetensors"]
    json.loads((folder / "state.json").read_text())  # plain JSON
    loaded = load_trial_state(folder)
    assert loaded["cell_ids"] == ["a", "b"]
    st = loaded["state"]
    assert st["step"] == 14 and st["seeds"] == [31, 32]
    assert st["batchers"][0]["rng"] == original["batchers"][0]["rng"]  # 128-bit PCG64 state as JSON ints
    assert isinstance(st["adam"]["param_groups"][0]["betas"], tuple) and sorted(st["adam"]["state"]) == [0, 1, 2, 3]
    resumed = train_stack(x, cfgs, state=st)
    np.testing.assert_array_equal(resumed.loss_mse, full.loss_mse)
    np.testing.assert_array_equal(resumed.loss_aux, full.loss_aux)
    if grad_clip is not None:
        np.testing.assert_array_equal(resumed.grad_norm, full.grad_norm)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        assert torch.equal(getattr(resumed.sae, name), getattr(full.sae, name))


def _trial_pids(layout: RunLayout) -> set[int]:
    """The process ids Tune recorded in the trials' results."""
    import json

    return {json.loads(line)["pid"] for path in layout.tune_dir.glob("*/*/result.json")
            for line in path.read_text().splitlines() if line.strip()}
