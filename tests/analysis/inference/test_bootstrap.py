"""Patient and crossed bootstraps: worker-count invariance and agreement with record-level resampling loops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr

from raybench.analysis.inference import bootstrap as bs
from raybench.analysis.inference import streams
from raybench.analysis.inference.packed_stats import StatsError, load_packed_stats
from raybench.core.sufficient_stats import patient_stats

THR = 0.2
P, C, CELLS = 40, 4, 3


def _records(seed: int = 0):
    """Record-level test data: patients with 1-3 records; per cell a selected coordinate per concept."""
    rng = np.random.default_rng(seed)
    per = rng.integers(1, 4, size=P)
    patient = np.repeat(np.arange(P), per)
    r = len(patient)
    y = rng.normal(size=(r, C)) * [1.0, 2.0, 0.5, 3.0] + [0.0, 5.0, -1.0, 100.0]
    cells = []
    for c in range(CELLS):
        a = np.abs(0.3 * (c + 1) * y + rng.normal(size=(r, C))) + 50.0 * (c == 2)  # large offset: conditioning
        if c == 1:
            a[:, 0] = 0.3  # constant selected coordinate -> r = 0 in every draw
        err = rng.gamma(2.0, 0.1 * (c + 1), size=r)
        dev = rng.gamma(2.0, 1.0, size=r) + err
        cells.append((a, err, dev))
    return patient, y, cells


def _write(tmp: Path, patient, y, cells) -> list[Path]:
    paths = []
    for i, (a, err, dev) in enumerate(cells):
        path = tmp / f"cell{i}" / "patient_stats.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **patient_stats(patient, P, a, y, err, dev))
        paths.append(path)
    return paths


def _direct(patient, y, cells, counts_row: np.ndarray) -> np.ndarray:
    """Record-level recomputation of one draw: expand the drawn patients' records and recompute everything."""
    idx = np.concatenate([np.flatnonzero(patient == p) for p in np.repeat(np.arange(P), counts_row.astype(int))])
    out = np.empty((len(cells), 3))
    for i, (a, err, dev) in enumerate(cells):
        r = np.array([0.0 if np.ptp(a[idx, j]) == 0 else pearsonr(a[idx, j], y[idx, j])[0] for j in range(C)])
        out[i] = (1 - err[idx].sum() / dev[idx].sum(), np.abs(r).mean(), np.mean(np.abs(r) >= THR))
    return out


def test_patient_bootstrap_matches_record_level_loop(tmp_path, ray_cluster):
    patient, y, cells = _records()
    paths = _write(tmp_path, patient, y, cells)
    stats = load_packed_stats(paths, ["c0", "c1", "c2"], C, THR, cells_per_block=2)
    assert stats.block_sizes == [2, 1] and stats.y_matrix.shape[1] == 1 + 2 * C  # y block stored once
    n_draws, chunk, seed = 120, 50, 11
    one = bs.patient_bootstrap(stats, n_draws, seed, chunk, num_workers=1)
    four = bs.patient_bootstrap(stats, n_draws, seed, chunk, num_workers=4)
    assert one.shape == (n_draws, CELLS, 3)
    assert np.array_equal(one, four)  # bitwise: independent of the number of workers

    counts = np.concatenate([streams.patient_counts(seed, n_draws, chunk, P, c)
                             for c in range(streams.n_chunks(n_draws, chunk))])
    assert counts.shape == (n_draws, P)
    direct = np.stack([_direct(patient, y, cells, row) for row in counts])
    np.testing.assert_allclose(one, direct, rtol=0, atol=1e-10)
    assert np.all(one[:, 1, 1] <= (C - 1) / C)  # the constant coordinate never correlates
    lo, hi = np.percentile(one, [2.5, 97.5], axis=0)
    dlo, dhi = np.percentile(direct, [2.5, 97.5], axis=0)
    np.testing.assert_allclose([lo, hi], [dlo, dhi], atol=1e-10)

    point = _direct(patient, y, cells, np.ones(P))
    np.testing.assert_allclose(stats.point, point, atol=1e-12)


def test_float32_packing_is_close(tmp_path, ray_cluster):
    patient, y, cells = _records(1)
    paths = _write(tmp_path, patient, y, cells)
    f64 = bs.patient_bootstrap(load_packed_stats(paths, ["a", "b", "c"], C, THR), 64, 2, 32)
    f32 = bs.patient_bootstrap(load_packed_stats(paths, ["a", "b", "c"], C, THR, dtype=np.float32), 64, 2, 32)
    np.testing.assert_allclose(f32[:, :, :2], f64[:, :, :2], atol=1e-5)
    assert np.mean(f32[:, :, 2] == f64[:, :, 2]) > 0.99


def test_draws_depend_only_on_seed_and_chunk():
    a = streams.patient_counts(5, 1000, 300, 17, 2)
    b = streams.patient_counts(5, 1000, 300, 17, 2)
    last = streams.patient_counts(5, 1000, 300, 17, 3)
    assert np.array_equal(a, b) and a.shape == (300, 17) and last.shape == (100, 17)
    assert not np.array_equal(a, streams.patient_counts(5, 1000, 300, 17, 1))
    assert not np.array_equal(a, streams.patient_counts(6, 1000, 300, 17, 2))


def test_crossed_bootstrap_matches_direct_resampling(ray_cluster):
    rng = np.random.default_rng(3)
    values = rng.uniform(size=(4, 5, 3))
    values[1, 2, 0] = np.nan  # one missing cell drops out of every draw that picks it
    n_draws, chunk, seed = 300, 70, 9
    one = bs.crossed_bootstrap(values, n_draws, seed, chunk, num_workers=1)
    four = bs.crossed_bootstrap(values, n_draws, seed, chunk, num_workers=4)
    assert np.array_equal(one, four) and one.shape == (n_draws, 4)
    direct = []
    children = np.random.SeedSequence([seed, 1]).spawn(streams.n_chunks(n_draws, chunk))
    for c in range(len(children)):
        g = np.random.default_rng(children[c])
        size = min(chunk, n_draws - c * chunk)
        di, si = g.integers(0, 5, size=(size, 5)), g.integers(0, 3, size=(size, 3))
        for n in range(size):
            direct.append([np.nanmean(values[m][np.ix_(di[n], si[n])]) for m in range(4)])
    np.testing.assert_allclose(one, np.array(direct), atol=1e-12)


def test_stats_errors_name_the_file(tmp_path):
    patient, y, cells = _records()
    paths = _write(tmp_path, patient, y, cells)
    with pytest.raises(StatsError, match="cell9"):
        load_packed_stats([*paths, tmp_path / "cell9" / "patient_stats.npz"], ["a", "b", "c", "d"], C, THR)
    bad = tmp_path / "bad" / "patient_stats.npz"
    bad.parent.mkdir()
    s = patient_stats(patient[patient < 10], 10, cells[0][0][patient < 10], y[patient < 10],
                     cells[0][1][patient < 10], cells[0][2][patient < 10])
    np.savez(bad, **s)
    with pytest.raises(StatsError, match="same sorted test patients"):
        load_packed_stats([paths[0], bad], ["a", "b"], C, THR)
    with pytest.raises(StatsError, match="concepts"):
        load_packed_stats(paths[:1], ["a"], C + 1, THR)


def test_in_place_abs_pearson_is_pearson_from_sums_bit_for_bit():
    """The bootstrap's buffer-reusing |r| equals |pearson_from_sums| exactly, zero-variance and dead cases included,
    with the concept side broadcast over cells as the bootstrap passes it."""
    from raybench.analysis.inference.packed_stats import abs_pearson_inplace
    from raybench.core.sufficient_stats import pearson_from_sums

    rng = np.random.default_rng(3)
    d, cells, c = 7, 5, 6
    n = rng.integers(20, 40, size=(d, 1, 1)).astype(float)
    sa, say = rng.normal(size=(2, d, cells, c))
    saa = np.abs(rng.normal(size=(d, cells, c))) * 40 + 1
    sy = rng.normal(size=(d, 1, c))
    syy = np.abs(rng.normal(size=(d, 1, c))) * 40 + 1
    saa[0, 0, :3] = sa[0, 0, :3] ** 2 / n[0, 0, 0]  # constant up to rounding: r = 0 by the zero-variance rule
    sa[1, 1], saa[1, 1] = 0.0, 0.0  # a dead coordinate
    syy[2, 0, 4] = sy[2, 0, 4] ** 2 / n[2, 0, 0]  # a constant concept in one draw
    say[3, 2, 1] = np.sqrt(saa[3, 2, 1] * syy[3, 0, 1]) * 2  # an |r| the clip has to cut to 1
    want = np.abs(pearson_from_sums(n, sa, sy, saa, syy, say))
    got = abs_pearson_inplace(n, sa.copy(), sy, saa, syy, say)
    assert np.array_equal(got, want)
    assert (got == 0).sum() >= 3 + c and got.max() <= 1.0


@pytest.mark.parametrize("stream", ["chunked", "published"])
@pytest.mark.parametrize("subset_first", [False, True])
def test_pipelined_pack_and_bootstrap_equal_the_two_in_turn(tmp_path, ray_cluster, monkeypatch, stream,
                                                             subset_first):
    """packed_patient_bootstrap (tasks start per packed block) against packing, then bootstrapping: the same stats
    and, bit for bit, the same draws. One cell is evaluated on fewer records (a second concept block, patients
    0-4 inactive): first, its block's tasks see only one concept block, and under the published stream the
    active patients grow after the first block, so the bootstrap must run again over the final set."""
    from raybench.analysis.inference.packed_stats import read_cell_stats

    patient, y, cells = _records(2)
    keep = (patient >= 5) & (np.arange(len(patient)) % 4 != 0)
    paths = _write(tmp_path, patient, y, cells)
    sub = tmp_path / "subset" / "patient_stats.npz"
    sub.parent.mkdir()
    a, err, dev = cells[0]
    np.savez(sub, **patient_stats(patient[keep], P, a[keep], y[keep], err[keep], dev[keep]))
    paths = [sub, *paths] if subset_first else [*paths, sub]
    ids = [f"c{i}" for i in range(len(paths))]
    n_draws, chunk, seed = 90, 40, 5
    ref_stats = load_packed_stats(paths, ids, C, THR, cells_per_block=1, put=True)
    ref = bs.patient_bootstrap(ref_stats, n_draws, seed, chunk, stream=stream)

    reruns = []
    in_turn = bs.patient_bootstrap
    monkeypatch.setattr(bs, "patient_bootstrap", lambda *a, **k: reruns.append(1) or in_turn(*a, **k))
    stats, got = bs.packed_patient_bootstrap(read_cell_stats(paths, ids), ids, C, THR, n_draws, seed, chunk,
                                             cells_per_block=1, stream=stream)
    assert np.array_equal(got, ref, equal_nan=True)
    assert np.array_equal(stats.y_matrix, ref_stats.y_matrix) and stats.y_matrix.shape[1] == 2 * (1 + 2 * C)
    assert np.array_equal(stats.cell_group, ref_stats.cell_group) and np.array_equal(stats.active, ref_stats.active)
    assert len(reruns) == (1 if stream == "published" and subset_first else 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_blocks_staged_for_the_object_store_equal_the_in_memory_ones(tmp_path, ray_cluster, dtype):
    """put=True packs every block into one reused small-page staging buffer (the last, shorter block into a slice
    of it) before ray.put; the blocks must be those that put=False keeps in memory."""
    import ray

    from raybench.analysis.inference.packed_stats import small_page_array

    buf = small_page_array((3, 5), dtype)
    assert buf.shape == (3, 5) and buf.dtype == dtype and buf.flags.writeable and not buf.any()
    paths = _write(tmp_path, *_records(3))
    ids = [f"c{i}" for i in range(len(paths))]
    kept = load_packed_stats(paths, ids, C, THR, cells_per_block=2, dtype=dtype)
    staged = load_packed_stats(paths, ids, C, THR, cells_per_block=2, put=True, dtype=dtype)
    assert kept.block_sizes == staged.block_sizes == [2, 1]
    for want, ref in zip(kept.cell_blocks, staged.cell_blocks, strict=True):
        got = ray.get(ref)
        assert got.dtype == dtype and np.array_equal(got, want)


def test_the_pipelined_bootstrap_counts_its_tasks_up_front(tmp_path, ray_cluster):
    """The progress line's total is every task of the bootstrap from its first line on (it used to grow block by
    block, 36 -> 246 in the demo)."""
    from raybench.analysis.inference.packed_stats import read_cell_stats
    from raybench.infra import progress

    patient, y, cells = _records(3)
    paths = _write(tmp_path, patient, y, cells)
    ids = [f"c{i}" for i in range(len(paths))]
    seen: list[tuple[int, int]] = []

    class Recorder(progress.Reporter):
        def _changed(self, key: str) -> None:
            seen.append((self.tasks[key].done, self.tasks[key].total))

    with progress.active(Recorder()):
        bs.packed_patient_bootstrap(read_cell_stats(paths, ids), ids, C, THR, 90, 5, 40, cells_per_block=1)
    assert seen[0] == (0, 0)  # add_total opens the task, then sets its total once
    assert {total for _, total in seen[1:]} == {3 * len(ids)} and seen[-1] == (3 * len(ids), 3 * len(ids))
