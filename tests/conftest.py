"""Shared fixtures: a LocalCluster with two worker processes for the distributed tests."""

import dask
import pytest


@pytest.fixture(scope="session")
def _session_cluster():
    """A LocalCluster with two single-threaded worker processes, started once per session.

    Its client is not made the global default: a test that does not ask for it runs on
    dask's local scheduler, whatever ran before it."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def cluster_client(_session_cluster):
    """A real ``distributed`` client, the scheduler of every dask call in the test."""
    with dask.config.set(scheduler=_session_cluster):
        yield _session_cluster


@pytest.fixture
def sync_scheduler():
    """Run dask graphs in this thread (fast, and tracemalloc sees every allocation)."""
    with dask.config.set(scheduler="synchronous"):
        yield


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip cleanly without a CUDA GPU that KeOps can use (CI has none)."""
    from dkern.backends import gpu_visible, keops_status

    if not any("gpu" in item.keywords for item in items):
        return
    if gpu_visible() and keops_status().available:
        return
    reason = ("needs a CUDA GPU visible to KeOps" if not gpu_visible()
              else f"a GPU is visible but KeOps does not work: {keops_status().detail}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
