"""The pieces a plan is built of: the cluster, the data, one pass's time, one worker's memory.

A pass over the data is one task per row chunk (or per chunk pair), run on
``workers × threads`` slots side by side; its wall time is the makespan of those tasks
plus one round trip to the scheduler and its per-task cost. A task's time is its rows
times the block function's time per row (kernel entries × :meth:`Rates.per_entry`, or a
BLAS rate), plus reading its chunk from the store when the chunk is not persisted.

A worker's peak memory is what it holds at once: the idle process (Python, numpy, dask,
dkern), its share of the persisted blocks (whole chunks: one chunk on two workers is all
on one), and, per thread, one task's temporaries (the chunk as read, kernel tiles, partial
results), plus the M × M matrices broadcast to every worker, plus the freed heap glibc keeps
(:func:`kept_heap_bytes`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from ..operators.memory import PERSIST_FRACTION, READ_FACTOR, TILE_OVERHEAD
from ..runtime import WORKER_MALLOC_ENV
from ..runtime.resources import PAUSE_FRACTION, TASK_FRACTION
from .rates import Rates

__all__ = ["Cluster", "Data", "Phase", "Plan", "kept_heap_bytes", "makespan", "pass_seconds",
           "read_task_bytes", "row_pass", "task_budget"]

#: Bytes of a float64 value: the solvers compute in float64 whatever the stored dtype.
FLOAT = 8


@dataclass(frozen=True)
class Cluster:
    """Where the run goes: ``workers`` processes of ``threads`` threads, each process
    allowed ``memory_limit`` bytes."""

    workers: int
    threads: int
    memory_limit: int

    @property
    def slots(self) -> int:
        """Tasks that run side by side."""
        return self.workers * self.threads


@dataclass(frozen=True)
class Data:
    """n rows of d features in row chunks of ``chunk_rows``, ``itemsize`` bytes a value
    as stored, with ``targets`` target columns. A ``chunk_rows`` above n is taken as n:
    the one chunk holds only the rows there are."""

    n: int
    d: int
    chunk_rows: int
    itemsize: int = 8
    targets: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_rows", max(1, min(self.chunk_rows, self.n)))

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """``(rows, count)`` of the chunks: the full ones, then the remainder. Grouped, so
        a plan costs the same at 10^9 rows in chunks of one row as at 10^5."""
        full, rest = divmod(self.n, self.chunk_rows)
        return [(self.chunk_rows, full)] * bool(full) + [(rest, 1)] * bool(rest)

    @property
    def n_chunks(self) -> int:
        return -(-self.n // self.chunk_rows)

    @property
    def nbytes(self) -> int:
        """Bytes of X in float64, as the solvers hold it."""
        return self.n * self.d * FLOAT

    def chunks_per_worker(self, cluster: Cluster) -> int:
        """Chunks on the busiest worker when they are spread evenly (whole chunks)."""
        return math.ceil(self.n_chunks / cluster.workers)


@dataclass(frozen=True)
class Phase:
    """One step of a run: its wall ``seconds``, the ``passes`` over the data it makes, the
    kernel ``entries`` it evaluates and the ``bytes_read`` from the store."""

    name: str
    seconds: float
    passes: int = 0
    entries: float = 0.0
    bytes_read: float = 0.0
    note: str = ""


@dataclass
class Plan:
    """The predicted run: phases, one worker's memory by part, the client's, and warnings."""

    phases: list[Phase]
    worker_memory: dict[str, int]
    client_memory_bytes: int
    cluster: Cluster
    warnings: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def worker_memory_bytes(self) -> int:
        return sum(self.worker_memory.values())

    def report(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict (``dkern plan --json``)."""
        return {
            "seconds": round(self.seconds, 2),
            "worker_memory_bytes": int(self.worker_memory_bytes),
            "worker_memory_limit": int(self.cluster.memory_limit),
            "fits": not any(w.startswith("memory") for w in self.warnings),
            "client_memory_bytes": int(self.client_memory_bytes),
            "passes": sum(p.passes for p in self.phases),
            "entries": float(sum(p.entries for p in self.phases)),
            "bytes_read": float(sum(p.bytes_read for p in self.phases)),
            "phases": {p.name: {"seconds": round(p.seconds, 3), "passes": p.passes,
                                "entries": p.entries, "bytes_read": p.bytes_read,
                                **({"note": p.note} if p.note else {})} for p in self.phases},
            "worker_memory": {k: int(v) for k, v in self.worker_memory.items()},
            "cluster": {"workers": self.cluster.workers, "threads": self.cluster.threads,
                        "memory_limit": self.cluster.memory_limit},
            "warnings": list(self.warnings),
            "assumptions": list(self.assumptions),
        }


def makespan(tasks: list[tuple[float, int]], slots: int) -> float:
    """Wall time of tasks, ``(seconds, count)`` groups in order, run on ``slots`` worker
    threads, each task to the first free slot (dask's scheduler with equal-sized chunks does
    no better or worse). A group's whole rounds of one task per slot are placed at once:
    exact where the slots are level (a pass's first group), else up to one of its tasks
    longer than placing them one by one (0.5% at n = 123,457 in chunks of 7,000 on 8 slots),
    and a plan of 10⁹ chunks costs no more than one of ten."""
    free = [0.0] * max(1, min(slots, sum(count for _, count in tasks)))
    for seconds, count in tasks:
        rounds, rest = divmod(count, len(free))
        if rounds:
            free = sorted(f + rounds * seconds for f in free)
        for _ in range(rest):
            heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free, default=0.0)


def pass_seconds(tasks: list[tuple[float, int]], cluster: Cluster, rates: Rates) -> float:
    """One pass of ``(seconds, count)`` task groups: their makespan, one round trip, and the
    scheduler's time per task."""
    return (makespan(tasks, cluster.slots) + rates.round_trip_seconds
            + sum(count for _, count in tasks) * rates.task_seconds)


def row_pass(name: str, data: Data, cluster: Cluster, rates: Rates, per_row: float, *,
             entries_per_row: float = 0.0, read: bool = True, count: int = 1,
             note: str = "") -> Phase:
    """``count`` passes of one task per row chunk costing ``per_row`` seconds a row, plus
    the chunk's read from the store when ``read`` (X not persisted on the workers)."""
    read_row = data.d * data.itemsize / rates.read_bytes_per_s if read else 0.0
    seconds = pass_seconds([(rows * (per_row + read_row), count) for rows, count in data.chunks],
                           cluster, rates)
    stored = data.n * data.d * data.itemsize if read else 0
    return Phase(name, count * seconds, count, count * data.n * entries_per_row,
                 count * stored, note)


def read_task_bytes(data: Data, per_row: int = 0) -> int:
    """Peak bytes of one task reading a row chunk: zarr's compressed, decoded and returned
    copies (``READ_FACTOR``) and one more block of that size, ``per_row`` float64 values a
    row, and the block function's tiles (the model of
    :func:`dkern.operators.memory.row_task_bytes`)."""
    row_bytes = data.d * data.itemsize
    return int(data.chunk_rows * ((READ_FACTOR + 1) * row_bytes + FLOAT * per_row)
               + TILE_OVERHEAD)


def task_budget(cluster: Cluster, rates: Rates) -> int:
    """Bytes one task may take on a worker beside the idle process (the rule of
    :class:`dkern.runtime.resources.TaskBudget`, with the calibrated idle memory)."""
    room = min(TASK_FRACTION * cluster.memory_limit,
               PAUSE_FRACTION * cluster.memory_limit - rates.worker_idle_bytes)
    return max(0, int(room / cluster.threads))


def persist_budget(cluster: Cluster) -> int:
    """Bytes persisted blocks may take over all workers (``PERSIST_FRACTION`` of each
    limit, as :func:`dkern.operators.persist_budget`)."""
    return int(PERSIST_FRACTION * cluster.memory_limit * cluster.workers)


def kept_heap_bytes(cluster: Cluster) -> int:
    """Freed memory a worker process keeps: glibc returns the top of a heap to the system
    only past ``MALLOC_TRIM_THRESHOLD_`` (dkern's workers set it high so that kernel tiles
    reuse warm pages, ``dkern/runtime/worker.yaml``), so each arena may keep that much, one
    arena per task thread and the main one (the event loop, deserialising).

    Parameters
    ----------
    cluster : Cluster

    Returns
    -------
    int
        Bytes, ``(threads + 1) × MALLOC_TRIM_THRESHOLD_``.
    """
    threshold = int(WORKER_MALLOC_ENV.get("MALLOC_TRIM_THRESHOLD_", 128 * 1024))
    return (cluster.threads + 1) * threshold
