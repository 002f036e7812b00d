"""A poison block (a task that kills every worker running it) ends in a dkern error that
names the block and its rows, after Dask's allowed failures: no hang, no bare KilledWorker."""

import time
from types import SimpleNamespace

import dask.array as da
import numpy as np
import pytest
from _resilience import PoisonGaussian, four_workers

import dkern
from dkern._failures import worker_failures
from dkern.errors import DkernError, WorkerFailureError
from dkern.io import check_store

MARK = 1e6
RNG = np.random.default_rng(11)


def test_killed_worker_key_is_named_by_block_and_rows(sync_scheduler):
    """Unit check of the translation: a KilledWorker for block (2, 0) of a Gram matvec over
    X chunked (100, 100, 100, 50) by Z (70 rows, one chunk) names rows 200-299 of X."""
    from distributed import KilledWorker

    X = da.from_array(RNG.normal(size=(350, 2)), chunks=(100, -1))
    op = dkern.gram(dkern.kernels.Gaussian(1.0), X, RNG.normal(size=(70, 2)), backend="numpy")
    product = op @ np.ones(70)
    layer = next(n for n in product.dask.layers if n.startswith("dk-gram-mv-")
                 and not n.startswith("dk-gram-mv-sum"))
    dead = SimpleNamespace(address="tcp://127.0.0.1:4242")
    with pytest.raises(WorkerFailureError) as info, worker_failures():
        raise KilledWorker((layer, 2, 0, 0), dead, 2)
    err = info.value
    assert isinstance(err, DkernError) and isinstance(err.__cause__, KilledWorker)
    assert err.rows == {"X": (200, 300), "Z": (0, 70)}
    assert err.key == (layer, 2, 0, 0)
    message = str(err)
    assert message.startswith("block (2, 0) of dk-gram-mv (rows 200–299 of X, rows 0–69 "
                              "of Z) killed its worker 3 times")
    assert "allowed-failures=2" in message and "tcp://127.0.0.1:4242" in message


def test_other_errors_pass_through_unchanged():
    with pytest.raises(ZeroDivisionError), worker_failures():
        raise ZeroDivisionError


def test_a_fused_task_is_named_by_its_row_block(sync_scheduler):
    """Dask fuses a block layer with the row-wise steps after it into one task named by
    their prefixes and indexed like the last step: its first index is X's row block."""
    from distributed import KilledWorker

    X = da.from_array(RNG.normal(size=(350, 2)), chunks=(100, -1))
    op = dkern.gram(dkern.kernels.Gaussian(1.0), X, RNG.normal(size=(70, 2)), backend="numpy",
                    name="dk-predict")
    assert (op @ np.ones(70)).shape == (350,)  # building the product registers its blocks
    key = ("dk-predict-dk-predict-sum-getitem-store-map-0123abcd", 3)
    with pytest.raises(WorkerFailureError) as info, worker_failures():
        raise KilledWorker(key, SimpleNamespace(address="tcp://127.0.0.1:1"), 0)
    assert info.value.rows == {"X": (300, 350)}
    assert str(info.value).startswith("block 3 of dk-predict (rows 300–349 of X) killed its "
                                      "worker once")
    with pytest.raises(WorkerFailureError) as info, worker_failures():
        raise KilledWorker(("getitem-0123abcd", 3), SimpleNamespace(address="tcp://h:1"), 0)
    assert info.value.rows == {} and str(info.value).startswith("task ('getitem-0123abcd', 3)")


@pytest.mark.distributed
@pytest.mark.slow
def test_poison_block_fails_with_its_rows_not_a_hang(tmp_path):
    """Predicting to Zarr with a test row that kills every worker: after 2 deaths
    (allowed-failures=1) the error names block 2 of dk-predict and rows 200-299, chains
    the KilledWorker, and nothing is published. On the old code: a bare KilledWorker."""
    from distributed import KilledWorker

    X = RNG.normal(size=(120, 2))
    model = dkern.KernelRidge(PoisonGaussian(1.0, marker=MARK), alpha=0.1, solver="exact",
                              backend="numpy").fit(X, np.sin(X[:, 0]))
    Xt = RNG.normal(size=(400, 2))
    Xt[257, 0] = MARK  # in row chunk 2 of 100-row chunks
    url = str(tmp_path / "pred.zarr")
    with four_workers(allowed_failures=1):
        start = time.monotonic()
        with pytest.raises(WorkerFailureError) as info:
            model.predict(da.from_array(Xt, chunks=(100, -1)), out=(url, "pred"))
        elapsed = time.monotonic() - start
    err = info.value
    assert isinstance(err.__cause__, KilledWorker)
    assert err.layer.startswith("dk-predict-") and err.rows["X"] == (200, 300)
    # Dask fuses the block with its sum and the store into one task (index 2) or not (2, 0)
    assert "of dk-predict (rows 200–299 of X" in str(err)
    assert "killed its worker 2 times" in str(err)
    assert elapsed < 300, f"the poison block took {elapsed:.0f} s to be reported"
    assert not (tmp_path / "pred.zarr").exists() or check_store(url).ok


def test_a_cluster_left_without_workers_fails_its_tasks_not_a_hang():
    """Every worker gone and none coming back: the embedded cluster's tasks fail with a
    WorkerFailureError naming the cause after the scheduler's no-workers-timeout, which
    dkern sets to 300 s unless dask's config sets it (here 2 s). On the old code the client
    waited for ever: a CI run stalled so for 45 minutes when its one worker died."""
    import dask
    from distributed.scheduler import NoWorkerError

    with dkern.connect(processes=False, n_workers=1) as client:
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.no_workers_timeout) \
            == 300
    with dask.config.set({"distributed.scheduler.no-workers-timeout": "2s"}), \
            dkern.connect(processes=False, n_workers=1) as client:
        client.started_cluster.scale(0)
        while client.scheduler_info()["workers"]:
            time.sleep(0.05)
        start = time.monotonic()
        with pytest.raises(WorkerFailureError,
                           match="found no worker to run it for 2 s.*workers died") as info, \
                worker_failures():
            da.ones((4, 2), chunks=(2, 2)).sum().compute()
        assert time.monotonic() - start < 30
    assert isinstance(info.value.__cause__, NoWorkerError)


def test_workers_paused_past_the_no_workers_timeout_are_named_as_paused():
    """distributed counts a paused worker as not running: a job whose only worker stays
    paused for memory past the timeout fails saying so, not that its workers died."""
    import dask
    from distributed.core import Status

    def pause(dask_worker):
        dask_worker.periodic_callbacks["memory_monitor"].stop()  # stays paused, as when full
        dask_worker.status = Status.paused

    with dask.config.set({"distributed.scheduler.no-workers-timeout": "2s"}), \
            dkern.connect(processes=False, n_workers=1) as client:
        client.run(pause)
        with pytest.raises(WorkerFailureError, match="1 worker.s. stayed paused for memory"), \
                worker_failures():
            da.ones((4, 2), chunks=(2, 2)).sum().compute()
