"""What both waveform-concept extractors share (docs/protocol.md §4.1).

Lead II locates the beats; intervals are kept only inside the protocol's plausibility windows and
summarized by the median over beats; ST is read `ST_OFFSET_MS` after the QRS offset. A record that
cannot be measured at all raises `ConceptError` (a `RecordError`) with a short reason.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from raybench.cohorts.waveforms import LEADS, RecordError

LEAD_II = LEADS.index("II")
# plausibility windows (ms), docs/protocol.md §4.1
RR_WINDOW = (250.0, 2500.0)
QRS_WINDOW = (40.0, 220.0)
PR_WINDOW = (60.0, 320.0)
QT_WINDOW = (180.0, 700.0)
ST_OFFSET_MS = 60.0


class ConceptError(RecordError):
    """A record that cannot be measured; `reason` is a short tag (too_few_beats, delineation_failed...)."""

    def __init__(self, reason: str, detail: str, record: str = "<signal>"):
        super().__init__(record, reason, detail)


@contextmanager
def quiet() -> Iterator[None]:
    """neurokit2 and numpy warn on every short or noisy record; the reasons are reported instead."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def median(values: list[float]) -> float:
    """The median over beats (the mean of the two middle values for an even count); NaN for no values."""
    return float(np.median(values)) if values else math.nan
