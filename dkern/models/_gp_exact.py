"""Dense GP algebra for n <= ``EXACT_MAX_N``: Cholesky, the log marginal likelihood and
its gradient, and posterior variances, all on tiles whose size is bounded.

With ``C = K + alpha I = L Lᵀ`` and ``a = C⁻¹ y`` (Rasmussen & Williams 2006, Alg. 2.1)::

    ln p(y | θ)        = -½ yᵀa - Σ ln L_ii - n/2 ln 2π              (per target, summed)
    ∂ ln p / ∂θ_k      = ½ Σ_ij (a aᵀ - C⁻¹)_ij ∂K_ij/∂θ_k           (R&W eq. 5.9)
    var(x*)            = k(x*, x*) - ||L⁻¹ k(X, x*)||²               (Alg. 2.1 lines 5-6)

The gradient is summed over row tiles of ∂K/∂θ (never an (n, n, p) array), and over
the lower triangle only: both factors are symmetric.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import numpy as np
import scipy.linalg as sla

from ..errors import NotPositiveDefiniteError
from ..kernels import Kernel

logger = logging.getLogger(__name__)

#: Bytes of one tile of ∂K/∂θ (rows × n × max(p, d) float64) in the LML gradient.
GRADIENT_TILE_BYTES = 64 * 2**20
#: Bytes of one (n, b) block of kernel columns in the exact variance.
VARIANCE_TILE_BYTES = 256 * 2**20


def cholesky(kernel: Kernel, X: np.ndarray, alpha: float) -> np.ndarray:
    """Lower Cholesky factor of ``K(X, X) + alpha I``; shape (n, n), upper triangle zero.

    Raises
    ------
    NotPositiveDefiniteError
        The matrix is not numerically positive definite.
    """
    C = np.asarray(kernel(X), dtype=np.float64)
    C[np.diag_indices_from(C)] += alpha
    try:
        return sla.cholesky(C, lower=True, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError as err:
        raise NotPositiveDefiniteError(
            f"K + alpha I (n={len(X)}, alpha={alpha:g}) is not numerically positive definite "
            f"({err}). Increase alpha (the noise variance added to the diagonal), e.g. "
            "alpha=1e-6, or check the kernel with dkern.kernels.check_psd.") from None


def lml_from_factor(L: np.ndarray, y: np.ndarray, a: np.ndarray) -> float:
    """``ln p(y)`` from the factor L, targets y (n, t) and ``a = C⁻¹ y``, summed over targets."""
    n, t = y.shape
    return float(-0.5 * np.einsum("ik,ik->", y, a) - t * np.log(np.diag(L)).sum()
                 - t * n / 2 * math.log(2 * math.pi))


def log_marginal_likelihood(kernel: Kernel, X: np.ndarray, y: np.ndarray, alpha: float,
                            eval_gradient: bool) -> tuple[float, np.ndarray]:
    """``ln p(y | X, θ)`` and (if asked) its gradient in ``kernel.theta``; shape (p,).

    Returns ``-inf`` and a zero gradient when ``K + alpha I`` is not positive definite
    (as scikit-learn does), so an optimizer steps away from such θ.
    """
    p = len(kernel.theta)
    try:
        L = cholesky(kernel, X, alpha)
    except NotPositiveDefiniteError:
        return -np.inf, np.zeros(p)
    a = sla.cho_solve((L, True), y, check_finite=False)  # shape: (n, t)
    value = lml_from_factor(L, y, a)
    if not eval_gradient:
        return value, np.zeros(p)
    W, info = sla.lapack.dpotri(L, lower=1, overwrite_c=1)  # lower triangle of C⁻¹, in place
    if info != 0:
        return -np.inf, np.zeros(p)
    W *= -y.shape[1]
    W += a @ a.T  # only the lower triangle of W is used below
    return value, 0.5 * _lower_contraction(kernel, X, W, p)


def _lower_contraction(kernel: Kernel, X: np.ndarray, W: np.ndarray, p: int) -> np.ndarray:
    """``Σ_ij W_ij ∂K_ij/∂θ`` for symmetric W and ∂K given by W's lower triangle; shape (p,)."""
    n = len(X)
    rows = max(1, GRADIENT_TILE_BYTES // (8 * n * max(p, X.shape[1], 1)))
    total = np.zeros(p)
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        Wt = W[i0:i1, :i1].copy()  # shape: (b, i1), the tile's lower-triangle part
        Wt[:, :i0] *= 2.0  # the mirrored upper triangle counts twice
        diag_block = Wt[:, i0:i1]
        diag_block *= np.tril(np.full((i1 - i0, i1 - i0), 2.0), -1) + np.eye(i1 - i0)
        total += np.einsum("ij,ijp->p", Wt, kernel.gradient(X[i0:i1], X[:i1]))
    return total


def variance(kernel: Kernel, X: np.ndarray, L: np.ndarray, Xt: np.ndarray) -> np.ndarray:
    """Latent posterior variance ``k(x*, x*) - ||L⁻¹ k(X, x*)||²`` for Xt (m, d); shape (m,)."""
    n = len(X)
    cols = max(1, VARIANCE_TILE_BYTES // (8 * n))
    out = np.empty(len(Xt))
    for j0 in range(0, len(Xt), cols):
        Xb = Xt[j0:j0 + cols]
        V = sla.solve_triangular(L, np.asarray(kernel(X, Xb), dtype=np.float64), lower=True,
                                 overwrite_b=True, check_finite=False)  # shape: (n, b)
        out[j0:j0 + cols] = kernel.diag(Xb) - np.einsum("ij,ij->j", V, V)
    return clip_variance(out)


def covariance(kernel: Kernel, X: np.ndarray, L: np.ndarray, Xt: np.ndarray) -> np.ndarray:
    """Latent posterior covariance ``K(Xt, Xt) - Vᵀ V``, ``V = L⁻¹ K(X, Xt)``; shape (m, m)."""
    V = sla.solve_triangular(L, np.asarray(kernel(X, Xt), dtype=np.float64), lower=True,
                             overwrite_b=True, check_finite=False)
    return np.asarray(kernel(Xt), dtype=np.float64) - V.T @ V


def clip_variance(var: np.ndarray) -> np.ndarray:
    """Variances with rounding's small negative values set to 0, with scikit-learn's warning."""
    negative = var < 0
    if np.any(negative):
        warnings.warn("Predicted variances smaller than 0. Setting those variances to 0 "
                      f"({int(negative.sum())} of {var.size}, the smallest {var.min():.3e}); "
                      "a larger alpha makes them positive.", UserWarning, stacklevel=3)
        var = np.where(negative, 0.0, var)
    return var


def variance_block(Xb: np.ndarray, *, kernel: Kernel, X: Any, L: Any) -> np.ndarray:
    """:func:`variance` of one row chunk of test points (a dask block function)."""
    return variance(kernel, X, L, np.asarray(Xb, dtype=np.float64))
