"""The analysis tells models apart: an encoder built to expose concepts more directly ranks first on
accessibility, and its paired contrast against the runner-up has a bootstrap CI excluding 0.

Real stages end to end: synthetic cohort -> manifest -> Ray Data extraction (the oracle, registered at run time,
shipped to the workers as its factory, in one pipeline with the demo encoders) -> Tune grid -> analyze_run. The
oracle (tests/oracle_encoder.py) sees only the waveform; nothing reads the cohort's ground truth.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from raybench.core.config import (
    CohortConfig,
    EncoderConfig,
    GridProtocol,
    ResourceConfig,
    RunConfig,
    demo_protocol,
)
from raybench.core.paths import RunLayout
from tests.oracle_encoder import N_FEATURES, OracleEncoder, beat_features
from tests.oracle_encoder import NAME as ORACLE

DEMO_MODELS = ("csfm", "ecg_jepa")


def _hann_train(t: np.ndarray, centres: np.ndarray, width: float) -> np.ndarray:
    return sum(np.where(np.abs(t - c) < width / 2, 0.5 * (1 + np.cos(2 * np.pi * (t - c) / width)), 0.0)
               for c in centres)


def test_oracle_measures_rate_amplitudes_and_intervals_of_a_known_beat_train():
    """Guards the slow test against an oracle that silently measures nothing: a hand-built 12-lead train
    (80-ms QRS every 800 ms with lead amplitudes 0.4..2 mV, a 160-ms T wave 300 ms later)."""
    fs = 500.0
    t = np.arange(5000) / fs
    beats = np.arange(0.3, 10.0, 0.8)
    r_amp, t_amp = np.linspace(0.4, 2.0, 12), np.linspace(-0.3, 0.5, 12)
    x = r_amp[:, None] * _hann_train(t, beats, 0.08) + t_amp[:, None] * _hann_train(t, beats + 0.3, 0.16)
    f = beat_features(x.astype(np.float32), fs)
    assert f.shape == (N_FEATURES,) and f.dtype == np.float32
    np.testing.assert_allclose(f[:12], r_amp, rtol=0.05)  # R maximum per lead
    big = np.abs(t_amp) > 0.05
    np.testing.assert_allclose(f[36:48][big], t_amp[big], rtol=0.1)  # signed T extreme per lead
    rr, qrs, qt = f[60] * 1000, f[61] * 100, f[62] * 400
    assert abs(rr - 800) < 16 and 50 < qrs < 100 and 300 < qt < 460, (rr, qrs, qt)
    states = OracleEncoder().layer_states(torch.from_numpy(np.stack([f, 2 * f])))
    assert states.shape == (2, 2, 64) and not torch.allclose(states[0], states[1])


def _config(run_dir) -> RunConfig:
    """3 models x 2 depths x E (1, 4) x 2 seeds = 24 cells, no sensitivity arm; 240 single-record patients."""
    p = demo_protocol()
    # the profiles and contrasts asserted on come from the 500 patient draws; the crossed bootstrap and the
    # reproducibility permutation floor (analyze_run computes both, nothing here reads them) at a token size
    p = replace(p, sae=replace(p.sae, steps=150, batch_size=64, checkpoint_every=150),
                grid=GridProtocol(models=(ORACLE, *DEMO_MODELS), depths=(0.0, 1.0), expansions=(1, 4),
                                  seeds=(4311, 4312), sensitivity_depth=None),
                eval=replace(p.eval, repro_permutations=10),
                inference=replace(p.inference, patient_draws=500, crossed_draws=50, chunk_draws=250))
    return RunConfig(run_dir=str(run_dir), protocol=p,
                     cohort=CohortConfig(kind="synth", records=240, patients=240, seed=11),
                     encoders=EncoderConfig(size="demo", batch_size=48, num_gpus=0.0),  # CPU: one pipeline
                     # one reused trial process runs the three trials one after another (auto reuses only in an
                     # instance raybench started): one trial process start instead of two; each trial trains its
                     # 8 small cells in well under a second, so running them side by side saves no CPU
                     resources=ResourceConfig(trial_unit="model", reuse_trial_processes=True,
                                              max_concurrent_trials=1)).validate()


@pytest.mark.slow
def test_a_run_time_registered_concept_exposing_encoder_reaches_the_workers_and_ranks_first(tmp_path, ray_cluster):
    """The oracle, registered with `register_encoder` in this process only (no builder, no entry point), reaches the
    Ray Data workers and stores what the single-process reference computes (this was a test of its own with its own
    cohort and pipeline); then it ranks first on accessibility with a separating CI."""
    from raybench.analysis.atlas.run import analyze_run
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.core.config import audited_depths
    from raybench.encoders.base import EncoderSpec
    from raybench.encoders.extract import extract_models
    from raybench.encoders.reference import plain_loop_activations
    from raybench.encoders.store import ActivationStore
    from raybench.sae.grid import run_grid

    cfg = _config(tmp_path / "run")
    layout = RunLayout.at(cfg.run_dir)
    generate_synth_cohort(layout.cohort_dir, cfg.cohort.records, cfg.cohort.patients, cfg.cohort.seed)
    build_synth_manifest(layout.cohort_dir, layout.manifest_dir)
    # one pipeline for all three: the oracle, registered in this process, travels as its registered factory
    # (raybench.encoders.base.worker_builder); the `builder=` path is tests/encoders/test_extract.py's
    extract_models(layout.manifest, layout.root, [EncoderSpec(name=m, size="demo") for m in (ORACLE, *DEMO_MODELS)],
                   cfg.encoders, progress=False, depths=audited_depths(cfg.protocol))
    spec = EncoderSpec(name=ORACLE, size="demo")
    ref = plain_loop_activations(layout.manifest, spec, layers=[1], batch_size=cfg.encoders.batch_size)
    store = ActivationStore(layout.activations_dir)
    assert set(ref[1]) == {"train", "val", "test"}
    for split, want in ref[1].items():  # float32 (values ~1; the actor's and this process's threads sum apart)
        np.testing.assert_allclose(store.load(ORACLE, 1, split), want, rtol=0, atol=1e-5)

    cells = run_grid(cfg)
    assert len(cells) == 24 and (cells["status"] == "ok").all(), cells["status"].tolist()
    tables = analyze_run(layout.root, cfg.protocol, cohort_kind="synth")

    prof = tables["profiles"]
    acc = prof[prof.metric == "accessibility"].set_index("model")
    assert set(acc.index) == {ORACLE, *DEMO_MODELS}
    assert acc["auc"].idxmax() == ORACLE, acc
    assert acc["rank1_prob"].idxmax() == ORACLE and acc.loc[ORACLE, "rank1_prob"] > 0.95, acc
    assert acc["mean_rank"].idxmin() == ORACLE and acc.loc[ORACLE, "mean_rank"] < 1.1, acc
    runner_up = acc.drop(ORACLE)["auc"].idxmax()

    con = tables["contrasts"]  # published orientation: the six encoders before one they do not know
    row = con[(con.metric == "accessibility") & (con.model_a == runner_up) & (con.model_b == ORACLE)]
    assert len(row) == 1, con[con.metric == "accessibility"]
    row = row.iloc[0]
    assert row["diff"] < 0 and row["ci_high"] < 0, row
    assert row["p_bh"] < 0.05, row
    # the written tables are the returned ones
    on_disk = pd.read_parquet(layout.tables_dir / "contrasts.parquet")
    assert np.allclose(on_disk.loc[on_disk.metric == "accessibility", "ci_low"],
                       con.loc[con.metric == "accessibility", "ci_low"])
