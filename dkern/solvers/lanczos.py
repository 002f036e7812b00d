"""LOVE with a Nyström-augmented Lanczos basis: GP predictive variances from one decomposition.

Pleiss, Gardner, Weinberger & Wilson (2018), "Constant-time predictive
distributions for Gaussian processes" (LOVE): k Lanczos steps on the lazy
operator ``C = K + σ²I`` started from the training targets ``y`` give an
orthonormal basis and the projection of C on it. Plain Lanczos needs k near the
number of eigenvalues of K above σ², so (as GPyTorch preconditions LOVE with a
pivoted Cholesky factor, Gardner et al. 2018) the basis is augmented by the
range of a rank-r Nyström / RPCholesky preconditioner: ``V = [U, Q]`` with U
(n × r) the preconditioner's orthonormal factor and Q (n × k) the Lanczos basis
of the deflated operator ``(I − UUᵀ) C (I − UUᵀ)`` started from ``(I − UUᵀ) y``.
With ``H = Vᵀ C V = L Lᵀ`` ((k + r) × (k + r), on the client),

.. math:: C^{-1} \\approx V H^{-1} V^\\top, \\qquad
          m(x_*) = k_*^\\top V H^{-1} V^\\top y, \\qquad
          v(x_*) = k(x_*, x_*) - \\|L^{-1} V^\\top k_*\\|^2 ,

so the mean and latent variance of any number of test points cost one operator
product ``K(X_*, X) V`` with k + r columns. The mean is the Galerkin solution of
``C c = y`` on span(V). ``V H⁻¹ Vᵀ ≼ C⁻¹`` (the Rayleigh–Ritz inverse on a
subspace), and the subspaces are nested in k: each variance lies between the
exact variance and the prior and does not grow with k (benchmarks/RESULTS.md,
"GP variance notes", has measured errors against k and r). Without a
preconditioner (r = 0) this is plain LOVE.

Each step reorthogonalises the new vector against the whole stored basis
twice (classical Gram–Schmidt twice, "twice is enough"): on the cluster,
with only k + r scalars reaching the client per pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ..backends.projections import residual_diag
from ..errors import NotPositiveDefiniteError
from ..operators import GramOperator, pairwise_rows
from ._checks import integer, square_operator
from .preconditioners import NystromPreconditioner

logger = logging.getLogger(__name__)

#: A step whose new vector keeps less than this fraction of the norm of ``C q`` after
#: orthogonalisation has found an invariant subspace: the basis is complete for ``y``.
BREAKDOWN = 1e-10


@dataclass(frozen=True)
class LanczosResult:
    """The outcome of :func:`lanczos_decomposition`.

    Attributes
    ----------
    V : dask.array.Array of shape (n, r + k), float64
        Orthonormal basis ``[U, Q]``: the preconditioner's r factor columns (none
        without one), then the k Lanczos vectors; persisted on the cluster, chunked
        like the operator's columns.
    H : ndarray of shape (r + k, r + k)
        The symmetric projection ``Vᵀ C V`` (its last k × k block is tridiagonal).
    Vtb : ndarray of shape (r + k,)
        ``Vᵀ b``, b the starting vector (the training targets).
    residual : float
        Relative residual ``‖b − C x‖ / ‖b‖`` of the Galerkin solution
        ``x = V H⁻¹ Vᵀ b`` (the predictive mean's weights), from one more matvec.
    n_augmented : int
        r, the preconditioner columns at the front of V.
    """

    V: da.Array
    H: np.ndarray
    Vtb: np.ndarray
    residual: float
    n_augmented: int

    @property
    def rank(self) -> int:
        """r + k, the columns of V (fewer Lanczos vectors than asked after a breakdown)."""
        return int(self.H.shape[0])


def lanczos_decomposition(A: Any, b: Any, rank: int, *,
                          preconditioner: NystromPreconditioner | None = None) -> LanczosResult:
    """Run ``rank`` Lanczos steps on ``A``, deflated by a preconditioner's range, from ``b``.

    .. math:: U = \\text{preconditioner.factor}, \\quad
              q_1 = (I - UU^\\top) b / \\|(I - UU^\\top) b\\|, \\quad
              V = [U, Q], \\quad H = V^\\top A V

    H is taken as computed, ``H[i, j] = v_iᵀ A v_j`` for i <= j.

    Parameters
    ----------
    A : Operator or object with ``shape``, ``dtype`` and ``matvec``
        Symmetric positive definite, e.g. ``dkern.gram(kernel, X) + sigma2``
        (``K + σ²I``, σ² as scikit-learn's ``GaussianProcessRegressor(alpha=σ²)``).
    b : array-like of shape (n,)
        The start direction: the training targets, so the predictive mean is the
        Galerkin solution on span(V). numpy or dask; not all zero.
    rank : int
        Lanczos vectors k, 1 <= k <= n − r; each costs one matvec and two passes over V.
    preconditioner : NystromPreconditioner, optional
        Built on the same kernel and X, e.g. ``NystromPreconditioner(kernel, X, sigma2,
        r, pivots="rpcholesky")``; its orthonormal factor (n × r, persisted) is the
        front of V, at the cost of one matvec with r columns. Only the factor's span is
        used (its alpha and Woodbury core are not). None: plain LOVE.

    Returns
    -------
    LanczosResult
        ``V`` (n, r + k) persisted on the cluster, ``H``, ``Vtb``, ``residual``.
        Fewer than ``rank`` Lanczos vectors when the Krylov space of b is exhausted.

    Raises
    ------
    NotPositiveDefiniteError
        When ``vᵀAv <= 0`` for a basis vector (A is not positive definite).
    """
    n = square_operator(A, "sigma2")
    q0, b_norm = _start_vector(A, b)
    U, H0 = _augmentation(A, preconditioner, q0.chunks[0])
    r = U.shape[1]
    rank = integer(rank, "rank", high=n - r,
                   hint=f" It is the number of Lanczos vectors k, at most n − r = {n - r}.")
    q, _ = _orthogonalise(U, q0)
    (norm,) = dask.compute(da.sqrt((q * q).sum()))
    V, H, k = U, np.zeros((r + rank, r + rank)), 0
    H[:r, :r] = H0
    if norm > BREAKDOWN:  # else b (of norm 1 here) lies in span(U): nothing to add
        (q,) = dask.persist(q / norm)
        V, k = _lanczos_steps(A, U, q, H, rank)
    H = _symmetric(H[:r + k, :r + k])
    (Vtq,) = dask.compute(V.T @ q0)
    Vtb = Vtq[:, 0] * b_norm
    residual = _galerkin_residual(A, V, H, Vtq[:, 0], q0)
    logger.info("Lanczos: %d preconditioner columns and %d Lanczos vectors, relative residual "
                "of the solve %.3e", r, k, residual)
    return LanczosResult(V, H, Vtb, residual, r)


def _lanczos_steps(A: Any, U: da.Array, q: da.Array, H: np.ndarray,
                   rank: int) -> tuple[da.Array, int]:
    """Up to ``rank`` steps from ``q`` ⊥ U, filling columns r.. of H; returns V and k."""
    r = U.shape[1]
    V = da.concatenate([U, q], axis=1).rechunk({1: -1})
    for j in range(r, r + rank):
        (w,) = dask.persist(A.matvec(q).astype(np.float64))
        w, h = _orthogonalise(V, w)
        H[:j + 1, j] = h
        _check_positive(h[j], j - r)
        (beta,) = dask.compute(da.sqrt((w * w).sum()))
        if beta <= BREAKDOWN * np.linalg.norm(h):
            return V, j + 1 - r
        if j == r + rank - 1:
            break
        q = w / beta
        (V, q) = dask.persist(da.concatenate([V, q], axis=1).rechunk({1: -1}), q)
    return V, rank


def _symmetric(H: np.ndarray) -> np.ndarray:
    """H from the coefficients ``H[i, j] = v_iᵀ A v_j`` computed for i <= j (upper triangle)."""
    return np.triu(H) + np.triu(H, 1).T


def _check_positive(alpha: float, j: int, what: str = "Lanczos step") -> None:
    if not alpha > 0:
        raise NotPositiveDefiniteError(
            f"{what} {j}: vᵀAv = {alpha:.3e} <= 0, so the operator is not positive "
            "definite; use a PSD kernel and sigma2 > 0 (K + σ²I).")


def lanczos_predict(result: LanczosResult, cross: GramOperator,
                    prior: Any = None) -> tuple[da.Array, da.Array]:
    """Predictive mean and latent variance at test points from a Lanczos decomposition.

    .. math:: W = K(X_*, X)\\, V, \\quad m = W H^{-1} V^\\top y, \\quad
              v = \\mathrm{clip}(k_{**} - \\|L^{-1} W^\\top\\|^2_{\\text{cols}},\\ 0,\\ k_{**})

    Parameters
    ----------
    result : LanczosResult
        From ``lanczos_decomposition(gram(kernel, X) + sigma2, y, rank, preconditioner=...)``.
    cross : GramOperator
        ``dkern.gram(kernel, X_test, X)``, shape (n*, n): the same kernel and training X.
    prior : array-like of shape (n*,), optional
        ``k(x*, x*)``; by default the kernel's diagonal at the test points, lazily.

    Returns
    -------
    mean : dask.array.Array of shape (n*,), float64
    variance : dask.array.Array of shape (n*,), float64
        Latent variance (σ² not included), in ``[0, k(x*, x*)]``; both lazy, chunked
        like X_test's rows, from one product of ``cross`` with the r + k columns of V.
    """
    if not isinstance(cross, GramOperator) or cross.shape[1] != result.V.shape[0]:
        raise ValueError(f"cross must be dkern.gram(kernel, X_test, X) with X the "
                         f"{result.V.shape[0]} training rows the decomposition was built on; "
                         f"got {cross!r}.")
    if prior is None:
        prior = gram_diag(cross)
    prior = da.asarray(prior).astype(np.float64).rechunk((cross.X.chunks[0],))
    L = np.linalg.cholesky(result.H)
    weights = sla.cho_solve((L, True), result.Vtb)
    W = cross.matvec(result.V).astype(np.float64)  # shape: (n*, r + k)
    mean = W @ weights
    variance = pairwise_rows(_variance_block, W, [prior[:, None]], width=None,
                             dtype=np.float64, name="dk-love-var", label="X_test",
                             broadcast={"L": L})
    return mean, variance


def gram_diag(cross: GramOperator) -> da.Array:
    """``k(x*, x*)`` for the rows of a (possibly rectangular) Gram operator; shape (n*,)."""
    return pairwise_rows(cross.blocks.kernel_diag, cross.X, width=None, dtype=cross.dtype,
                         name="dk-diag", label="X_test", kernel=cross.kernel)


def _variance_block(W: np.ndarray, prior: np.ndarray, *, L: np.ndarray) -> np.ndarray:
    """One test chunk: ``clip(prior − ‖L⁻¹ wᵢ‖², 0, prior)``; shape (n_i,)."""
    p = prior[:, 0]
    return np.clip(residual_diag(p, W, L), 0.0, p)


def _orthogonalise(Q: da.Array, w: da.Array) -> tuple[da.Array, np.ndarray]:
    """``w`` minus its projection on span(Q), by classical Gram–Schmidt twice.

    Returns the persisted vector and the coefficients ``Qᵀw`` (first pass plus correction).
    """
    if Q.shape[1] == 0:
        return w, np.zeros(0)
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


def _augmentation(A: Any, preconditioner: Any,
                  chunks: tuple[int, ...]) -> tuple[da.Array, np.ndarray]:
    """The preconditioner's factor U (n, r), chunked as ``chunks``, and ``Uᵀ A U`` (r, r).

    One matvec with r columns; U is (n, 0) without a preconditioner.
    """
    n = A.shape[0]
    if preconditioner is None:
        return da.zeros((n, 0), chunks=(chunks, 0)), np.zeros((0, 0))
    U = getattr(preconditioner, "factor", None)
    if not isinstance(U, da.Array) or U.ndim != 2 or U.shape[0] != n:
        raise TypeError(f"preconditioner must be a dkern.solvers.NystromPreconditioner built on "
                        f"the operator's {n} training rows (its factor is the (n, r) basis); got "
                        f"{type(preconditioner).__name__} with factor "
                        f"{getattr(U, 'shape', None)}.")
    (U,) = dask.persist(U.astype(np.float64).rechunk((chunks, -1)))
    (H0,) = dask.compute(U.T @ A.matvec(U).astype(np.float64))
    H0 = (H0 + H0.T) / 2
    for j in range(H0.shape[0]):
        _check_positive(H0[j, j], j, "preconditioner column")
    return U, H0


def _galerkin_residual(A: Any, V: da.Array, H: np.ndarray, Vtq: np.ndarray,
                       q0: da.Array) -> float:
    """``‖q0 − A V H⁻¹ Vᵀ q0‖`` for the unit start vector q0 (one matvec)."""
    x = V @ da.from_array(np.linalg.solve(H, Vtq)[:, None])
    (res,) = dask.compute(da.sqrt(((q0 - A.matvec(x)) ** 2).sum()))
    return float(res)
