"""When a cell counts as done: its folder is complete and it was trained on what the run holds now.

Each cell's metrics.json records the run's config hash and the manifest hash + encoder fingerprint of the
activation store it trained on (raybench.sae.trial). A cell of another config, or trained on activations of
another manifest or encoder, is not done and is retrained; the grid, the cells table and the pipeline's
completeness check all ask `cell_done` / `cell_complete`.
"""

from __future__ import annotations

import json
from pathlib import Path

from raybench.core.paths import RunLayout
from raybench.core.run_state import compatible_hashes
from raybench.encoders.store import ActivationStore, StoreError
from raybench.sae.cells import CellSpec


def cell_complete(cell_dir: Path, expect: dict[str, str] | None = None,
                  config_hashes: frozenset[str] = frozenset()) -> bool:
    """A cell folder exists only after its atomic rename, and metrics.json is in it.

    With `expect` (see `expected_provenance`) the cell must also record exactly those values, except that its
    config_hash may also be one of `config_hashes` (the run's earlier hashes: raybench.core.run_state).
    """
    path = cell_dir / "metrics.json"
    if not path.exists():
        return False
    if expect is None:
        return True
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return all(recorded.get(key) == value or (key == "config_hash" and recorded.get(key) in config_hashes)
               for key, value in expect.items())


def activation_provenance(run_root: str | Path, model: str, layer: int) -> dict[str, str] | None:
    """Manifest hash and encoder fingerprint of the (model, layer) activation store; None when there is none."""
    try:
        idx = ActivationStore.for_run(run_root).index(model, layer)
    except (StoreError, ValueError):
        return None
    return {"manifest_hash": str(idx.get("manifest_hash")), "encoder_fingerprint": str(idx.get("fingerprint"))}


def expected_provenance(run_root: str | Path, config_hash: str,
                        cells: list[CellSpec]) -> dict[str, dict[str, str] | None]:
    """cell_id -> what its metrics.json must record to count as complete: the run's config hash and the
    manifest hash + encoder fingerprint of the activation store it trains on (None: no store, never complete)."""
    stores: dict[tuple[str, int], dict[str, str] | None] = {}
    out: dict[str, dict[str, str] | None] = {}
    for c in cells:
        key = (c.model, c.layer)
        if key not in stores:
            stores[key] = activation_provenance(run_root, *key)
        out[c.cell_id] = None if stores[key] is None else {"config_hash": config_hash, **stores[key]}
    return out


def cell_done(layout: RunLayout, expect: dict[str, dict[str, str] | None], cell: CellSpec) -> bool:
    """`cell` is complete and records what `expect` (expected_provenance) says it must; a cell trained before the
    run's model list changed records an earlier, compatible config hash (raybench.core.run_state)."""
    want = expect.get(cell.cell_id)
    if want is None:
        return False
    return cell_complete(layout.cell_dir(cell.cell_id), want, compatible_hashes(layout.root, want["config_hash"]))


def check_stores_match_manifest(layout: RunLayout, cells: list[CellSpec]) -> None:
    """Refuse to train on activation stores encoded from another manifest than the run's current one."""
    from raybench.cohorts.manifest import load_manifest

    if not layout.manifest.exists():
        return  # a remote run's trials fetch it; nothing to compare here
    current = load_manifest(layout.manifest)[1].manifest_hash
    stale = sorted({layout.activation_dir(c.model, c.layer).relative_to(layout.activations_dir).as_posix()
                    for c in cells if (p := activation_provenance(layout.root, c.model, c.layer)) is not None
                    and p["manifest_hash"] != current})
    if stale:
        raise StoreError(f"activation stores {stale} under {layout.activations_dir} were encoded from another manifest "
                         f"than {layout.manifest} (hash {current}); run `raybench encode --run-dir {layout.root}` "
                         "first")
