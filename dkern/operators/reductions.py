"""The classic toolbox's passes over the data, as backend blocks on :func:`pairwise_reduce`.

=============================  =====================================  ====================
pass                           block on (queries_i, training_j)       combined over j
=============================  =====================================  ====================
kernel sums (KDE, N–W)         log-scaled ``Σ k``, ``Σ k t``           rescale to common max
k nearest neighbours           top-k by (distance, index)             merge top-k
=============================  =====================================  ====================

The blocks are methods of the backend named (:mod:`dkern.backends.blocks`): numpy's
tiles or KeOps' ``Max_SumShiftExpWeight`` and ``KMin_ArgKMin`` reductions. Each pass
returns lazy dask arrays chunked like the queries; the training rows are read chunk by
chunk and never gathered.
"""

from __future__ import annotations

import dask.array as da
import numpy as np

from ..backends import block_backend
from ..backends.keops_backend import log_fallback_once
from ..backends.neighbors import (
    merge_hits,
    merge_neighbors,
    nearest_block,
    nearest_block_metric,
    neighbors_dtype,
    sample_bound,
    sample_bound_metric,
    within_radius_block,
)
from ..backends.smoothing import merge_log_sums
from ..kernels import Kernel
from .in_process import pass_scheduler
from .pairwise import Operand, pairwise_reduce, pairwise_rows

__all__ = ["kernel_log_sums", "nearest_neighbors"]

#: Training rows the kNN search takes its starting bound from (the first ones).
SAMPLE_ROWS = 2048


def kernel_log_sums(queries: da.Array, training: da.Array, targets: da.Array | None = None, *,
                    kernel: Kernel | None = None, box_width: float | None = None,
                    scale: float = 1.0, name: str, backend: str = "numpy") -> da.Array:
    """``[m, s₀, s₁ … s_T]`` per query row: ``Σₙ k = e^m s₀`` and ``Σₙ k tₙⱼ = e^m sⱼ``.

    Parameters
    ----------
    queries : dask.array.Array of shape (q, d)
    training : dask.array.Array of shape (n, d)
    targets : dask.array.Array of shape (n, T), optional
        Chunked like ``training``'s rows.
    kernel, box_width, scale
        As :func:`dkern.backends.smoothing.weighted_log_sums_block`.
    name : str
        The dashboard's task prefix, e.g. ``"dk-kde"``.
    backend : {"numpy", "keops", "triton"}, default="numpy"
        A concrete backend (:func:`dkern.backends.resolve_backend`).

    Returns
    -------
    dask.array.Array of shape (q, 2 + T), float64
    """
    operands: list[Operand] = [] if targets is None else [(targets, "cols")]
    width = 2 + (0 if targets is None else targets.shape[1])
    return pairwise_reduce(block_backend(backend).weighted_log_sums, queries, training, operands,
                           over="cols", width=width, name=name, combine=merge_log_sums,
                           labels=("X", "X_fit"), kernel=kernel, box_width=box_width,
                           scale=float(scale))


def nearest_neighbors(queries: da.Array, training: da.Array, k: int, *,
                      name: str = "dk-knn", backend: str = "numpy", metric: str = "minkowski",
                      p: float = 2, order: da.Array | None = None) -> tuple[da.Array, da.Array]:
    """The k nearest training rows of every query row (ties to the lower index).

    Partial results travel as records of :func:`~dkern.backends.neighbors.neighbors_dtype`
    (float64 squared distances, int64 indices): indices are integers end to end.

    Parameters
    ----------
    queries : dask.array.Array of shape (q, d)
    training : dask.array.Array of shape (n, d)
    k : int
    name : str, default="dk-knn"
    backend : {"numpy", "keops", "triton"}, default="numpy"
        A concrete backend (:func:`dkern.backends.resolve_backend`); the Euclidean search
        only: other metrics run numpy's block (logged once).
    metric : {"minkowski", "cosine"}, default="minkowski"
    p : float, default=2
        Minkowski's power, >= 1 (2: Euclidean; inf: Chebyshev); unused by ``"cosine"``
        (:func:`dkern.backends.neighbors.metric_distances`).
    order : dask.array.Array of shape (n, 1), int32, optional
        Each training chunk's :func:`~dkern.backends.neighbors.tile_order`, chunked like
        ``training`` (a fitted model keeps it): numpy's Euclidean block then gathers its
        rows in that order instead of sorting them. Only with ``backend="numpy"``.

    Returns
    -------
    distances : dask.array.Array of shape (q, k), float64
        Exact distances, ascending.
    indices : dask.array.Array of shape (q, k), int64
    """
    k = int(k)
    if order is not None and (backend != "numpy" or metric != "minkowski" or p != 2):
        raise ValueError(f"order is the tile order of numpy's Euclidean search; got it with "
                         f"backend={backend!r}, metric={metric!r}, p={p}. Pass order=None.")
    if metric != "minkowski" or p != 2:
        return _nearest_by_metric(queries, training, k, name=name, backend=backend,
                                  metric=metric, p=p)
    # Each block would otherwise search from scratch, admitting ~k·ln(rows) candidates
    # per query row: a bound from the first rows (one chunk read) lets it admit only rows
    # nearer than some k training rows already are.
    head = training[:max(k, SAMPLE_ROWS)]  # here, in an in-process pass
    sample = np.asarray(head.compute(scheduler=pass_scheduler()), dtype=np.float64)
    limit = pairwise_rows(sample_bound, queries, width=1, dtype=np.float64,
                          name=f"{name}-bound", broadcast={"sample": sample}, k=k)
    index = da.arange(training.shape[0], chunks=training.chunks[0], dtype=np.int64)[:, None]
    operands: list[Operand] = [(limit, "rows"), (index, "cols")]
    block = block_backend(backend).nearest
    if order is not None:  # numpy's block, told its rows' tile order
        block, operands = nearest_block, [*operands, (order, "cols")]
    records = pairwise_reduce(block, queries, training, operands, over="cols", width=1,
                              dtype=neighbors_dtype(k), name=name, combine=merge_neighbors,
                              labels=("X", "X_fit"), k=k)
    return np.sqrt(records["sq"][:, 0]), records["index"][:, 0]


def _nearest_by_metric(queries: da.Array, training: da.Array, k: int, *, name: str,
                       backend: str, metric: str, p: float) -> tuple[da.Array, da.Array]:
    """:func:`nearest_neighbors` for a metric other than the Euclidean: exact distance tiles
    (:func:`~dkern.backends.neighbors.nearest_block_metric`), numpy on every backend."""
    if backend != "numpy":
        log_fallback_once("k-nearest neighbours", f"the {metric} metric (p={p}) has a "
                          "Euclidean search only on this backend", backend=backend)
    head = training[:max(k, SAMPLE_ROWS)]  # here, in an in-process pass
    sample = np.asarray(head.compute(scheduler=pass_scheduler()), dtype=np.float64)
    limit = pairwise_rows(sample_bound_metric, queries, width=1, dtype=np.float64,
                          name=f"{name}-bound", broadcast={"sample": sample}, k=k,
                          metric=metric, p=p)
    index = da.arange(training.shape[0], chunks=training.chunks[0], dtype=np.int64)[:, None]
    records = pairwise_reduce(nearest_block_metric, queries, training,
                              [(limit, "rows"), (index, "cols")], over="cols", width=1,
                              dtype=neighbors_dtype(k), name=name, combine=merge_neighbors,
                              labels=("X", "X_fit"), k=k, metric=metric, p=p)
    return records["sq"][:, 0], records["index"][:, 0]


def radius_neighbors(queries: da.Array, training: da.Array, radius: float, *,
                     metric: str = "minkowski", p: float = 2,
                     name: str = "dk-radius") -> da.Array:
    """The training rows within ``radius`` of every query row, by exact distance tiles
    (:func:`~dkern.backends.neighbors.within_radius_block`, numpy on every backend).

    Returns
    -------
    dask.array.Array of shape (q, 1), object
        Per query row an array of :data:`~dkern.backends.neighbors.HIT` records (global
        index, distance), ascending index.
    """
    index = da.arange(training.shape[0], chunks=training.chunks[0], dtype=np.int64)[:, None]
    return pairwise_reduce(within_radius_block, queries, training, [(index, "cols")],
                           over="cols", width=1, dtype=object, name=name, combine=merge_hits,
                           labels=("X", "X_fit"), radius=float(radius), metric=metric, p=p)
