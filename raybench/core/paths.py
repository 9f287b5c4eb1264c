"""The run folder layout: the one place that knows where every artifact lives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunLayout:
    """Paths inside a run folder (docs/architecture.md §2)."""

    root: Path

    @classmethod
    def at(cls, root: str | Path) -> RunLayout:
        return cls(Path(root))

    @property
    def run_yaml(self) -> Path:
        return self.root / "run.yaml"

    @property
    def resources_resolved(self) -> Path:
        """The GPU shares `auto` resolved to, per stage (raybench.infra.resources)."""
        return self.root / "resources_resolved.json"

    @property
    def cohort_dir(self) -> Path:
        """Generated synthetic cohort (synth runs only)."""
        return self.root / "cohort"

    @property
    def manifest_dir(self) -> Path:
        return self.root / "manifest"

    @property
    def manifest(self) -> Path:
        return self.manifest_dir / "manifest.parquet"

    @property
    def manifest_summary(self) -> Path:
        return self.manifest_dir / "summary.json"

    @property
    def quarantine(self) -> Path:
        return self.manifest_dir / "quarantine.csv"

    @property
    def activations_dir(self) -> Path:
        return self.root / "activations"

    def activation_dir(self, model: str, layer: int) -> Path:
        return self.activations_dir / model / f"layer_{layer:02d}"

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    def cell_dir(self, cell_id: str) -> Path:
        return self.cells_dir / cell_id

    @property
    def tables_dir(self) -> Path:
        return self.root / "tables"

    @property
    def cells_table(self) -> Path:
        return self.tables_dir / "cells.parquet"

    @property
    def randomness_dir(self) -> Path:
        """Seeds, streams and index files of the evaluation's random draws (raybench.analysis.inference.randomness)."""
        return self.root / "randomness"

    @property
    def figures_dir(self) -> Path:
        return self.root / "figures"

    @property
    def dashboards_dir(self) -> Path:
        """Feature dashboards of the report: index.json and lazy-loaded images (raybench.analysis.features)."""
        return self.figures_dir / "dashboards"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def tune_dir(self) -> Path:
        return self.root / "tune"

    @property
    def mlflow_dir(self) -> Path:
        """The default MLflow file store of experiment tracking (raybench.sae.tracking)."""
        return self.root / "mlruns"
