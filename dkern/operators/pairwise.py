"""The one mechanism every pass over the data goes through.

Every heavy step is "for each (row chunk i of A) × (row chunk j of B): a block
function; then combine the partial results". :func:`pairwise_reduce` builds it
as one ``blockwise`` layer of block tasks and one tree ``reduction``:

=========================  ================================  ==================
product                     block on (A_i, B_j, operands)     combined over
=========================  ================================  ==================
Gram matvec ``K V``         ``k(A_i, B_j) @ V_j``             j (sum)
``K(C, X) Y``               ``k(C, X_j) @ Y_j``               j (sum)
Nyström normal ``KᵀK v``    ``k(A_i, C)ᵀ k(A_i, C) v``        i (sum)
kernel smoothing sums       log-scaled ``Σ k``, ``Σ k t``     j (log-add)
k nearest neighbours        top-k (distance², index)          j (merge top-k)
=========================  ================================  ==================

:func:`pairwise_map` is the same grid without the combine step (dense kernel
blocks for a few columns); :func:`pairwise_rows` maps row chunks alone (a kernel
diagonal). Block functions come from a backend (:mod:`dkern.backends.blocks`) or
are module-level functions of the caller; operators add block functions, not
graph code.

Two kinds of extra input reach a block. *Operands* are chunked like the rows or
the columns, and task (i, j) gets their matching blocks. *Broadcast* arrays are
small client arrays every task needs whole (centres, a Cholesky factor, weights):
each becomes one single-chunk dask array, sent to the cluster once, whose one
key every task depends on — never a copy inside each task's arguments.

Partial results keep their dtype. A plain dtype (float64 sums) gives partials of
shape (rows, width); a structured dtype gives one record per row (``width=1``),
whose fields may differ in type: k nearest neighbours travel as
``[("sq", float64, (k,)), ("index", int64, (k,))]``, so indices stay int64 from
the block to the user (numpy concatenates and slices records like any array, and
a dask array's field, ``result["index"]``, is again a typed dask array). Such a
block may return its fields as a tuple, in the dtype's field order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import dask.array as da
import numpy as np
from dask.base import tokenize

from .._failures import Side, register_blocks
from .base import sent_once

__all__ = ["pairwise_map", "pairwise_reduce", "pairwise_rows"]

Combine = Callable[..., np.ndarray]  # f(x, axis=..., keepdims=...), as np.sum
Operand = tuple[da.Array, Literal["rows", "cols"]]
Broadcast = Mapping[str, "np.ndarray | da.Array"]
#: A broadcast client array this large is sent before the graph that uses it (_single_chunk).
SENT_BEFORE_BYTES = 2**20


def pairwise_reduce(block: Callable[..., Any], rows: da.Array, cols: da.Array,
                    operands: Sequence[Operand] = (), *, over: Literal["rows", "cols"],
                    width: int, name: str, combine: Combine = np.sum,
                    dtype: Any = np.float64, broadcast: Broadcast | None = None,
                    labels: tuple[str, str] = ("X", "Z"), **kwargs: Any) -> da.Array:
    """Apply ``block`` to every chunk pair and combine the partial results.

    Parameters
    ----------
    block : callable
        ``block(a, b, *operand_blocks, **broadcast, **kwargs)`` for ``a = rows[i]``
        (n_i, p) and ``b = cols[j]`` (m_j, q); returns the partial result, of shape
        (n_i, width) when ``over="cols"`` and (m_j, width) when ``over="rows"``; for
        a structured ``dtype``, an array of records or a tuple of its fields.
    rows, cols : dask.array.Array of shape (n, p) and (m, q)
        Chunked along axis 0 only.
    operands : sequence of (array, side)
        Extra 2-D arrays chunked like ``rows`` (side ``"rows"``) or ``cols``
        (``"cols"``) along axis 0; task (i, j) gets their matching blocks.
    over : {"cols", "rows"}
        The index the partial results are combined over.
    width : int
        Columns of every partial result (1 for a structured dtype: one record per row).
    name : str
        Prefix of the task keys as the dashboard shows them, e.g. ``"dk-gram-mv"``;
        the tree reduction's tasks get ``name + "-sum"``.
    combine : callable, default numpy.sum
        ``combine(x, axis=..., keepdims=...)``, associative (``numpy.sum``,
        ``numpy.max``, ``scipy.special.logsumexp``): applied in a tree.
    dtype : numpy dtype, default float64
        Of the partial results and the result; partials are cast to it (a plain
        dtype) or packed into it (a structured one).
    broadcast : mapping of str to array, optional
        Small arrays every block needs whole, passed as keyword arguments of these
        names: numpy arrays are sent once as single-chunk dask arrays (module
        docstring); a dask array must be one chunk already.
    labels : (str, str), default ("X", "Z")
        What ``rows`` and ``cols`` are to the user: a task that kills its workers is
        reported by its block and row ranges under these names.
    **kwargs
        Passed to every ``block`` call (the kernel, scalars).

    Returns
    -------
    dask.array.Array of shape (n, width) or (m, width), of ``dtype``
        Chunked like ``rows`` (``over="cols"``) or ``cols`` (``over="rows"``).
    """
    dtype = np.dtype(dtype)
    kept, reduced = ("i", "j") if over == "cols" else ("j", "i")
    args = _indexed(rows, cols, operands)
    names, shared = _broadcast_args(broadcast)
    token = tokenize(_identity(block), *(a.name for a in (args + shared)[::2]), over, width,
                     dtype, names, kwargs)
    parts = da.blockwise(
        _partial_block, f"{kept}{reduced}t", *args, *shared, new_axes={"t": width},
        adjust_chunks={reduced: 1}, concatenate=False, dtype=dtype,
        meta=np.empty((0, 0, 0), dtype), name=f"{name}-{token}", block=block,
        n_data=len(args) // 2, broadcast_names=names, out_dtype=dtype, **kwargs)
    row_position = 0 if over == "cols" else 1  # the key is (name, kept, reduced, 0)
    register_blocks(parts.name, [Side(labels[0], rows.chunks[0], row_position),
                                 Side(labels[1], cols.chunks[0], 1 - row_position)], 3)
    return da.reduction(parts, combine, combine, combine=combine, axis=1, dtype=dtype,
                        meta=np.empty((0, 0), dtype), name=f"{name}-sum-{token}")


def pairwise_rows(block: Callable[..., Any], rows: da.Array, operands: Sequence[da.Array] = (),
                  *, width: int | None, dtype: Any, name: str,
                  broadcast: Broadcast | None = None, label: str = "X",
                  **kwargs: Any) -> da.Array:
    """``block(rows[i], *operand_blocks, **broadcast, **kwargs)`` for every row chunk.

    The per-row-chunk map (a kernel diagonal ``k(x_i, x_i)``, a whitened residual):
    no column chunks, nothing combined.

    Parameters
    ----------
    block : callable
        Returns shape (n_i, width), or (n_i,) when ``width`` is None.
    rows : dask.array.Array of shape (n, p)
        Chunked along axis 0 only.
    operands : sequence of dask.array.Array
        2-D arrays chunked like ``rows`` along axis 0.
    width : int or None
        Columns of the result; None for a vector.
    dtype : numpy dtype
        Of the result.
    name : str
        Prefix of the task keys, e.g. ``"dk-diag"``.
    broadcast : mapping of str to array, optional
        As for :func:`pairwise_reduce`.
    label : str, default "X"
        What ``rows`` are to the user (reports of tasks that kill workers).
    **kwargs
        Passed to every ``block`` call.

    Returns
    -------
    dask.array.Array of shape (n, width) or (n,), chunked like ``rows``
    """
    dtype = np.dtype(dtype)
    args = _indexed(rows, None, [(a, "rows") for a in operands])
    names, shared = _broadcast_args(broadcast)
    token = tokenize(_identity(block), *(a.name for a in (args + shared)[::2]), width, dtype,
                     names, kwargs)
    out_index, new_axes = ("it", {"t": width}) if width is not None else ("i", {})
    out = da.blockwise(
        _row_block, out_index, *args, *shared, new_axes=new_axes, concatenate=False,
        dtype=dtype, meta=np.empty((0,) * len(out_index), dtype), name=f"{name}-{token}",
        block=block, n_data=len(args) // 2, broadcast_names=names, out_dtype=dtype,
        **kwargs)
    register_blocks(out.name, [Side(label, rows.chunks[0], 0)], len(out_index))
    return out


def pairwise_map(block: Callable[..., np.ndarray], rows: da.Array, cols: da.Array, *,
                 dtype: Any, name: str, labels: tuple[str, str] = ("X", "Z"),
                 **kwargs: Any) -> da.Array:
    """``block(rows[i], cols[j], **kwargs)`` for every chunk pair, as an (n, m) dask array.

    Each task returns its (n_i, m_j) block; nothing is combined, so this is for a
    few columns only (``m`` small): the result is chunked like ``rows`` by ``cols``.
    ``name`` and ``labels`` as for :func:`pairwise_reduce`.
    """
    _indexed(rows, cols, ())
    token = tokenize(_identity(block), rows.name, cols.name, kwargs)
    out = da.blockwise(_whole_block, "ij", rows, "ia", cols, "jb", concatenate=False,
                       dtype=dtype, meta=np.empty((0, 0), dtype), name=f"{name}-{token}",
                       block=block, **kwargs)
    register_blocks(out.name, [Side(labels[0], rows.chunks[0], 0),
                               Side(labels[1], cols.chunks[0], 1)], 2)
    return out


def _partial_block(*blocks: Any, block: Callable[..., Any], n_data: int,
                   broadcast_names: tuple[str, ...], out_dtype: np.dtype,
                   **kwargs: Any) -> np.ndarray:
    """One task: the block function's partial result with the combined axis added."""
    data, shared = _split(blocks, n_data, broadcast_names)
    return _typed(block(*data, **shared, **kwargs), out_dtype)[:, None, :]


def _row_block(*blocks: Any, block: Callable[..., Any], n_data: int,
               broadcast_names: tuple[str, ...], out_dtype: np.dtype,
               **kwargs: Any) -> np.ndarray:
    """One task of :func:`pairwise_rows`."""
    data, shared = _split(blocks, n_data, broadcast_names)
    return np.asarray(block(*data, **shared, **kwargs), dtype=out_dtype)


def _whole_block(a: list[np.ndarray], b: list[np.ndarray], *, block: Callable[..., np.ndarray],
                 **kwargs: Any) -> np.ndarray:
    """One task of :func:`pairwise_map`: the block function on the chunk pair."""
    return block(_only(a), _only(b), **kwargs)


def _only(blocks: list[np.ndarray]) -> np.ndarray:
    """The one block blockwise hands over along an operand's second (whole) axis.

    With ``concatenate=True`` dask would copy it (concatenating a list of one): for a
    cached n_i × M kernel block that copy cost more than the product itself."""
    return blocks[0]


def _split(blocks: tuple[Any, ...], n_data: int,
           names: tuple[str, ...]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """A task's data blocks, and its broadcast arrays by name (each its one block)."""
    data = [_only(b) for b in blocks[:n_data]]
    shared = {}
    for key, value in zip(names, blocks[n_data:], strict=True):
        while isinstance(value, list):  # one chunk along every (contracted) axis
            value = value[0]
        shared[key] = value
    return data, shared


def _typed(out: Any, dtype: np.dtype) -> np.ndarray:
    """A block's partial result as an (n, width) array of ``dtype``: cast to a plain
    dtype; packed, one record per row, into a structured one."""
    if dtype.names is None:  # (n, a, b, ...) blocks flatten to (n, a·b·...)
        out = np.asarray(out, dtype=dtype)
        return _rows_by_width(out) if out.ndim > 2 else out
    if isinstance(out, tuple):
        if len(out) != len(dtype.names):
            raise ValueError(f"a block of structured dtype {dtype} must return its "
                             f"{len(dtype.names)} fields {dtype.names}; got {len(out)} arrays.")
        records = np.empty(len(out[0]), dtype)
        for field, values in zip(dtype.names, out, strict=True):
            records[field] = values
        out = records
    out = np.asarray(out)
    if out.dtype != dtype:
        raise ValueError(f"a block of structured dtype {dtype} returned dtype {out.dtype}; "
                         "return its fields as a tuple, or records of that dtype.")
    return _rows_by_width(out)


def _rows_by_width(out: np.ndarray) -> np.ndarray:
    """``out`` (n, ...) as (n, width): its trailing axes flattened, also for n = 0 (an
    empty row chunk), where ``reshape(n, -1)`` cannot tell the width."""
    return out.reshape(len(out), math.prod(out.shape[1:]))


def _broadcast_args(broadcast: Broadcast | None) -> tuple[tuple[str, ...], list[Any]]:
    """The broadcast arrays' names, and their blockwise (array, index) pairs.

    Each is one chunk, indexed by letters no output has: blockwise contracts them, so
    every task depends on the array's one key (and gets it in nested lists of one).
    """
    names, args = [], []
    for k, (key, value) in enumerate((broadcast or {}).items()):
        array = value if isinstance(value, da.Array) else _single_chunk(key, value)
        if array.ndim == 0 or array.npartitions != 1:
            raise ValueError(f"broadcast array {key!r} must be one chunk of at least one "
                             f"dimension; got shape {array.shape} in {array.npartitions} "
                             f"chunks. Pass the numpy array, or x.rechunk(-1).")
        names.append(key)
        args += [array, tuple(f"broadcast{k}_{axis}" for axis in range(array.ndim))]
    return tuple(names), args


def _single_chunk(key: str, value: Any) -> da.Array:
    """A client array as a one-chunk dask array named by its content.

    One of a MiB or more is sent to the cluster before the pass's graph (an exact GP's
    factor is n² floats): otherwise the graph carries it, and distributed warns of a large
    graph the user can do nothing about.
    """
    array = np.asarray(value)
    chunk = da.from_array(array, chunks=array.shape, name=f"dk-bc-{key}-{tokenize(array)}")
    return sent_once(chunk) if array.nbytes >= SENT_BEFORE_BYTES else chunk


def _indexed(rows: da.Array, cols: da.Array | None,
             operands: Sequence[Operand]) -> list[Any]:
    """blockwise's (array, index) pairs: rows on i, cols on j, each second axis whole."""
    args: list[Any] = [rows, "ia"] + ([] if cols is None else [cols, "jb"])
    for k, (array, side) in enumerate(operands):
        if side not in ("rows", "cols") or (side == "cols" and cols is None):
            raise ValueError(f"an operand's side must be 'rows' or 'cols'; got {side!r}.")
        args += [array, ("i" if side == "rows" else "j") + "cdefgh"[k]]
    for array in args[::2]:
        if array.ndim != 2 or len(array.chunks[1]) != 1:
            raise ValueError(f"pairwise operands must be 2-D and chunked along rows only; got "
                             f"shape {array.shape} with chunks {array.chunks}. Rechunk with "
                             "x.rechunk({1: -1}).")
    return args


def _identity(block: Callable[..., Any]) -> tuple[str, ...]:
    """A stable token for a block function or a backend's bound method."""
    owner = getattr(block, "__self__", None)
    return (block.__module__, block.__qualname__, type(owner).__qualname__ if owner else "")
