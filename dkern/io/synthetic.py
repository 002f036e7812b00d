"""Synthetic regression data written to a store lazily, chunk by chunk."""

from __future__ import annotations

from numbers import Integral
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from dkern.errors import MemoryLimitError
from dkern.io._store import Url
from dkern.io.write import write_arrays
from dkern.runtime.resources import ADVICE_MARGIN, TaskBudget, scheduler_workers, task_budget

__all__ = ["REGRESSION_TARGET", "make_regression_store"]

#: The target ``make_regression_store`` draws, as recorded in the store's attrs.
REGRESSION_TARGET = "y = sin(3*x0) + 0.5*cos(2*sum_j(x_j)/sqrt(d)) + noise*N(0, 1)"

# Rows per generator block. Every block of rows has its own random stream, so the
# values depend on (seed, row) only, never on how the rows are chunked.
_GEN_ROWS = 4096

#: Rows per stored chunk without a ``distributed`` cluster, and at most with one.
DEFAULT_CHUNK_ROWS = 100_000
#: Peak bytes of a task writing a chunk, per byte of the chunk: the generator blocks, their
#: concatenation, the cast, the stacked ``[X | y]`` and zarr's encoded copy.
WRITE_FACTOR = 5
#: What the first writing tasks add to a worker beside their chunks: measured, 10 MiB for
#: 0.4 MB chunks (zarr's and the codecs' code and buffers).
WRITE_OVERHEAD = 16 * 2**20
#: The fewest rows per chunk ``make_regression_store`` picks by itself: below, the tasks'
#: overhead dominates.
MIN_CHUNK_ROWS = 1024


def make_regression_store(
    url: Url,
    n: int,
    d: int,
    *,
    chunk_rows: int | None = None,
    seed: int = 0,
    noise: float = 0.1,
    n_test: int = 0,
    overwrite: bool = False,
    dtype: Any = np.float64,
) -> None:
    """Write a synthetic regression problem that a Gaussian kernel learns well.

    ``X`` is uniform on ``[-1, 1]^d`` and

    .. math:: y = \\sin(3 x_0) + 0.5 \\cos(2 \\sum_j x_j / \\sqrt{d}) + \\sigma \\varepsilon,
       \\quad \\varepsilon \\sim N(0, 1)

    computed in float64 from ``X`` as stored (after the cast to ``dtype``). The
    values depend only on ``seed`` and the row index: neither ``chunk_rows``,
    the scheduler nor ``n`` change them (the first rows of ``n=10`` and
    ``n=1000`` agree). Nothing is gathered in memory beyond one chunk.

    Parameters
    ----------
    url : str or os.PathLike
        The store, a local path or fsspec URL.
    n, d : int
        Training rows and features: ``X`` has shape (n, d), ``y`` shape (n,).
    chunk_rows : int, optional
        Rows per stored chunk. Default: ``DEFAULT_CHUNK_ROWS`` (100,000), fewer if the
        current ``distributed`` workers have less room for one chunk's task, as measured
        (their memory limit, less what each worker process holds, below the pause
        threshold).
    seed : int, default 0
        Seed of all random streams.
    noise : float, default 0.1
        The noise standard deviation :math:`\\sigma` of ``y``.
    n_test : int, default 0
        When positive, also write ``X_test`` of shape (n_test, d), drawn from an
        independent stream, and the noise-free ``y_test`` of shape (n_test,), so
        test error measures the estimate of the target function itself.
    overwrite : bool, default False
        Replace existing arrays of the same names.
    dtype : {numpy.float64, numpy.float32}
        The stored dtype of every array.

    Raises
    ------
    MemoryLimitError
        Before anything is submitted: a task writing one chunk of ``chunk_rows`` rows
        would not fit in the tightest worker (the message gives the largest that fits), or,
        without ``chunk_rows``, not even ``MIN_CHUNK_ROWS`` rows fit (the message gives the
        memory limit that would).
    """
    if n < 1 or d < 1 or n_test < 0:
        raise ValueError(f"need n >= 1, d >= 1, n_test >= 0; got n={n}, d={d}, n_test={n_test}.")
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or
                                   not isinstance(chunk_rows, Integral) or chunk_rows < 1):
        raise ValueError(f"chunk_rows must be a positive int (rows per stored chunk) or None; "
                         f"got {chunk_rows!r}.")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be numpy.float32 or numpy.float64; got {dtype}.")
    chunk_rows = _chunk_rows(chunk_rows, d, dtype)
    X, y = _regression_arrays(n, d, chunk_rows, seed, noise, dtype, stream=0)
    arrays = {"X": X, "y": y}
    if n_test > 0:
        arrays["X_test"], arrays["y_test"] = _regression_arrays(
            n_test, d, chunk_rows, seed, 0.0, dtype, stream=1
        )
    attrs = {
        "generator": "dkern.io.make_regression_store",
        "n": n,
        "d": d,
        "n_test": n_test,
        "seed": seed,
        "noise": noise,
        "dtype": str(dtype),
        "target": REGRESSION_TARGET,
        "test_target": "noise-free: y_test = sin(3*x0) + 0.5*cos(2*sum_j(x_j)/sqrt(d))",
    }
    dims = {"X": ("sample", "feature"), "y": ("sample",)}  # xarray aligns their rows
    if n_test > 0:
        dims |= {"X_test": ("test_sample", "feature"), "y_test": ("test_sample",)}
    write_arrays(url, arrays, attrs=attrs, overwrite=overwrite, chunk_rows=chunk_rows, dims=dims)


def _chunk_rows(chunk_rows: int | None, d: int, dtype: np.dtype) -> int:
    """``chunk_rows`` if a task writing such a chunk fits in the current workers; without
    it, the most rows up to ``DEFAULT_CHUNK_ROWS`` that fit."""
    budget = task_budget(scheduler_workers())
    if budget is None:
        return chunk_rows or DEFAULT_CHUNK_ROWS
    row_bytes = WRITE_FACTOR * (d + 1) * dtype.itemsize
    fit = int(ADVICE_MARGIN * budget.budget - WRITE_OVERHEAD) // row_bytes
    if chunk_rows is None:
        if fit < MIN_CHUNK_ROWS:
            least = budget.limit_for(WRITE_OVERHEAD + MIN_CHUNK_ROWS * row_bytes)
            raise MemoryLimitError(
                f"make_regression_store: the workers have room for {budget.budget / 1e6:.0f} "
                f"MB per task ({budget.describe()}); a chunk of {MIN_CHUNK_ROWS} rows of "
                f"{d} features needs {_write_bytes(MIN_CHUNK_ROWS, row_bytes) / 1e6:.0f} MB. "
                f"Nothing was submitted. Give the workers a memory_limit of at least "
                f"{least / 1e6:.0f} MB, or fewer threads each.")
        return int(min(DEFAULT_CHUNK_ROWS, fit))
    if _write_bytes(chunk_rows, row_bytes) > budget.budget:
        _refuse(chunk_rows, d, row_bytes, int(fit), budget)
    return chunk_rows


def _write_bytes(rows: int, row_bytes: int) -> int:
    """Peak bytes of a task writing ``rows`` rows."""
    return WRITE_OVERHEAD + rows * row_bytes


def _refuse(chunk_rows: int, d: int, row_bytes: int, fit: int, budget: TaskBudget) -> None:
    """Raise the MemoryLimitError for a ``chunk_rows`` too large for the workers."""
    need = _write_bytes(chunk_rows, row_bytes)
    fix = (f"Use chunk_rows={fit} or fewer (or leave chunk_rows unset to have it chosen)"
           if fit >= 1 else "No chunking fits")
    raise MemoryLimitError(
        f"make_regression_store: a task writing a chunk of {chunk_rows} rows of {d} features "
        f"needs about {need / 1e6:.0f} MB, over the {budget.budget / 1e6:.0f} MB a task may "
        f"take on the workers ({budget.describe()}). Nothing was submitted. {fix}; or give "
        f"the workers a memory_limit of at least {budget.limit_for(need) / 1e6:.0f} MB.")


def _regression_arrays(
    n: int, d: int, chunk_rows: int, seed: int, noise: float, dtype: np.dtype, stream: int
) -> tuple[da.Array, da.Array]:
    """Lazy ``X`` (n, d) and ``y`` (n,) sharing one generator task per chunk."""
    rows = min(chunk_rows, n)
    chunks = ((rows,) * (n // rows) + ((n % rows,) if n % rows else ()), (d + 1,))
    token = tokenize(n, d, rows, seed, noise, str(dtype), stream)
    Z = da.map_blocks(  # shape: (n, d + 1), the last column is y
        _regression_block,
        d,
        seed,
        noise,
        dtype,
        stream,
        chunks=chunks,
        dtype=dtype,
        meta=np.empty((0, 0), dtype=dtype),
        name=f"dk-synthetic-{token}",
    )
    return Z[:, :d], Z[:, d]


def _regression_block(
    d: int,
    seed: int,
    noise: float,
    dtype: np.dtype,
    stream: int,
    *,
    block_info: dict[Any, Any],
) -> np.ndarray:
    """Rows ``[start, stop)`` of ``[X | y]``, shape (stop - start, d + 1)."""
    start, stop = block_info[None]["array-location"][0]
    first, last = start // _GEN_ROWS, (stop - 1) // _GEN_ROWS
    parts = [_generator_rows(d, seed, stream, b) for b in range(first, last + 1)]
    offset = start - first * _GEN_ROWS
    X = np.concatenate([p[0] for p in parts])[offset : offset + stop - start].astype(dtype)
    eps = np.concatenate([p[1] for p in parts])[offset : offset + stop - start]
    y = _target(X) + noise * eps
    return np.column_stack([X, y.astype(dtype)])


def _generator_rows(d: int, seed: int, stream: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Generator block ``block``: X of shape (_GEN_ROWS, d) and eps of shape (_GEN_ROWS,)."""
    rng = np.random.default_rng([seed, stream, block])
    return rng.uniform(-1.0, 1.0, size=(_GEN_ROWS, d)), rng.standard_normal(_GEN_ROWS)


def _target(X: np.ndarray) -> np.ndarray:
    """The noise-free target of :func:`make_regression_store`, in float64.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)

    Returns
    -------
    ndarray of shape (n_samples,)
    """
    X = np.asarray(X, dtype=np.float64)
    return np.sin(3.0 * X[:, 0]) + 0.5 * np.cos(2.0 * X.sum(axis=1) / np.sqrt(X.shape[1]))
