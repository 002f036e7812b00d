"""Falkon: Nyström kernel ridge regression solved by preconditioned CG.

The M-dimensional system lives on the client; each CG iteration is one pass
over X's row chunks computing ``K_nmᵀ K_nm v`` (:mod:`dkern.operators.nystrom`).

The preconditioner is Falkon's (Rudi, Carratino & Rosasco 2017) with one change:
Falkon approximates ``K_nmᵀ K_nm`` by ``(n / M) K_mm²``, i.e. it uses the centres
as a sample of the data; dkern estimates it from a larger uniform sample of s
rows, ``(n / s) K_smᵀ K_sm`` (sketch-and-precondition: Rokhlin & Tygert 2008;
Avron, Clarkson & Woodruff 2017 for kernel ridge regression). Measured on the
synthetic store, n = 200,000, M = 2,000, α = 1e-3: 13 iterations to tol = 1e-6
with s = 20,000, against 30 iterations reaching only 3e-4 with the centres.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import scipy.linalg as sla

from ..errors import ConvergenceWarning, NotPositiveDefiniteError
from ..kernels import Kernel
from ..operators.nystrom import NystromOperator
from ._checks import positive_number
from ._iteration import block_cg_loop, progress_bar, stall_advice
from .sampling import gather_rows

logger = logging.getLogger(__name__)

#: Jitter tried on K_mm's diagonal, as fractions of its mean diagonal, when Cholesky fails.
JITTERS = (1e-10, 1e-8, 1e-6)
#: Falkon usually converges in tens of iterations; more means a badly conditioned problem.
DEFAULT_MAX_ITER = 200
#: K_nm up to this size (over all workers) is computed once and kept on the cluster, so each
#: iteration reads it instead of re-evaluating the kernel (n = 200,000, M = 1,000 in float64
#: is 1.6 GB; n = 1,000,000, M = 2,000 would be 16 GB and is recomputed per pass).
KNM_CACHE_BYTES = 2 * 2**30
#: Rows of the preconditioner's sample per centre (see ``sketch_size``).
SKETCH_PER_CENTER = 10
#: The sample's cost, 2 s M² flops, is kept to about that of this many kernel values per data
#: row and centre, i.e. of roughly one CG iteration: ``s <= SKETCH_COST · n / M``.
SKETCH_COST = 50
#: Rows of the sample whose kernel block is formed at once (block memory: rows × M values).
SKETCH_BLOCK_ROWS = 4096


@dataclass(frozen=True)
class NystromResult:
    """The outcome of :func:`falkon`.

    Attributes
    ----------
    beta : ndarray of shape (M, t)
        Coefficients of the centres: predictions are ``K(X_new, centers) @ beta``.
    n_iter : int
    residuals : ndarray of shape (n_iter + 1, t)
        Relative residuals of the preconditioned system; the last row is recomputed.
    converged : ndarray of bool, shape (t,)
    """

    beta: np.ndarray
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray


def falkon(kernel: Kernel, X: Any, y: Any, centers: Any, alpha: float, *, tol: float = 1e-6,
           max_iter: int | None = None, backend: str = "auto",
           callback: Callable[[int, np.ndarray], None] | None = None,
           progress: bool = False, cache_bytes: int = KNM_CACHE_BYTES,
           sketch_rows: int | None = None, random_state: Any = None) -> NystromResult:
    """Nyström kernel ridge regression with Falkon's preconditioner.

    .. math:: (K_{nm}^\\top K_{nm} + \\alpha K_{mm})\\, \\beta = K_{nm}^\\top y

    the minimiser of ``||K_nm β − y||² + α βᵀ K_mm β``. ``alpha`` is scikit-learn's
    ``KernelRidge`` alpha: with every training point as a centre, β solves
    ``(K + alpha I) β = y`` exactly.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
        numpy, dask or Zarr; row-chunked.
    y : array-like of shape (n,) or (n, t)
    centers : ndarray of shape (M, d)
        E.g. from :func:`select_centers`.
    alpha : float
        Ridge penalty, > 0.
    tol : float, default=1e-6
        Relative residual of the preconditioned system; a stall above it (rounding floor)
        stops the solve with a ConvergenceWarning naming the reachable tol.
    max_iter : int, optional
        Default ``DEFAULT_MAX_ITER`` (200); Falkon typically needs tens of iterations.
    backend : {"auto", "numpy", "keops"}, default="auto"
    callback : callable, optional
        ``callback(iteration, relative_residuals)``.
    progress : bool, default=False
        Show a tqdm bar with the iteration, the largest relative residual and the time.
    cache_bytes : int, default=KNM_CACHE_BYTES (2 GiB)
        Keep ``K_nm`` on the workers when it takes at most this much memory (summed
        over workers); 0 recomputes the kernel in every pass.
    sketch_rows : int, optional
        Size s of the uniform row sample the preconditioner estimates ``K_nmᵀ K_nm``
        from; default :func:`sketch_size`. ``s <= M`` uses the centres themselves
        (Falkon's original preconditioner).
    random_state : int or numpy.random.Generator, optional
        Draws the preconditioner's sample.

    Returns
    -------
    NystromResult
        ``beta`` (M, t), ``n_iter``, ``residuals`` (n_iter + 1, t), ``converged`` (t,).
    """
    # float64 whatever the stored dtype: the normal equations square K's condition number,
    # and float32 kernel values (relative error ~1e-7) made pᵀAp negative at n = 10⁶, α = 1e-3.
    op = NystromOperator(kernel, X, centers, backend=backend, dtype=np.float64)
    n, M = op.shape
    alpha = positive_number(alpha, "alpha", " (the ridge penalty)")
    tol = positive_number(tol, "tol", ", e.g. 1e-6")
    if max_iter is not None and (isinstance(max_iter, bool) or int(max_iter) != max_iter
                                 or max_iter < 1):
        raise ValueError(f"max_iter must be an integer >= 1; got {max_iter!r}.")
    if op.cache_blocks(cache_bytes):
        logger.info("falkon: K_nm (%d x %d) cached on the workers", *op.shape)
    s = sketch_size(n, M) if sketch_rows is None else int(sketch_rows)
    sample = None
    if s > M:
        rng = np.random.default_rng(random_state)
        sample = gather_rows(op.X, np.sort(rng.choice(n, size=min(s, n), replace=False)))
    T, A = falkon_factors(kernel, op.C, alpha, n, sample)
    (Kty,) = dask.compute(op.rmatvec(y))  # shape: (M, t)

    def precondition(v: np.ndarray) -> np.ndarray:  # β = B v with B = T⁻¹ A⁻¹ / √n
        return sla.solve_triangular(T, sla.solve_triangular(A, v), check_finite=False) / np.sqrt(n)

    def precondition_t(v: np.ndarray) -> np.ndarray:  # Bᵀ v
        w = sla.solve_triangular(T, v, trans="T", check_finite=False)
        return sla.solve_triangular(A, w, trans="T", check_finite=False) / np.sqrt(n)

    def system(v: np.ndarray) -> np.ndarray:  # Bᵀ (K_nmᵀ K_nm + α K_mm) B v, one pass over X
        b = precondition(v)
        (normal,) = dask.compute(op.normal_matvec(b))
        return precondition_t(normal + alpha * (T.T @ (T @ b)))

    rhs = precondition_t(Kty)
    max_iter = int(max_iter or DEFAULT_MAX_ITER)
    bar = progress_bar(max_iter, "dkern falkon") if progress else None
    try:
        out = block_cg_loop(system, lambda r: r, rhs, np.zeros_like(rhs), x0_given=False,
                            tol=float(tol), max_iter=max_iter, refresh_every=50,
                            callback=callback, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if not out.converged.all():
        advice = stall_advice(out) or " Raise max_iter, loosen tol, or increase alpha."
        warnings.warn(f"falkon stopped after {out.n_iter} iterations above tol={tol:g} "
                      f"(largest relative residual {out.residuals[-1].max():.2e}).{advice}",
                      ConvergenceWarning, stacklevel=2)
    beta = precondition(out.x)
    logger.info("falkon: M=%d centres, %d iterations", M, out.n_iter)
    return NystromResult(beta, out.n_iter, out.residuals, out.converged)


def sketch_size(n: int, M: int) -> int:
    """Default sample size of the preconditioner: ``min(n, 10 M, 50 n / M)``.

    Ten rows per centre estimate ``K_nmᵀ K_nm`` well at the ridge penalties that
    make M centres worth having; the cap keeps the sample's ``2 s M²`` flops near
    the cost of one CG iteration (``n M`` kernel values).
    """
    return int(min(n, SKETCH_PER_CENTER * M, SKETCH_COST * n // max(M, 1)))


def falkon_factors(kernel: Kernel, C: np.ndarray, alpha: float, n: int,
                   sample: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Upper-triangular T, A of the preconditioner ``B = T⁻¹ A⁻¹ / √n``.

    Rudi, Carratino & Rosasco (2017), Falkon, Eq. 9 and the "Preconditioning"
    paragraph: with ``λ`` their penalty and ``K_nmᵀ K_nm ≈ (n / M) K_mm²``,
    ``BBᵀ = (n/M K_mm² + λ n K_mm)⁻¹`` for ``T = chol(K_mm)`` and
    ``A = chol(T Tᵀ / M + λ I)``. Our system puts ``alpha`` where they put ``λ n``,
    so ``λ = alpha / n``: ``(B Bᵀ)⁻¹ = n Tᵀ (T Tᵀ / M + alpha / n · I) T
    = (n / M) K_mm² + alpha K_mm``.

    With a ``sample`` S of s rows, ``T Tᵀ / M`` becomes ``Wᵀ W / s`` with
    ``W = K_sm T⁻¹``, so that ``(B Bᵀ)⁻¹ = (n / s) K_smᵀ K_sm + alpha K_mm``: the
    same form, with ``K_nmᵀ K_nm`` estimated from s rows instead of the M centres.

    Parameters
    ----------
    kernel : Kernel
    C : ndarray of shape (M, d)
        The centres.
    alpha : float
    n : int
        Number of training points.
    sample : ndarray of shape (s, d), optional
        Uniformly drawn rows of X; None uses the centres.

    Returns
    -------
    T, A : ndarrays of shape (M, M), upper triangular
    """
    M = len(C)
    T = _cholesky_with_jitter(kernel(C, C))
    if sample is None:
        G = T @ T.T / M
    else:  # G = Wᵀ W / s, W = K_sm T⁻¹, accumulated over blocks of the sample's rows
        G = np.zeros((M, M))
        for i0 in range(0, len(sample), SKETCH_BLOCK_ROWS):
            Wt = sla.solve_triangular(T, kernel(sample[i0:i0 + SKETCH_BLOCK_ROWS], C).T,
                                      trans="T", check_finite=False)  # shape: (M, rows)
            G += Wt @ Wt.T
        G /= len(sample)
    A = sla.cholesky(G + (alpha / n) * np.eye(M), lower=False)
    return T, A


def _cholesky_with_jitter(Kmm: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of K_mm, adding jitter · mean(diag) if it is not numerically PD."""
    try:
        return sla.cholesky(Kmm, lower=False)
    except np.linalg.LinAlgError:
        pass
    scale = float(np.mean(np.diag(Kmm)))
    for eps in JITTERS:
        try:
            T = sla.cholesky(Kmm + eps * scale * np.eye(len(Kmm)), lower=False)
        except np.linalg.LinAlgError:
            continue
        warnings.warn(f"K_mm is not numerically positive definite; added jitter {eps:g} x "
                      f"mean diagonal ({eps * scale:.2e}). Duplicate or near-duplicate centres "
                      "cause this: pick fewer or more distinct centres.", stacklevel=3)
        return T
    raise NotPositiveDefiniteError(
        f"K_mm ({len(Kmm)} centres) is not positive definite even with jitter "
        f"{JITTERS[-1]:g} x mean diagonal: the kernel is not PSD on these centres, or they are "
        "heavily duplicated. Check the kernel with dkern.kernels.check_psd, or pick distinct "
        "centres.")
