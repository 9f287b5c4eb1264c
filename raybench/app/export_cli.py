"""`raybench export`: the command line of raybench.app.export (run artifacts) and raybench.app.export_formats
(SAEs for other tools)."""

from __future__ import annotations

import click

from raybench.app.export import export_run


@click.command()
@click.option("--run-dir", required=True, help="The local run folder written by `raybench grid`.")
@click.option("--to", "dest", required=True, help="New (or empty) folder to receive the shareable artifacts.")
@click.option("--format", "fmt", type=click.Choice(["run", "saelens", "safetensors"]), default="run",
              show_default=True, help="run: the shareable run artifacts; saelens / safetensors: the SAEs of --cells, "
                                      "one folder each with a model card (raybench/app/export_formats.py).")
@click.option("--cells", default=None, help="With --format saelens|safetensors: comma-separated cell ids or globs, "
                                            "e.g. 'ecg_fm-q100-E08-primary-*'.")
def export(run_dir: str, dest: str, fmt: str, cells: str | None) -> None:
    """Copy what may leave this environment: report, aggregate tables, figures, SAE weights, run.yaml.

    Nothing record-level is copied (manifest/, activation stores and their ids, patient_stats.npz,
    harmonization caches, quarantine lists, cohort/, Tune logs). Credentialed cohorts (MIMIC) are also
    scanned for record and subject ids; a hit aborts the export. `--format saelens|safetensors --cells ...`
    writes the chosen SAEs in a layout SAELens (or any safetensors reader) loads, with a model card each.
    """
    if "://" in run_dir:
        raise click.UsageError(f"--run-dir {run_dir}: export reads a local run folder; copy the run down first "
                               "(inside the credentialed environment) and pass that folder")
    from raybench.analysis import run_folder

    if fmt != "run":
        from raybench.app.export_formats import export_cells

        if not cells:
            raise click.UsageError(f"--format {fmt} needs --cells (cell ids or globs)")
        run_folder.check_run_folder(run_dir, "export", run_folder.EXPORT_CELLS)
        folders = export_cells(run_dir, dest, tuple(c.strip() for c in cells.split(",") if c.strip()), fmt)
        click.echo(f"exported {len(folders)} SAE(s) as {fmt} to {dest}: {', '.join(f.name for f in folders)}")
        return
    if cells:
        raise click.UsageError("--cells applies to --format saelens|safetensors only")
    run_folder.check_run_folder(run_dir, "export", run_folder.EXPORT)
    result = export_run(run_dir, dest)  # an ExportError is a user error: one line, exit 2
    total = sum(f["bytes"] for f in result.files)
    click.echo(f"exported {len(result.files)} files ({total / 1e6:.1f} MB) to {result.dest}; "
               f"{result.left_behind} record-level or unlisted files left in {run_dir}"
               + (f"; scanned for {result.scanned_ids} record/subject ids: none found" if result.scanned_ids else ""))
