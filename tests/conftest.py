"""Shared fixtures: a LocalCluster with two worker processes for the distributed tests."""

import dask
import pytest


@pytest.fixture(scope="session")
def cluster_client():
    """A real ``distributed`` client over two single-threaded worker processes."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


@pytest.fixture
def sync_scheduler():
    """Run dask graphs in this thread (fast, and tracemalloc sees every allocation)."""
    with dask.config.set(scheduler="synchronous"):
        yield
