"""A client-side watch that says, within seconds, when workers are paused for memory.

A paused worker runs no task; a job whose tasks sit on paused workers waits without end
and without a word on the client (distributed logs the pause on the worker only).
"""

from __future__ import annotations

import logging
import threading
import warnings
import weakref
from typing import Any

from dask.utils import format_bytes

from .config import worker_config

logger = logging.getLogger(__name__)


class WorkersPausedWarning(UserWarning):
    """Workers are paused for memory: tasks on them wait until their memory falls."""


def paused_workers(info: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``{address: (process memory, memory limit)}`` of the paused workers in ``info``.

    Parameters
    ----------
    info : dict
        ``Client.scheduler_info()``.
    """
    return {address: (int(w.get("metrics", {}).get("memory", 0)), int(w.get("memory_limit") or 0))
            for address, w in info.get("workers", {}).items() if w.get("status") == "paused"}


def pause_message(paused: dict[str, tuple[int, int]]) -> str:
    """The warning for ``paused`` (from ``paused_workers``), naming each worker and the fix."""
    names = "; ".join(f"{address} at {format_bytes(memory)} of its {format_bytes(limit)} limit"
                      for address, (memory, limit) in sorted(paused.items()))
    return (f"{len(paused)} dask worker(s) paused for memory, running no tasks until their "
            f"memory falls below distributed.worker.memory.pause: {names}. Tasks that no other "
            f"worker can run wait until then, or fail after the scheduler's "
            f"distributed.scheduler.no-workers-timeout (on the schedulers dkern "
            f"starts: {worker_config()['distributed.scheduler.no-workers-timeout']} unless "
            f"dask's config sets another; a scheduler without it waits for ever). Give the "
            f"workers more memory (memory_limit= in dkern.connect, --memory-limit for dask worker; "
            f"cluster/README.md states the smallest sensible limit), or use smaller chunks.")


class PauseWatch:
    """A daemon thread asking the scheduler every ``interval`` seconds for paused workers.

    It warns (``logging`` WARNING and a ``WorkersPausedWarning``) once per episode: again
    only after the set of paused workers changes. It ends with its client.
    """

    def __init__(self, client: Any, interval: float = 1.0) -> None:
        self._client = weakref.ref(client)
        self.interval = interval
        self.warned: frozenset[str] = frozenset()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dkern-pause-watch", daemon=True)

    def start(self) -> PauseWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def check(self) -> dict[str, tuple[int, int]]:
        """Ask once; warn if workers are newly paused. Returns the paused workers."""
        client = self._client()
        if client is None or client.status in ("closing", "closed"):
            self.stopped.set()
            return {}
        if client.status != "running":  # e.g. "connecting" again after a dropped comm
            return {}
        paused = paused_workers(client.scheduler_info(n_workers=-1))
        if paused and frozenset(paused) != self.warned:
            message = pause_message(paused)
            logger.warning(message)
            warnings.warn(message, WorkersPausedWarning, stacklevel=2)
        self.warned = frozenset(paused)
        return paused

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.check()
            except Exception as err:  # e.g. the client closing between two checks
                logger.debug("pause watch: %s", err)
