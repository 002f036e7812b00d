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
=========================  ================================  ==================

:func:`pairwise_map` is the same grid without the combine step (dense kernel
blocks for a few columns). Block functions come from a backend
(:mod:`dkern.backends.blocks`) or are module-level functions of the caller;
operators add block functions, not graph code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import dask.array as da
import numpy as np
from dask.base import tokenize

from .._failures import Side, register_blocks

__all__ = ["pairwise_map", "pairwise_reduce"]

Combine = Callable[..., np.ndarray]  # f(x, axis=..., keepdims=...), as np.sum
Operand = tuple[da.Array, Literal["rows", "cols"]]


def pairwise_reduce(block: Callable[..., np.ndarray], rows: da.Array, cols: da.Array,
                    operands: Sequence[Operand] = (), *, over: Literal["rows", "cols"],
                    width: int, name: str, combine: Combine = np.sum,
                    labels: tuple[str, str] = ("X", "Z"), **kwargs: Any) -> da.Array:
    """Apply ``block`` to every chunk pair and combine the partial results.

    Parameters
    ----------
    block : callable
        ``block(a, b, *operand_blocks, **kwargs)`` for ``a = rows[i]`` (n_i, p) and
        ``b = cols[j]`` (m_j, q); returns the partial result, of shape (n_i, width)
        when ``over="cols"`` and (m_j, width) when ``over="rows"``.
    rows, cols : dask.array.Array of shape (n, p) and (m, q)
        Chunked along axis 0 only.
    operands : sequence of (array, side)
        Extra 2-D arrays chunked like ``rows`` (side ``"rows"``) or ``cols``
        (``"cols"``) along axis 0; task (i, j) gets their matching blocks.
    over : {"cols", "rows"}
        The index the partial results are combined over.
    width : int
        Columns of every partial result.
    name : str
        Prefix of the task keys as the dashboard shows them, e.g. ``"dkern-gram-matvec"``;
        the tree reduction's tasks get ``name + "-sum"``.
    combine : callable, default numpy.sum
        ``combine(x, axis=..., keepdims=...)``, associative (``numpy.sum``,
        ``numpy.max``, ``scipy.special.logsumexp``): applied in a tree.
    labels : (str, str), default ("X", "Z")
        What ``rows`` and ``cols`` are to the user: a task that kills its workers is
        reported by its block and row ranges under these names.
    **kwargs
        Passed to every ``block`` call (the kernel, small client-side arrays).

    Returns
    -------
    dask.array.Array of shape (n, width) or (m, width), float64
        Chunked like ``rows`` (``over="cols"``) or ``cols`` (``over="rows"``).
    """
    kept, reduced = ("i", "j") if over == "cols" else ("j", "i")
    args = _indexed(rows, cols, operands)
    token = tokenize(_identity(block), *(a.name for a in args[::2]), over, width, kwargs)
    parts = da.blockwise(
        _partial_block, f"{kept}{reduced}t", *args, new_axes={"t": width},
        adjust_chunks={reduced: 1}, concatenate=False, dtype=np.float64,
        meta=np.empty((0, 0, 0)), name=f"{name}-{token}", block=block, **kwargs)
    row_position = 0 if over == "cols" else 1  # the key is (name, kept, reduced, 0)
    register_blocks(parts.name, [Side(labels[0], rows.chunks[0], row_position),
                                 Side(labels[1], cols.chunks[0], 1 - row_position)], 3)
    return da.reduction(parts, combine, combine, combine=combine, axis=1, dtype=np.float64,
                        meta=np.empty((0, 0)), name=f"{name}-sum-{token}")


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


def _partial_block(*blocks: list[np.ndarray], block: Callable[..., np.ndarray],
                   **kwargs: Any) -> np.ndarray:
    """One task: the block function's partial result with the combined axis added."""
    out = block(*(_only(b) for b in blocks), **kwargs)
    return np.asarray(out, dtype=np.float64)[:, None, :]


def _whole_block(a: list[np.ndarray], b: list[np.ndarray], *, block: Callable[..., np.ndarray],
                 **kwargs: Any) -> np.ndarray:
    """One task of :func:`pairwise_map`: the block function on the chunk pair."""
    return block(_only(a), _only(b), **kwargs)


def _only(blocks: list[np.ndarray]) -> np.ndarray:
    """The one block blockwise hands over along an operand's second (whole) axis.

    With ``concatenate=True`` dask would copy it (concatenating a list of one): for a
    cached n_i × M kernel block that copy cost more than the product itself."""
    return blocks[0]


def _indexed(rows: da.Array, cols: da.Array, operands: Sequence[Operand]) -> list[Any]:
    """blockwise's (array, index) pairs: rows on i, cols on j, each second axis whole."""
    args: list[Any] = [rows, "ia", cols, "jb"]
    for k, (array, side) in enumerate(operands):
        if side not in ("rows", "cols"):
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
