"""Worker processes forked from one server that imported dkern once.

A spawned worker process imports numpy, scipy, dask, distributed, zarr and dkern before it
runs its first task: seconds of CPU per worker, paid again by every embedded cluster (each
``dkern`` command starts one). With multiprocessing's ``forkserver`` start method one server
process imports them once and every worker is a fork of it. The server is started while
dkern's worker environment (``pre-spawn-environ``: malloc thresholds, one BLAS thread) is in
``os.environ``, because a fork inherits the server's environment and the settings glibc and
OpenBLAS read at start-up, not the nanny's. Where ``forkserver`` does not exist (Windows)
workers are spawned as before.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from multiprocessing import forkserver

import dask
from distributed import Nanny
from distributed.core import Status

logger = logging.getLogger(__name__)

#: What the server imports before it forks workers (``dkern`` imports numpy, scipy, dask,
#: zarr and scikit-learn with it).
PRELOAD = ["distributed", "dkern"]

#: The dask setting that names the start method of worker processes.
METHOD_KEY = "distributed.worker.multiprocessing-method"


def user_start_method() -> str | None:
    """The start method the user's Dask config names, if it names one: a value other than
    distributed's default ``"spawn"``, or any value set by its environment variable.
    dkern's setting yields to it."""
    method = dask.config.get(METHOD_KEY, "spawn")
    chosen = method != "spawn" or "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD" in os.environ
    return method if chosen else None


def worker_start_method(requested: str) -> str:
    """The start method to give ``METHOD_KEY``: ``requested``, or ``"spawn"`` where this
    platform has no fork server.

    Parameters
    ----------
    requested : str
        The method dkern's worker settings ask for.
    """
    if requested == "forkserver" and "forkserver" not in multiprocessing.get_all_start_methods():
        logger.info("no forkserver start method on this platform: worker processes are spawned")
        return "spawn"
    return requested


#: ``os.environ`` when this process's fork server started (its workers' environment).
_server_environ: dict[str, str] = {}


def start_preloaded_forkserver() -> dict[str, str]:
    """Start this process's fork server with ``PRELOAD`` imported, if it is not running,
    and return what ``os.environ`` has set differently since it started.

    Call it while the workers' environment is in ``os.environ``: the server keeps the
    environment it starts with for every worker it forks. Give the returned variables to
    the nannies (``env=``), which set them in each worker as it starts, so a variable set
    after an earlier cluster still reaches the workers of the next (those read only at
    process start, such as glibc's, keep the server's values).
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    if not _server_environ:  # the first call starts the server (this process's first cluster)
        _server_environ.update(os.environ)
    forkserver.ensure_running()
    return {key: value for key, value in os.environ.items()
            if _server_environ.get(key) != value}


class ForkserverNanny(Nanny):
    """A nanny that starts its worker from the fork server again when it restarts it.

    distributed reads the start method from the Dask config each time a nanny starts its
    worker process; dkern's setting is in force only while ``connect()`` creates the
    cluster, so without this a restart (``client.restart()``, a worker past its memory
    limit) would spawn instead, and that worker never came back.
    """

    async def instantiate(self) -> Status:
        with dask.config.set({METHOD_KEY: "forkserver"}):
            return await super().instantiate()
