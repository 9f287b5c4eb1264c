"""What a reader must know before any number, in plain sentences: which weights the encoders ran with, which cohort
they saw, and what the run found, said only as far as the contrasts support it (docs/protocol.md §8).

Why: a demo run (random-weight encoders on a synthetic cohort) renders the same report as the published protocol,
and a "best model" whose contrast with the runner-up is noise reads like a result. The report's summary, the
terminal's last lines (`raybench grid`, `analyze`, `report`), the feature dashboards and every exported model card
take their words from here, so they cannot disagree. Pure functions of run.yaml, the activation stores' index.json
and the tables; nothing is computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.core.models import model_label
from raybench.core.paths import RunLayout
from raybench.core.run_state import read_run_yaml, run_section

SEPARATED = 0.05
"""A leader is separated from another model when their contrast's BH-adjusted p is below this (the report's
significance column uses the same cut)."""
COHORT_NAMES = {"ptbxl": "PTB-XL", "mimic": "MIMIC-IV-ECG", "wfdb": "WFDB folder"}
METRIC_LABELS = {"reconstruction": "Reconstruction", "accessibility": "Accessibility", "coverage": "Coverage"}


@dataclass(frozen=True)
class Leaders:
    """Per metric: the models no contrast separates from the best (best first) and the p of each against it, plus
    the first model that is separated (None when every model ties with the best)."""

    metric: str
    models: tuple[str, ...]
    p_values: tuple[float, ...]  # against models[0], for models[1:]
    separated: str | None
    p_separated: float | None
    tested: bool  # False: no contrasts table, nothing is known about separation


def grid_models(run: dict[str, Any] | None) -> list[str]:
    grid = (run_section(run, "protocol") or {}).get("grid") or {}
    return [str(m) for m in grid.get("models") or []]


def store_record(layout: RunLayout, model: str) -> dict[str, Any]:
    """The index.json of any activation store of `model` (it records the checkpoint the encoder loaded)."""
    for path in sorted((layout.activations_dir / model).glob("layer_*/index.json")):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return {}


def weights(layout: RunLayout, run: dict[str, Any] | None) -> dict[str, str]:
    """model -> its weights in words: 'random weights (demo encoders)', 'random weights (no checkpoint)' or
    '<file> (sha256 <hex>)'."""
    enc = run_section(run, "encoders") or {}
    checkpoints = enc.get("checkpoints") or {}
    out: dict[str, str] = {}
    for model in grid_models(run):
        rec = store_record(layout, model)
        if (rec.get("size") or enc.get("size")) == "demo":
            out[model] = "random weights (demo encoders)"
            continue
        path = rec.get("checkpoint") or checkpoints.get(model)
        if not path:
            out[model] = "random weights (no checkpoint)"
            continue
        sha = rec.get("checkpoint_sha256")
        out[model] = f"{Path(str(path)).name} (sha256 {sha})" if sha else f"{path} (sha256 not recorded)"
    return out


def weights_text(layout: RunLayout, run: dict[str, Any] | None, short: bool = False) -> str:
    """One sentence naming the encoders' weights; `short` cuts each sha256 to 12 hex digits (terminal lines)."""
    per = weights(layout, run)
    if not per:
        return "Encoder weights: not recorded (no run.yaml model list)."
    kinds = set(per.values())
    if kinds == {"random weights (demo encoders)"}:
        return ("Encoder weights: random weights (demo encoders) for all "
                f"{len(per)} models: no result here describes the published foundation models.")
    if len(kinds) == 1 and next(iter(kinds)).startswith("random"):
        return f"Encoder weights: random weights (no checkpoint) for all {len(per)} models."

    def shown(text: str) -> str:
        if short and "(sha256 " in text and "not recorded" not in text:
            name, sha = text.split(" (sha256 ")
            return f"{name} (sha256 {sha[:12]}…)"
        return text

    return "Encoder weights: " + "; ".join(f"{model_label(m)}: {shown(w)}" for m, w in per.items()) + "."


def cohort_text(layout: RunLayout, run: dict[str, Any] | None) -> str:
    """One sentence naming the cohort: synthetic (and its size), or its name and size."""
    cohort = run_section(run, "cohort") or {}
    kind = str(cohort.get("kind", "unknown"))
    n = _records(layout)
    size = f"{n:,} records" if n is not None else "no manifest summary"
    if kind == "synth":
        made = f"{cohort.get('records', '?')} records of {cohort.get('patients', '?')} patients"
        kept = "" if n is None or str(n) == str(cohort.get("records")) else f"; {size} in the manifest"
        return (f"Cohort: synthetic (raybench's generator, {made}{kept}): not real ECGs, nothing here is a "
                "clinical finding.")
    root = cohort.get("root")
    return f"Cohort: {COHORT_NAMES.get(kind, kind)}" + (f" ({Path(str(root)).name})" if root else "") + f", {size}."


def _records(layout: RunLayout) -> int | None:
    try:
        return int(json.loads(layout.manifest_summary.read_text())["records"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def leaders(profiles: pd.DataFrame, contrasts: pd.DataFrame | None, metric: str) -> Leaders:
    """The models of `metric` that no contrast separates from the best (by AUC; ties by name)."""
    prof = profiles[profiles.metric == metric].sort_values(["auc", "model"], ascending=[False, True])
    order = [str(m) for m in prof.model]
    best = order[0]
    if contrasts is None or contrasts.empty or "p_bh" not in contrasts:
        return Leaders(metric, (best,), (), None, None, tested=False)
    con = contrasts[contrasts.metric == metric]
    group, ps = [best], []
    for other in order[1:]:
        p = _p(con, best, other)
        if p is None or p >= SEPARATED:
            group.append(other)
            ps.append(float("nan") if p is None else p)
        else:
            return Leaders(metric, tuple(group), tuple(ps), other, p, tested=True)
    return Leaders(metric, tuple(group), tuple(ps), None, None, tested=True)


def _p(con: pd.DataFrame, a: str, b: str) -> float | None:
    row = con[((con.model_a == a) & (con.model_b == b)) | ((con.model_a == b) & (con.model_b == a))]
    return None if row.empty else float(row.p_bh.iloc[0])


def leader_sentence(lead: Leaders) -> str:
    """'Reconstruction: CARDIAC-FM and ECG-FM lead; not distinguishable (BH p = 0.48)' and the like."""
    label = METRIC_LABELS.get(lead.metric, lead.metric)
    names = [model_label(m) for m in lead.models]
    if not lead.tested:
        return f"{label}: highest AUC {names[0]}; no contrasts table, so whether it leads is untested."
    if len(names) == 1:
        return (f"{label}: {names[0]} leads, separated from the runner-up {model_label(lead.separated or '')} "
                f"(BH p = {_fmt(lead.p_separated)}).")
    ps = ", ".join(_fmt(p) for p in lead.p_values)
    joined = ", ".join(names[:-1]) + f" and {names[-1]}"
    if lead.separated is None:
        return (f"{label}: no leader: all {len(names)} models are within the contrasts' noise of "
                f"{names[0]} (BH p = {ps}).")
    return f"{label}: {joined} lead; not distinguishable (BH p = {ps} against {names[0]})."


def _fmt(p: float | None) -> str:
    if p is None or p != p:
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.2f}" if p >= 0.01 else f"{p:.3f}"


def gate_flag(tables: dict[str, pd.DataFrame]) -> str | None:
    """A warning when no configuration of the primary arm passes the fidelity gate (published aggregation)."""
    gm = tables.get("fidelity_gate_models")
    if gm is None or gm.empty or "n_configs_pass" not in gm:
        return None
    p = gm[gm.arm == "primary"] if (gm.arm == "primary").any() else gm
    if int(p.n_configs_pass.sum()) > 0:
        return None
    return (f"No configuration passes the fidelity gate (0 of {int(p.n_configs.sum())}, R² ≥ .90 and dead fraction "
            "< .20 on seed means): every SAE here reconstructs below the protocol's bar.")


def findings(tables: dict[str, pd.DataFrame]) -> list[str]:
    """What the run found, one sentence per metric, then the gate warning (if any)."""
    prof = tables.get("profiles")
    out: list[str] = []
    if prof is not None and not prof.empty:
        out += [leader_sentence(leaders(prof, tables.get("contrasts"), m))
                for m in [m for m in METRIC_LABELS if (prof.metric == m).any()]]
    flag = gate_flag(tables)
    return out + ([flag] if flag else [])


def dashboard_about(root: str | Path, model: str) -> str:
    """One line under a feature dashboard's title: the model's weights and the cohort."""
    layout = RunLayout.at(root)
    run = read_run_yaml(layout.root)
    kind = str((run_section(run, "cohort") or {}).get("kind", "unknown"))
    n = _records(layout)
    cohort = ("synthetic" if kind == "synth" else COHORT_NAMES.get(kind, kind)) + (f", {n:,} records" if n else "")
    return f"weights: {weights(layout, run).get(model, 'not recorded')} · cohort: {cohort}"


def headline(root: str | Path) -> list[str]:
    """The terminal's last lines: weights, cohort, findings (read from the run folder)."""
    layout = RunLayout.at(root)
    run = read_run_yaml(layout.root)
    paths = {name: layout.tables_dir / f"{name}.parquet" for name in ("profiles", "contrasts", "fidelity_gate_models")}
    tables = {name: pd.read_parquet(path) for name, path in paths.items() if path.exists()}
    return [weights_text(layout, run, short=True), cohort_text(layout, run), *findings(tables)]
