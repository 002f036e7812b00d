"""Cluster failures told in dkern's terms: which block killed its workers, which rows.

When a task kills every worker that runs it (out of memory, a crash in native code),
the scheduler gives up after ``distributed.scheduler.allowed-failures`` deaths and
the client gets a ``distributed.KilledWorker`` naming only the task's key, e.g.
``('dk-gram-mv-3f2a…', 3, 0, 0)``. The row chunks behind that key exist only
on the client, while the graph is built, so the pairwise layers register them here
(:func:`register_blocks`); :func:`worker_failures`, around the places where dkern
computes, turns the ``KilledWorker`` into a :class:`~dkern.errors.WorkerFailureError`
that names the block and its row ranges, chained from the original; a computation whose
persisted inputs are gone (a closed client's) becomes a :class:`~dkern.errors.LostDataError`
that says how to keep a model across clients; a task failed by the scheduler's
``no-workers-timeout`` (every worker gone, none restarted) becomes a
:class:`~dkern.errors.WorkerFailureError` that says so, instead of distributed's
``NoWorkerError``; one cancelled because the client lost its scheduler becomes a
:class:`~dkern.errors.SchedulerLostError`.

``distributed`` is never imported here: without it loaded no ``KilledWorker`` can
come, so dask's local schedulers pay nothing.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from .errors import LostDataError, SchedulerLostError, WorkerFailureError

__all__ = ["register_blocks", "worker_failures"]

#: Layers remembered; the oldest are dropped first (a CG solve registers a few per iteration).
MAX_LAYERS = 4096


class Side(NamedTuple):
    """One indexed input of a block layer: its label, row chunks and position in the key."""

    label: str
    chunks: tuple[int, ...]
    position: int  # index into the task key (after the layer name)


_layers: OrderedDict[str, tuple[tuple[Side, ...], int]] = OrderedDict()
_lock = threading.Lock()


def register_blocks(name: str, sides: Sequence[Side], ndim: int) -> None:
    """Remember how the ``ndim`` indices of layer ``name``'s task keys index row chunks
    of its inputs."""
    with _lock:
        _layers[name] = (tuple(sides), ndim)
        _layers.move_to_end(name)
        while len(_layers) > MAX_LAYERS:
            _layers.popitem(last=False)


@contextmanager
def worker_failures() -> Iterator[None]:
    """Raise :class:`~dkern.errors.WorkerFailureError` for a ``KilledWorker`` inside, and
    :class:`~dkern.errors.LostDataError` for persisted inputs that are gone.

    Usable as a context manager or as a decorator; other exceptions pass unchanged.
    """
    try:
        yield
    except Exception as err:
        if _is_killed_worker(err):
            raise _translated(err) from err
        if _is_no_worker(err):
            raise _no_worker(err) from err
        if _is_lost_data(err):
            raise LostDataError(LOST_DATA_HELP.format(err=err)) from err
        if _is_scheduler_lost(err):
            raise SchedulerLostError(SCHEDULER_LOST_HELP.format(err=err)) from err
        raise


#: What a computation whose persisted inputs are gone tells the user.
LOST_DATA_HELP = (
    "arrays this computation needs were persisted on a Dask cluster that no longer holds "
    "them: its client was closed, or the workers holding them died ({err}). A model fitted "
    "on dask or Zarr rows keeps its coefficients on the cluster that fitted it, until a "
    "client from dkern.connect() gathers them into the model as it closes; under another "
    "client keep it open while using the model, or dkern.save the model there and "
    "dkern.load it under the new client, or fit it again.")


#: What a computation cancelled by a lost scheduler tells the user.
SCHEDULER_LOST_HELP = (
    "the computation was cancelled: this process's Dask client lost its scheduler (it "
    "stopped, or the network to it failed) and did not reconnect within "
    "distributed.comm.timeouts.connect ({err}). Start the cluster again, or "
    "dkern.connect() to a running one, and run again; a model fitted on the lost cluster "
    "must be fitted again unless it was dkern.save'd or its client gathered it.")


def _is_scheduler_lost(err: BaseException) -> bool:
    """A future cancelled because its client lost the scheduler: distributed cancels
    them for "scheduler-connection-lost" as it starts to reconnect, and those still
    waiting for an "unknown" reason when the client closes after failing to."""
    client = sys.modules.get("distributed.client")
    if client is None or not isinstance(
            err, (client.FutureCancelledError, client.FuturesCancelledError)):
        return False
    if "scheduler-connection-lost" in str(err):
        return True
    current = client._get_global_client()
    return current is None or current.status in ("connecting", "closing", "closed")


def _is_killed_worker(err: BaseException) -> bool:
    distributed = sys.modules.get("distributed")
    return distributed is not None and isinstance(err, distributed.KilledWorker)


def _is_no_worker(err: BaseException) -> bool:
    scheduler = sys.modules.get("distributed.scheduler")
    # NoValidWorkerError: as distributed fails a task whose only workers are paused
    return scheduler is not None and isinstance(err, (scheduler.NoWorkerError,
                                                      scheduler.NoValidWorkerError))


def _no_worker(err: Any) -> WorkerFailureError:
    key = err.task
    layer = key[0] if isinstance(key, tuple) else str(key)
    paused = _paused_workers()
    needs = {name: value for name in ("host_restrictions", "worker_restrictions",
                                      "resource_restrictions")
             if (value := getattr(err, name, None))}
    why = (f"no worker has what it asks for ({needs})" if needs else
           f"its {paused} worker(s) stayed paused for memory (see the WorkersPausedWarning: "
           "give them more memory or use smaller chunks)" if paused else
           "its workers died and none came back (a worker killed for memory whose nanny could "
           "not start a new one, or stopped worker processes; their logs say why: start the "
           "workers again, or dkern.connect() a new cluster)")
    message = (
        f"task {key!r} found no worker to run it for {err.timeout:g} s (its scheduler's "
        f"distributed.scheduler.no-workers-timeout): {why}. Then run again.")
    return WorkerFailureError(message, key=key, layer=layer)


def _paused_workers() -> int:
    """How many workers of the current client's cluster are paused (0 if it cannot say)."""
    from .runtime.watch import paused_workers

    client = sys.modules["distributed.client"]._get_global_client()
    try:
        return len(paused_workers(client.scheduler_info(n_workers=-1)))
    except Exception:  # noqa: BLE001 - no client, or its scheduler gone: nothing to tell
        return 0


def _is_lost_data(err: BaseException) -> bool:
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return False
    # a released future's task inside a new graph: dask finds its key nowhere
    missing = isinstance(err, ValueError) and str(err).startswith("Missing dependency")
    return missing or (isinstance(err, distributed.client.FutureCancelledError)
                       and "lost dependencies" in str(err))


def _translated(err: Any) -> WorkerFailureError:
    key = err.task
    layer, index = (key[0], key[1:]) if isinstance(key, tuple) else (str(key), ())
    prefix, sides = _block_layer(layer, len(index))
    rows = {s.label: _row_range(s.chunks, index[s.position]) for s in sides}
    where = ", ".join(f"rows {a}–{b - 1} of {label}" for label, (a, b) in rows.items())
    block = [index[s.position] for s in sides]
    number = str(block[0]) if len(block) == 1 else str(tuple(block))
    what = f"block {number} of {prefix} ({where})" if rows else f"task {key!r}"
    last = getattr(err.last_worker, "address", err.last_worker)
    deaths = err.allowed_failures + 1
    times = "once" if deaths == 1 else f"{deaths} times"
    message = (
        f"{what} killed its worker {times} (the scheduler allows "
        f"distributed.scheduler.allowed-failures={err.allowed_failures}); the last was "
        f"{last}. A task that kills every worker usually runs out of memory (give the "
        "workers more memory, their memory_limit, or use smaller row chunks) or crashes in "
        "native code (a kernel or a KeOps build); the workers' logs say which.")
    return WorkerFailureError(message, key=key, layer=layer, rows=rows)


def _block_layer(layer: str, n_index: int) -> tuple[str, tuple[Side, ...]]:
    """The registered block layer behind a task's layer name, and the sides its index shows.

    Dask fuses a block layer with the row-wise steps after it (partial sums, ``[:, 0]``,
    ``astype``, the store) into one task named by the fused layers' prefixes joined, e.g.
    ``dk-predict-dk-predict-sum-getitem-store-map-<token>``, indexed like the last
    step. Axis 0 of every pairwise product is the side it keeps, and row-wise steps keep
    it, so a fused task's first index is that side's block; the other is summed away.
    """
    with _lock:
        entry = _layers.get(layer)
        if entry is not None:
            return layer.rsplit("-", 1)[0], entry[0] if entry[1] == n_index else ()
        fused = [(len(p), i, p, entry) for i, (p, entry) in enumerate(
            (name.rsplit("-", 1)[0], entry) for name, entry in _layers.items())
            if f"-{p}-" in f"-{layer}"]
    if not fused or n_index == 0:
        return layer, ()
    _, _, prefix, (sides, ndim) = max(fused)  # the longest prefix, then the newest layer
    if ndim != n_index:  # not indexed like the block layer: axis 0 only
        sides = tuple(s for s in sides if s.position == 0)
    return prefix, sides


def _row_range(chunks: tuple[int, ...], i: int) -> tuple[int, int]:
    start = sum(chunks[:i])
    return start, start + chunks[i]
