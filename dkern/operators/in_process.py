"""Small passes over in-memory arrays run on this process's threads, not on the cluster.

A pass over numpy arrays on a ``distributed`` client first ships the arrays to the
workers and the results back, and waits on the scheduler for every task: for a few
thousand query rows that fixed cost is most of the call (benchmarks/toolbox.py). When
every input is in memory and the pass is small, :func:`in_process` runs the same graph
(the same chunks, block functions and combine tree, so the same numbers) on dask's
threaded scheduler: a pool of one thread per core in this process, each block with BLAS
on one thread as the backends arrange. Dask and Zarr inputs always go to the scheduler
in use (their chunks are read where the work runs, never gathered here).

The choice is per call, not global: the block sets a context variable that the pass's
own dask calls read (``dask.compute(..., scheduler=pass_scheduler())``), so another
thread of this process computing at the same time keeps its scheduler. (``dask.config``
is one dict for the whole process: setting its scheduler there would move that thread's
work too, and a ``persist`` there would keep its results here rather than on the cluster.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import dask
import dask.local
import dask.multiprocessing
import dask.threaded
import numpy as np
from dask.base import get_scheduler

__all__ = ["IN_PROCESS_PAIRS", "in_process", "pass_scheduler"]

logger = logging.getLogger(__name__)

#: Pairs (query rows × training rows) up to which a pass over in-memory arrays runs in
#: this process: 2,000 queries of a million rows, seconds of work on a few cores, where
#: shipping the rows to the workers costs as much as the pass. Larger passes go to the
#: scheduler in use, which may have more cores than this machine.
IN_PROCESS_PAIRS = 2**31

#: dask's own schedulers, which already run where they are called (or were chosen as such).
_LOCAL = (dask.threaded.get, dask.local.get_sync, dask.multiprocessing.get)

#: The scheduler of the in-process pass running in this context (thread); None: none.
_PASS_SCHEDULER: ContextVar[str | None] = ContextVar("dkern_pass_scheduler", default=None)


def pass_scheduler() -> str | None:
    """The ``scheduler=`` of a dask call made by a pass: ``"threads"`` inside an
    :func:`in_process` block that runs in this process, None (dask's default, the client
    in use) anywhere else, and in every other thread."""
    return _PASS_SCHEDULER.get()


@contextlib.contextmanager
def in_process(pairs: float, *arrays: Any, name: str) -> Iterator[bool]:
    """Within the block, the pass's dask calls compute on this process's threads when it
    is small: they pass ``scheduler=pass_scheduler()``.

    Parameters
    ----------
    pairs : float
        Rows × columns the pass computes (query rows × training rows, or centres).
    *arrays : array-like or None
        The pass's inputs; a dask array, a Zarr array or a store reference among them
        (anything but numpy and None) keeps the scheduler in use.
    name : str
        The pass, as the debug log names it (``"dk-knn"``).

    Yields
    ------
    bool
        Whether the block runs in this process: in-memory inputs, ``pairs`` at most
        :data:`IN_PROCESS_PAIRS` and a ``distributed`` (or other remote) scheduler in use.
        dask's local schedulers are left as they are.
    """
    in_memory = all(a is None or isinstance(a, np.ndarray) for a in arrays)
    scheduler = get_scheduler()  # None: dask's default, threads for arrays
    remote = scheduler is not None and scheduler not in _LOCAL
    local = remote and in_memory and pairs <= IN_PROCESS_PAIRS
    if remote:
        logger.debug("%s: %.3g pairs, %s inputs: %s (in-process up to %.3g pairs)", name,
                     pairs, "in-memory" if in_memory else "lazy",
                     "this process's threads" if local else "the scheduler in use",
                     IN_PROCESS_PAIRS)
    if not local:
        yield False
        return
    token = _PASS_SCHEDULER.set("threads")
    try:
        yield True
    finally:
        _PASS_SCHEDULER.reset(token)
