"""One Tune trial of the grid: train, evaluate and save the missing cells of its stacks.

A trial asks for `{"cpu": c, "gpu": g}` (fractional g packs several trials on one GPU), reads the activation
store of each (model, layer) it needs, trains each stack's seeds together with periodic in-trial checkpoints
(raybench.sae.trial_state) and writes every finished cell's folder atomically (raybench.sae.cell_files). A
restarted trial resumes its stack from the checkpoint and never retrains a cell that is already done.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from raybench.core.atomic import write_json
from raybench.core.config import Protocol, from_dict
from raybench.core.paths import RunLayout
from raybench.encoders.store import INDEX
from raybench.sae.cell_files import save_cell
from raybench.sae.cells import CellSpec
from raybench.sae.data import CellData, load_cell_data
from raybench.sae.evaluate import evaluate_cell
from raybench.sae.freshness import activation_provenance, cell_done, expected_provenance
from raybench.sae.model import SAECellConfig
from raybench.sae.tracking import curve_report, final_report
from raybench.sae.train import train_stack
from raybench.sae.trial_state import load_trial_state, save_trial_state
from raybench.sae.tune_experiments import earlier_state


def train_cells_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: train + evaluate + save the missing cells of each stack in this trial."""
    import torch
    from ray import tune

    layout = RunLayout.at(config["run_root"])
    remote = config.get("remote_uri")
    protocol: Protocol = from_dict(Protocol, config["protocol"])
    stacks = [[CellSpec(**c) for c in stack] for stack in config["stacks"]]
    if remote:  # this node may not have the inputs (or other nodes' finished cells) yet
        from raybench.infra.s3_lease import adopt_lease
        from raybench.infra.storage import sync_down

        adopt_lease(remote, config.get("lease_token"))  # its uploads stop once the driver's lease is lost

        sync_down(remote, layout.root, "manifest")
        for cell in (c for stack in stacks for c in stack):
            sync_down(remote, layout.root, f"cells/{cell.cell_id}")
        for key in dict.fromkeys((c.model, c.layer) for stack in stacks for c in stack):  # what cells must match
            sync_down(remote, layout.root, (RunLayout(Path(".")).activation_dir(*key) / INDEX).as_posix())
    total = sum(len(s) for s in stacks)
    expect = expected_provenance(layout.root, config["config_hash"], [c for s in stacks for c in s])
    todo_stacks = [[c for c in s if not cell_done(layout, expect, c)] for s in stacks]
    todo_stacks = [s for s in todo_stacks if s]
    done_before = total - sum(len(s) for s in todo_stacks)
    if todo_stacks:
        _maybe_fail_once(config.get("fail_once_dir"), todo_stacks[0][0].stack_id)
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    device = "cuda" if torch.cuda.is_available() and _assigned_gpu() else "cpu"

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as ckdir:
            resume = load_trial_state(ckdir)  # tensors + JSON: nothing is unpickled

    trained = 0
    loaded: dict[tuple[str, int], CellData] = {}
    for todo in todo_stacks:
        key = (todo[0].model, todo[0].layer)
        if key not in loaded:
            loaded.clear()  # one (model, layer) in memory at a time
            if remote:
                sync_down(remote, layout.root, RunLayout(Path(".")).activation_dir(*key).as_posix())
            loaded[key] = load_cell_data(layout.root, key[0], key[1], protocol.eval)
            store_provenance = activation_provenance(layout.root, *key) or {}  # the activations trained on
        ids = [c.cell_id for c in todo]
        state = resume["state"] if resume is not None and resume.get("cell_ids") == ids else earlier_state(config, ids)
        _train_and_save(layout, protocol, todo, loaded[key], device, state, config["config_hash"],
                        {"cells_trained": trained, "cells_total": total, "cells_done": done_before + trained},
                        remote, config.get("hold_dir"),
                        provenance=store_provenance, log_every=int(config.get("log_every", 0)))
        trained += len(todo)
        # after every stack, so the driver's display counts cells as they are saved (raybench.infra.progress)
        tune.report({"cells_trained": trained, "cells_total": total, "cells_done": done_before + trained})
    if not todo_stacks:
        tune.report({"cells_trained": 0, "cells_total": total, "cells_done": total})


def _train_and_save(layout: RunLayout, protocol: Protocol, todo: list[CellSpec], data: CellData, device: str,
                    state: dict | None, config_hash: str, progress: dict[str, int],
                    remote_uri: str | None = None, hold_dir: str | None = None, *,
                    provenance: dict[str, str] | None = None, log_every: int = 0) -> None:
    """Train one stack (the seeds of a cell) together, then evaluate and save each SAE atomically.

    Each cell's metrics.json records `config_hash` and `provenance` (manifest hash + encoder fingerprint of the
    activations it was trained on): raybench.sae.freshness compares them with the run's current ones.
    With `log_every` (experiment tracking) each cell's loss curves and final metrics are reported to Tune's logger
    callbacks (raybench.sae.tracking).
    """
    from ray import tune

    cfgs = [SAECellConfig.from_protocol(protocol.sae, c.d, c.n_latents, c.k, c.seed) for c in todo]
    ids = [c.cell_id for c in todo]

    def on_checkpoint(step: int, st: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            save_trial_state(tmp, {"cell_ids": ids, "state": st})
            tune.report({"step": step, **progress}, checkpoint=tune.Checkpoint.from_directory(tmp))
        _maybe_hold(hold_dir, ids)

    def on_log(step: int, point: dict) -> None:
        tune.report(curve_report(todo, step, point))

    t0 = time.perf_counter()
    result = train_stack(data.acts["train"], cfgs, device=device, state=state, on_checkpoint=on_checkpoint,
                         checkpoint_every=protocol.sae.checkpoint_every, implementation="auto",
                         on_log=on_log if log_every else None, log_every=log_every)
    seconds = (time.perf_counter() - t0) / len(todo)
    finals: dict[str, dict] = {}
    for i, cell in enumerate(todo):
        ev = evaluate_cell(result.sae, result.normalizer, data.acts, data.concepts, data.test_patient_codes,
                           data.selection_idx, protocol.eval, index=i, n_patients=len(data.test_patients),
                           selection_present=data.selection_present)
        extra = {"cell_id": cell.cell_id, "realized_depth": cell.realized_depth, "train_seconds": seconds,
                 "config_hash": config_hash, "device": device, "concepts": list(data.concept_names),
                 "n_test_patients": len(data.test_patients), **(provenance or {}), **_placement(),
                 "missing_concepts": data.missing_concepts,
                 "n_eval_records": {s: int(len(data.acts[s])) for s in ("val", "test")}}
        save_cell(layout.cell_dir(cell.cell_id), result.sae.single(i), {**asdict(cfgs[i]), **cell.to_dict()}, ev,
                  extra, normalizer=result.normalizer)
        if remote_uri:
            from raybench.infra.storage import sync_up

            sync_up(layout.root, remote_uri, f"cells/{cell.cell_id}")
        finals[cell.cell_id] = ev.metrics
    if log_every:
        tune.report(final_report(finals, protocol.sae.steps))


def _placement() -> dict[str, str]:
    """Where the cell was trained (node id + host), so elastic runs can be audited."""
    import socket

    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    return {"node_id": node, "hostname": socket.gethostname()}


def _assigned_gpu() -> bool:
    import ray

    try:
        return bool(ray.get_gpu_ids())
    except Exception:
        return False


def _maybe_fail_once(marker_dir: str | None, stack_id: str) -> None:
    """Test hook: the first attempt of a stack raises, the retry succeeds (exercises FailureConfig)."""
    if not marker_dir:
        return
    marker = Path(marker_dir) / f"{stack_id}.failed-once"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("injected failure\n")
        raise RuntimeError(f"injected failure for {stack_id} (test hook)")


def _maybe_hold(hold_dir: str | None, cell_ids: list[str]) -> None:
    """Test hook: on the node whose id is in <hold_dir>/node_id, a trial that has just persisted a checkpoint
    says so (<hold_dir>/held.json) and waits to be killed, so a node kill lands mid-trial for certain."""
    if not hold_dir or not (Path(hold_dir) / "node_id").exists():
        return
    import ray

    if (Path(hold_dir) / "node_id").read_text().strip() != ray.get_runtime_context().get_node_id():
        return
    write_json(Path(hold_dir) / "held.json", cell_ids)
    while True:
        time.sleep(1.0)
