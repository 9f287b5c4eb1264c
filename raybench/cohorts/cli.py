"""`raybench cohort ...` (make cohorts) and `raybench manifest ...` (validate records, build the manifest)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

_PATH = click.Path(path_type=Path)
_EXISTING = click.Path(exists=True, file_okay=False, path_type=Path)


@click.group()
def cohort() -> None:
    """Create cohorts (the synthetic PTB-XL-shaped cohort)."""


@cohort.command("synth")
@click.option("--out", "out", type=_PATH, required=True,
              help="Folder to write (replaced atomically): a new or empty folder, or a previous synthetic cohort.")
@click.option("--records", type=click.IntRange(1, 99_999), default=1500, show_default=True)
@click.option("--patients", type=click.IntRange(1), default=500, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--bad-fraction", type=click.FloatRange(0.0, 0.5, max_open=True), default=0.0, show_default=True,
              help="Fraction of deliberately defective records (truncated, NaN/flat/missing lead, wrong rate).")
@click.option("--layout", type=click.Choice(["ptbxl", "challenge"]), default="ptbxl", show_default=True,
              help="ptbxl: PTB-XL's folders and tables; challenge: the PhysioNet Challenge's .mat + .hea with #Dx "
                   "(a `cohort.kind: wfdb` folder; patients in #Patient).")
def synth_cohort(out: Path, records: int, patients: int, seed: int, bad_fraction: float, layout: str) -> None:
    """Write a synthetic cohort with known concept values (ground_truth.csv), PTB-XL-shaped or Challenge-shaped."""
    from raybench.cohorts.stage import write_synth_cohort

    if patients > records:
        raise click.BadParameter(f"--patients ({patients}) must not exceed --records ({records})")
    start = time.perf_counter()
    path = write_synth_cohort(out, records, patients, seed, bad_fraction, layout)
    took = time.perf_counter() - start
    click.echo(f"wrote {records} records ({patients} patients) to {path} in {took:.1f} s "
               f"({records / took:.0f} records/s)")


@click.group()
def manifest() -> None:
    """Build a validated, patient-split manifest (manifest.parquet, summary.json, quarantine.csv)."""


def _report(path: Path) -> None:
    summary_path = path.parent / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    splits = ", ".join(f"{k} {v.get('records')} ({v.get('patients')} patients)"
                       for k, v in summary.get("splits", {}).items())
    click.echo(f"manifest {path}: {summary.get('records')} records [{splits}], {summary.get('quarantined')} "
               f"quarantined {summary.get('quarantine_reasons') or ''}; concepts: {len(summary.get('concepts', []))} "
               f"({summary.get('concept_source')}); hash {summary.get('manifest_hash')}")
    for note in summary.get("notes", []):
        click.echo(f"note: {note}", err=note.startswith("WARNING"))


@manifest.command("ptbxl")
@click.argument("root", type=_EXISTING)
@click.option("--out", "out", type=_PATH, required=True, help="Output folder.")
@click.option("--rate", type=click.Choice(["500", "100"]), default="500", show_default=True,
              help="records500 (12 x 5000) or records100 (12 x 1000).")
@click.option("--concepts", type=click.Choice(["auto", "tables", "waveform", "waveform49", "none"]), default="auto",
              show_default=True, help="auto: PTB-XL+ tables if present under ROOT/features, else waveform-derived.")
@click.option("--features", type=_EXISTING, default=None, help="PTB-XL+ features folder (default ROOT/features).")
def manifest_ptbxl(root: Path, out: Path, rate: str, concepts: str, features: Path | None) -> None:
    """Manifest for a PTB-XL folder (ptbxl_database.csv, records500/, records100/)."""
    from raybench.cohorts.ptbxl import build_ptbxl_manifest

    _report(build_ptbxl_manifest(root, out, sampling_rate=int(rate), concepts=concepts, features_dir=features))


@manifest.command("synth")
@click.argument("root", type=_EXISTING)
@click.option("--out", "out", type=_PATH, required=True, help="Output folder.")
@click.option("--rate", type=click.Choice(["500", "100"]), default="500", show_default=True)
@click.option("--concepts", type=click.Choice(["auto", "tables", "waveform", "waveform49", "none"]), default="auto",
              show_default=True, help="auto: the cohort's feature tables; waveform49: the panel measured from the "
                                      "waveform.")
def manifest_synth(root: Path, out: Path, rate: str, concepts: str) -> None:
    """Manifest for a synthetic cohort made by `raybench cohort synth`."""
    from raybench.cohorts.ptbxl import build_synth_manifest

    _report(build_synth_manifest(root, out, sampling_rate=int(rate), concepts=concepts))


@manifest.command("mimic")
@click.argument("root", type=_EXISTING)
@click.option("--out", "out", type=_PATH, required=True, help="Output folder.")
@click.option("--extractor", type=click.Choice(["published", "refined"]), default="published", show_default=True,
              help="published: the protocol's own concept extractor; refined: raybench's (12-lead QRS bounds, "
                   "per-beat pairing, baseline-referenced amplitudes).")
@click.option("--pool", type=click.Choice(["published", "all"]), default="published", show_default=True,
              help="published: ICD-linked studies whose extraction succeeds, ranked; all: every study, ranked.")
@click.option("--admissions", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="MIMIC-IV hosp/admissions.csv.gz, for the published pool's ICD link.")
@click.option("--max-records", type=click.IntRange(1), default=100_000, show_default=True,
              help="Pool size (the published protocol: 100,000).")
@click.option("--rate-concept", type=click.Choice(["heart_rate_bpm", "rr_mean_ms"]), default="heart_rate_bpm",
              show_default=True, help="heart_rate_bpm: 60000 / RR, the published run's; rr_mean_ms: raybench's.")
@click.option("--concepts", type=click.Choice(["waveform", "waveform49"]), default="waveform", show_default=True,
              help="waveform: the seven waveform concepts; waveform49: the 49-concept panel from the waveform.")
def manifest_mimic(root: Path, out: Path, extractor: str, pool: str, admissions: Path | None,
                   max_records: int, rate_concept: str, concepts: str) -> None:
    """Manifest for MIMIC-IV-ECG (record_list.csv, files/); waveform-derived concepts."""
    from raybench.cohorts.mimic import build_mimic_manifest

    _report(build_mimic_manifest(root, out, max_records=max_records, concept_extractor=extractor, record_pool=pool,
                                 admissions=admissions, rate_concept=rate_concept, concepts=concepts))


@manifest.command("wfdb")
@click.argument("root", type=_EXISTING)
@click.option("--out", "out", type=_PATH, required=True, help="Output folder.")
@click.option("--patients-csv", type=click.Path(path_type=Path), default=None,
              help="CSV with columns record, patient_id (optional site, device, recording_date).")
@click.option("--patient-key", default=None, help="Header comment key holding the patient id (#Patient: 12).")
@click.option("--concepts", type=click.Choice(["auto", "waveform", "waveform49", "none"]), default="auto",
              show_default=True, help="auto = waveform49: the 49-concept panel measured from the waveform; waveform: "
                                      "the seven waveform concepts.")
@click.option("--open-data", is_flag=True, help="The records are open data (cohort.credentialed: false).")
def manifest_wfdb(root: Path, out: Path, patients_csv: Path | None, patient_key: str | None, concepts: str,
                  open_data: bool) -> None:
    """Manifest for any folder of 12-lead WFDB records (.hea + .dat or .mat, at any depth)."""
    from raybench.cohorts.wfdb_cohort import build_wfdb_manifest

    _report(build_wfdb_manifest(root, out, patients_csv=patients_csv, patient_key=patient_key, concepts=concepts,
                                credentialed=not open_data))
