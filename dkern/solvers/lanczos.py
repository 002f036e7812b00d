"""LOVE: a rank-k Lanczos decomposition of ``C = K + σ²I`` for GP predictive variances.

Pleiss, Gardner, Weinberger & Wilson (2018), "Constant-time predictive
distributions for Gaussian processes" (LOVE). k Lanczos steps on the lazy
operator ``C``, started from the training targets ``y``, give an orthonormal
basis ``Q`` (n × k, persisted on the cluster) of the Krylov space
``span{y, Cy, …, C^{k-1}y}`` and the tridiagonal ``T = Qᵀ C Q`` (k × k, on
the client). Then

.. math:: C^{-1} \\approx Q T^{-1} Q^\\top, \\qquad
          T = L L^\\top, \\qquad
          m(x_*) = k_*^\\top Q T^{-1} e_1 \\|y\\|, \\qquad
          v(x_*) = k(x_*, x_*) - \\|L^{-1} Q^\\top k_*\\|^2 ,

so the mean and latent variance of any number of test points cost one
operator product ``W = K(X_*, X) Q`` (n* × k). The mean is the k-step CG
(Lanczos) solution of ``C c = y``. Because ``Q T⁻¹ Qᵀ ≼ C⁻¹`` (the projection of
an SPD inverse onto a subspace), each Lanczos variance lies between the exact
variance and the prior ``k(x*, x*)``: the error is one-sided and shrinks as k
grows (benchmarks/RESULTS.md has measured errors against k).

Each step reorthogonalises the new vector against the whole stored basis
twice (classical Gram–Schmidt twice, "twice is enough"): on the cluster,
with only k scalars reaching the client per pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ..errors import NotPositiveDefiniteError
from ..operators import GramOperator
from ._checks import integer

logger = logging.getLogger(__name__)

#: A step whose new vector keeps less than this fraction of the norm of ``C q`` after
#: orthogonalisation has found an invariant subspace: the basis is complete for ``y``.
BREAKDOWN = 1e-10


@dataclass(frozen=True)
class LanczosResult:
    """The outcome of :func:`lanczos_decomposition`.

    Attributes
    ----------
    Q : dask.array.Array of shape (n, k), float64
        Orthonormal Lanczos basis, persisted on the cluster, chunked like the operator's columns.
    T : ndarray of shape (k, k)
        The symmetric tridiagonal ``Qᵀ C Q``.
    b_norm : float
        ``‖b‖`` of the starting vector (the training targets).
    residual : float
        Relative residual ``‖b − C x‖ / ‖b‖ = β_k |e_kᵀ T⁻¹ e₁|`` of the Lanczos
        solution ``x = Q T⁻¹ e₁ ‖b‖`` (the predictive mean's weights), from T alone.
    """

    Q: da.Array
    T: np.ndarray
    b_norm: float
    residual: float

    @property
    def rank(self) -> int:
        """k, the number of Lanczos vectors (fewer than asked after a breakdown)."""
        return int(self.T.shape[0])


def lanczos_decomposition(A: Any, b: Any, rank: int) -> LanczosResult:
    """Run ``rank`` Lanczos steps on the SPD operator ``A`` from the direction of ``b``.

    .. math:: q_1 = b / \\|b\\|, \\quad T = Q^\\top A Q, \\quad Q^\\top Q = I_k

    T is taken as computed, ``T[i, j] = q_iᵀ A q_j`` for i <= j (the full
    projection, tridiagonal up to rounding).

    Parameters
    ----------
    A : Operator or object with ``shape``, ``dtype`` and ``matvec``
        Symmetric positive definite, e.g. ``dkern.gram(kernel, X) + sigma2``
        (``K + σ²I``, σ² as scikit-learn's ``GaussianProcessRegressor(alpha=σ²)``).
    b : array-like of shape (n,)
        The start direction: the training targets, so the predictive mean is the
        Lanczos (k-step CG) solution. numpy or dask; not all zero.
    rank : int
        Lanczos vectors k, 1 <= k <= n; each costs one matvec and two passes over Q.

    Returns
    -------
    LanczosResult
        ``Q`` (n, k) persisted on the cluster, ``T`` (k, k), ``b_norm``, ``residual``.
        Fewer than ``rank`` vectors when the Krylov space of b is exhausted earlier.

    Raises
    ------
    NotPositiveDefiniteError
        When ``qᵀAq <= 0`` for a Lanczos vector (A is not positive definite).
    """
    n = _check_operator(A)
    rank = integer(rank, "rank", high=n, hint=" It is the number of Lanczos vectors k.")
    q, b_norm = _start_vector(A, b)
    Q, H, k = q, np.zeros((rank, rank)), rank
    for j in range(rank):
        (w,) = dask.persist(A.matvec(q).astype(np.float64))
        w, h = _orthogonalise(Q, w)
        H[:j + 1, j] = h
        _check_positive(h[j], j)
        (beta,) = dask.compute(da.sqrt((w * w).sum()))
        if j == rank - 1 or beta <= BREAKDOWN * np.linalg.norm(h):
            k = j + 1
            break
        q = w / beta
        (Q, q) = dask.persist(da.concatenate([Q, q], axis=1).rechunk({1: -1}), q)
    T = _symmetric(H[:k, :k])
    residual = _solution_residual(T, float(beta))
    logger.info("Lanczos: %d vectors, relative residual of the solve %.3e", k, residual)
    return LanczosResult(Q, T, b_norm, residual)


def _symmetric(H: np.ndarray) -> np.ndarray:
    """T from the coefficients ``H[i, j] = q_iᵀ A q_j`` computed for i <= j (upper triangle)."""
    return np.triu(H) + np.triu(H, 1).T


def _check_positive(alpha: float, j: int) -> None:
    if not alpha > 0:
        raise NotPositiveDefiniteError(
            f"Lanczos step {j}: qᵀAq = {alpha:.3e} <= 0, so the operator is not positive "
            "definite; use a PSD kernel and sigma2 > 0 (K + σ²I).")


def lanczos_predict(result: LanczosResult, cross: GramOperator,
                    prior: Any = None) -> tuple[da.Array, da.Array]:
    """Predictive mean and latent variance at test points from a Lanczos decomposition.

    .. math:: W = K(X_*, X)\\, Q, \\quad m = W T^{-1} e_1 \\|y\\|, \\quad
              v = \\mathrm{clip}(k_{**} - \\|L^{-1} W^\\top\\|^2_{\\text{cols}},\\ 0,\\ k_{**})

    Parameters
    ----------
    result : LanczosResult
        From ``lanczos_decomposition(gram(kernel, X) + sigma2, y, rank)``.
    cross : GramOperator
        ``dkern.gram(kernel, X_test, X)``, shape (n*, n): the same kernel and training X.
    prior : array-like of shape (n*,), optional
        ``k(x*, x*)``; by default the kernel's diagonal at the test points, lazily.

    Returns
    -------
    mean : dask.array.Array of shape (n*,), float64
    variance : dask.array.Array of shape (n*,), float64
        Latent variance (σ² not included), in ``[0, k(x*, x*)]``; both lazy, chunked
        like X_test's rows, from one product of ``cross`` with the k columns of Q.
    """
    if not isinstance(cross, GramOperator) or cross.shape[1] != result.Q.shape[0]:
        raise ValueError(f"cross must be dkern.gram(kernel, X_test, X) with X the "
                         f"{result.Q.shape[0]} training rows the decomposition was built on; "
                         f"got {cross!r}.")
    if prior is None:
        prior = gram_diag(cross)
    prior = da.asarray(prior).astype(np.float64).rechunk((cross.X.chunks[0],))
    L = np.linalg.cholesky(result.T)
    weights = sla.cho_solve((L, True), np.eye(result.rank)[:, 0] * result.b_norm)
    W = cross.matvec(result.Q).astype(np.float64)  # shape: (n*, k)
    mean = W @ weights
    variance = da.map_blocks(_variance_block, W, prior[:, None], drop_axis=1, dtype=np.float64,
                             meta=np.empty((0,)), L=L)
    return mean, variance


def gram_diag(cross: GramOperator) -> da.Array:
    """``k(x*, x*)`` for the rows of a (possibly rectangular) Gram operator; shape (n*,)."""
    return da.map_blocks(cross.blocks.kernel_diag, cross.X, drop_axis=1, dtype=cross.dtype,
                         meta=np.empty((0,), cross.dtype), kernel=cross.kernel)


def _variance_block(W: np.ndarray, prior: np.ndarray, *, L: np.ndarray) -> np.ndarray:
    """One test chunk: ``clip(prior − ‖L⁻¹ wᵢ‖², 0, prior)``; shape (n_i,)."""
    V = sla.solve_triangular(L, W.T, lower=True)  # shape: (k, n_i)
    p = prior[:, 0]
    return np.clip(p - np.einsum("ij,ij->j", V, V), 0.0, p)


def _orthogonalise(Q: da.Array, w: da.Array) -> tuple[da.Array, np.ndarray]:
    """``w`` minus its projection on span(Q), by classical Gram–Schmidt twice.

    Returns the persisted vector and the coefficients ``Qᵀw`` (first pass plus correction).
    """
    (h,) = dask.compute(Q.T @ w)
    (w,) = dask.persist(w - Q @ h)
    (h2,) = dask.compute(Q.T @ w)
    (w,) = dask.persist(w - Q @ h2)
    return w, (h + h2)[:, 0]


def _start_vector(A: Any, b: Any) -> tuple[da.Array, float]:
    """``b / ‖b‖`` as a persisted (n, 1) float64 dask array chunked like A's columns, and ‖b‖."""
    n = A.shape[0]
    bd = b if isinstance(b, da.Array) else np.asarray(b)
    if bd.ndim != 1 or bd.shape[0] != n or bd.dtype.kind not in "biuf":
        raise ValueError(f"b must be a numeric vector of shape ({n},), the training targets; got "
                         f"shape {bd.shape} and dtype {bd.dtype}.")
    chunks = (getattr(A, "col_chunks", None) or "auto", 1)
    bd = da.asarray(bd).astype(np.float64).reshape(n, 1).rechunk(chunks)
    (norm,) = dask.compute(da.sqrt((bd * bd).sum()))
    if not np.isfinite(norm) or norm == 0:
        raise ValueError(f"b must be finite and not all zero to start Lanczos; its norm is "
                         f"{norm}. Centre y only if it is not constant, or use variance='cg'.")
    (q,) = dask.persist(bd / norm)
    return q, float(norm)


def _solution_residual(T: np.ndarray, beta: float) -> float:
    """``‖b − A x_k‖ / ‖b‖ = β_k |e_kᵀ T⁻¹ e₁|`` for the Lanczos solution x_k."""
    e1 = np.zeros(len(T))
    e1[0] = 1.0
    return float(beta * abs(np.linalg.solve(T, e1)[-1]))


def _check_operator(A: Any) -> int:
    for attr in ("shape", "dtype", "matvec"):
        if not hasattr(A, attr):
            raise TypeError(f"A must be a dkern operator (e.g. dkern.gram(kernel, X) + sigma2) or "
                            f"have shape, dtype and matvec; {type(A).__name__} has no {attr!r}.")
    if len(A.shape) != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be square (n, n); got shape {A.shape}. Use "
                         "gram(kernel, X) + sigma2, not gram(kernel, X, Z).")
    return int(A.shape[0])
