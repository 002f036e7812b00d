"""The exact posterior: ``C = K + alpha I = L Lᵀ`` by dense Cholesky, for n <= ``EXACT_MAX_N``.

Rasmussen & Williams (2006), Alg. 2.1, with ``a = C⁻¹ y``::

    mean(x*)           = k_*ᵀ a                                        (line 4)
    var(x*)            = k(x*, x*) - ||L⁻¹ k(X, x*)||²                 (lines 5-6)
    ln p(y | θ)        = -½ yᵀa - Σ ln L_ii - n/2 ln 2π                (line 7, per target)
    ∂ ln p / ∂θ_k      = ½ Σ_ij (a aᵀ - C⁻¹)_ij ∂K_ij/∂θ_k             (eq. 5.9)

``K = k(X)`` holds the kernel's White noise on its diagonal (scikit-learn's
``WhiteKernel``): the factor includes it, the mean's cross-covariances ``k(x*, X)`` do
not, and the variance's ``k(x*, x*)`` (``kernel.diag``) does, as scikit-learn's.

The factor is :func:`dkern.solvers.exact.cholesky_factor`, the one kernel ridge's exact
solve uses too. The gradient is summed over row tiles of ∂K/∂θ (never an (n, n, p)
array), and over the lower triangle only: both factors are symmetric.
"""

from __future__ import annotations

import math
from typing import Any

import dask.array as da
import numpy as np
import scipy.linalg as sla

from ...backends.projections import residual_diag
from ...errors import NotPositiveDefiniteError
from ...kernels import Kernel
from ...operators import pairwise_rows
from ...solvers.exact import cholesky_factor
from .expansion import KernelExpansion, clip_variance

#: Bytes of one tile of ∂K/∂θ (rows × n × max(p, d) float64) in the LML gradient.
GRADIENT_TILE_BYTES = 64 * 2**20
#: Bytes of one (n, b) block of kernel columns in the exact variance.
VARIANCE_TILE_BYTES = 256 * 2**20


class ExactPosterior(KernelExpansion):
    """Mean, variance, covariance and evidence of ``C a = y`` from the Cholesky factor L.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d), float64
    weights : ndarray of shape (n,) or (n, t)
        ``a = C⁻¹ y``.
    L : ndarray of shape (n, n)
        The lower Cholesky factor of ``C``.
    backend : str, default="auto"
        How the mean's kernel blocks are computed.
    """

    def __init__(self, kernel: Kernel, X: np.ndarray, weights: np.ndarray, L: np.ndarray, *,
                 backend: str = "auto") -> None:
        super().__init__(kernel, X, weights, backend=backend)
        self.L = L

    @classmethod
    def fit(cls, kernel: Kernel, X: np.ndarray, y: np.ndarray, alpha: float, *,
            backend: str = "auto") -> ExactPosterior:
        """Factor ``C = K(X, X) + alpha I`` and solve ``C a = y`` (y of shape (n,) or (n, t))."""
        L = cholesky_factor(kernel, X, alpha)
        # C order, as a model file reads it back: BLAS rounds differently per layout
        weights = np.ascontiguousarray(sla.cho_solve((L, True), y, check_finite=False))
        return cls(kernel, X, weights, L, backend=backend)

    def variance(self, Xt: Any) -> Any:
        """Latent variance at Xt (m, d); numpy (m,), or lazy per row chunk for dask Xt."""
        if isinstance(Xt, da.Array):
            return pairwise_rows(_variance_block, Xt, width=None, dtype=np.float64,
                                 name="dk-exact-var", label="X_test",
                                 broadcast={"X": self.X, "L": self.L}, kernel=self.kernel)
        return _variance(self.kernel, self.X, self.L, Xt)

    def covariance(self, Xt: np.ndarray) -> np.ndarray:
        """``K(Xt, Xt) - Vᵀ V`` with ``V = L⁻¹ K(X, Xt)``; shape (m, m)."""
        V = sla.solve_triangular(self.L, np.asarray(self.kernel(self.X, Xt), dtype=np.float64),
                                 lower=True, overwrite_b=True, check_finite=False)
        return np.asarray(self.kernel(Xt), dtype=np.float64) - V.T @ V

    def log_marginal_likelihood(self, y: np.ndarray) -> float:
        """``ln p(y)`` of the targets y (n, t) the weights solve for, summed over targets."""
        return _lml_from_factor(self.L, y, self.weights.reshape(y.shape))

    def state(self) -> dict[str, Any]:
        """Everything :meth:`from_state` needs: kernel, X, weights, L, backend."""
        return {"kernel": self.kernel, "X": self.X, "weights": self.weights, "L": self.L,
                "backend": self.backend}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ExactPosterior:
        return cls(state["kernel"], state["X"], state["weights"], state["L"],
                   backend=state["backend"])

    def rebound(self) -> ExactPosterior:
        return self  # numpy arrays only: nothing lives on a cluster


def log_marginal_likelihood(kernel: Kernel, X: np.ndarray, y: np.ndarray, alpha: float,
                            eval_gradient: bool) -> tuple[float, np.ndarray]:
    """``ln p(y | X, θ)`` for y (n, t) and (if asked) its gradient in ``kernel.theta``, (p,).

    Returns ``-inf`` and a zero gradient when ``K + alpha I`` is not positive definite
    (as scikit-learn does), so an optimizer steps away from such θ.
    """
    p = len(kernel.theta)
    try:
        L = cholesky_factor(kernel, X, alpha)
    except NotPositiveDefiniteError:
        return -np.inf, np.zeros(p)
    a = sla.cho_solve((L, True), y, check_finite=False)  # shape: (n, t)
    value = _lml_from_factor(L, y, a)
    if not eval_gradient:
        return value, np.zeros(p)
    W, info = sla.lapack.dpotri(L, lower=1, overwrite_c=1)  # lower triangle of C⁻¹, in place
    if info != 0:
        return -np.inf, np.zeros(p)
    W *= -y.shape[1]
    W += a @ a.T  # only the lower triangle of W is used below
    gradient = 0.5 * lower_contraction(kernel, X, W, p)
    if kernel.has_white:
        # White's noise sits on C's diagonal only (its blocks k(x_i, x_j) are zero): its
        # term of eq. 5.9 is ½ trace(a aᵀ - C⁻¹) ∂noise/∂θ, summed over the targets
        gradient += 0.5 * np.trace(W) * kernel.white_noise_gradient()
    return value, gradient


def _lml_from_factor(L: np.ndarray, y: np.ndarray, a: np.ndarray) -> float:
    """``ln p(y)`` from the factor L, targets y (n, t) and ``a = C⁻¹ y``, summed over targets."""
    n, t = y.shape
    return float(-0.5 * np.einsum("ik,ik->", y, a) - t * np.log(np.diag(L)).sum()
                 - t * n / 2 * math.log(2 * math.pi))


def lower_contraction(kernel: Kernel, X: np.ndarray, W: np.ndarray, p: int) -> np.ndarray:
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


def _variance(kernel: Kernel, X: np.ndarray, L: np.ndarray, Xt: np.ndarray) -> np.ndarray:
    """``k(x*, x*) - ||L⁻¹ k(X, x*)||²`` for Xt (m, d), in column tiles; shape (m,)."""
    cols = max(1, VARIANCE_TILE_BYTES // (8 * len(X)))
    out = np.empty(len(Xt))
    for j0 in range(0, len(Xt), cols):
        Xb = Xt[j0:j0 + cols]
        cross = np.asarray(kernel(X, Xb), dtype=np.float64).T  # shape: (b, n)
        out[j0:j0 + cols] = residual_diag(kernel.diag(Xb), cross, L)
    return clip_variance(out)


def _variance_block(Xb: np.ndarray, *, kernel: Kernel, X: Any, L: Any) -> np.ndarray:
    """:func:`_variance` of one row chunk of test points (a dask block function)."""
    return _variance(kernel, X, L, np.asarray(Xb, dtype=np.float64))
