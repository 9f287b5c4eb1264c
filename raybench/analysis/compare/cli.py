"""`raybench compare RUN_A RUN_B [--out DIR]`: two finished runs of one protocol side by side (docs/protocol.md
§8.9): tables (Parquet + CSV), a figure (PNG + SVG) and report.html under --out, by default
<RUN_A>/compare/<name of RUN_B>/.

The protocols are checked first, from run.yaml alone, so runs that cannot be compared are refused (exit 2, the
differing fields named) before any statistics are read.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from raybench.core.symlinks import refuse_symlinks
from raybench.infra.run_lock import locks_run, run_holding


def default_out(run_a: Path, run_b: Path) -> Path:
    """<RUN_A>/compare/<name of RUN_B>/."""
    return run_a / "compare" / run_b.resolve().name


def _out_folder(params: dict) -> Path:
    out = params.get("out")
    return Path(out) if out is not None else default_out(Path(params["run_a"]), Path(params["run_b"]))


def _written_run(params: dict) -> str | None:
    """The run folder the comparison writes into (RUN_A by default; whichever run holds --out), for its lock."""
    return run_holding(_out_folder(params), (params["run_a"], params["run_b"]))


def _plain_out(params: dict) -> None:
    """No symlink on the way from the run that holds the output folder to it, nor inside it (a planted
    `compare/` link would send the tables and report into someone else's folder): guard of locks_run."""
    run = _written_run(params)
    if run is not None:
        root = os.path.abspath(run)
        refuse_symlinks(root, [os.path.relpath(os.path.abspath(_out_folder(params)), root)])


SOURCES = "sources.json"
"""<out>/sources.json: where the two runs lie on this machine, so `raybench export` can scan a comparison with a
credentialed run for that run's record ids. Never exported (not on the export's allow-list)."""


def run_names(run_a: Path, run_b: Path) -> tuple[str, str]:
    """The runs' folder names, marked (A) and (B) when they are the same: never their paths, which name users and
    machines in exported tables."""
    a, b = run_a.resolve().name, run_b.resolve().name
    return (a, b) if a != b else (f"{a} (A)", f"{b} (B)")


def check_runs(root_a: Path, root_b: Path) -> None:
    """Each argument is a run folder (it has the run.yaml compare reads its protocol from); the same folder twice
    is allowed, with a warning: every comparison then agrees by construction."""
    from raybench.analysis.completeness import AnalysisError
    from raybench.core.paths import RunLayout

    for root in (root_a, root_b):
        if not RunLayout.at(root).run_yaml.exists():
            raise AnalysisError(f"{root} has no run.yaml: not a run folder written by `raybench grid`; give two "
                                "finished run folders")
    if root_a.resolve() == root_b.resolve():
        click.echo(f"WARNING: {root_a} and {root_b} are the same run: every leader is preserved and every difference "
                   "is zero by construction", err=True)


@click.command()
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@click.option("--out", default=None, help="Output folder (default: <RUN_A>/compare/<name of RUN_B>/).")
@click.option("--draws", type=int, default=None,
              help="Patient-bootstrap draws per run (default: the smaller of the runs' inference.patient_draws).")
@click.option("--seed", type=int, default=None, help="Seed of the comparison's draws (default 20260801).")
@click.option("--num-workers", type=int, default=None, help="Parallel bootstrap tasks (default: what Ray has).")
@locks_run("compare", _written_run, _plain_out)
def compare(run_a: str, run_b: str, out: str | None, draws: int | None, seed: int | None,
            num_workers: int | None) -> None:
    """Compare two finished runs of one protocol (e.g. PTB-XL and MIMIC-IV-ECG): per metric whether each run's
    leader is preserved in the other, Kendall tau and Spearman rho of the model profiles and each model's AUC
    difference, with intervals from independent patient bootstraps of the two runs."""
    from raybench.analysis.cli import resolve_config
    from raybench.analysis.compare.figures import draw
    from raybench.analysis.compare.run import (
        CompareConfig,
        check_comparable,
        check_metrics,
        compute,
        load_profiles,
        protocol_differences,
        read_profiles_table,
        run_seed,
        write_tables,
    )
    from raybench.analysis.compare.section import write_report
    from raybench.analysis.stage import local_run_dir
    from raybench.infra import ray_session

    root_a, root_b = local_run_dir(run_a), local_run_dir(run_b)
    check_runs(root_a, root_b)
    name_a, name_b = run_names(root_a, root_b)
    cfg_a, cfg_b = resolve_config(run_a, None), resolve_config(run_b, None)
    check_comparable(protocol_differences(cfg_a.protocol, cfg_b.protocol), name_a, name_b)
    check_metrics(name_a, read_profiles_table(root_a), name_b, read_profiles_table(root_b))
    inf = cfg_a.protocol.inference  # run A's interval bounds (the protocol's 2.5 / 97.5 unless it sets others)
    config = CompareConfig(draws=draws, ci_low=inf.ci_low, ci_high=inf.ci_high,
                           **({} if seed is None else {"seed": seed})).validate()
    n = config.draws or min(cfg_a.protocol.inference.patient_draws, cfg_b.protocol.inference.patient_draws)

    ray_session.init_ray(cfg_a.resources)
    a = load_profiles(root_a, name_a, cfg_a.protocol, cfg_a.cohort.kind, n, run_seed(config.seed, 0), num_workers)
    b = load_profiles(root_b, name_b, cfg_b.protocol, cfg_b.cohort.kind, n, run_seed(config.seed, 1), num_workers)
    tables = compute(a, b, config)
    folder = Path(out) if out is not None else default_out(root_a, root_b)
    write_tables(tables, folder)
    from raybench.core.atomic import write_json

    write_json(folder / SOURCES, {"a": str(root_a.resolve()), "b": str(root_b.resolve())})
    figures = draw(tables, folder / "figures")
    report = write_report(tables, folder, figures)
    for r in tables["leaders"].itertuples():
        state = "preserved" if bool(r.leader_preserved) else "not preserved"
        click.echo(f"{r.metric}: leader {r.leader_a} in {name_a}, {r.leader_b} in {name_b}: {state} "
                   f"(in {r.preserved_prob:.0%} of draw pairs)")
    click.echo(f"tables: {len(tables)} in {folder / 'tables'}; figures: {len(figures)}; report: {report}")
