"""Rows grouped into compact tiles, and lower bounds on distances to a tile.

An exact search over every pair of a block costs the same whatever the data; grouped
into tiles of nearby rows, a tile whose bounding box is farther from a query row than
the row's k-th nearest so far holds none of its k nearest and is skipped unread. The
grouping only reorders rows (their indices travel with them), so the result is that
of the exhaustive search; only the number of pairs computed changes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["box_bounds", "spatial_order", "tile_boxes"]

#: Relative slack taken off a box's lower bound: the bound is summed over the features in
#: another order than a pair's exact distance, so it may round up by up to ~d·ε; a smaller
#: bound only visits a tile more (never skips a row within reach).
BOUND_SLACK = 1e-9

#: Bytes of bounds summed at a time by :func:`box_bounds` (about half an L2 cache).
BOUND_BYTES = 1 << 19
#: Rows of a segment whose spread picks the feature it is split along.
SPREAD_SAMPLE = 512


def spatial_order(a: np.ndarray, leaf: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``a`` reordered so that consecutive runs of ``leaf`` rows are compact.

    Median splits along the widest feature, as a k-d tree's, at a multiple of ``leaf`` rows
    so every run but the last is full; the leaves are left in tree order. The rows move
    feature by feature (a gather of a segment of one feature stays in cache; a gather of
    whole rows reads memory at random, several times slower).

    Parameters
    ----------
    a : ndarray of shape (n, d)
    leaf : int
        Rows per run (>= 1).

    Returns
    -------
    rows : ndarray of shape (n, d)
        ``a[order]``.
    order : ndarray of shape (n,), int64
    """
    columns, order = np.array(a.T, order="C"), np.arange(len(a))  # a feature per row
    pending = [(0, len(a))]
    while pending:
        start, stop = pending.pop()
        if stop - start <= leaf:
            continue
        part = columns[:, start:stop]
        spread = part[:, ::-(-part.shape[1] // SPREAD_SAMPLE)]  # the widest of a sample
        widest = int(np.argmax(spread.max(axis=1) - spread.min(axis=1)))
        split = leaf * -(-(stop - start) // (2 * leaf))  # a multiple of leaf, < stop - start
        moves = np.argpartition(part[widest], split)
        for moved in (*columns, order):
            moved[start:stop] = moved[start:stop].take(moves)
        pending += [(start, start + split), (start + split, stop)]
    return np.ascontiguousarray(columns.T), order


def tile_boxes(a: np.ndarray, leaf: int) -> tuple[np.ndarray, np.ndarray]:
    """The bounding box of each run of ``leaf`` rows of ``a`` (n, d): (low, high), each of
    shape (ceil(n / leaf), d)."""
    starts = np.arange(0, len(a), leaf)
    return np.minimum.reduceat(a, starts, axis=0), np.maximum.reduceat(a, starts, axis=0)


def box_bounds(x: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """A lower bound on the squared Euclidean distance of each row of x (n, d) to every row
    in each box (low, high of shape (t, d)); shape (n, t), float64.

    Each feature's gap ``max(low − x, x − high, 0)`` is at most its difference to any row
    in the box, and rounding keeps that order (a subtraction rounds monotonically); the
    sum is shrunk by ``BOUND_SLACK`` against a different rounding of the pair's own sum.
    Feature by feature, in slices of rows whose (rows, t) sums stay in cache.
    """
    bound = np.empty((len(x), len(low)))
    rows = max(1, BOUND_BYTES // (8 * max(1, len(low))))
    for i0 in range(0, len(x), rows):
        part = bound[i0:i0 + rows]
        part[:] = 0.0
        gap = np.empty_like(part)
        for f in range(x.shape[1]):
            xf = x[i0:i0 + rows, f, None]
            np.subtract(low[:, f], xf, out=gap)
            np.maximum(gap, xf - high[:, f], out=gap)  # at most one of the two is > 0
            np.maximum(gap, 0.0, out=gap)
            gap *= gap
            part += gap
    bound *= 1.0 - BOUND_SLACK
    return bound
