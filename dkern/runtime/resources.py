"""How much memory the current cluster's workers have left for one task, as measured.

A worker process holds memory before any task runs: Python, numpy, dask, dkern, zarr. How
much depends on the machine and the libraries (175 MiB on one, 215 MiB on another), and
the room left below distributed's pause threshold is what decides whether a task runs or
the worker pauses for good. This module asks each worker for its process memory instead of
assuming a figure (the scheduler's copy, sent with heartbeats, can predate the imports that
connect() triggers: 62 MiB against 176 MiB measured a second later).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.base
import psutil

from .config import worker_config

__all__ = ["ADVICE_MARGIN", "PAUSE_FRACTION", "TASK_FRACTION", "TaskBudget", "scheduler_workers",
           "task_budget"]

#: Share of its memory limit above which a dkern worker pauses (``WORKER_CONFIG``).
PAUSE_FRACTION = float(worker_config()["distributed.worker.memory.pause"])
#: Share of a worker's memory limit that the tasks it runs side by side may take at most,
#: whatever the worker holds: data waiting between tasks needs room too.
TASK_FRACTION = 0.5

#: Share of a measured budget that advised and default chunk sizes use: a worker's process
#: memory moves by a few MB between two measurements, and advice at the very edge of the
#: budget would be refused by the next check.
ADVICE_MARGIN = 0.9


@dataclass(frozen=True)
class TaskBudget:
    """What one task may take on the tightest worker, and why.

    Attributes
    ----------
    budget : int
        Bytes one task may add: ``min(TASK_FRACTION · limit, PAUSE_FRACTION · limit −
        used) / nthreads`` (0 when the worker is already at its pause threshold).
    limit : int
        That worker's memory limit, bytes.
    nthreads : int
        Its threads: tasks running side by side.
    used : int
        Its measured memory that is not dask data (process memory less managed bytes).
    """

    budget: int
    limit: int
    nthreads: int
    used: int

    def limit_for(self, task_bytes: int) -> int:
        """The smallest memory limit that gives each thread ``task_bytes`` beside ``used``."""
        return int(max((self.used + self.nthreads * task_bytes) / PAUSE_FRACTION,
                       self.nthreads * task_bytes / TASK_FRACTION))

    def describe(self) -> str:
        """The figures, for error messages."""
        return (f"memory_limit {self.limit / 1e6:.0f} MB, {self.nthreads} thread(s), "
                f"{self.used / 2**20:.0f} MiB already in use by the worker process, pause at "
                f"{PAUSE_FRACTION:.0%} of the limit; dkern allows a thread at most "
                f"{TASK_FRACTION:.0%} of the limit")


def scheduler_workers() -> list[dict[str, Any]] | None:
    """The current ``distributed`` scheduler's worker records; None for local schedulers."""
    client = getattr(dask.base.get_scheduler(), "__self__", None)
    info = getattr(client, "scheduler_info", None)
    if info is None:
        return None
    try:
        workers = info(n_workers=-1)["workers"]  # some versions list only a few
    except TypeError:  # versions without n_workers list them all
        workers = info()["workers"]
    memory = _process_memory(client)
    return [{**w, "metrics": {**w.get("metrics", {}),
                              "memory": memory.get(address, w.get("metrics", {}).get("memory", 0))}}
            for address, w in workers.items()]


def _process_memory(client: Any) -> dict[str, int]:
    """``{worker address: process memory}``, asked now; ``{}`` if the workers cannot answer
    (then the scheduler's heartbeat figures serve)."""
    try:
        return dict(client.run(process_rss))
    except Exception:  # noqa: BLE001  (a worker gone or unreachable: fall back, not fail)
        return {}


def process_rss() -> int:
    """This process's resident memory, bytes (what distributed's ``memory`` metric is)."""
    return int(psutil.Process().memory_info().rss)


def task_budget(workers: list[dict[str, Any]] | None) -> TaskBudget | None:
    """The :class:`TaskBudget` of the worker in ``workers`` where it is smallest.

    None without workers or when none has a memory limit. A record without ``metrics``
    counts no memory in use.
    """
    budgets = [_budget(w) for w in workers or () if w.get("memory_limit")]
    return min(budgets, key=lambda b: b.budget, default=None)


def _budget(worker: dict[str, Any]) -> TaskBudget:
    """One worker record's :class:`TaskBudget`."""
    limit = int(worker["memory_limit"])
    nthreads = max(1, int(worker.get("nthreads") or 1))
    metrics = worker.get("metrics") or {}
    # Managed bytes are dask's data, which the worker spills to disk before it pauses.
    used = max(0, int(metrics.get("memory", 0)) - int(metrics.get("managed_bytes", 0)))
    room = min(TASK_FRACTION * limit, PAUSE_FRACTION * limit - used)
    return TaskBudget(max(0, int(room / nthreads)), limit, nthreads, used)
