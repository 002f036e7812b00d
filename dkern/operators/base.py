"""A small operator base: subclasses give ``shape``, ``dtype``, the vector chunking
they multiply, and ``_matvec``; the rest (input checks, ``@``, ``+ alpha``) is here."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from numbers import Real
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.utils import parse_bytes

from ..io import is_lazy
from .in_process import pass_scheduler
from .memory import check_row_chunks, rows_within_tasks


def data_rows(X: Any, *, name: str = "X", dtype: Any = None, check_finite: bool = True,
              per_row: int = 0) -> da.Array:
    """X as a row-chunked float dask array (float32 stays float32, anything else float64).

    In-memory (numpy) input is persisted: on a distributed cluster its chunks are
    sent to the workers once, and every later graph built on it (one per solver
    iteration) names them by key instead of carrying the data again.

    Raises :class:`~dkern.errors.MemoryLimitError` before anything runs when one task
    over a row chunk, holding ``per_row`` float64 values per row besides it (a factor's
    block), cannot fit in the current cluster's workers (:func:`check_row_chunks`).
    """
    Xd = rows_within_tasks(X, per_row, name=name, dtype=dtype, check_finite=check_finite)
    Xd = Xd if dtype is not None or Xd.dtype == np.float32 else Xd.astype(np.float64)
    check_row_chunks(Xd, name, per_row)
    return Xd if is_lazy(X) else sent_once(Xd)


def sent_once(array: da.Array) -> da.Array:
    """A dask array built on client data, persisted: on a distributed cluster its chunks
    go to the workers now, in one graph, and every later graph names them by key instead
    of carrying the data again (in an in-process pass it stays in this process)."""
    with client_data_in_graph(array.nbytes):
        (array,) = dask.persist(array, scheduler=pass_scheduler())
    return array


#: distributed warns of a graph over this size (10 MB by default), advising to load the
#: data with dask or scatter it.
LARGE_GRAPH_KEY = "distributed.admin.large-graph-warning-threshold"
#: The bytes of client data now being persisted by threads of this process, and the
#: threshold as it was before the first of them (dask's config is one dict per process).
_in_graph = {"bytes": 0, "saved": None}
_in_graph_lock = threading.Lock()


@contextlib.contextmanager
def client_data_in_graph(nbytes: int) -> Iterator[None]:
    """Raise distributed's large-graph warning threshold by ``nbytes`` meanwhile.

    In-memory rows go into the graph on purpose: persisted once, they stay recomputable
    after a lost worker, which scattered data is not; and the user, who passed a numpy
    array, can do nothing about the warning. A graph larger than the rows by more than the
    threshold is still reported. Threads persisting at once add their bytes, and the last
    one out restores the threshold as it was; one the user set to something that is not a
    size is left alone (no distributed client reads it here, or it fails there anyway).
    """
    with _in_graph_lock:
        saved = _in_graph["saved"] if _in_graph["bytes"] else dask.config.get(LARGE_GRAPH_KEY,
                                                                              None)
        try:
            base = parse_bytes(saved)
        except (TypeError, ValueError, AttributeError, OverflowError):
            base = None
        if base is not None:
            _in_graph["saved"] = saved
            _in_graph["bytes"] += int(nbytes)
            dask.config.set({LARGE_GRAPH_KEY: base + _in_graph["bytes"]})
    try:
        yield
    finally:
        if base is not None:
            with _in_graph_lock:
                _in_graph["bytes"] -= int(nbytes)
                dask.config.set({LARGE_GRAPH_KEY: base + _in_graph["bytes"]
                                 if _in_graph["bytes"] else _in_graph["saved"]})


class Operator:
    """A linear operator of shape (n, m) acting on dask arrays, never materialised.

    Subclasses set ``shape``, ``dtype`` and ``col_chunks`` (the row chunks a
    vector must have to be multiplied) and implement ``_matvec``.
    """

    shape: tuple[int, int]
    dtype: np.dtype
    col_chunks: tuple[int, ...]

    def _matvec(self, V: da.Array) -> da.Array:
        """``self @ V`` for V of shape (m, t) chunked as ``(col_chunks, t)``."""
        raise NotImplementedError

    @property
    def is_square(self) -> bool:
        """True for an operator whose rows and columns index the same points."""
        return False

    def matvec(self, V: Any) -> da.Array:
        """``self @ V`` as a lazy dask array.

        Parameters
        ----------
        V : array-like of shape (m,) or (m, t)
            numpy or dask; rechunked to the operator's column chunks.

        Returns
        -------
        dask.array.Array of shape (n,) or (n, t), ``self.dtype``
        """
        V2 = self.as_operand(V)
        out = self._matvec(V2)
        return out[:, 0] if np.ndim(V) == 1 else out

    __matmul__ = matvec

    def as_operand(self, V: Any) -> da.Array:
        """V as a dask array of shape (m, t) chunked like the operator's columns."""
        if not isinstance(V, da.Array):
            V = np.asarray(V)
            if not np.issubdtype(V.dtype, np.number) or np.iscomplexobj(V):
                raise TypeError(f"V must be a real numeric array; got dtype {V.dtype}.")
            if V.ndim in (1, 2) and not np.all(np.isfinite(V)):
                raise ValueError("V contains NaN or Inf; the product would be NaN.")
        if V.ndim not in (1, 2) or V.shape[0] != self.shape[1]:
            m = self.shape[1]
            raise ValueError(f"V must have shape ({m},) or ({m}, t) to multiply an operator of "
                             f"shape {self.shape}; got V of shape {V.shape}.")
        V2 = V.reshape(V.shape[0], -1) if V.ndim == 1 else V
        V2 = V2.astype(self.dtype, copy=False)
        if isinstance(V2, da.Array):
            return V2.rechunk((self.col_chunks, -1))
        return da.from_array(V2, chunks=(self.col_chunks, -1))

    def __add__(self, alpha: float) -> Operator:
        from .shifted import ShiftedOperator

        if not isinstance(alpha, Real):
            return NotImplemented
        return ShiftedOperator(self, float(alpha))

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"<{type(self).__name__} shape={self.shape} dtype={self.dtype}>"
