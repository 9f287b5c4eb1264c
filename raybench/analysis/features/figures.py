"""Feature dashboards as pictures: the report's folder of lazy-loaded images, and one dashboard as one figure.

`write_dashboards(root)` (the analyze stage, after the figures) fills `figures/dashboards/`:

    index.json              what the report's browsable section shows: cells, latents, r, picks, unexplained;
                            and a stamp (content hash of its inputs) per image, to skip unchanged ones
    records/<ecg_id>.png    each drawn test record once, on the ECG paper grid (shared by every dashboard)
    <model>/<concept>.png   activation histogram and activation-vs-concept scatter with r

Record images are record-level: for credentialed cohorts (raybench.core.privacy; MIMIC-IV-ECG) nothing is written
into the run folder, whatever `features.enabled` says; `raybench features --out DIR` draws single dashboards
into a local folder outside the run folder instead (cli.py), and `raybench export` never copies this folder for
such a run. `dashboard_figure` draws one complete dashboard (the command's PNG/SVG).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from raybench.analysis.features.dashboards import Choice, ConceptView, ModelView, model_view, weak_r_note
from raybench.analysis.features.ecg_paper import PaperCanvas, draw_ecg, paper_size_mm, quantized_png
from raybench.analysis.inference.shared_jobs import run_jobs
from raybench.analysis.report.plotting import METADATA, RC, model_label
from raybench.core.atomic import atomic_dir
from raybench.core.config import FeaturesConfig, Protocol
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

INDEX = "index.json"
FORMAT_VERSION = 1
DRAW_VERSION = 2  # bump when the drawing changes: images stamped with an older one are redrawn
KIND_COLORS = {"top": "#c0392b", "median": "#e67e22", "zero": "#2471a3"}
KIND_LABELS = {"top": "top-activating", "median": "near the median activation", "zero": "near zero activation"}
Loader = Callable[[int], tuple[np.ndarray, float]]  # ecg_id -> (signal [12, T] mV, fs)


def safe_name(name: str) -> str:
    """A file-name-safe form of a concept or model name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def record_loader(root: str | Path) -> Loader:
    """ecg_id -> its waveform, read from the cohort the run's manifest names (as encoding read it)."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.waveforms import read_record

    manifest, info = load_manifest(RunLayout.at(root).manifest, verify=False)
    rows = manifest.set_index("ecg_id")

    def load(ecg_id: int) -> tuple[np.ndarray, float]:
        row = rows.loc[int(ecg_id)]
        wave = read_record(info.root, str(row["path"]), expect_fs=float(row["fs"]),
                           expect_samples=int(row["n_samples"]))
        return wave.signal, wave.fs

    return load


def features_config(raw: dict[str, Any] | None) -> FeaturesConfig:
    """The run's `features:` section (run.yaml), defaults when absent."""
    from raybench.core.config import from_dict
    from raybench.core.run_state import run_section

    section = run_section(raw, "features")
    cfg = from_dict(FeaturesConfig, section, "features") if section else FeaturesConfig()
    cfg.validate()
    return cfg


# ---------------------------------------------------------------- panels

def _padded(lo: float, hi: float, axis) -> tuple[float, float]:
    """Matplotlib's autoscaled view of data [lo, hi]: non-singular, with the default 5% margins."""
    lo, hi = axis.get_major_locator().nonsingular(lo, hi)
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


class StatsPanel:
    """Histogram of the latent's non-zero activations, and activation against the concept's value with r.

    The artists are made once and refilled per concept (`show`): building axes, bars and scatters anew for each
    of the ~300 dashboards of a run cost three times their drawing. Limits follow matplotlib's autoscaling."""

    def __init__(self, ax_h, ax_s):
        self.ax_h, self.ax_s = ax_h, ax_s
        self.bars = ax_h.stairs(np.zeros(1), np.array([0.0, 1.0]), fill=True, color="#566573")
        self.cloud = ax_s.scatter(np.zeros(0), np.zeros(0), s=6, color="#85929e", alpha=0.6, linewidths=0)
        self.marks = {kind: ax_s.scatter(np.zeros(0), np.zeros(0), s=22, color=color, label=KIND_LABELS[kind],
                                         zorder=3) for kind, color in KIND_COLORS.items()}
        self.legends: dict[tuple[str, ...], Any] = {}
        ax_h.set_ylabel("test records")
        ax_s.set_ylabel("activation")
        for ax in (ax_h, ax_s):  # an explicit y skips re-placing the title around the ticks at every draw
            ax.set_title("", y=1.0)

    def show(self, view: ModelView, c: int, concept: ConceptView) -> None:
        ax_h, ax_s = self.ax_h, self.ax_s
        a = view.activations[:, c]
        y = view.values[:, c]
        firing = a[a > 0]
        counts, edges = np.histogram(firing if firing.size else np.zeros(1), bins=30)
        self.bars.set_data(counts, edges)
        ax_h.set_xlim(*_padded(float(edges[0]), float(edges[-1]), ax_h.xaxis))
        ax_h.set_ylim(0.0, 1.05 * float(counts.max()))
        ax_h.set_xlabel(f"activation of latent {concept.latent}")
        ax_h.title.set_text(f"fires on {concept.firing_rate:.1%} of {a.size} test records "
                       f"({a.size - firing.size} at zero, not shown)")
        ok = np.isfinite(y)
        xs, ys = [y[ok]], [a[ok]]
        self.cloud.set_offsets(np.column_stack([y[ok], a[ok]]))
        kinds = []
        for kind, marks in self.marks.items():
            picks = [(p.value, p.activation) for p in concept.picks if p.kind == kind and np.isfinite(p.value)]
            marks.set_offsets(np.array(picks, dtype=np.float64).reshape(-1, 2))
            if picks:
                kinds.append(kind)
                xs.append(np.array([p[0] for p in picks]))
                ys.append(np.array([p[1] for p in picks]))
        x_all, y_all = np.concatenate(xs), np.concatenate(ys)
        if x_all.size:
            ax_s.set_xlim(*_padded(float(x_all.min()), float(x_all.max()), ax_s.xaxis))
            ax_s.set_ylim(*_padded(float(y_all.min()), float(y_all.max()), ax_s.yaxis))
        ax_s.set_xlabel(f"{concept.concept} (raw value)")
        ax_s.title.set_text(f"r = {concept.r:+.3f} (test, standardized concept)")
        key = tuple(kinds)
        if key and key not in self.legends:  # loc="best" is placed anew at every draw
            self.legends[key] = ax_s.legend(handles=[self.marks[k] for k in key], fontsize=7, loc="best",
                                            frameon=False)
        ax_s.legend_ = self.legends.get(key)


def _stats_title(view: ModelView, cv: ConceptView) -> str:
    return f"{model_label(view.model)} · {cv.concept} · latent {cv.latent} of {view.cell['cell_id']}"


class PanelCanvas:
    """The report's per-concept panel (histogram and scatter side by side) rendered to PNG from one reused
    figure, stored with a 64-colour palette. PNG bytes are deterministic and depend on the concept only."""

    def __init__(self, dpi: int = 72):
        self.fig = Figure(figsize=(9.0, 2.8), dpi=dpi)  # fixed margins: a layout engine triples the drawing time
        axes = self.fig.subplots(1, 2, gridspec_kw={"left": 0.07, "right": 0.98, "bottom": 0.17, "top": 0.8,
                                                    "wspace": 0.22})
        self.panel = StatsPanel(*axes)
        self.title = self.fig.suptitle("", fontsize=10)
        self.canvas = FigureCanvasAgg(self.fig)

    def png(self, view: ModelView, concept: str) -> bytes:
        c, cv = view.concept(concept)
        self.panel.show(view, c, cv)
        self.title.set_text(_stats_title(view, cv))
        self.canvas.draw()
        return quantized_png(np.asarray(self.canvas.buffer_rgba()), colors=64)


def dashboard_figure(view: ModelView, concept: str, load: Loader, about: str = "",
                     threshold: float | None = None) -> Figure:
    """One whole dashboard: the stats panel, then every picked record on ECG paper, labelled with its activation.
    `about` (the encoders' weights and the cohort, raybench.analysis.summary.headline) and a weak-r caveat go under
    the title (the caveat when |r| is below `threshold`, eval.coverage_threshold), so the picture says what it shows
    even alone."""
    c, cv = view.concept(concept)
    width_mm, height_mm = paper_size_mm()
    width = width_mm / 25.4
    ecg_h = height_mm / 25.4
    weak = weak_r_note(cv.r, threshold) if threshold is not None else None
    stats_h, head_h = 3.0, 0.9 + 0.2 * (bool(about) + bool(weak))
    n = len(cv.picks)
    total = head_h + stats_h + n * ecg_h
    fig = Figure(figsize=(width, total))
    gs = fig.add_gridspec(1 + n, 2, height_ratios=[stats_h] + [ecg_h] * n, hspace=0.15, wspace=0.25,
                          left=0.07, right=0.98, top=1 - head_h / total, bottom=0.005)
    StatsPanel(fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1])).show(view, c, cv)
    fig.suptitle(f"{model_label(view.model)} · {cv.concept} · latent {cv.latent} · {view.cell['cell_id']} "
                 f"(layer {view.cell['layer']}, E = {view.cell['expansion']}, k = {view.cell['k']}, "
                 f"seed {view.cell['seed']})" + "".join(f"\n{t}" for t in (about, weak) if t), fontsize=10,
                 y=1 - 0.15 / total, va="top")
    for i, pick in enumerate(cv.picks):
        signal, fs = load(pick.ecg_id)
        ax = fig.add_subplot(gs[1 + i, :])
        draw_ecg(ax, signal, fs, f"{KIND_LABELS[pick.kind]}: record {pick.ecg_id} · activation "
                                 f"{pick.activation:.3f} · {cv.concept} = {pick.value:.4g}")
    return fig


def save_figure_file(fig: Figure, path: Path, fmt: str, dpi: int = 100) -> Path:
    """Save with raybench's deterministic metadata (PNG or SVG)."""
    from raybench.core.atomic import atomic_path

    FigureCanvasAgg(fig)
    with matplotlib.rc_context(RC), atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi, metadata=METADATA[fmt])
    return path


# ---------------------------------------------------------------- the report's folder

def dashboards_enabled(raw: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the analyze stage renders dashboards into the run folder, and why not."""
    from raybench.core.privacy import is_credentialed

    cfg = features_config(raw)
    if is_credentialed(raw or {}):
        if cfg.enabled:
            log.warning("features.enabled is ignored for a credentialed cohort: record-level waveforms stay out of "
                        "the run folder; draw single dashboards locally with `raybench features --out DIR`")
        return False, "credentialed cohort: record-level waveforms are not drawn into the run folder"
    if cfg.enabled is False:
        return False, "features.enabled is false in the run config"
    return True, ""


def write_dashboards(root: str | Path, protocol: Protocol | None = None, parallel: bool | None = None) -> list[Path]:
    """Fill figures/dashboards/ for every model of the grid (replacing it whole); [] when disabled (the folder
    is then removed, so no stale record images stay behind).

    Drawing runs in chunks, shared between Ray tasks and this process when Ray is up (the analyze stage;
    `parallel` None) or `parallel` is True; serially here otherwise (`raybench report`).
    An image whose inputs hash to the stamp index.json recorded for it last time is copied from the old folder
    instead of drawn again."""
    from raybench.core.run_state import read_run_yaml, run_protocol

    layout = RunLayout.at(root)
    out_dir = layout.dashboards_dir
    raw = read_run_yaml(layout.root)
    enabled, why = dashboards_enabled(raw)
    protocol = protocol or run_protocol(layout.root)
    if enabled:
        why = ("no run.yaml protocol" if protocol is None else "no tables/cells.parquet"
               if not layout.cells_table.exists() else "no manifest" if not layout.manifest.exists() else "")
    if why:
        if out_dir.exists():
            shutil.rmtree(out_dir)
        log.info("feature dashboards skipped: %s", why)
        return []
    import pandas as pd

    choice = Choice.resolve(features_config(raw), protocol)
    cells = pd.read_parquet(layout.cells_table)
    models = [m for m in protocol.grid.models if (cells["model"] == m).any()]
    load = record_loader(layout.root)
    index: dict[str, Any] = {"format_version": FORMAT_VERSION, "choice": vars(choice), "models": [], "skipped": {},
                             "records": {}, "stamps": {}}
    with atomic_dir(out_dir) as tmp:
        (tmp / "records").mkdir()
        drawer = _Drawer(tmp, out_dir, _old_stamps(out_dir), index["stamps"], parallel)
        for model in models:
            try:
                view = model_view(layout.root, protocol, model, choice, cells)
                index["models"].append(_model_entry(tmp, view, load, index["records"], drawer))
            except (RaybenchError, OSError) as err:  # e.g. no cell at the chosen E, a cohort folder moved away
                log.warning("feature dashboards of %s skipped: %s", model, err)
                index["skipped"][model] = f"{type(err).__name__}: {err}"
        drawer.finish()
        (tmp / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return sorted(out_dir.rglob("*.png"))


PANEL_CHUNK, RECORD_CHUNK = 10, 12  # images per drawing task: small enough to balance two to a few cores
DRAW_RC = {**RC, "text.hinting": "auto"}  # FreeType's light autohinter: a fifth less time per image, as legible


def panel_pngs(view: ModelView, concepts: list[str]) -> list[bytes]:
    """The panels of `concepts` of one model (a drawing task)."""
    with matplotlib.rc_context(DRAW_RC):
        canvas = PanelCanvas()
        return [canvas.png(view, c) for c in concepts]


def record_pngs(records: list[tuple[int, np.ndarray, float]]) -> list[bytes]:
    """(ecg_id, signal, fs) records on ECG paper, captioned with their id (a drawing task)."""
    with matplotlib.rc_context(DRAW_RC):
        canvas = PaperCanvas()
        return [canvas.png(signal, fs, f"record {int(ecg_id)}") for ecg_id, signal, fs in records]


def _stamp(*parts: Any) -> str:
    """A content hash of what an image is drawn from (arrays by their bytes), with the drawing code's version."""
    h = hashlib.sha256(f"{FORMAT_VERSION}/{DRAW_VERSION}".encode())
    for part in parts:
        h.update(np.ascontiguousarray(part).tobytes() if isinstance(part, np.ndarray) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _old_stamps(out_dir: Path) -> dict[str, str]:
    try:
        old = json.loads((out_dir / INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return old.get("stamps", {}) if old.get("format_version") == FORMAT_VERSION else {}


class _Drawer:
    """Writes images into the new folder: copied from the old one when the stamp matches, else drawn in chunks
    (with Ray, shared between tasks and this process: raybench.analysis.inference.shared_jobs)."""

    def __init__(self, tmp: Path, old_dir: Path, old: dict[str, str], stamps: dict[str, str],
                 parallel: bool | None):
        import ray

        self.tmp, self.old_dir, self.old, self.stamps = tmp, old_dir, old, stamps
        self.remote = ray.is_initialized() if parallel is None else parallel
        self.chunks: list[tuple[list[str], Callable, tuple]] = []
        self.queues: dict[Any, list[tuple[str, Any]]] = {panel_pngs: [], record_pngs: []}
        self.view: ModelView | None = None

    def add(self, rel: str, stamp: str, fn: Callable, item: Any, view: ModelView | None = None) -> None:
        self.stamps[rel] = stamp
        old = self.old_dir / rel
        if self.old.get(rel) == stamp and old.is_file():
            shutil.copyfile(old, self.tmp / rel)
            return
        if view is not None and view is not self.view:
            self.flush(panel_pngs)  # a panel chunk holds one model's concepts
            self.view = view
        self.queues[fn].append((rel, item))
        if len(self.queues[fn]) >= (PANEL_CHUNK if fn is panel_pngs else RECORD_CHUNK):
            self.flush(fn)

    def flush(self, fn: Callable) -> None:
        queue, self.queues[fn] = self.queues[fn], []
        if queue:
            items = [item for _, item in queue]
            self.chunks.append(([rel for rel, _ in queue], fn, (self.view, items) if fn is panel_pngs else (items,)))

    def _write(self, rels: list[str], pngs: list[bytes]) -> None:
        for rel, png in zip(rels, pngs, strict=True):
            (self.tmp / rel).write_bytes(png)

    def finish(self) -> None:
        """Draw every queued image and write it (called once, after the last model)."""
        for fn in list(self.queues):
            self.flush(fn)
        chunks, self.chunks = self.chunks, []
        for i, pngs in run_jobs([(fn, args) for _, fn, args in chunks], self.remote):
            self._write(chunks[i][0], pngs)


def _model_entry(tmp: Path, view: ModelView, load: Loader, records: dict[str, str], drawer: _Drawer
                 ) -> dict[str, Any]:
    """One model's index entry; its panels and not yet drawn records go to the drawer."""
    def record(ecg_id: int) -> str:
        rel = f"records/{int(ecg_id)}.png"
        if str(ecg_id) not in records:
            signal, fs = load(ecg_id)
            signal = np.asarray(signal, dtype=np.float32)
            drawer.add(rel, _stamp("record", int(ecg_id), signal, float(fs)), record_pngs, (int(ecg_id), signal, fs))
            records[str(ecg_id)] = rel
        return rel

    folder = safe_name(view.model)
    (tmp / folder).mkdir()
    label = model_label(view.model)
    concepts = []
    for c, cv in enumerate(view.concepts):
        rel = f"{folder}/{safe_name(cv.concept)}.png"
        drawer.add(rel, _stamp("panel", label, sorted(view.cell.items()), repr(cv), view.activations[:, c],
                               view.values[:, c]), panel_pngs, cv.concept, view)
        concepts.append({"concept": cv.concept, "latent": cv.latent, "r": cv.r, "firing_rate": cv.firing_rate,
                         "panel": rel, "picks": [{"kind": p.kind, "ecg_id": p.ecg_id, "activation": p.activation,
                                                  "value": p.value if np.isfinite(p.value) else None,
                                                  "image": record(p.ecg_id)} for p in cv.picks]})
    unexplained = [{**row, "image": record(row["ecg_id"])} for row in view.unexplained.to_dict("records")]
    return {"model": view.model, "label": label, "cell": view.cell, "n_test": int(view.ecg_ids.size),
            "concepts": concepts, "unexplained": unexplained}


def read_index(root: str | Path) -> dict[str, Any] | None:
    """figures/dashboards/index.json, or None when the run has no dashboards."""
    path = RunLayout.at(root).dashboards_dir / INDEX
    return json.loads(path.read_text()) if path.exists() else None
