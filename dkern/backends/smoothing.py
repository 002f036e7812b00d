"""Block functions of kernel smoothing: log-scaled sums of kernel weights, and their merge.

Kernel density estimation and Nadaraya–Watson regression both need, for every query
row x, the sums ``Σₙ k(x, zₙ)`` and ``Σₙ k(x, zₙ) tₙ`` over all training rows. Far from
the data a Gaussian's weights underflow to 0 (0/0 in Nadaraya–Watson, ``log 0`` in a
density), so the sums are carried in log-scaled form, per query row::

    [m, s₀, s₁ … s_T]   with   Σ k = e^m s₀,   Σ k tⱼ = e^m sⱼ,   m = max log k

as a log-sum-exp does. :func:`weighted_log_sums_block` computes them on one
(query chunk × training chunk) pair, tile by tile; :func:`merge_log_sums` merges the
partial results of several pairs (rescaling each to the common maximum), associatively,
as :func:`dkern.operators.pairwise_reduce` needs. A query row with no training row in
the kernel's reach (a box kernel, or weights underflowing for a non-Gaussian kernel)
has ``m = -inf`` and ``s = 0``. The KeOps backend computes the same form for a Gaussian by
one reduction (:func:`dkern.backends.keops_backend.log_sums_block_keops`), and the fused C
loop of :mod:`.fused_cpu` without tiles of log weights, where it is built.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import Gaussian, Kernel, fastexp
from ..kernels.profiles import RadialProfile
from ..kernels.stationary import Stationary
from .fused_cpu import log_sums_block_fused
from .numpy_backend import default_tile, single_threaded_blas

__all__ = ["log_weights", "merge_log_sums", "weighted_log_sums_block"]


def log_weights(x: np.ndarray, z: np.ndarray, *, kernel: Kernel | None,
                box_width: float | None) -> np.ndarray:
    """``log k(x, z)`` for every pair; shape (n, m), float64.

    A Gaussian is taken in the log domain (``-‖x − z‖² / 2ℓ²``: no underflow at any
    distance); ``box_width`` w gives the hypercube kernel of side w (``log 1`` where
    every coordinate differs by at most w/2, else ``-inf``), compared coordinate by
    coordinate; a :class:`~dkern.kernels.profiles.RadialProfile` gives its log directly;
    any other kernel's values are taken as they are, and must be ≥ 0.
    """
    if box_width is not None:
        inside = np.ones((len(x), len(z)), dtype=bool)
        for j in range(x.shape[1]):
            inside &= np.abs(x[:, j, None] - z[None, :, j]) <= box_width / 2
        return np.where(inside, 0.0, -np.inf)
    assert kernel is not None
    if type(kernel) is Gaussian:
        return kernel.half_neg_sqdist(x, z)
    if isinstance(kernel, RadialProfile):  # in the log domain too (the exponential's tail)
        return kernel.log_block(x, z)
    values = np.asarray(kernel(x, z), dtype=np.float64)
    if (values < 0).any():
        raise ValueError(f"kernel smoothing needs weights k(x, z) >= 0, but {kernel!r} gave "
                         f"{values.min():.3g}; use a kernel with non-negative values, such as "
                         "Gaussian, Laplacian or Matern.")
    with np.errstate(divide="ignore"):
        return np.log(values)


def weighted_log_sums_block(x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                            kernel: Kernel | None = None, box_width: float | None = None,
                            scale: float = 1.0) -> np.ndarray:
    """``[m, s₀, s₁ … s_T]`` of the weights ``k(x/scale, z/scale)`` per row of x.

    Parameters
    ----------
    x : ndarray of shape (n, d)
        Query rows.
    z : ndarray of shape (m, d)
        Training rows.
    t : ndarray of shape (m, T), optional
        Values the weights multiply (Nadaraya–Watson's targets); none for a density.
    kernel, box_width
        See :func:`log_weights`.
    scale : float, default=1.0
        Rows are divided by it first (a bandwidth).

    Returns
    -------
    ndarray of shape (n, 2 + T), float64
    """
    if box_width is None and (fused := log_sums_block_fused(x, z, t, kernel=kernel,
                                                            scale=scale)) is not None:
        return fused
    x, z = np.asarray(x, dtype=np.float64), np.asarray(z, dtype=np.float64)
    if box_width is not None:  # the scale goes where no row is divided: x / h rounds a far
        box_width = box_width * scale  # row to its own magnitude, losing a small difference
    elif isinstance(kernel, Stationary):
        params = kernel.get_params(deep=False)
        kernel = type(kernel)(**{**params, "lengthscale": np.asarray(kernel.lengthscale) * scale})
    else:
        x, z = x / scale, z / scale
    ones = np.ones((len(z), 1))
    values = ones if t is None else np.hstack([ones, np.asarray(t, dtype=np.float64)])
    out = np.full((len(x), 1 + values.shape[1]), [-np.inf] + [0.0] * values.shape[1])
    tile_rows, tile_cols = default_tile(np.dtype(np.float64))
    with single_threaded_blas():
        for j0 in range(0, len(z), tile_cols):
            zt, vt = z[j0:j0 + tile_cols], values[j0:j0 + tile_cols]
            for i0 in range(0, len(x), tile_rows):
                L = log_weights(x[i0:i0 + tile_rows], zt, kernel=kernel, box_width=box_width)
                part = _tile_log_sums(L, vt)
                rows = out[i0:i0 + tile_rows]
                rows[:] = merge_log_sums(np.stack([rows, part], axis=1), axis=1, keepdims=False)
    return out


def _tile_log_sums(L: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``[m, Σ e^{L − m} values]`` per row of a tile of log weights L; shape (n, 1 + T)."""
    m = L.max(axis=1) if L.shape[1] else np.full(len(L), -np.inf)
    shift = np.where(np.isfinite(m), m, 0.0)
    W = fastexp.exp(L - shift[:, None])  # ≤ 1: the largest weight of each row is 1
    return np.column_stack([m, W @ values])


def merge_log_sums(parts: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    """Merge log-scaled sums along ``axis``, each rescaled to the common maximum.

    ``parts`` has ``[m, s…]`` along its last axis; the merge is associative and
    commutative (a ``combine`` of :func:`dkern.operators.pairwise_reduce`).
    """
    ax = axis[0] if isinstance(axis, tuple) else axis
    m = parts[..., :1]
    top = m.max(axis=ax, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0.0)
    sums = (parts[..., 1:] * np.exp(m - shift)).sum(axis=ax, keepdims=True)
    out = np.concatenate([top, sums], axis=-1)
    return out if keepdims else np.squeeze(out, axis=ax)
