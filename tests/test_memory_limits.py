"""Memory limits: work whose single task cannot fit in a worker is refused before it runs,
and a fit on a Zarr input several times the cluster's memory completes without a worker
being killed."""

import re
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest

from dkern.errors import MemoryLimitError
from dkern.io import open_array, write_array
from dkern.kernels import Gaussian
from dkern.models import KernelRidge
from dkern.operators import gram
from dkern.operators.memory import TASK_FRACTION, check_row_chunks, row_task_bytes


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
    assert f"over the {TASK_FRACTION * 400e6 / 1e6:.0f} MB a task may take" in message
    after = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)
    assert after == transitions, "tasks were submitted before the refusal"
    # The advice is consistent: chunks of the rows it names are accepted, twice that not.
    rows = int(re.search(r"chunk_rows=(\d+)", message).group(1))
    assert 1 <= rows < 3_000_000
    with dask.config.set(scheduler=client):
        check_row_chunks(da.zeros((2 * rows, 8), chunks=(rows, 8)))
        with pytest.raises(MemoryLimitError):
            check_row_chunks(da.zeros((2 * rows, 8), chunks=(2 * rows, 8)))
