"""waveform49: the 49 panel concepts measured from the raw 12-lead waveform (docs/protocol.md §4.4).

`cohort.concepts: waveform49` (ptbxl, mimic, synth) gives a cohort without PTB-XL+ feature tables the full
panel: the same names, families and lead aggregations as `raybench.cohorts.panel`, in the tables' units.

Public interface:
  measure_signal49(signal, fs) -> dict[str, float]
      signal: np.ndarray [12, T] in mV, leads in `raybench.cohorts.waveforms.LEADS` order; fs in Hz.
      Returns every `concept_names()` key; a concept that cannot be measured is NaN.
  measure_signal49_reasons(signal, fs) -> (values, {concept: reason})
      The same, with the reason of each NaN (`no_p_wave`, `not_delineated`, `implausible`, ...).
      A record that cannot be measured at all raises `ConceptError` (reasons `too_short`, `too_few_beats`).
  waveform49_values(root, records, num_cpus, notes, summary) -> DataFrame
      (runner) every record of a manifest table (ecg_id, path, fs) measured as Ray tasks; per-concept
      missing counts with reasons in `summary["waveform49_missing"]`; one bad record never stops the others.

Modules: `beats` (filter, QRS detection, one median beat per lead), `delineation` (P/QRS/T onsets,
peaks, ends), `measures` (the 49 values), `runner` (Ray tasks over manifest rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from raybench.cohorts.waveform49.measures import measure_signal49, measure_signal49_reasons

__all__ = ["measure_signal49", "measure_signal49_reasons", "waveform49_values"]


def waveform49_values(root: Path, records: pd.DataFrame, num_cpus: int | None, notes: list[str],
                      summary: dict[str, Any]) -> pd.DataFrame:
    """`raybench.cohorts.waveform49.runner.waveform49_values` (imported here on first use: the runner imports Ray)."""
    from raybench.cohorts.waveform49.runner import waveform49_values as run

    return run(root, records, num_cpus, notes, summary)
