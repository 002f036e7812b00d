"""Where the work runs: an embedded LocalCluster by default, any Dask scheduler otherwise."""

from __future__ import annotations

import logging
import os
from typing import Any

import dask
from distributed import Client, LocalCluster

logger = logging.getLogger(__name__)

#: Environment variable naming a scheduler to connect to when no address is given.
SCHEDULER_ENV = "DKERN_SCHEDULER_ADDRESS"

#: glibc settings for the embedded cluster's worker processes. distributed's nanny sets
#: MALLOC_TRIM_THRESHOLD_=64 KiB, which also freezes glibc's mmap threshold at 128 KiB: every
#: 4 MiB kernel tile is then a fresh mmap, zero-filled page by page (many times the page
#: faults, and passes far slower than in-process: benchmarks/RESULTS.md). 32 MiB keeps tiles
#: on the heap.
WORKER_MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(32 * 2**20),
                     "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}


def connect(address: str | None = None, **kwargs: Any) -> Client:
    """A ``distributed.Client`` for dkern's work.

    Parameters
    ----------
    address : str, optional
        A scheduler address (``tcp://host:8786``, ``tls://…``). Without one,
        ``$DKERN_SCHEDULER_ADDRESS`` is used if set, else an embedded
        ``LocalCluster`` starts (one single-threaded worker process per core by
        default, so each worker's BLAS uses one core).
    **kwargs
        Passed to ``LocalCluster`` (e.g. ``n_workers``, ``memory_limit``) for the
        embedded cluster, or to ``Client`` for a remote scheduler.

    Returns
    -------
    distributed.Client
        Its dashboard link is logged at INFO level.

    Raises
    ------
    ValueError
        ``address`` is not a scheduler address.
    ConnectionError
        No scheduler answers at ``address`` (within distributed's connect timeout).
    """
    address = address or os.environ.get(SCHEDULER_ENV) or None
    if address is None:
        kwargs.setdefault("n_workers", os.cpu_count() or 1)
        kwargs.setdefault("threads_per_worker", 1)
        kwargs.setdefault("dashboard_address", ":0")
        # Read by each nanny when it is created (and reused if it restarts its worker).
        with dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v
                              for k, v in WORKER_MALLOC_ENV.items()}):
            cluster = LocalCluster(**kwargs)
        client = Client(cluster)
    else:
        if not address.startswith(("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")):
            raise ValueError(f"address must be a Dask scheduler address such as "
                             f"'tcp://host:8786'; got {address!r}.")
        try:
            client = Client(address, **kwargs)
        except OSError as err:
            raise ConnectionError(
                f"could not reach the Dask scheduler at {address!r}: {err}. Start it (see "
                f"cluster/README.md) or check the address; with no address (and "
                f"${SCHEDULER_ENV} unset) dkern starts an embedded LocalCluster.") from err
    logger.info("dkern connected to %s; dashboard: %s", client.scheduler.address,
                client.dashboard_link)
    return client
