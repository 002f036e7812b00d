"""Memory limits: work whose single task cannot fit in a worker is refused before it runs,
and a fit on a Zarr input several times the cluster's memory completes without a worker
being killed."""

import os
import re
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest
from _daskproc import sample_worker_memory

from dkern.errors import MemoryLimitError
from dkern.io import open_array, write_array
from dkern.kernels import Gaussian
from dkern.models import KernelRidge
from dkern.operators import gram
from dkern.operators.memory import TASK_FRACTION, check_row_chunks, row_task_bytes
from dkern.solvers.preconditioners import FACTOR_VALUES_PER_PIVOT, NystromPreconditioner


def _one_chunk_store(path, n, d, rng=None):
    """A store with X (n, d) and y (n,) each in a single Zarr chunk; zeros compress to
    nothing, so writing a large X is quick."""
    X = np.zeros((n, d)) if rng is None else rng.normal(size=(n, d))
    write_array(X, path, "X", chunk_rows=n)
    write_array(np.zeros(n), path, "y", chunk_rows=n)
    return str(path)


def test_estimate_bounds_the_measured_peak_of_a_pass(tmp_path, sync_scheduler):
    """The per-task estimate is at least the peak a pass over a one-chunk store allocates
    (tracemalloc; the synchronous scheduler runs the read and the block in this thread),
    and within a factor two of it: neither blind to the read nor needlessly strict."""
    url = _one_chunk_store(tmp_path / "s.zarr", 200_000, 16, np.random.default_rng(0))
    X = open_array(url, "X")
    op = gram(Gaussian(3.0), X, np.zeros((300, 16)), backend="numpy")
    tracemalloc.start()
    try:
        (op @ np.ones(300)).compute()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = row_task_bytes(X)
    assert peak <= estimate <= 2 * peak, (peak, estimate)


def test_knm_is_not_cached_in_row_blocks_too_big_for_a_task(monkeypatch, sync_scheduler):
    """Ten 1 GB workers (3 GB to persist into) could hold a 640 MB K_nm, but not as one
    40,000 x 2,000 row block in one task (500 MB each): before, it was cached anyway."""
    from dkern.operators import memory
    from dkern.operators.nystrom import NystromOperator

    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 1e9, "nthreads": 1}] * 10)
    X = da.from_array(np.random.default_rng(0).normal(size=(40_000, 2)), chunks=(-1, -1))
    too_wide = NystromOperator(Gaussian(1.0), X, np.zeros((2_000, 2)))
    assert not too_wide.cache_blocks(memory.persist_budget())
    assert too_wide.cached is None
    narrow = NystromOperator(Gaussian(1.0), X, np.zeros((200, 2)))  # 64 MB blocks
    assert narrow.cache_blocks(memory.persist_budget())


def test_factor_estimate_bounds_the_measured_peak_of_building_it(sync_scheduler):
    """Building the CG preconditioner's rank-r factor over a one-chunk X: the per-task
    estimate with FACTOR_VALUES_PER_PIVOT values per row and pivot is at least the peak
    allocated (the synchronous scheduler also keeps the persisted factor in this process,
    so the peak is that of a worker holding both) and within a factor two of it."""
    n, rank = 20_000, 100
    X = da.from_array(np.random.default_rng(0).normal(size=(n, 4)), chunks=(n, 4))
    tracemalloc.start()
    try:
        NystromPreconditioner(Gaussian(1.0), X, 1e-3, rank, pivots="rpcholesky",
                              random_state=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = row_task_bytes(X, FACTOR_VALUES_PER_PIVOT * rank)
    assert peak <= estimate <= 2 * peak, (peak, estimate)


def test_a_factor_too_big_for_the_workers_is_refused_before_anything_runs(monkeypatch,
                                                                           sync_scheduler):
    """X's 200,000-row chunks fit a 1 GB worker's task (500 MB), but their rank-300
    factor blocks (about 1.9 GB) do not: before, only X was checked, and a CG fit on
    such workers had them killed instead of being refused."""
    from dkern.operators import memory

    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 1e9, "nthreads": 1}] * 4)
    X = da.zeros((400_000, 2), chunks=(200_000, 2))
    check_row_chunks(X)  # X alone fits
    computed = []
    with dask.config.set(scheduler=lambda dsk, keys, **kw: computed.append(keys)), \
            pytest.raises(MemoryLimitError, match="1200 float64 values per row"):
        NystromPreconditioner(Gaussian(1.0), X, 1e-3, 300, pivots="rpcholesky")
    assert computed == [], "work was submitted before the refusal"
    # dask's local schedulers keep it in this process: no workers to spill or pause, and
    # no refusal (the diff review found it refused there, talking of workers)
    monkeypatch.setattr(memory, "_workers", lambda: None)
    monkeypatch.setattr(memory, "persist_budget", lambda: 1)
    small = da.from_array(np.random.default_rng(2).normal(size=(500, 2)), chunks=250)
    assert NystromPreconditioner(Gaussian(1.0), small, 1e-3, 20).rank == 20


def test_stored_chunks_that_fit_are_merged_only_as_far_as_the_workers_allow(
        tmp_path, monkeypatch, sync_scheduler):
    """Reads merge a store's Zarr chunks to about 16 MiB, for speed. On memory-limited
    workers a store of small chunks, written as the refusal advised, was refused again for
    the merged chunks (adversary E's repro). Now whole Zarr chunks are merged only as far as
    a task fits, through the estimators' input checks and data_rows alike."""
    from dkern.io import as_rows
    from dkern.models._validation import check_X
    from dkern.operators import data_rows, memory

    X = np.random.default_rng(1).normal(size=(400_000, 2))
    url = str(tmp_path / "small.zarr")
    write_array(X, url, "X", chunk_rows=10_000)
    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 40e6, "nthreads": 1}] * 2)
    merged = as_rows((url, "X"), name="X")  # the read alone merges to 200,000 rows
    assert max(merged.chunks[0]) == 200_000 and not memory.fits_in_task(merged)
    for Xd in (data_rows((url, "X")), check_X(KernelRidge(), (url, "X"), reset=True)):
        rows = max(Xd.chunks[0])
        assert rows % 10_000 == 0 and 10_000 <= rows < 200_000, Xd.chunks[0]
        assert memory.fits_in_task(Xd)
        check_row_chunks(Xd)
        np.testing.assert_array_equal(Xd.compute(), X)


def test_in_memory_rows_are_split_as_far_as_the_workers_allow(monkeypatch, sync_scheduler):
    """In-memory rows get chunks of about 16 MiB, which the user cannot choose: an exact GP
    fitted on tight workers was refused at predict for its own training rows (the review's
    repro_13). They are now split as far as a task needs; a dask array's own chunks are
    kept (and refused with advice, the user's to change)."""
    from dkern.models import GaussianProcessRegressor
    from dkern.operators import data_rows, memory

    rng = np.random.default_rng(3)
    X = rng.normal(size=(6_000, 64))
    y = np.sin(X[:, 0])
    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 34e6, "nthreads": 1}] * 2)
    Xd = data_rows(X)
    assert max(Xd.chunks[0]) < 3_000 and memory.fits_in_task(Xd), Xd.chunks[0]
    np.testing.assert_array_equal(Xd.compute(), X)
    with pytest.raises(MemoryLimitError, match=r"X\.rechunk\(\{0: \d+\}\)"):
        data_rows(da.from_array(X, chunks=3_000))
    gp = GaussianProcessRegressor(Gaussian(8.0), alpha=0.1, optimizer=None).fit(X, y)
    mean, std = gp.predict(X[:100] + 0.5, return_std=True)
    monkeypatch.setattr(memory, "_workers", lambda: None)  # the reference: no limits
    want_mean, want_std = gp.predict(X[:100] + 0.5, return_std=True)
    # the same sums in another chunking: equal to rounding (measured 2e-14)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(std, want_std, rtol=1e-10, atol=1e-12)
    # wide rows, whose own chunks are already small (512 rows of 32 KiB), split too (the
    # review: a floor of 1,024 rows kept them whole and refused them)
    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 100e6, "nthreads": 1}] * 2)
    wide = rng.normal(size=(2_048, 4_096))
    Wd = data_rows(wide)
    assert max(Wd.chunks[0]) < 512 and memory.fits_in_task(Wd), Wd.chunks[0]
    np.testing.assert_array_equal(Wd.compute(), wide)
    # the CG preconditioner's factor (4 values per pivot and row) splits them further (the
    # review: split for the rows alone, they were refused for the factor's block)
    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 34e6, "nthreads": 1}] * 2)
    P = NystromPreconditioner(Gaussian(8.0), X, 0.1, 100)
    assert P.rank == 100 and max(P.factor.chunks[0]) < max(Xd.chunks[0]), P.factor.chunks[0]
    # past MAX_SPLIT_CHUNKS: refused, with the way out for a numpy array
    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 100e6, "nthreads": 1}] * 2)
    monkeypatch.setattr(memory, "MAX_SPLIT_CHUNKS", 4)
    with pytest.raises(MemoryLimitError, match=r"dask\.array\.from_array\(X, chunks=\(\d+, -1\)\)"):
        data_rows(wide)


def test_a_factor_the_workers_cannot_keep_is_refused_before_anything_runs(monkeypatch,
                                                                          sync_scheduler):
    """The CG preconditioner keeps its n x r factor on the workers. Each task of it fitted,
    but 200,000 x 300 float64 (480 MB) on two 300 MB workers made them spill and pause, and
    the fit waited (adversary E's repro). It is refused first, naming a limit that fits."""
    from dkern.operators import memory

    monkeypatch.setattr(memory, "_workers", lambda: [{"memory_limit": 3e8, "nthreads": 1}] * 2)
    X = da.zeros((200_000, 2), chunks=(2_000, 2))
    computed = []
    with dask.config.set(scheduler=lambda dsk, keys, **kw: computed.append(keys)), \
            pytest.raises(MemoryLimitError, match=r"factor, 200,000 x 300 float64, takes 480 MB "
                          r"kept on the workers, over the 180 MB they may keep .*2 worker\(s\) "
                          r"of 300 MB.*a memory_limit of at least 800 MB each"):
        NystromPreconditioner(Gaussian(1.0), X, 1e-3, 300, pivots="rpcholesky")
    assert computed == [], "work was submitted before the refusal"


@pytest.fixture(scope="module")
def small_workers():
    """One single-threaded worker process limited to 400 MB."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="400MB", processes=True,
                      host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


@pytest.mark.distributed
@pytest.mark.slow
def test_a_chunk_too_big_for_the_workers_is_refused_before_anything_runs(tmp_path,
                                                                          small_workers):
    """Reading a 192 MB Zarr chunk takes ~580 MB; a 400 MB worker may give a task 200 MB.
    Before, the fit was submitted and its nanny killed the worker on every try of the read
    (KilledWorker after distributed's allowed failures)."""
    url = _one_chunk_store(tmp_path / "big.zarr", 3_000_000, 8)
    client = small_workers
    transitions = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
    with dask.config.set(scheduler=client), pytest.raises(MemoryLimitError) as info:
        KernelRidge(Gaussian(1.0), solver="nystrom", n_centers=8).fit((url, "X"), (url, "y"))
    message = str(info.value)
    assert f"{row_task_bytes(open_array(url, 'X')) / 1e6:.0f} MB per task" in message
    assert f"memory_limit {400e6 / 1e6:.0f} MB" in message
    # the room is measured: under TASK_FRACTION of the limit once the worker holds its code
    room = int(re.search(r"over the (\d+) MB a task may take", message).group(1))
    assert 0 < room <= TASK_FRACTION * 400e6 / 1e6
    after = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
    assert after == transitions, "tasks were submitted before the refusal"
    # The advice is consistent: chunks of the rows it names are accepted, twice that not.
    rows = int(re.search(r"chunk_rows=(\d+)", message).group(1))
    assert 1 <= rows < 3_000_000
    with dask.config.set(scheduler=client):
        check_row_chunks(da.zeros((2 * rows, 8), chunks=(rows, 8)))
        with pytest.raises(MemoryLimitError):
            check_row_chunks(da.zeros((2 * rows, 8), chunks=(2 * rows, 8)))


#: The cluster of the big fit: one worker process of two threads, limited to 1 GB.
LIMIT = 1_000_000_000
#: Its input: X of 1,000,000 rows x 512 float64 features, 4.1 GB (>= 4 x LIMIT), in Zarr
#: chunks of 8192 rows (33.5 MB); the rows lie on a 2-D plane (isometrically), so a few
#: Gaussian centres can model a smooth target of them.
N, D, CHUNK, PLANE_SEED = 1_000_000, 512, 8192, 7
#: Disk the store takes, with room to spare: without it the test skips and says so.
DISK_NEEDED = 6_000_000_000


def _plane():
    """An isometric embedding of R² in R^D: two orthonormal rows, shape (2, D)."""
    Q, _ = np.linalg.qr(np.random.default_rng(PLANE_SEED).normal(size=(D, 2)))
    return Q.T


def _target(Z, noise):
    """A smooth function of the plane's coordinates Z (k, 2), plus noise (k, 1)."""
    return np.sin(2 * Z[:, 0]) + np.cos(1.5 * Z[:, 1]) + 0.1 * noise[:, 0]


def _write_big_store(url):
    """X and y generated on the cluster chunk by chunk (never whole anywhere), stored as
    plain uncompressed Zarr arrays: random values do not compress, and compressing and
    checksumming 4 GB would add to the cost of writing and of every pass, not to memory."""
    import zarr

    rng = da.random.default_rng(0)
    Z = rng.normal(size=(N, 2), chunks=(CHUNK, 2))
    X = Z @ _plane()
    y = da.map_blocks(_target, Z, rng.normal(size=(N, 1), chunks=(CHUNK, 1)), drop_axis=1,
                      dtype=np.float64)
    root = zarr.open_group(url, mode="w", zarr_format=3)
    stored = [root.create_array(name, shape=a.shape, chunks=a.chunksize, dtype=a.dtype,
                                compressors=None) for name, a in (("X", X), ("y", y))]
    da.store([X, y], stored, lock=False)


def _nystrom_reference(C, X, y, X_test):
    """The same sparse-GP mean solved densely in numpy on a sample (X, y) of the law.

    The SGPR mean is ``k(x*, C) b`` with ``(K_mn K_nm + sigma² K_mm) b = K_mn y``; on a
    sample of s rows the noise's share is ``sigma² s / N`` (sigma² = 1). Returns the
    predictions at X_test.
    """
    def k(A, B):  # Gaussian(1.0)
        sq = (A**2).sum(1)[:, None] + (B**2).sum(1)[None, :] - 2 * A @ B.T
        return np.exp(-0.5 * np.maximum(sq, 0.0))

    Ksm = k(X, C)
    beta = np.linalg.solve(Ksm.T @ Ksm + (len(X) / N) * k(C, C), Ksm.T @ y)
    return k(X_test, C) @ beta


@pytest.mark.distributed
@pytest.mark.slow
def test_fit_on_a_zarr_input_four_times_the_cluster_memory(tmp_path, record_figures):
    """A sparse-GP fit (8 centres; its statistics in one pass) reads 4.1 GB of Zarr input
    on a cluster with 1 GB of memory in all: it completes, no worker is killed by its
    nanny, and its predictions beat the mean and are as good as those of the same model
    (its centres) solved densely on a sample of the same law."""
    import shutil
    import threading
    import time

    from distributed import Client, LocalCluster

    from dkern.models import GaussianProcessRegressor

    free = shutil.disk_usage(tmp_path).free
    if free < DISK_NEEDED:
        pytest.skip(f"needs {DISK_NEEDED / 1e9:.0f} GB free under {tmp_path} for a 4.1 GB "
                    f"store; {free / 1e9:.1f} GB are")
    start = time.perf_counter()
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit=LIMIT, processes=True,
                      host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client, dask.config.set(scheduler=client):
        pids = client.run(os.getpid)
        samples, stop = [], threading.Event()
        sampler = threading.Thread(target=sample_worker_memory, args=(client, samples, stop))
        sampler.start()
        try:
            url = str(tmp_path / "big.zarr")
            _write_big_store(url)
            written = time.perf_counter()
            X = open_array(url, "X")
            assert X.nbytes >= 4 * LIMIT
            model = GaussianProcessRegressor(Gaussian(1.0), alpha=1.0, solver="nystrom",
                                             variance="nystrom", n_centers=8, optimizer=None,
                                             random_state=0)
            model.fit((url, "X"), (url, "y"))
            fitted = time.perf_counter()
        finally:
            stop.set()
            sampler.join()
            shutil.rmtree(tmp_path / "big.zarr", ignore_errors=True)  # 4 GB: not kept
        assert client.run(os.getpid) == pids, "a worker was restarted (killed by its nanny?)"
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(22_000, 2))
    X_all, y_all = Z @ _plane(), _target(Z, rng.normal(size=(22_000, 1)))
    pred, std = model.predict(X_all[:2000], return_std=True)
    mse = float(np.mean((pred - y_all[:2000]) ** 2))
    mse_ref = float(np.mean((_nystrom_reference(model.centers_, X_all[2000:], y_all[2000:],
                                                 X_all[:2000]) - y_all[:2000]) ** 2))
    mse_mean = float(np.var(y_all[:2000]))
    figures = {"input_bytes": int(X.nbytes), "worker_memory_limit": LIMIT, "workers": 1,
               "threads_per_worker": 2, "zarr_chunk_bytes": CHUNK * D * 8,
               "peak_worker_memory_sampled": int(max(samples, default=0)),
               "generate_s": round(written - start, 1),
               "fit_s": round(fitted - written, 1), "total_s": round(fitted - start, 1),
               "test_mse": mse, "test_mse_same_centres_dense_20000_rows": mse_ref,
               "test_mse_predicting_mean": mse_mean}
    record_figures("memory_4x", **figures)
    assert np.all(np.isfinite(pred)) and np.all((std >= 0) & (std <= 1.0)), figures
    assert mse < 0.2 * mse_mean, figures
    assert mse < 1.1 * mse_ref, figures
    assert max(samples) < 0.95 * LIMIT, figures
