"""The analysis contract: what an analysis is, and the report section it shows. Every analysis (the atlas
tables, the release audit, the secondary analyses, the reliability and provenance audits, the feature
dashboards, ...) is one folder with the same file names and one `Analysis` entry in `registry.ANALYSES`, which
is in report order (docs/architecture.md §4).

    run(RunInputs)       -> {table name: DataFrame}   the costly part, in the analyze stage only
    render(RenderInputs) -> [written paths]            figures drawn from the tables on disk (and cheap files
                                                       derived from them); `raybench report` runs every one
    sections                                           report sections: glob patterns over table / figure stems,
                                                       plus an optional HTML body

This module is a leaf of the analysis package: it imports no analysis.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.core.config import Protocol, RunConfig
from raybench.core.paths import RunLayout
from raybench.core.run_state import run_section


@dataclass
class Context:
    """Everything a section renderer may read; built once per render."""

    layout: RunLayout
    tables: dict[str, pd.DataFrame]
    figures: dict[str, Path]  # stem -> PNG path
    run: dict[str, Any] | None
    audit: dict[str, Any] | None
    claimed_tables: set[str] = field(default_factory=set)
    claimed_figures: set[str] = field(default_factory=set)
    failures: dict[str, str] = field(default_factory=dict)  # failed secondary analysis -> reason

    @property
    def cohort_kind(self) -> str | None:
        cohort = run_section(self.run, "cohort")
        return None if cohort is None else str(cohort.get("kind"))

    def match_tables(self, patterns: tuple[str, ...]) -> list[str]:
        return _match(sorted(self.tables), patterns)

    def match_figures(self, patterns: tuple[str, ...]) -> list[str]:
        return _match(sorted(self.figures), patterns)


@dataclass(frozen=True)
class Section:
    """A report section. `figures`/`tables` are glob patterns over stems; `body` adds custom HTML first."""

    id: str
    title: str
    intro: str = ""
    figures: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    optional: bool = False  # omitted entirely unless some figure or table matches
    body: Callable[[Context], str] | None = None
    claims: tuple[str, ...] = ()  # tables shown by `body` (kept out of "Other results")
    needs: tuple[str, ...] = ()  # tables `body` reads; without them the section says what is missing


@dataclass(frozen=True)
class RunInputs:
    """What an analysis' `run` gets: the local run folder and the run's config. num_workers caps concurrent Ray
    tasks (results never depend on it); allow_incomplete analyzes a grid with missing or failed cells."""

    root: Path
    cfg: RunConfig
    num_workers: int | None = None
    allow_incomplete: bool = False

    @property
    def protocol(self) -> Protocol:
        return self.cfg.protocol


@dataclass(frozen=True)
class RenderInputs:
    """What an analysis' `render` gets: the run folder and its protocol (None when the run recorded none: then
    what depends on it is left as it is). `parallel`: draw figures in Ray tasks when Ray is up (None)."""

    root: Path
    protocol: Protocol | None
    parallel: bool | None = None

    @property
    def layout(self) -> RunLayout:
        return RunLayout.at(self.root)


def _always(cfg: RunConfig) -> bool:
    return True


@dataclass(frozen=True)
class Analysis:
    """One analysis of a finished grid.

    name: its folder under raybench/analysis/. run: computes and writes its tables (None: it only renders or
    only shows). render: draws its figures from the tables on disk. sections: its report sections, in order.
    enabled(cfg): whether the analyze stage runs it (its config section's switch). captions: figure stem ->
    caption in the report.
    """

    name: str
    sections: tuple[Section, ...] = ()
    run: Callable[[RunInputs], Mapping[str, pd.DataFrame]] | None = None
    render: Callable[[RenderInputs], list[Path]] | None = None
    enabled: Callable[[RunConfig], bool] = _always
    captions: Mapping[str, str] = field(default_factory=dict)


def _match(names: list[str], patterns: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
