"""Helpers of the worker-loss and poison-block tests: picklable kernels that misbehave
on marked rows, a four-worker LocalCluster, and a way to kill one of its workers.

The kernels are module-level so the worker processes can unpickle them (this
directory is on their ``sys.path``: the nanny spawns them with the test's path).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator

import dask
import numpy as np

from dkern.kernels import Gaussian


class PoisonGaussian(Gaussian):
    """A Gaussian kernel that kills its process whenever its first argument holds a row
    whose feature 0 equals ``marker``: a block that kills every worker running it."""

    def __init__(self, lengthscale: float = 1.0, marker: float = 1e6) -> None:
        self.marker = marker
        super().__init__(lengthscale)

    def __call__(self, X, Z=None):
        if np.any(np.asarray(X)[:, 0] == self.marker):
            os._exit(1)
        return super().__call__(X, Z)


class GatedGaussian(Gaussian):
    """A Gaussian kernel whose blocks with a row of feature 0 equal to ``marker`` wait
    (up to ``timeout`` s) until the file ``gate`` exists: it holds part of a job back so a
    test can kill a worker while that part is still to run, on any machine speed."""

    def __init__(self, lengthscale: float = 1.0, marker: float = 0.5, gate: str = "",
                 timeout: float = 120.0) -> None:
        self.marker, self.gate, self.timeout = marker, gate, timeout
        super().__init__(lengthscale)

    def __call__(self, X, Z=None):
        if np.any(np.asarray(X)[:, 0] == self.marker):
            deadline = time.monotonic() + self.timeout
            while not os.path.exists(self.gate):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {self.gate} stayed closed")
                time.sleep(0.02)
        return super().__call__(X, Z)


@contextlib.contextmanager
def four_workers(allowed_failures: int = 3) -> Iterator:
    """A LocalCluster of 4 single-threaded worker processes as every dask call's scheduler.

    ``allowed_failures`` is the scheduler's ``distributed.scheduler.allowed-failures``,
    read when the scheduler starts."""
    from distributed import Client, LocalCluster

    # The client becomes the default scheduler by name: a Client object in dask's config
    # would be pickled with it into every worker process the nanny restarts, and fail.
    # LocalCluster closes a nanny for good when its restarted worker has not registered
    # within lost-worker-timeout (15 s) of the kill, read when the worker is removed: on a
    # loaded 2-core CI host a restart took longer, and the cluster stayed at 3 workers.
    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures,
                          "distributed.deploy.lost-worker-timeout": "300s"}), \
            LocalCluster(n_workers=4, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(4, timeout=120)
        yield client


def kill_a_worker(client) -> int:
    """SIGKILL one worker process (its nanny restarts it); returns its PID."""
    pids = client.run(os.getpid, wait=True)
    pid = pids[sorted(pids)[0]]
    os.kill(pid, signal.SIGKILL)
    return pid


class KillAtIteration(logging.Handler):
    """Kills one worker when the CG loop logs iteration ``k`` (its DEBUG record
    ``CG iteration %d: ...`` comes once per iteration, on the client)."""

    def __init__(self, client, k: int) -> None:
        super().__init__(logging.DEBUG)
        self.client, self.k = client, k
        self.killed: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if (self.killed is None and record.msg.startswith("CG iteration")
                and record.args and record.args[0] == self.k):
            self.killed = kill_a_worker(self.client)


@contextlib.contextmanager
def killing_at(client, k: int) -> Iterator[KillAtIteration]:
    """Install a :class:`KillAtIteration` on dkern's CG logger for the block."""
    logger = logging.getLogger("dkern.solvers.cg")
    handler, level = KillAtIteration(client, k), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
