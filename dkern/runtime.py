"""Where the work runs: an embedded LocalCluster by default, any Dask scheduler otherwise."""

from __future__ import annotations

import logging
import os
from typing import Any

from distributed import Client, LocalCluster

logger = logging.getLogger(__name__)

#: Environment variable naming a scheduler to connect to when no address is given.
SCHEDULER_ENV = "DKERN_SCHEDULER_ADDRESS"


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
    """
    address = address or os.environ.get(SCHEDULER_ENV) or None
    if address is None:
        kwargs.setdefault("n_workers", os.cpu_count() or 1)
        kwargs.setdefault("threads_per_worker", 1)
        kwargs.setdefault("dashboard_address", ":0")
        cluster = LocalCluster(**kwargs)
        client = Client(cluster)
    else:
        if not address.startswith(("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")):
            raise ValueError(f"address must be a Dask scheduler address such as "
                             f"'tcp://host:8786'; got {address!r}.")
        client = Client(address, **kwargs)
    logger.info("dkern connected to %s; dashboard: %s", client.scheduler.address,
                client.dashboard_link)
    return client
