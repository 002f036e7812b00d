"""How much memory the workers give to dkern: to persisted blocks, and to one task of a pass.

A pass over the data runs one task per row chunk (or chunk pair); a task that needs more
than a worker has is not slowed down but killed by the worker's nanny, retried elsewhere
and killed again. :func:`check_row_chunks` refuses such a chunking before anything is
submitted, with the estimate, the limit and the fix in the message.
"""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import psutil
import zarr

from ..errors import MemoryLimitError
from ..io import as_rows, is_lazy, is_store_ref, open_array
from ..runtime.resources import (
    ADVICE_MARGIN,
    TASK_FRACTION,  # noqa: F401  (its home before resources.py)
    TaskBudget,
    scheduler_workers,
)
from ..runtime.resources import task_budget as _task_budget

logger = logging.getLogger(__name__)

#: Share of the workers' memory that persisted blocks may take: dask's workers spill at
#: 60% of their limit and pause at 80%, and the tasks of a pass need room of their own.
PERSIST_FRACTION = 0.3
#: Peak bytes of a task reading a stored row chunk, per byte of the chunk: zarr holds the
#: compressed bytes, the decoded chunk and the array it returns at once (the measured peak
#: of a pass over a one-chunk store is in benchmarks/reliability/memory_4x.json).
READ_FACTOR = 3
#: What a block function adds to its inputs: up to three 4 MiB kernel tiles
#: (:mod:`dkern.backends.numpy_backend`).
TILE_OVERHEAD = 3 * 4 * 2**20
#: Tasks up to this estimate are not checked (no round trip to the scheduler): it is little
#: more than a block function's tiles, the least any task of a pass takes.
UNCHECKED_TASK_BYTES = 16 * 2**20


def persist_budget() -> int:
    """Bytes that data persisted on the current scheduler's workers may take, in total.

    A ``distributed`` client as the scheduler: ``PERSIST_FRACTION`` of the smallest
    worker's memory limit times the number of workers (blocks spread evenly); a worker
    without a limit counts the machine's available memory. Dask's local schedulers keep
    persisted blocks in this process: ``PERSIST_FRACTION`` of its available memory.
    """
    return _persist_budget(_workers())


def _persist_budget(workers: list[dict[str, Any]] | None) -> int:
    """:func:`persist_budget` of the worker records ``workers`` (None: a local scheduler)."""
    available = psutil.virtual_memory().available
    if workers is None:
        return int(PERSIST_FRACTION * available)
    limits = [w.get("memory_limit") or available for w in workers]
    if not limits:
        return 0
    return int(PERSIST_FRACTION * min(limits) * len(limits))


def check_persisted(nbytes: int, what: str, fix: str) -> None:
    """Refuse, before anything runs, data to be persisted on a ``distributed`` cluster's
    workers beyond :func:`persist_budget`: they would spill it and pause rather than fail
    (dask's local schedulers keep it in this process, which has no such limit).

    Parameters
    ----------
    nbytes : int
        The bytes to be persisted, over all workers.
    what : str
        What they are, for the message ("the preconditioner's factor, 200,000 x 300 float64").
    fix : str
        What else would help, besides more memory (a sentence).

    Raises
    ------
    MemoryLimitError
        With the budget, how it is set, and the memory limit that would fit.
    """
    workers = _workers()
    if not workers:  # dask's local schedulers: no workers to spill or pause
        return
    budget = _persist_budget(workers)  # one round trip to the workers, not two
    if nbytes <= budget:
        return
    count = len(workers)
    raise MemoryLimitError(
        f"{what} takes {nbytes / 1e6:,.0f} MB kept on the workers, over the {budget / 1e6:,.0f} "
        f"MB they may keep ({PERSIST_FRACTION:.0%} of {count} worker(s) of "
        f"{budget / PERSIST_FRACTION / count / 1e6:,.0f} MB, the smallest memory limit): they "
        f"would spill it to disk and pause. Nothing was submitted. Give the workers a "
        f"memory_limit of at least {nbytes / PERSIST_FRACTION / count / 1e6:,.0f} MB each, "
        f"{fix}")


def task_budget() -> TaskBudget | None:
    """What one task may take on the tightest worker of the current ``distributed`` client.

    Returns
    -------
    dkern.runtime.resources.TaskBudget or None
        ``min(TASK_FRACTION · limit, PAUSE_FRACTION · limit − used) / nthreads`` for the
        worker where it is smallest, ``used`` being the worker process's measured memory
        (not an assumed figure); None on dask's local schedulers or when no worker has a
        memory limit.
    """
    return _task_budget(_workers())


def row_task_bytes(X: da.Array, per_row: int = 0) -> int:
    """Peak bytes of one task of a pass over X's largest row chunk.

    The task reads the chunk (``READ_FACTOR`` times its bytes), holds one more block of
    that size (the other side of a chunk pair, or the chunk as read while the next is
    decoded), ``per_row`` float64 values per row (kernel columns, a factor), and the
    block function's kernel tiles.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d)
        Row-chunked.
    per_row : int, default=0
        float64 values per row the task holds besides X's row.
    """
    rows = max(X.chunks[0]) if X.shape[0] else 0
    row_bytes = X.dtype.itemsize * (X.shape[1] if X.ndim > 1 else 1)
    return int(rows * ((READ_FACTOR + 1) * row_bytes + 8 * per_row) + TILE_OVERHEAD)


def fits_in_task(X: da.Array, per_row: int = 0) -> bool:
    """Whether :func:`row_task_bytes` is within :func:`task_budget` (True without limits)."""
    need = row_task_bytes(X, per_row)
    budget = task_budget() if need > UNCHECKED_TASK_BYTES else None
    return budget is None or need <= budget.budget


def task_rows(X: da.Array, per_row: int = 0, budget: TaskBudget | None = None) -> int | None:
    """The most rows of X one task may take on the current workers (by the same estimate
    as :func:`row_task_bytes`, with the margin of the refusal's advice), at least 1; None
    on dask's local schedulers or without memory limits. ``budget``: the workers' as
    already measured (default: asked now)."""
    budget = budget or task_budget()
    if budget is None:
        return None
    row_bytes = X.dtype.itemsize * (X.shape[1] if X.ndim > 1 else 1)
    per_chunk_row = (READ_FACTOR + 1) * row_bytes + 8 * per_row
    return max(1, int((ADVICE_MARGIN * budget.budget - TILE_OVERHEAD) / per_chunk_row))


#: In-memory rows are split into at most this many row chunks to fit a task: past it, the
#: scheduler's cost per task outweighs a pass's work, and the refusal (check_row_chunks)
#: names the memory the workers need instead.
MAX_SPLIT_CHUNKS = 10_000


def rows_within_tasks(X: Any, per_row: int = 0, **read: Any) -> da.Array:
    """``as_rows(X, **read)``, with the row chunks dkern chooses kept within a task that
    holds ``per_row`` float64 values per row besides them (:func:`row_task_bytes`).

    Reads merge a store's whole Zarr chunks to about 16 MiB, and split in-memory rows into
    chunks of about that size, for speed only: on memory-limited workers that must not
    refuse a store whose own chunks fit (the refusal's advice is to rewrite the store
    with smaller chunks), nor in-memory rows, whose chunks the user cannot choose (a
    model's training rows, for one). A dask array's own chunks are the user's: they are
    kept, and refused with advice where they do not fit (:func:`check_row_chunks`).
    """
    Xd = as_rows(X, **read)
    if not is_lazy(X):
        return _split_to_fit(Xd, per_row)
    rows = _stored_rows_in_task(X, Xd, per_row)
    return Xd if rows is None else as_rows(X, row_chunks=rows, **read)


def _split_to_fit(Xd: da.Array, per_row: int) -> da.Array:
    """In-memory rows ``Xd`` in row chunks of half the rows that fit a task on the workers
    now; as they are when they fit, or when no split into at most ``MAX_SPLIT_CHUNKS``
    chunks fits (then refused by :func:`check_row_chunks`)."""
    need = row_task_bytes(Xd, per_row)
    budget = task_budget() if need > UNCHECKED_TASK_BYTES else None  # one round trip
    if budget is None or need <= budget.budget:
        return Xd
    # half what fits now: a worker's own memory moves between this measurement and the
    # passes' (by 11-26 MB of 250 MB workers in adversary I's runs)
    rows = max(1, (task_rows(Xd, per_row, budget) or 1) // 2)
    if -(-Xd.shape[0] // rows) > MAX_SPLIT_CHUNKS:
        return Xd
    split = Xd.rechunk({0: rows})
    fits = row_task_bytes(split, per_row) <= max(budget.budget, UNCHECKED_TASK_BYTES)
    return split if fits else Xd  # one row may not fit: refused as it is


def _stored_rows_in_task(X: Any, Xd: da.Array, per_row: int) -> int | None:
    """For stored X (a Zarr array or a store reference) read as ``Xd``: rows per chunk when
    its merged chunks would not fit in a task on the workers, as many whole Zarr chunks as
    fit (one at least); None when they fit."""
    if not (isinstance(X, zarr.Array) or is_store_ref(X)) or fits_in_task(Xd, per_row):
        return None
    stored = int(X.chunks[0] if isinstance(X, zarr.Array) else open_array(*X).chunks[0][0])
    rows = task_rows(Xd, per_row)
    if rows is None or max(Xd.chunks[0]) <= stored:
        return None
    return stored * max(1, rows // stored)


def check_row_chunks(X: da.Array, name: str = "X", per_row: int = 0) -> None:
    """Refuse, before anything runs, row chunks whose task cannot fit in a worker.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d)
        The rows a pass will read, chunked as the pass will read them.
    name : str
        How the message names X.
    per_row : int, default=0
        See :func:`row_task_bytes`.

    Raises
    ------
    MemoryLimitError
        The estimate of one task is over ``TASK_FRACTION`` of the smallest worker memory
        limit (per thread); the message gives both and the largest row chunk that fits.
        Estimates up to ``UNCHECKED_TASK_BYTES`` are accepted without asking the scheduler.
    """
    need = row_task_bytes(X, per_row)
    budget = task_budget() if need > UNCHECKED_TASK_BYTES else None
    if budget is None or need <= budget.budget:
        return
    rows = max(X.chunks[0])
    per_chunk_row = (need - TILE_OVERHEAD) / rows
    fit = int((ADVICE_MARGIN * budget.budget - TILE_OVERHEAD) / per_chunk_row)
    extra = f", and {per_row} float64 values per row computed from them" if per_row else ""
    what = (f"{name}'s row chunks of up to {rows} rows ({X.shape[1] if X.ndim > 1 else 1} "
            f"{X.dtype} values each{extra}) need about {need / 1e6:.0f} MB per task, over the "
            f"{budget.budget / 1e6:.0f} MB a task may take on the workers "
            f"({budget.describe()}). Nothing was submitted.")
    if fit < 1:
        least = budget.limit_for(TILE_OVERHEAD + 1024 * per_chunk_row)
        raise MemoryLimitError(
            f"{what} No row chunking fits: give the workers a memory_limit of at least "
            f"{least / 1e6:.0f} MB (for chunks of 1,024 rows), or fewer threads each.")
    raise MemoryLimitError(
        f"{what} Use row chunks of at most {fit} rows: {name}.rechunk({{0: {fit}}}) for a "
        f"dask array, dask.array.from_array({name}, chunks=({fit}, -1)) for a numpy one, "
        f"dkern.io.open_array(url, path).rechunk({{0: {fit}}}) for a store's "
        f"(`dkern fit`: --row-chunks {fit}); a task reads whole Zarr chunks, so a store "
        f"whose chunks are larger needs rewriting with dkern.io.write_array(..., "
        f"chunk_rows={fit}). Or give the workers more memory (a memory_limit of "
        f"{budget.limit_for(need) / 1e6:.0f} MB fits these chunks).")


_workers = scheduler_workers
