"""Worker preload (named in ``worker.yaml``): return freed heap to the OS near the limit.

With ``MALLOC_TRIM_THRESHOLD_``/``MALLOC_MMAP_THRESHOLD_`` at 32 MiB (fast kernel tiles),
glibc keeps freed tiles on the heap; small live arrays allocated between them pin the
holes, so a worker's process memory stays near its peak. Above distributed's pause
fraction the worker then runs no task again: nothing frees memory, it never resumes. Here
a periodic callback on the worker's event loop, which runs while paused too, calls
``malloc_trim(0)`` whenever process memory is above ``dkern.worker.trim-above`` of the
limit. Below that fraction nothing changes, so tiles keep reusing warm heap pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from typing import Any

import dask
from dask.utils import format_bytes, parse_timedelta
from threadpoolctl import threadpool_limits
from tornado.ioloop import PeriodicCallback

logger = logging.getLogger(__name__)

_CALLBACK = "dkern-malloc-trim"


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class Trimmer:
    """Calls ``malloc_trim(0)`` when ``worker``'s process memory passes ``fraction`` of its limit.

    Parameters
    ----------
    worker : distributed.Worker
    fraction : float
        Of the worker's memory limit; no limit, no trimming.
    trim : callable
        ``malloc_trim``.
    """

    def __init__(self, worker: Any, fraction: float, trim: Callable[[int], int]) -> None:
        self.worker, self.fraction, self.trim = worker, fraction, trim

    def __call__(self) -> None:
        limit = self.worker.memory_manager.memory_limit
        if not limit:
            return
        before = self.worker.monitor.get_process_memory()
        if before <= self.fraction * limit:
            return
        self.trim(0)
        logger.debug("malloc_trim: process memory %s -> %s (limit %s)", format_bytes(before),
                     format_bytes(self.worker.monitor.get_process_memory()),
                     format_bytes(limit))


def dask_setup(worker: Any) -> None:
    """Start the trimming callback on ``worker`` (distributed's preload hook), and give its
    BLAS the threads ``DKERN_BLAS_THREADS`` names (GPU workers: their share of the cores;
    a forked worker's OpenBLAS read its thread count in the fork server, so the variable
    alone would change nothing)."""
    threads = os.environ.get("DKERN_BLAS_THREADS")
    if threads:
        threadpool_limits(int(threads), user_api="blas")
        logger.info("worker BLAS threads: %s", threads)
    trim = _malloc_trim()
    if trim is None:
        logger.info("no malloc_trim in this C library; freed heap is not trimmed")
        return
    fraction = float(dask.config.get("dkern.worker.trim-above", 0.5))
    interval = parse_timedelta(dask.config.get("dkern.worker.trim-interval", "500ms"))
    callback = PeriodicCallback(Trimmer(worker, fraction, trim), interval * 1000)
    # The worker stops every entry of periodic_callbacks when it closes.
    worker.periodic_callbacks[_CALLBACK] = callback
    callback.start()
