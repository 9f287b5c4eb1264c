"""`raybench features --run-dir R --model M --concept C`: draw one feature dashboard to a PNG or SVG file.

For a credentialed cohort (MIMIC-IV-ECG) the dashboard shows record-level waveforms, so `--out` is required
and must lie outside the run folder: the picture stays in the user's environment and never reaches the
report or `raybench export`.
"""

from __future__ import annotations

from pathlib import Path

import click

from raybench.core.errors import RaybenchError
from raybench.infra.run_lock import locks_run, run_holding


class FeaturesOutError(RaybenchError):
    """Where a dashboard may not be written."""


def out_folder(run_dir: Path, out: str | None, credentialed: bool) -> Path:
    """The folder the dashboard goes to: --out, else <run>/features/ (open cohorts only)."""
    if out is None:
        if credentialed:
            raise FeaturesOutError(
                f"{run_dir} holds a credentialed cohort: its dashboards show record-level waveforms and are drawn "
                "only into a local folder you name with --out (outside the run folder), never into the run")
        return run_dir / "features"
    folder = Path(out).expanduser().resolve()
    root = run_dir.resolve()
    if credentialed and (folder == root or root in folder.parents):
        raise FeaturesOutError(f"--out {folder} is inside the run folder of a credentialed cohort; name a local "
                               "folder outside it, so exports and the report never pick the waveforms up")
    return folder


@click.command()
@click.option("--run-dir", required=True, help="A finished run folder (local).")
@click.option("--model", required=True, help="Model id, e.g. ecg_fm.")
@click.option("--concept", required=True, help="Concept name, e.g. qrs_duration.")
@click.option("--out", default=None,
              help="Output folder (default: <run>/features/; required for credentialed cohorts).")
@click.option("--format", "fmt", type=click.Choice(["png", "svg"]), default="png", show_default=True)
@click.option("--expansion", type=int, default=None, help="E of the cell (default: features.expansion, else 8).")
@click.option("--depth", type=float, default=None, help="Relative depth q of the cell (default: 1.0, final layer).")
@click.option("--seed", type=int, default=None, help="Seed of the cell (default: the lowest).")
@locks_run("features", lambda p: run_holding(p["out"] or Path(p["run_dir"]) / "features", (p["run_dir"],)))
def features(run_dir: str, model: str, concept: str, out: str | None, fmt: str, expansion: int | None,
             depth: float | None, seed: int | None) -> None:
    """Draw the dashboard of one concept's selected latent: top, median and zero-activation test records on ECG
    paper, the activation histogram and the scatter against the concept with r."""
    from raybench.analysis.features.dashboards import Choice, FeaturesError, model_view
    from raybench.analysis.features.figures import (
        dashboard_figure,
        features_config,
        record_loader,
        safe_name,
        save_figure_file,
    )
    from raybench.core.privacy import is_credentialed
    from raybench.core.run_state import read_run_yaml, run_protocol

    root = Path(run_dir)
    raw = read_run_yaml(root)
    protocol = run_protocol(root)
    if raw is None or protocol is None:
        raise FeaturesError(f"{root}/run.yaml not found or without a protocol: give a run folder written by "
                            "`raybench grid`")
    if model not in protocol.grid.models:
        raise FeaturesError(f"unknown model {model!r} for --model: choose one of {', '.join(protocol.grid.models)}")
    from dataclasses import replace

    from raybench.analysis import run_folder

    run_folder.check_run_folder(root, "features", replace(run_folder.FEATURES, models=(model,)))
    credentialed = is_credentialed(raw)
    folder = out_folder(root, out, credentialed)
    choice = Choice.resolve(features_config(raw), protocol, expansion=expansion, depth=depth, seed=seed)
    view = model_view(root, protocol, model, choice)
    from raybench.analysis.features.dashboards import weak_r_note
    from raybench.analysis.summary.headline import dashboard_about

    about = dashboard_about(root, model)
    threshold = protocol.eval.coverage_threshold
    fig = dashboard_figure(view, concept, record_loader(root), about, threshold)
    path = save_figure_file(fig, folder / f"{safe_name(model)}-{safe_name(concept)}.{fmt}", fmt)
    _, cv = view.concept(concept)
    click.echo(f"{path}: {model} {concept}, latent {cv.latent} of {view.cell['cell_id']} (r = {cv.r:+.3f}, "
               f"{len(cv.picks)} records)")
    click.echo(about)
    weak = weak_r_note(cv.r, threshold)
    if weak:
        click.echo(weak)
    if credentialed:
        click.echo("record-level waveforms of a credentialed cohort: keep this file inside your environment")
