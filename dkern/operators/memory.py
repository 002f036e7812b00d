"""How much memory the workers can give to data kept on the cluster (persisted blocks)."""

from __future__ import annotations

import logging

import dask.base
import psutil

logger = logging.getLogger(__name__)

#: Share of the workers' memory that persisted blocks may take: dask's workers spill at
#: 60% of their limit and pause at 80%, and the tasks of a pass need room of their own.
PERSIST_FRACTION = 0.3


def persist_budget() -> int:
    """Bytes that data persisted on the current scheduler's workers may take, in total.

    A ``distributed`` client as the scheduler: ``PERSIST_FRACTION`` of the smallest
    worker's memory limit times the number of workers (blocks spread evenly); a worker
    without a limit counts the machine's available memory. Dask's local schedulers keep
    persisted blocks in this process: ``PERSIST_FRACTION`` of its available memory.
    """
    client = getattr(dask.base.get_scheduler(), "__self__", None)
    info = getattr(client, "scheduler_info", None)
    available = psutil.virtual_memory().available
    if info is None:
        return int(PERSIST_FRACTION * available)
    try:
        workers = info(n_workers=-1)["workers"].values()  # some versions list only a few
    except TypeError:  # versions without n_workers list them all
        workers = info()["workers"].values()
    limits = [w.get("memory_limit") or available for w in workers]
    if not limits:
        return 0
    return int(PERSIST_FRACTION * min(limits) * len(limits))

