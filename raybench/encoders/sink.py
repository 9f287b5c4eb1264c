"""The driver's end of an extraction: the Ray Data batch stream written into each model's layer stores in
manifest order, with its quarantined rows, record notes and live progress (raybench.encoders.extract)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pandas as pd

from raybench.encoders.loading import ExtractionError
from raybench.encoders.store import QUARANTINE_COLUMNS
from raybench.infra import progress as live_progress


class Sink:
    """One model's share of the batch stream: its layer writers, quarantined rows, record notes and progress.
    `prefix` picks its columns in a multi-model stream (MultiEncoderActor's "<i>:")."""

    def __init__(self, name: str, writers: dict, todo: list[int], n_total: int, prefix: str = ""):
        self.name, self.writers, self.todo, self.n_total, self.prefix = name, writers, todo, n_total, prefix
        self.bad: list[pd.DataFrame] = []
        self.notes: dict[str, list[int]] = {}
        self.devices: set[str] = set()
        self.seen = 0
        self.key = f"encode:{name}"

    def take(self, batch: dict[str, np.ndarray]) -> None:
        p = self.prefix
        ids, split = batch["ecg_id"], batch["split"].astype(str)
        ok, states = batch[p + "ok"], batch[p + "states"]
        for s in np.unique(split[ok]):
            mask = ok & (split == s)
            for j, layer in enumerate(self.todo):
                self.writers[layer].append(s, ids[mask], states[mask, j])
        for i in np.flatnonzero(ok):
            for text in json.loads(batch[p + "notes"][i]):
                self.notes.setdefault(text, []).append(int(ids[i]))
        if not ok.all():
            cols = {k: batch[k if k in ("ecg_id", "split", "path") else p + k][~ok] for k in QUARANTINE_COLUMNS}
            self.bad.append(pd.DataFrame(cols))
        self.devices.update(str(v) for v in np.unique(batch[p + "device"]))
        self.seen += len(ids)

    def close(self) -> pd.DataFrame:
        """The quarantined rows; the writers get the notes."""
        quarantine = (pd.concat(self.bad, ignore_index=True) if self.bad
                      else pd.DataFrame(columns=list(QUARANTINE_COLUMNS)))
        for writer in self.writers.values():
            writer.set_notes(self.notes)
        return quarantine


def consume(ds, sinks: list[Sink], t0: float, progress: bool) -> list[pd.DataFrame]:
    """Stream the pipeline's batches into every sink's layer writers in manifest order; returns each sink's
    quarantine. Progress: records done/total per model on the live display, and a line every 30 s."""
    last_id = -(2**63)
    last_report = t0
    display = live_progress.current()
    # one display line per pass over the records: sinks fed by one pipeline (one actor running several encoders)
    # advance together, and six identical lines would say nothing more than one
    key = sinks[0].key if len(sinks) == 1 else "encode"
    label = f"encode {sinks[0].name}" if len(sinks) == 1 else \
        f"encode {len(sinks)} encoders in one pass ({', '.join(s.name for s in sinks)})"
    display.start(key, label, sinks[0].n_total, "records")
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
        ids = batch["ecg_id"]
        if len(ids) and (ids[0] <= last_id or np.any(np.diff(ids) <= 0)):
            raise ExtractionError("Ray Data returned records out of manifest order; preserve_order was not honored")
        if len(ids):
            last_id = int(ids[-1])
        for sink in sinks:
            sink.take(batch)
        display.update(key, done=sinks[0].seen)
        now = time.perf_counter()
        if progress and now - last_report > 30:
            for sink in sinks:
                say(f"[encode] {sink.name}: {sink.seen}/{sink.n_total} records, {sink.seen / (now - t0):.1f} rec/s")
            last_report = now
    out = [sink.close() for sink in sinks]
    bad = {sink.name: len(q) for sink, q in zip(sinks, out, strict=True) if len(q)}
    display.finish(key, ", ".join(f"{name}: {n} quarantined" if len(sinks) > 1 else f"{n} quarantined"
                                  for name, n in bad.items()) or None)
    return out


def check_counts(name: str, first_writer, capacity: dict[str, int], quarantine: pd.DataFrame) -> None:
    n_bad = quarantine["split"].astype(str).value_counts().to_dict()
    for s, n in capacity.items():
        if first_writer.count[s] + n_bad.get(s, 0) != n:
            raise ExtractionError(f"{name}: split {s!r} got {first_writer.count[s]} rows + {n_bad.get(s, 0)} "
                                  f"quarantined of {n} manifest records; the stream ended early")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
