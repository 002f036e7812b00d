"""Sampling rows with probability ∝ a weight n-vector that stays on the cluster.

Two stages (so no n-vector reaches the client): the per-chunk sums come to the
client, which draws how many samples each chunk gets; then one task per chosen
chunk inverts that chunk's cumulative weights at uniforms the client drew.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

#: Rounds of with-replacement draws ``sample_distinct`` tries before giving up.
MAX_ROUNDS = 50


def pick_in_chunk_block(w: np.ndarray, *, u: np.ndarray) -> np.ndarray:
    """One task: the local rows of a weight chunk at the uniforms ``u`` of the chunk's mass."""
    cdf = np.cumsum(w, dtype=np.float64)
    return np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), len(w) - 1)


def chunk_sum_block(w: np.ndarray) -> np.ndarray:
    """One task: the float64 sum of a weight chunk, shape (1,)."""
    return np.array([w.sum(dtype=np.float64)])


def chunk_sums(weights: da.Array) -> np.ndarray:
    """Sum of the weights in each row chunk, brought to the client; shape (n_chunks,)."""
    sums = da.map_blocks(chunk_sum_block, weights, chunks=(1,), dtype=np.float64,
                         name=f"dk-draw-sums-{tokenize(weights.name)}")
    (out,) = dask.compute(sums)
    return np.maximum(np.asarray(out), 0.0)


def sample_rows(weights: da.Array, size: int, rng: np.random.Generator,
                sums: np.ndarray | None = None) -> np.ndarray:
    """``size`` row indices drawn with replacement, with probability ∝ ``weights``.

    Parameters
    ----------
    weights : dask.array.Array of shape (n,)
        Non-negative, persisted (it is read once per call).
    size : int
    rng : numpy.random.Generator
    sums : ndarray of shape (n_chunks,), optional
        ``chunk_sums(weights)`` when the caller already has them.

    Returns
    -------
    ndarray of int, shape (size,)
    """
    picks = []
    for c, u, offset in _draws(weights, size, rng, sums):
        picks.append(da.map_blocks(
            pick_in_chunk_block, weights.blocks[c], chunks=(len(u),), dtype=np.int64, u=u,
            name=f"dk-draw-pick-{tokenize(weights.name, c, u)}") + offset)
    return np.concatenate(dask.compute(*picks)).astype(np.int64)


def _draws(weights: da.Array, size: int, rng: np.random.Generator,
           sums: np.ndarray | None) -> list[tuple[int, np.ndarray, int]]:
    """The chunks that get samples: (chunk, its uniforms, its first row) each, drawn on the
    client from the per-chunk sums."""
    sums = chunk_sums(weights) if sums is None else sums
    total = sums.sum()
    if not total > 0:
        raise ValueError("cannot sample rows: every weight is zero (the residual diagonal or the "
                         "leverage scores vanished); use fewer pivots or centres.")
    counts = rng.multinomial(size, sums / total)
    offsets = np.concatenate([[0], np.cumsum(weights.chunks[0])])
    return [(int(c), rng.random(counts[c]), int(offsets[c])) for c in np.flatnonzero(counts)]


def pick_and_take_block(w: np.ndarray, *blocks: np.ndarray, u: np.ndarray, offset: int
                        ) -> tuple[np.ndarray, ...]:
    """One task: the rows a weight chunk gives at the uniforms u (as global indices), and
    those rows of each block of the same row chunk."""
    local = pick_in_chunk_block(w, u=u)
    return (local + offset, *(b[local] for b in blocks))


def sample_distinct_rows_of(weights: da.Array, size: int, rng: np.random.Generator,
                            arrays: list[da.Array], sums: np.ndarray | None = None
                            ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The distinct sorted rows S of ``size`` draws as :func:`sample_rows` makes them (the
    same S from the same rng), and ``A[S]`` of each array, in one round trip: each
    chosen chunk's task picks its rows and takes them from the arrays' blocks there.

    Parameters
    ----------
    weights : dask.array.Array of shape (n,)
    size : int
    rng : numpy.random.Generator
    arrays : list of dask.array.Array of shape (n, ·)
        Chunked along rows like ``weights``.
    sums : ndarray of shape (n_chunks,), optional
        ``chunk_sums(weights)`` when the caller already has them.

    Returns
    -------
    S : ndarray of int, shape (k,)
    rows : list of ndarray, one (k, ·) per array
    """
    tasks = [dask.delayed(pick_and_take_block, nout=1 + len(arrays))(
        weights.blocks[c], *(A.blocks[c] for A in arrays), u=u, offset=offset,
        dask_key_name=f"dk-draw-take-{tokenize(weights.name, *(A.name for A in arrays), c, u)}")
        for c, u, offset in _draws(weights, size, rng, sums)]
    parts = dask.compute(*tasks)
    picked = np.concatenate([p[0] for p in parts]).astype(np.int64)
    S, first = np.unique(picked, return_index=True)
    rows = [np.concatenate([p[1 + i] for p in parts])[first] for i in range(len(arrays))]
    return S, rows


def sample_distinct(weights: da.Array, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct row indices, drawn ∝ ``weights`` in rounds, duplicates dropped.

    Raises ``ValueError`` when fewer than ``size`` rows have positive weight in reach.
    """
    sums = chunk_sums(weights)
    chosen: list[int] = []
    seen: set[int] = set()
    for _ in range(MAX_ROUNDS):
        for i in sample_rows(weights, 2 * (size - len(chosen)), rng, sums):
            if int(i) not in seen and len(chosen) < size:
                seen.add(int(i))
                chosen.append(int(i))
        if len(chosen) == size:
            return np.array(chosen, dtype=np.int64)
    raise ValueError(f"could draw only {len(chosen)} distinct rows of {size} wanted in "
                     f"{MAX_ROUNDS} rounds: the weights are concentrated on few rows. Ask for "
                     "fewer centres, or use method='uniform'.")


def gather_rows(X: da.Array, idx: np.ndarray) -> np.ndarray:
    """The rows ``X[idx]`` as numpy, reading only the chunks that hold them; shape (len(idx), d)."""
    order = np.argsort(idx)
    (rows,) = dask.compute(X[np.asarray(idx)[order]])
    out = np.empty_like(rows)
    out[order] = rows
    return out
