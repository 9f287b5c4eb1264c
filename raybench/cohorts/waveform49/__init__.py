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

import numpy as np

from raybench.cohorts.extractor_rules import quiet
from raybench.cohorts.waveform49.beats import record_beats
from raybench.cohorts.waveform49.delineation import delineate
from raybench.cohorts.waveform49.measures import concepts49

__all__ = ["measure_signal49", "measure_signal49_reasons", "waveform49_values"]


def measure_signal49_reasons(signal: np.ndarray, fs: float) -> tuple[dict[str, float], dict[str, str]]:
    """(the 49 concepts of one [12, T] mV signal, the reason of each NaN); ConceptError if unmeasurable."""
    sig = np.asarray(signal, dtype=np.float64)
    if sig.ndim != 2 or sig.shape[0] != 12:
        raise ValueError(f"signal must be [12, T] in LEADS order, got shape {sig.shape}")
    with quiet():
        beats = record_beats(sig, float(fs))
        return concepts49(beats, delineate(beats))


def measure_signal49(signal: np.ndarray, fs: float) -> dict[str, float]:
    """The 49 concepts of one [12, T] mV signal (NaN where unmeasurable; module doc)."""
    return measure_signal49_reasons(signal, fs)[0]


def waveform49_values(*args, **kwargs):
    """See `raybench.cohorts.waveform49.runner.waveform49_values` (imported lazily: it imports Ray)."""
    from raybench.cohorts.waveform49.runner import waveform49_values as run

    return run(*args, **kwargs)
