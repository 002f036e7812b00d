"""Block functions of exact k-nearest-neighbour search: a per-block top-k, and its merge.

Each (query chunk × training chunk) pair gives, per query row, its k nearest training
rows of the chunk: squared Euclidean distances, ascending (float64), and global row
indices (int64). Between tasks they travel as one record per query row of
:func:`neighbors_dtype` (fields ``sq`` and ``index``), so indices stay integers;
:func:`merge_neighbors` merges such records. Order is by (distance, index): of rows at
equal distance the lower index comes first, whatever the chunking.

Distances by ``‖x‖² + ‖z‖² − 2xᵀz`` (one BLAS product per tile, on rows centred on
``c``) are off by up to ``δ_ij ≈ C·ε·(‖x_i − c‖² + ‖z_j − c‖²)``, which can reorder near
neighbours. They only select candidates: every pair that could be within the row's
k-th distance so far once its own ``δ_ij`` is allowed for (a set that provably holds
the tile's true k nearest), whose distances are then recomputed exactly from the
differences ``x − z``. Every distance returned is exact for its index.

The bound is per pair, not per row, and ``c`` is a sampled coordinatewise median of the
training rows (:func:`dkern.kernels.stationary.robust_centre`), not their mean: one far
row (``1e9`` among ordinary ones) cannot move the centre, and its large norm widens the
bound of its own pairs only. With a per-row bound built from the largest norm it made
every pair of the tile a candidate (a 70× slower block). The per-pair margin costs
nothing: it is folded into the coefficients of the same product.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from scipy.spatial.distance import cdist

from ..kernels.stationary import robust_centre
from .numpy_backend import single_threaded_blas
from .spatial import box_bounds, spatial_order, tile_boxes

__all__ = ["HIT", "PAD_INDEX", "best_k", "merge_hits", "merge_neighbors", "metric_distances",
           "nearest_block", "nearest_block_metric", "neighbors_dtype", "sample_bound_metric",
           "tile_order", "within_radius_block"]

#: The index of an empty slot (fewer than k rows seen): sorts after every real index.
PAD_INDEX = np.iinfo(np.int64).max
#: Query rows searched together × training rows per tile: tiles of nearby training rows
#: small enough to be skipped whole; the rows of a query tile that are not skipped (~10%
#: in 8 dimensions) leave products of about an L2 cache (1 MiB of float32).
TILE = (8192, 1024)
#: Query rows of one product with a training tile, at most (4 MiB of float32).
PRODUCT_ROWS = 1024
#: Bytes of the lower bounds from a tile of query rows to every training tile, at most.
REACH_BYTES = 32 * 2**20
#: Columns per run in :func:`_true_entries` (a divisor of the tile's column count).
RUN = 64
#: Squared norms up to this select candidates in float32 (its range ends at 3.4e38).
FLOAT32_SAFE = 1e30
#: Bound on the error of ``‖x‖² + ‖z‖² − 2xᵀz − threshold`` (one augmented product, on
#: centred rows) in units of ε(‖x‖² + ‖z‖² + |threshold|), per feature (rounding in the dot
#: product grows with d); generous: a larger bound only adds candidates.
ERROR_PER_FEATURE = 16.0
#: The error bounds' absolute part: below the smallest normal float64 (2.2e-308) rounding
#: is absolute (subnormals), so a bound relative to the norms fails where squared distances
#: are subnormal (features near 1e-157: neighbours were lost as if beyond the k-th); any d
#: terms' subnormal rounding is far below this, which moves no normal bound.
SUBNORMAL_MARGIN = float(np.finfo(np.float64).tiny)


def neighbors_dtype(k: int) -> np.dtype:
    """One query row's k nearest (squared distance, index) pairs, as one record."""
    return np.dtype([("sq", np.float64, (k,)), ("index", np.int64, (k,))])


def tile_order(z: np.ndarray) -> np.ndarray:
    """The positions of a training block's rows in the order :func:`nearest_block` groups
    them into tiles; shape (m, 1), int32.

    A model computes it once per training chunk at fit and passes it back with every
    search (``order``), so the blocks gather their rows instead of sorting them again.
    """
    if len(z) >= 2**31:
        raise ValueError(f"tile_order takes blocks of fewer than 2**31 rows (int32 "
                         f"positions); got {len(z)}. Use smaller row chunks.")
    order = spatial_order(np.asarray(z, dtype=np.float64), TILE[1])[1]
    return order.astype(np.int32)[:, None]


def nearest_block(x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray,
                  order: np.ndarray | None = None, *, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of z to each row of x, by exact squared distance, then index,
    among those within ``limit``.

    The training rows are grouped into tiles of nearby rows (:mod:`dkern.backends.spatial`).
    Each query row first searches the tile whose bounding box is nearest, which gives it a
    tight bound on its k-th distance at once; then every other tile, skipping the rows the
    tile's box is farther from than their k-th nearest so far.

    Parameters
    ----------
    x : ndarray of shape (n, d)
        Query rows.
    z : ndarray of shape (m, d)
        Training rows.
    limit : ndarray of shape (n, 1)
        An upper bound on each query row's k-th smallest squared distance over all the
        training rows (:func:`sample_bound`): farther rows cannot be among its k nearest,
        so every block starts its search with it rather than from scratch.
    index : ndarray of shape (m, 1)
        z's global row indices (int64).
    order : ndarray of shape (m, 1), optional
        :func:`tile_order` of z, kept from an earlier call (a model's fit); None: the
        rows are sorted here. Any permutation gives the same result: the order only
        decides which rows share a tile, and so how many are skipped.
    k : int

    Returns
    -------
    sq : ndarray of shape (n, k), float64
        Squared distances, ascending; ``inf`` in slots no row within ``limit`` fills.
    index : ndarray of shape (n, k), int64
        Their rows' global indices; ``PAD_INDEX`` in those slots.
    """
    x, z = np.asarray(x, dtype=np.float64), np.asarray(z, dtype=np.float64)
    best_sq = np.full((len(x), k), np.inf)
    best_idx = np.full((len(x), k), PAD_INDEX)
    if len(z) == 0 or len(x) == 0:  # nothing to search, or no one asking
        return best_sq, best_idx
    tile_rows, tile_cols = TILE
    if order is None:
        z, by_place = spatial_order(z, tile_cols)  # compact tiles of tile_cols rows
    elif len(order) != len(z):
        raise ValueError(f"order must give the tile order of z's {len(z)} rows (tile_order "
                         f"of this block); got {len(order)} positions. Pass the order of "
                         "the same chunk, or None.")
    else:
        by_place = order[:, 0]
        z = z.take(by_place, axis=0)  # several times faster than z[by_place] here
    index = np.asarray(index, dtype=np.int64)[by_place, 0]
    xa, za, hx, rel = _augmented(x, z)
    train = _Tiles(z, np.ascontiguousarray(za.T), index, *tile_boxes(z, tile_cols), rel)
    cap = 4.0 * (hx + za[:, -2].max(initial=0.0))  # exceeds every distance (see _candidates)
    start = np.where(np.isfinite(limit[:, 0]), np.minimum(limit[:, 0], cap), np.inf)
    # the rows searched together hold their bounds to every training tile: keep that small
    tile_rows = min(tile_rows, max(PRODUCT_ROWS, REACH_BYTES // (8 * len(train.low))))
    with single_threaded_blas():
        for i0 in range(0, len(x), tile_rows):
            part = slice(i0, i0 + tile_rows)
            best_sq[part], best_idx[part] = _nearest_rows(x[part], xa[part], hx[part],
                                                          start[part], train, k)
    return best_sq, best_idx


class _Tiles(NamedTuple):
    """A training block in compact tiles of ``TILE[1]`` rows (:func:`nearest_block`)."""

    z: np.ndarray  # (m, d) rows, in tile order
    zat: np.ndarray  # (d + 2, m) their augmented rows, transposed (:func:`_augmented`)
    index: np.ndarray  # (m,) their global indices
    low: np.ndarray  # (tiles, d) each tile's bounding box
    high: np.ndarray
    rel: float  # the products' relative error bound


def _nearest_rows(x: np.ndarray, xa: np.ndarray, hx: np.ndarray, start: np.ndarray,
                  train: _Tiles, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nearest_block` for query rows x (r, d), with their augmented rows ``xa``,
    centred squared norms ``hx`` and starting bounds ``start`` (r,)."""
    best = np.full((len(x), k), np.inf), np.full((len(x), k), PAD_INDEX)
    reach = box_bounds(x, train.low, train.high)  # (r, tiles)
    seed = reach.argmin(axis=1)  # each row's nearest tile, searched first
    by_seed = np.argsort(seed, kind="stable")
    edges = np.searchsorted(seed[by_seed], np.arange(reach.shape[1] + 1))
    unbounded = np.full(len(x), np.inf)  # its k nearest in the tile, whatever the limit
    for t in np.unique(seed):
        _search_tile(t, by_seed[edges[t]:edges[t + 1]], unbounded, x, xa, hx, train, best, k)
    for t in range(reach.shape[1]):
        bound = np.minimum(best[0][:, k - 1], start)
        rows = np.flatnonzero((reach[:, t] <= bound) & (seed != t))
        for r0 in range(0, len(rows), PRODUCT_ROWS):  # all of them where nothing is skipped
            _search_tile(t, rows[r0:r0 + PRODUCT_ROWS], bound, x, xa, hx, train, best, k)
    beyond = best[0] > start[:, None]  # found by the nearest tile's search, past the limit
    best[0][beyond], best[1][beyond] = np.inf, PAD_INDEX
    return best


def _search_tile(t: int, rows: np.ndarray, bound: np.ndarray, x: np.ndarray, xa: np.ndarray,
                 hx: np.ndarray, train: _Tiles, best: tuple[np.ndarray, np.ndarray],
                 k: int) -> None:
    """Merge training tile ``t``'s rows within ``bound`` (r,) into the k nearest so far of
    the query ``rows`` (indices into x), in place in ``best`` = (sq, index), each (r, k)."""
    j0 = t * TILE[1]
    hits, cols = _candidates(xa[rows], train.zat[:, j0:j0 + TILE[1]], hx[rows], train.rel,
                             bound[rows], k)
    if len(hits) == 0:
        return
    hit, hits = np.unique(hits, return_inverse=True)  # merge these rows only
    at = rows[hit]
    exact = np.square(x[at[hits]] - train.z[j0 + cols]).sum(axis=1)
    best_sq, best_idx = best
    best_sq[at], best_idx[at] = best_k(
        np.concatenate([np.repeat(np.arange(len(at)), k), hits]),
        np.concatenate([best_sq[at].ravel(), exact]),
        np.concatenate([best_idx[at].ravel(), train.index[j0 + cols]]), len(at), k)


def sample_bound(x: np.ndarray, sample: np.ndarray, *, k: int) -> np.ndarray:
    """An upper bound on each row's k-th smallest exact squared distance to the ``sample``
    rows; shape (n, 1).

    The sample rows are training rows, so this bounds the k-th smallest over all of them.
    Distances by one product on rows centred on the sample (``‖x‖² + ‖s‖² − 2xᵀs``), each
    raised by a bound on its error and on the exact sum's rounding (as :func:`_augmented`'s,
    for float64), so a sample row at the k-th exact distance is within it.
    """
    x, sample = np.asarray(x, dtype=np.float64), np.asarray(sample, dtype=np.float64)
    centre = robust_centre(sample)
    sc = sample - centre
    hs = np.einsum("ij,ij->i", sc, sc)
    rel = ERROR_PER_FEATURE * (x.shape[1] + 2) * float(np.finfo(np.float64).eps)
    out = np.empty((len(x), 1))
    rows = 512  # a (rows, len(sample)) block of distances at a time
    with single_threaded_blas(), np.errstate(over="ignore", invalid="ignore"):
        for i0 in range(0, len(x), rows):
            xc = x[i0:i0 + rows] - centre
            hx = np.einsum("ij,ij->i", xc, xc)[:, None]
            upper = (hx + hs) * (1.0 + rel) - 2.0 * (xc @ sc.T)
            upper[np.isnan(upper)] = np.inf  # inf - inf of overflowing squares
            out[i0:i0 + rows, 0] = np.partition(upper, k - 1, axis=1)[:, k - 1]
    return out * (1 + 1e-12) + SUBNORMAL_MARGIN


def metric_distances(x: np.ndarray, z: np.ndarray, *, metric: str, p: float) -> np.ndarray:
    """Exact distances between the rows of x (n, d) and z (m, d) as scikit-learn defines
    them; shape (n, m), float64.

    ``metric="minkowski"``: ``(Σ|xᵢ − zᵢ|^p)^(1/p)`` (p = 1 Manhattan, p = inf Chebyshev);
    ``"cosine"``: ``1 − x̂·ẑ`` clipped to [0, 2], rows of norm 0 left at 0 (scikit-learn's
    ``normalize``, so their distance to every row is 1).
    """
    x, z = np.asarray(x, dtype=np.float64), np.asarray(z, dtype=np.float64)
    if metric == "cosine":
        with single_threaded_blas():
            return np.clip(1.0 - _unit_rows(x) @ _unit_rows(z).T, 0.0, 2.0)
    if np.isinf(p):
        return cdist(x, z, "chebyshev")
    return cdist(x, z, "cityblock") if p == 1 else cdist(x, z, "minkowski", p=p)


def _unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows divided by their norms; rows of norm 0 stay 0."""
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return np.divide(a, norms, out=np.zeros_like(a), where=norms > 0)


def nearest_block_metric(x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray,
                         *, k: int, metric: str, p: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nearest_block` for the distances of :func:`metric_distances`: the k nearest
    rows of z to each row of x by (distance, index), among those within ``limit`` (n, 1)
    (:func:`sample_bound_metric`). No product trick here: every distance of a tile is
    computed exactly, and those within each row's k-th so far enter the merge.

    Returns
    -------
    (ndarray of shape (n, k), ndarray of shape (n, k))
        Distances (float64, ascending; ``inf`` in empty slots) and global indices
        (``PAD_INDEX`` there): the ``sq`` and ``index`` fields of :func:`neighbors_dtype`.
    """
    index = np.asarray(index, dtype=np.int64)
    best = np.full((len(x), k), np.inf)
    best_idx = np.full((len(x), k), PAD_INDEX)
    tile_rows, tile_cols = TILE
    for j0 in range(0, len(z), tile_cols):
        for i0 in range(0, len(x), tile_rows):
            part = slice(i0, i0 + tile_rows)
            dist = metric_distances(x[part], z[j0:j0 + tile_cols], metric=metric, p=p)
            bound = np.minimum(best[part, k - 1], limit[part, 0])
            rows, cols = np.nonzero(dist <= bound[:, None])
            if len(rows) == 0:
                continue
            hit, rows = np.unique(rows, return_inverse=True)
            at = i0 + hit
            best[at], best_idx[at] = best_k(
                np.concatenate([np.repeat(np.arange(len(hit)), k), rows]),
                np.concatenate([best[at].ravel(), dist[hit[rows], cols]]),
                np.concatenate([best_idx[at].ravel(), index[j0 + cols, 0]]), len(hit), k)
    return best, best_idx


#: One training row within a query row's radius: its global index and exact distance.
HIT = np.dtype([("index", np.int64), ("dist", np.float64)])


def within_radius_block(x: np.ndarray, z: np.ndarray, index: np.ndarray, *, radius: float,
                        metric: str, p: float) -> np.ndarray:
    """The rows of z within ``radius`` of each row of x, by :func:`metric_distances`.

    Returns
    -------
    ndarray of shape (n, 1), object
        Per row of x an array of :data:`HIT` records (ascending index): the partial
        result :func:`merge_hits` merges across training blocks.
    """
    index = np.asarray(index, dtype=np.int64)[:, 0]
    rows, hits = [np.empty(0, np.int64)], [np.empty(0, HIT)]
    tile_rows, tile_cols = TILE
    for j0 in range(0, len(z), tile_cols):
        for i0 in range(0, len(x), tile_rows):
            dist = metric_distances(x[i0:i0 + tile_rows], z[j0:j0 + tile_cols], metric=metric,
                                    p=p)
            r, c = np.nonzero(dist <= radius)
            found = np.empty(len(r), HIT)
            found["index"], found["dist"] = index[j0 + c], dist[r, c]
            rows.append(i0 + r)
            hits.append(found)
    row, hit = np.concatenate(rows), np.concatenate(hits)
    order = np.lexsort((hit["index"], row))  # by row, then ascending index
    bounds = np.searchsorted(row[order], np.arange(1, len(x)))
    out = np.empty((len(x), 1), dtype=object)
    for i, part in enumerate(np.split(hit[order], bounds)):
        out[i, 0] = part
    return out


def merge_hits(parts: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    """Merge per-row :data:`HIT` arrays ``(n, r, 1)`` (object) along axis 1 into ``(n, 1)``,
    ascending index. Associative (a ``combine`` of :func:`dkern.operators.pairwise_reduce`)."""
    out = np.empty((parts.shape[0], 1), dtype=object)
    for row in range(parts.shape[0]):
        hits = np.concatenate([np.atleast_1d(h) for h in parts[row].ravel()])
        out[row, 0] = hits[np.argsort(hits["index"], kind="stable")]
    return out[:, None, :] if keepdims else out


def sample_bound_metric(x: np.ndarray, sample: np.ndarray, *, k: int, metric: str,
                        p: float) -> np.ndarray:
    """:func:`sample_bound` for :func:`metric_distances`: each row's k-th smallest distance
    to the ``sample`` (training) rows, with a margin; shape (n, 1)."""
    kth = np.empty((len(x), 1))
    rows = 128  # a (rows, len(sample)) distance block at a time
    for i0 in range(0, len(x), rows):
        dist = metric_distances(x[i0:i0 + rows], sample, metric=metric, p=p)
        kth[i0:i0 + rows, 0] = np.partition(dist, k - 1, axis=1)[:, k - 1]
    return kth + 1e-12 * (1.0 + np.abs(kth))  # should a block's distance round differently


def _augmented(x: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                      float]:
    """Rows ``[−2x, 1, ‖x‖²]`` and ``[z, ‖z‖², 1]``, centred on a robust centre of z (the
    error bound scales with the centred norms), whose products are the approximate squared
    distances; the x rows' centred squared norms (float64); and the relative bound ``C·ε``
    on the products' error: ``C·ε·(‖x − c‖² + ‖z − c‖² + |threshold|)`` per pair.

    They are float32 (twice the speed of float64 products, half the memory traffic) unless
    the norms would overflow it; the exact distances that order candidates are float64.
    """
    centre = robust_centre(z)
    xc, zc = x - centre, z - centre
    hx, hz = np.einsum("ij,ij->i", xc, xc), np.einsum("ij,ij->i", zc, zc)
    dtype = np.float32 if max(hx.max(), hz.max()) < FLOAT32_SAFE else np.float64
    rel = ERROR_PER_FEATURE * (x.shape[1] + 2) * float(np.finfo(dtype).eps)
    xa = np.hstack([-2.0 * xc, np.ones((len(xc), 1)), hx[:, None]]).astype(dtype)
    za = np.hstack([zc, hz[:, None], np.ones((len(zc), 1))]).astype(dtype)
    return xa, za, hx, rel


def _candidates(xa: np.ndarray, zat: np.ndarray, hx: np.ndarray, rel: float,
                bound: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) pairs of a tile that surely hold every column that can enter a row's
    k nearest so far, whose k-th exact squared distance is ``bound`` (inf: fewer than k).

    ``xa`` (n, d + 2) and ``zat`` (d + 2, m) are a tile's augmented rows, ``hx`` the rows'
    centred squared norms and ``rel`` the products' relative error bound (:func:`_augmented`).
    A finite ``bound`` may be capped at anything above every distance of the row
    (``4 (h_x + max h_z)`` is, as ``‖x − z‖² ≤ 2 (h_x + h_z)``): it still admits every column.
    """
    m = zat.shape[1]
    short = np.isinf(bound)
    if m <= k and short.any():
        rows, cols = np.indices((len(xa), m))
        return rows.ravel(), cols.ravel()
    # Computed products A_ij = h_x + h_z − 2 x·z − t_i differ from ‖x − z‖² − t_i by at most
    # e_ij = rel (h_x + h_z + |t_i|). A column enters only if its exact distance is at most
    # the bound t_i, so only if A_ij − e_ij ≤ 0: folded into the product as the coefficients
    # (1 − rel) of h_x and h_z and (1 + rel) of t_i, one comparison per pair, at no extra cost.
    threshold = bound.copy()
    if short.any():  # the tile's k-th distance is at most the k-th smallest D_ij + 2 e_ij
        up = xa[short].copy()  # (an upper bound on each pair's distance): use that bound
        up[:, -2] = 1.0 + 2.0 * rel
        up[:, -1] = (1.0 + 2.0 * rel) * hx[short]
        upper = up @ zat
        threshold[short] = np.partition(upper, k - 1, axis=1)[:, k - 1]
    shifted = xa.copy()
    shifted[:, -2] = 1.0 - rel
    shifted[:, -1] = ((1.0 - rel) * hx - threshold - rel * np.abs(threshold)
                      - SUBNORMAL_MARGIN)
    return _true_entries((shifted @ zat) <= 0.0)


def _true_entries(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.nonzero(mask)`` of a sparse (n, m) mask, faster: once a row has its k, few of
    a tile's columns enter, so the mask is scanned in runs of ``RUN`` columns (one ``any``
    each) and only the runs holding a True are searched."""
    n, m = mask.shape
    if m % RUN:
        rows, cols = np.nonzero(mask)
        return rows, cols
    runs = mask.reshape(n, m // RUN, RUN)
    rows, run = np.nonzero(runs.any(axis=2))
    which, col = np.nonzero(runs[rows, run])
    return rows[which], run[which] * RUN + col


def best_k(rows: np.ndarray, sq: np.ndarray, idx: np.ndarray, n_rows: int,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k entries smallest by (distance, index) among (row, sq, idx) triples.

    Returns
    -------
    (ndarray of shape (n_rows, k), ndarray of shape (n_rows, k))
        Squared distances and indices; ``(inf, PAD_INDEX)`` in slots no entry fills.
    """
    order = np.lexsort((idx, sq, rows))
    rows, sq, idx = rows[order], sq[order], idx[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, np.arange(n_rows))[rows]
    keep = rank < k
    out_sq = np.full((n_rows, k), np.inf)
    out_idx = np.full((n_rows, k), PAD_INDEX)
    out_sq[rows[keep], rank[keep]] = sq[keep]
    out_idx[rows[keep], rank[keep]] = idx[keep]
    return out_sq, out_idx


def merge_neighbors(parts: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    """Merge neighbour records ``(n, r, 1)`` of :func:`neighbors_dtype` along ``axis``
    (1) into ``(n, 1)``.

    Associative and commutative (a ``combine`` of :func:`dkern.operators.pairwise_reduce`).
    """
    ax = axis[0] if isinstance(axis, tuple) else axis
    if ax != 1 or parts.ndim != 3 or parts.dtype.names != ("sq", "index"):
        raise ValueError(f"merge_neighbors merges (n, r, 1) records of neighbors_dtype(k) "
                         f"along axis 1; got shape {parts.shape}, dtype {parts.dtype} and "
                         f"axis {axis!r}.")
    n = parts.shape[0]
    k = parts.dtype["sq"].shape[0]
    rows = np.repeat(np.arange(n), parts.shape[1] * parts.shape[2] * k)  # parts[0]: n may be 0
    out = np.empty((n, 1), parts.dtype)
    out["sq"][:, 0], out["index"][:, 0] = best_k(rows, parts["sq"].ravel(),
                                                 parts["index"].ravel(), n, k)
    return out[:, None, :] if keepdims else out
