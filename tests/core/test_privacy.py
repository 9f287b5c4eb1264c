"""Record ids never reach a shareable artifact of a credentialed (MIMIC) run, and `raybench export` copies
only the allow-list.

A MIMIC-shaped fixture run: the real MIMIC manifest builder on tests/cohorts/test_mimic.py's fixture, the finished
tables of tests/fake_run.py, and two planted trial failures whose messages list the fixture's study and
subject ids (a pandas KeyError raised the way a stale activation store raises it, wrapped the way Ray Tune
reports it, and a traceback text naming a record path). They go through the SAE stage's real failure path
(trial_errors -> collect_cells_table) into the cells table, then tables/missing, audit.json and report.html.
MIMIC ids are 8-digit numbers: the greps below match them as whole digit runs, never as substrings.
"""

from __future__ import annotations

import json
import re
import shutil
import traceback
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from fake_run import D_MODEL, N_LAYERS, small_protocol, write_fake_run
from test_mimic import write_mimic_fixture

from raybench.analysis.release_audit.run import release_audit
from raybench.analysis.run_inputs import select_ok
from raybench.analysis.stage import render_report
from raybench.app.cli import main
from raybench.core.atomic import write_json, write_table, write_text
from raybench.core.config import CohortConfig, ModelDims, RunConfig, demo_run
from raybench.core.paths import RunLayout
from raybench.core.privacy import WITHHELD, failure_text, id_like_count, is_credentialed
from raybench.sae.cells import build_cells, group_trials
from raybench.sae.cells_table import collect_cells_table
from raybench.sae.grid import trial_errors

WITHHELD_STATUS = re.compile(r"^failed: (\w+) \(" + re.escape(WITHHELD) + r"; (\d+) identifier-like values?\)$")


def _ray_error(err: BaseException) -> BaseException:
    """`err` as Ray Tune hands it back from a failed trial: RayTaskError(<type>) with the remote traceback."""
    from ray.exceptions import RayTaskError

    return RayTaskError("train_cells_trial", "".join(traceback.format_exception(err)), err).as_instanceof_cause()


def _digit_runs(data: bytes) -> set[bytes]:
    return set(re.findall(rb"\d+", data))


def _texts(path: Path) -> list[bytes]:
    """A file's bytes, plus a parquet table decoded to text (its pages may be compressed)."""
    out = [path.read_bytes()]
    if path.suffix == ".parquet":
        out.append(pd.read_parquet(path).to_csv(index=False).encode())
    return out


def _id_hits(root: Path, ids: set[bytes]) -> dict[str, set[bytes]]:
    hits = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        found = set().union(*(_digit_runs(t) & ids for t in _texts(path)))
        if found:
            hits[path.relative_to(root).as_posix()] = found
    return hits


@pytest.fixture(scope="module")
def mimic_run(tmp_path_factory, ray_cluster):
    from raybench.cohorts.mimic import build_mimic_manifest

    data = tmp_path_factory.mktemp("mimic-iv-ecg")
    write_mimic_fixture(data)
    listed = pd.read_csv(data / "record_list.csv")
    study_ids = {str(s).encode() for s in listed["study_id"]}
    subject_ids = {str(s).encode() for s in listed["subject_id"]}
    assert all(len(i) == 8 for i in study_ids | subject_ids)

    protocol = small_protocol()
    root = write_fake_run(tmp_path_factory.mktemp("runs") / "run", protocol, cohort_kind="mimic")
    layout = RunLayout.at(root)
    raw = yaml.safe_load(layout.run_yaml.read_text())
    raw["cohort"]["root"] = str(data)
    write_text(layout.run_yaml, "# raybench 0.1.0\n" + yaml.safe_dump(raw, sort_keys=False))
    build_mimic_manifest(data, layout.manifest_dir)
    cfg = replace(demo_run(str(root)), protocol=protocol, cohort=CohortConfig(kind="mimic", root=str(data))).validate()

    # a stale activation store still lists the two quarantined studies: load_cell_data's lookup raises
    manifest = pd.read_parquet(layout.manifest).set_index("ecg_id")
    quarantined = pd.read_csv(layout.quarantine)["ecg_id"].astype(np.int64).tolist()
    store_ids = np.array(sorted(manifest.index.tolist() + quarantined), dtype=np.int64)
    try:
        manifest.loc[store_ids, ["patient_id"]]
    except KeyError as err:
        key_error = _ray_error(err)
    subject, study = listed.iloc[0]["subject_id"], listed.iloc[0]["study_id"]
    path_error = (f"Traceback (most recent call last):\n  File \"raybench/cohorts/waveforms.py\", line 110\n"
                  f"FileNotFoundError: [Errno 2] No such file or directory: "
                  f"'{data}/files/p{str(subject)[:4]}/p{subject}/s{study}/{study}.hea' (subject {subject})")

    dims = {m: ModelDims(n_layers=N_LAYERS[m], d=D_MODEL) for m in protocol.grid.models}
    cells = build_cells(protocol, dims)
    stacks = [s for stacks in group_trials(cells, "stack").values() for s in stacks]
    planted = {"key_error": stacks[0], "path_error": stacks[7]}
    results = [SimpleNamespace(error=key_error, config={"stacks": [[c.to_dict() for c in planted["key_error"]]]}),
               SimpleNamespace(error=path_error, config={"stacks": [[c.to_dict() for c in planted["path_error"]]]})]
    raw_errors = trial_errors(results, credentialed=False)
    errors = trial_errors(results, credentialed=is_credentialed(cfg))
    failed = collect_cells_table(cfg, cells, errors).set_index("cell_id")
    failed_ids = [c.cell_id for s in planted.values() for c in s]
    table = pd.read_parquet(layout.cells_table)
    mask = table["cell_id"].isin(failed_ids)
    table.loc[mask, "status"] = table.loc[mask, "cell_id"].map(failed["status"])
    for col in ("val_r2", "test_r2", "val_dead_fraction", "test_accessibility", "test_coverage"):
        table.loc[mask, col] = np.nan
    table.loc[mask, "gate_pass"] = False
    write_table(layout.cells_table, table)
    write_table(layout.tables_dir / "missing.parquet", select_ok(table, protocol)[1])
    release_audit(root, protocol)
    layout.figures_dir.mkdir(parents=True, exist_ok=True)
    (layout.figures_dir / "profiles.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    (layout.figures_dir / "profiles.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'><text>csfm</text></svg>")
    render_report(root)

    # record-level data a real run holds beside the results (a run.yaml key listing ids is hypothetical)
    raw["quarantined_ids"] = [int(i) for i in listed["study_id"].tail(2)]
    write_text(layout.run_yaml, "# raybench 0.1.0\n" + yaml.safe_dump(raw, sort_keys=False))
    ok_cell = table.loc[~mask, "cell_id"].iloc[0]
    cdir = layout.cell_dir(ok_cell)
    cdir.mkdir(parents=True, exist_ok=True)
    from safetensors.numpy import save_file

    save_file({"W_dec": np.zeros((4, 8), np.float32)}, str(cdir / "sae.safetensors"))
    write_json(cdir / "cfg.json", {"d": 4, "n_latents": 8, "k": 2})
    write_json(cdir / "metrics.json", {"val_r2": 0.9})
    np.savez(cdir / "patient_stats.npz", patients=np.array(sorted(subject_ids), dtype="S8"), n=np.ones(3))
    store = layout.activation_dir("ecg_fm", 0)
    store.mkdir(parents=True)
    np.save(store / "train_ecg_ids.npy", store_ids)
    (store / "index.json").write_text(json.dumps({"n_layers": 12, "d": 768}))
    (layout.root / "secondary" / "harmonization").mkdir(parents=True)
    np.savez(layout.root / "secondary" / "harmonization" / "ecg_fm.npz", ids=store_ids)
    layout.cohort_dir.mkdir()
    shutil.copy(data / "record_list.csv", layout.cohort_dir / "record_list.csv")
    trial = layout.tune_dir / "grid-0" / "trial_0"
    trial.mkdir(parents=True)
    (trial / "error.txt").write_text(str(key_error) + "\n" + path_error)
    return SimpleNamespace(root=root, data=data, cfg=cfg, study_ids=study_ids, subject_ids=subject_ids,
                           ids=study_ids | subject_ids, planted=planted, raw_errors=raw_errors, quarantined=quarantined)


def test_credentialed_failure_status_holds_only_the_type_and_a_count(mimic_run):
    run = mimic_run
    # the planted failures really name records: an open cohort's reason would carry them
    assert all(_digit_runs(r.encode()) & run.ids for r in run.raw_errors.values()), run.raw_errors
    layout = RunLayout.at(run.root)
    cells = pd.read_parquet(layout.cells_table).set_index("cell_id")
    expect = {"key_error": ("KeyError", len(run.quarantined)), "path_error": ("FileNotFoundError", None)}
    for name, stack in run.planted.items():
        for cell in stack:
            status = cells.loc[cell.cell_id, "status"]
            m = WITHHELD_STATUS.match(status)
            assert m, status
            kind, count = expect[name]
            assert m.group(1) == kind
            if count is not None:
                assert int(m.group(2)) == count
    missing = pd.read_parquet(layout.tables_dir / "missing.parquet")
    planted_ids = {c.cell_id for s in run.planted.values() for c in s}
    assert set(missing["cell_id"]) == planted_ids
    assert missing["reason"].str.match(WITHHELD_STATUS).all()
    audit = json.loads((layout.tables_dir / "audit.json").read_text())
    assert {f["cell_id"] for f in audit["primary"]["failed"]} == planted_ids
    for path in (layout.cells_table, layout.tables_dir / "cells.csv", layout.tables_dir / "missing.csv",
                 layout.tables_dir / "audit.json", layout.report):
        assert not _id_hits(path.parent, run.ids).get(path.name), path
    assert "message withheld" in layout.report.read_text()


def test_export_copies_the_allow_list_and_no_record_id(mimic_run, tmp_path):
    run = mimic_run
    # the run folder itself holds ids as text (manifest, Tune's traceback, the cohort copy; the stores and
    # caches hold them as binary int64)
    source_hits = _id_hits(run.root, run.ids)
    for part in ("manifest/", "cohort/", "tune/"):
        assert any(part in p for p in source_hits), (part, sorted(source_hits))

    out = tmp_path / "share"
    res = CliRunner().invoke(main, ["export", "--run-dir", str(run.root), "--to", str(out)])
    assert res.exit_code == 0, res.output
    assert "none found" in res.output
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert _id_hits(out, run.ids) == {}, "record or subject ids in the export"
    for path in out.rglob("*"):  # and no path names one
        assert not _digit_runs(str(path.relative_to(out)).encode()) & run.ids

    assert {"report.html", "run.yaml", "EXPORT.json", "tables/cells.parquet", "tables/missing.csv",
            "tables/audit.json", "figures/profiles.png", "figures/profiles.svg"} <= set(files)
    cells = [f for f in files if f.startswith("cells/")]
    assert cells and {Path(f).name for f in cells} == {"sae.safetensors", "cfg.json"}
    allowed = re.compile(r"^(report\.html|run\.yaml|EXPORT\.json|tables/[^/]+\.(parquet|csv|json)|"
                         r"figures/[^/]+\.(png|svg)|cells/[^/]+/(sae\.safetensors|cfg\.json))$")
    assert [f for f in files if not allowed.match(f)] == []
    for bad in ("manifest", "activations", "secondary", "cohort", "tune", "quarantine", "_ids", ".npz", ".npy",
                "patient_stats", "metrics.json"):
        assert not any(bad in f for f in files), bad
    exported = yaml.safe_load((out / "run.yaml").read_text())
    source = yaml.safe_load(RunLayout.at(run.root).run_yaml.read_text())
    assert exported == {k: v for k, v in source.items() if k != "quarantined_ids"}
    listing = json.loads((out / "EXPORT.json").read_text())
    assert listing["credentialed"] is True and listing["left_behind"] > 0
    assert sorted(f["path"] for f in listing["files"]) == [f for f in files if f != "EXPORT.json"]


def test_export_refuses_a_file_that_names_records(mimic_run, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(mimic_run.root, root)
    study = sorted(mimic_run.study_ids)[3].decode()
    write_table(RunLayout.at(root).tables_dir / "legacy.parquet",
                pd.DataFrame({"cell_id": ["x"], "status": [f"failed: KeyError: '[{study}] not in index'"]}))
    out = tmp_path / "share"
    res = CliRunner().invoke(main, ["export", "--run-dir", str(root), "--to", str(out)])
    assert res.exit_code != 0 and "tables/legacy.csv" in res.output and "tables/legacy.parquet" in res.output
    assert study not in res.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".share")]


def test_export_refuses_unsafe_destinations(mimic_run, tmp_path):
    runner = CliRunner()
    inside = runner.invoke(main, ["export", "--run-dir", str(mimic_run.root), "--to", str(mimic_run.root / "x")])
    assert inside.exit_code != 0 and "inside the run folder" in inside.output
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.txt").write_text("x")
    res = runner.invoke(main, ["export", "--run-dir", str(mimic_run.root), "--to", str(full)])
    assert res.exit_code != 0 and "not an empty folder" in res.output
    remote = runner.invoke(main, ["export", "--run-dir", "s3://bucket/run", "--to", str(tmp_path / "o")])
    assert remote.exit_code != 0 and "local run folder" in remote.output


def test_failure_text_rules():
    ids = "'[40012345, 40023456] not in index'"
    assert failure_text(KeyError("[40012345, 40023456] not in index"), False) == f"KeyError: {ids}"
    assert failure_text(KeyError("[40012345, 40023456] not in index"), True) == \
        f"KeyError ({WITHHELD}; 2 identifier-like values)"
    wrapped = _ray_error(KeyError("[40012345] not in index"))
    assert failure_text(wrapped, True) == f"KeyError ({WITHHELD}; 1 identifier-like value)"
    assert failure_text(wrapped, False).startswith("RayTaskError(KeyError): ")  # the open-cohort text as before
    text = "Traceback (most recent call last):\n  File 'x.py'\nValueError: record 40012345 of p10001217 is flat\n"
    assert failure_text(text, False) == "ValueError: record 40012345 of p10001217 is flat"
    once = failure_text(text, True)
    assert once == f"ValueError ({WITHHELD}; 2 identifier-like values)" and failure_text(once, True) == once
    assert failure_text(f"failed: {once}", True) == f"failed: {once}"
    assert failure_text("diverged", False) == "diverged"
    assert id_like_count("p1000/p10001217/s40012345 line 12") == 3
    assert is_credentialed(CohortConfig(kind="mimic", root="/x")) and is_credentialed({"cohort": {"kind": "mimic"}})
    assert is_credentialed(RunConfig(cohort=CohortConfig(kind="mimic", root="/x")))
    assert is_credentialed({"config": {"cohort": {"kind": "mimic"}}}) and is_credentialed("mimic")
    assert not is_credentialed(demo_run()) and not is_credentialed({"cohort": {"kind": "ptbxl"}})
    assert not is_credentialed(None) and not is_credentialed({})


def test_a_wfdb_cohort_is_credentialed_unless_its_config_says_open():
    assert is_credentialed("wfdb") and is_credentialed(CohortConfig(kind="wfdb", root="/x"))
    assert is_credentialed({"cohort": {"kind": "wfdb"}}) and is_credentialed({"cohort": {"kind": "wfdb",
                                                                                         "credentialed": True}})
    assert not is_credentialed(CohortConfig(kind="wfdb", root="/x", credentialed=False))
    assert not is_credentialed(RunConfig(cohort=CohortConfig(kind="wfdb", root="/x", credentialed=False)))
    assert not is_credentialed({"config": {"cohort": {"kind": "wfdb", "credentialed": False}}})


def test_secondary_analysis_failures_are_reduced_too():
    """tables/secondary_failures.json (then audit.json and the report) gets the same treatment."""
    from raybench.analysis.records import failure_record

    err = KeyError("[40012345, 40023456] not in index")
    mimic = RunConfig(cohort=CohortConfig(kind="mimic", root="/data/mimic"))
    rec = failure_record("harmonization", _ray_error(err), mimic)
    assert rec["reason"] == f"KeyError ({WITHHELD}; 2 identifier-like values)"
    assert "40012345" not in json.dumps(rec)
    assert "40012345" in failure_record("harmonization", err, demo_run())["reason"]  # open cohorts keep it


@pytest.mark.parametrize("text", ["s40689238: header missing", "40689238: header missing", "p10001217.s40689238: x",
                                  "record_40689238: flat", "failed: s40689238: header missing", "s40689238",
                                  "wfdb.p10001217.Error: bad header", "diverged",
                                  "s40689238 (message withheld: credentialed cohort; 0 identifier-like values)"])
def test_credentialed_text_keeps_no_identifier_as_its_type(text):
    """Only an exception type name may stand before the withheld note; an id in its place is counted instead."""
    out = failure_text(text, True)
    assert not re.search(r"\d{4}", out.split("(")[0]), out
    assert out.startswith(("Error (", "failed: Error (")) and WITHHELD in out
    if re.search(r"\d{4}", text):
        assert re.search(r"; [1-9]\d* identifier-like value", out), out


def test_credentialed_text_keeps_real_exception_type_names():
    for name in ("ValueError", "wfdb.io.Error", "KeyboardInterrupt", "StopIteration", "h5py.OSError",
                 "botocore.exceptions.ClientError", "TimeoutError", "ray.exceptions.RayTaskError(KeyError)"):
        kept = "KeyError" if name.endswith("(KeyError)") else name
        assert failure_text(f"{name}: record 40012345 missing", True) == \
            f"{kept} ({WITHHELD}; 1 identifier-like value)"
