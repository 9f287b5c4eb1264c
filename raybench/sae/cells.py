"""The cell grid: which SAEs the protocol trains, how they are named, and how they group into trials.

A cell is one SAE (model, relative depth, expansion, seed, arm). Cells that differ only by seed form a
*stack*: they share (d, N, k) and train together in one process; a Tune trial trains one or more stacks
(ResourceConfig.trial_unit). The encoders' dimensions come from the activation store
(raybench.encoders.store.ActivationStore.model_dims); the layer and k rules from raybench.core.protocol.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from raybench.core.config import ModelDims, Protocol, k_for, layer_for_depth
from raybench.core.protocol import Arm


@dataclass(frozen=True)
class CellSpec:
    """One grid cell (docs/protocol.md §6.6)."""

    model: str  # encoder name
    q: float  # nominal relative depth
    layer: int  # audited layer layer_for_depth(q, n_layers)
    n_layers: int  # the encoder's audited state count L
    d: int  # state width (SAE input)
    arm: Arm  # primary (k = d / 8) | sensitivity (k = N / 64)
    expansion: int  # E = N / d
    n_latents: int  # dictionary width N
    k: int  # active latents per record (batch average)
    seed: int

    @property
    def cell_id(self) -> str:
        return f"{self.model}-q{round(self.q * 100):03d}-E{self.expansion:02d}-{self.arm}-s{self.seed}"

    @property
    def stack_id(self) -> str:
        return f"{self.model}-q{round(self.q * 100):03d}-E{self.expansion:02d}-{self.arm}"

    @property
    def realized_depth(self) -> float:
        return self.layer / (self.n_layers - 1) if self.n_layers > 1 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def build_cells(protocol: Protocol, dims: dict[str, ModelDims]) -> list[CellSpec]:
    """All cells of the atlas in a stable order: primary arm first, then the sensitivity arm."""
    grid = protocol.grid
    missing = [m for m in grid.models if m not in dims]
    if missing:
        raise KeyError(f"no encoder dimensions for models {missing}; encode them first")
    cells: list[CellSpec] = []
    arms: list[tuple[Arm, tuple[float, ...]]] = [("primary", grid.depths)]
    if grid.sensitivity_depth is not None:
        arms.append(("sensitivity", (grid.sensitivity_depth,)))
    for arm, depths in arms:
        for model in grid.models:
            md = dims[model]
            for q in depths:
                layer = layer_for_depth(q, md.n_layers)
                for e in grid.expansions:
                    n = e * md.d
                    k = k_for(md.d, n, arm, protocol.sae, grid)
                    for seed in grid.seeds:
                        cells.append(CellSpec(model, q, layer, md.n_layers, md.d, arm, e, n, k, seed))
    return cells


def trial_key(cell: CellSpec, unit: str) -> str:
    """Which trial a cell's stack belongs to (see ResourceConfig.trial_unit)."""
    if unit == "stack":
        return cell.stack_id
    if unit == "layer":
        return f"{cell.model}-q{round(cell.q * 100):03d}-{cell.arm}"
    if unit == "model":
        return f"{cell.model}-{cell.arm}"
    raise ValueError(f"unknown trial unit {unit!r}")


def group_trials(cells: list[CellSpec], unit: str) -> dict[str, list[list[CellSpec]]]:
    """Trial key -> its stacks (each a list of seed cells), preserving grid order."""
    trials: dict[str, list[list[CellSpec]]] = {}
    for stack in group_stacks(cells).values():
        trials.setdefault(trial_key(stack[0], unit), []).append(stack)
    return trials


def group_stacks(cells: list[CellSpec]) -> dict[str, list[CellSpec]]:
    """Stack id -> its cells (seeds), preserving order."""
    stacks: dict[str, list[CellSpec]] = {}
    for cell in cells:
        stacks.setdefault(cell.stack_id, []).append(cell)
    return stacks
