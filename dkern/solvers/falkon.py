"""Falkon: Nyström kernel ridge regression solved by preconditioned CG.

The M-dimensional system lives on the client; each CG iteration is one pass
over X's row chunks computing ``K_nmᵀ K_nm v`` (:mod:`dkern.operators.nystrom`).

The preconditioner is Falkon's (Rudi, Carratino & Rosasco 2017) with one change:
Falkon approximates ``K_nmᵀ K_nm`` by ``(n / M) K_mm²``, i.e. it uses the centres
as a sample of the data; dkern estimates it from a larger uniform sample of s
rows, ``(n / s) K_smᵀ K_sm`` (sketch-and-precondition: Rokhlin & Tygert 2008;
Avron, Clarkson & Woodruff 2017 for kernel ridge regression). M centres estimate
``K_nmᵀ K_nm`` poorly (and not at all without bias when they were chosen by
leverage), while s ≈ 10 M rows cost about one CG iteration to use and cut the
iterations several-fold (benchmarks/RESULTS.md, "Solver notes").

When K_mm is singular to working precision (duplicate or near-duplicate
centres), no jitter is added: β is sought in K_mm's numerical range, which loses
nothing of the stated ridge problem (a direction v with ``K_mm v = 0`` is the
function ``Σ_j v_j k(c_j, ·)`` of RKHS norm ``vᵀ K_mm v = 0``, so ``K_nm v = 0``
too). Adding jitter to K_mm would solve a different problem; adding it to the
preconditioner only would leave CG a singular system whose null space rounding
makes indefinite.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import scipy.linalg as sla
from dask.base import tokenize

from ..errors import ConvergenceWarning, NotPositiveDefiniteError
from ..kernels import Kernel
from ..operators import persist_budget
from ..operators.nystrom import NystromOperator
from ._checks import integer, positive_number
from ._iteration import LoopResult, SolveProgress, block_cg_loop, stall_advice
from .checkpoint import CHECKPOINT_EVERY, Checkpoint
from .preconditioners import FalkonPreconditioner, factor_solve_t
from .sampling import gather_rows

logger = logging.getLogger(__name__)

#: Eigenvalues of K_mm up to ``RANK_RTOL · M · λ_max`` are rounding noise (numpy's
#: ``matrix_rank`` rule), and so are those up to |λ_min| when λ_min < 0 (a kernel evaluated
#: to limited precision): their directions are dropped when K_mm's Cholesky fails.
RANK_RTOL = np.finfo(np.float64).eps
#: A K_mm with an eigenvalue below ``-NOISE_MAX · mean(diag)`` is not PSD, not noisy.
NOISE_MAX = 1e-6
#: Falkon usually converges in tens of iterations; more means a badly conditioned problem.
DEFAULT_MAX_ITER = 200
#: K_nm up to this size (over all workers, and within their memory: ``persist_budget``) is
#: computed once and kept on the cluster, so each iteration reads it instead of re-evaluating
#: the kernel (n = 200,000, M = 1,000 in float64 is 1.6 GB; n = 1,000,000, M = 2,000 would be
#: 16 GB and is recomputed per pass).
KNM_CACHE_BYTES = 2 * 2**30
#: Rows of the preconditioner's sample per centre (see ``sketch_size``).
SKETCH_PER_CENTER = 10
#: The sample's cost, 2 s M² flops (a triangular solve and a rank-s update), is kept to about
#: that of this many kernel values per data row and centre, ``s <= SKETCH_COST · n / M``: a
#: few CG iterations' worth, which a better preconditioner more than pays back in iterations
#: (one iteration's worth, 50, needed nearly twice as many: benchmarks/RESULTS.md, "KRR:
#: falkon-real").
SKETCH_COST = 150
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
        Relative residuals of the *preconditioned* system CG solves,
        ``‖Bᵀ(K_nmᵀ y − H β)‖ / ‖Bᵀ K_nmᵀ y‖`` with ``H = K_nmᵀ K_nm + alpha K_mm``
        and B the preconditioner; ``tol`` applies to these. The last row is recomputed.
    converged : ndarray of bool, shape (t,)
        Whether each column's last preconditioned residual is <= ``tol``.
    normal_residuals : ndarray of shape (t,)
        Relative residuals of the unpreconditioned normal equations,
        ``‖K_nmᵀ y − H β‖ / ‖K_nmᵀ y‖``, from the product CG's last true-residual check
        formed at β (one more pass over X only when that check was not at β).
    """

    beta: np.ndarray
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray
    normal_residuals: np.ndarray


def falkon(kernel: Kernel, X: Any, y: Any, centers: Any, alpha: float, *, tol: float = 1e-6,
           max_iter: int | None = None, backend: str = "auto",
           callback: Callable[[int, np.ndarray], None] | None = None,
           progress: bool = False, cache_bytes: int = KNM_CACHE_BYTES,
           sketch_rows: int | None = None, random_state: Any = None,
           checkpoint: str | os.PathLike[str] | None = None,
           checkpoint_every: int = CHECKPOINT_EVERY) -> NystromResult:
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
        Relative residual CG must reach on the *preconditioned* system (``residuals``).
        The unpreconditioned residual of the normal equations, ``normal_residuals``, can
        be larger by up to the preconditioner's condition number. A stall above tol
        (rounding floor) stops the solve with a ConvergenceWarning naming the reachable tol.
    max_iter : int, optional
        Default ``DEFAULT_MAX_ITER`` (200); Falkon typically needs tens of iterations.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
    callback : callable, optional
        ``callback(iteration, relative_residuals)``.
    progress : bool, default=False
        Show a tqdm bar with the iteration, the largest relative residual and the time.
    cache_bytes : int, default=KNM_CACHE_BYTES (2 GiB)
        Keep ``K_nm`` on the workers when it takes at most this much memory (summed
        over workers) and fits in their memory (:func:`dkern.operators.persist_budget`:
        a share of the workers' memory limits); 0 recomputes the kernel in every pass, as
        the ``"keops"`` and ``"triton"`` backends always do (they stream kernel values: a
        cached block would move the passes from the GPU onto the CPU's BLAS).
    sketch_rows : int, optional
        Size s of the uniform row sample the preconditioner estimates ``K_nmᵀ K_nm``
        from; default :func:`sketch_size`. ``s <= M`` uses the centres themselves
        (Falkon's original preconditioner).
    random_state : int or numpy.random.Generator, optional
        Draws the preconditioner's sample.
    checkpoint : str or os.PathLike, optional
        Where CG's M-dimensional state is saved every ``checkpoint_every`` iterations;
        calling ``falkon`` again on the same problem resumes there, as for
        :func:`dkern.solvers.cg` (see it). The preconditioner is rebuilt from the
        centres, alpha, the kernel and the sample, deterministically; the checkpoint's
        fingerprint covers them, its factors and the data, so a checkpoint of another
        problem is refused.
    checkpoint_every : int, default=CHECKPOINT_EVERY (50)

    Returns
    -------
    NystromResult
        ``beta`` (M, t), ``n_iter``, ``residuals`` (n_iter + 1, t), ``converged`` (t,),
        ``normal_residuals`` (t,).
    """
    # float64 whatever the stored dtype: the normal equations square K's condition number,
    # and float32 kernel values made pᵀAp negative on ill-conditioned problems.
    op = NystromOperator(kernel, X, centers, backend=backend, dtype=np.float64)
    n, M = op.shape
    alpha = positive_number(alpha, "alpha", " (the ridge penalty)")
    tol = positive_number(tol, "tol", ", e.g. 1e-6")
    max_iter = DEFAULT_MAX_ITER if max_iter is None else integer(max_iter, "max_iter")
    s = sketch_size(n, M) if sketch_rows is None else integer(sketch_rows, "sketch_rows", low=0)
    budget = min(integer(cache_bytes, "cache_bytes", low=0), persist_budget())
    if op.backend in ("keops", "triton"):  # a cached block would move the passes onto BLAS
        logger.info("falkon: K_nm (%d x %d) recomputed in every pass (backend=%r streams "
                    "kernel values, never stores them)", *op.shape, op.backend)
    elif op.cache_blocks(budget):
        logger.info("falkon: K_nm (%d x %d) cached on the workers", *op.shape)
    else:
        logger.info("falkon: K_nm (%d x %d) recomputed in every pass: it is over the cache "
                    "budget of %.2f GB", *op.shape, budget / 1e9)
    sample = None
    if s > M:
        rng = np.random.default_rng(random_state)
        sample = gather_rows(op.X, np.sort(rng.choice(n, size=min(s, n), replace=False)))
    T, A, basis = falkon_factors(kernel, op.C, alpha, n, sample)
    pre = FalkonPreconditioner(T, A, n, basis)
    (Kty,) = dask.compute(op.rmatvec(y))  # shape: (M, t)
    saved = None if checkpoint is None else Checkpoint(
        checkpoint, checkpoint_every, _fingerprint(op, pre, alpha, Kty, tol), "falkon")
    system = _System(op, pre, alpha)
    out = _solve(system, Kty, tol, max_iter, callback, progress, saved)
    beta = pre.apply(out.x)
    normal = _normal_residuals(system, Kty, out.x)
    if not out.converged.all():
        advice = stall_advice(out) or " Raise max_iter, loosen tol, or increase alpha."
        warnings.warn(f"falkon stopped after {out.n_iter} iterations above tol={tol:g} "
                      f"(largest relative residual {out.residuals[-1].max():.2e}).{advice}",
                      ConvergenceWarning, stacklevel=2)
    logger.info("falkon: M=%d centres, %d iterations, relative residual %.2e preconditioned, "
                "%.2e of the normal equations", M, out.n_iter, out.residuals[-1].max(),
                normal.max())
    return NystromResult(beta, out.n_iter, out.residuals, out.converged, normal)


class _System:
    """``u ↦ Bᵀ (K_nmᵀ K_nm + alpha K_mm) B u``, one pass over X per call, remembering the
    last call's ``H B u``: CG's final call is the true-residual check at the returned
    iterate, so the normal equations' residual there needs no pass of its own."""

    def __init__(self, op: NystromOperator, pre: FalkonPreconditioner, alpha: float) -> None:
        self.op, self.pre, self.alpha = op, pre, alpha
        self.last: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, v: np.ndarray) -> np.ndarray:
        b = self.pre.apply(v)
        (normal,) = dask.compute(self.op.normal_matvec(b))
        product = normal + self.alpha * self.pre.kmm_matvec(b)  # shape: (M, t), H b
        self.last = (v.copy(), product)
        return self.pre.apply_t(product)

    def product_at(self, u: np.ndarray) -> np.ndarray:
        """``H B u``: the last call's when it was at u, else one more pass over X."""
        if self.last is not None and np.array_equal(self.last[0], u):
            return self.last[1]
        self(u)
        return self.last[1]


def _solve(system: _System, Kty: np.ndarray, tol: float, max_iter: int,
           callback: Callable[[int, np.ndarray], None] | None, progress: bool,
           checkpoint: Checkpoint | None) -> LoopResult:
    """CG on ``Bᵀ (K_nmᵀ K_nm + alpha K_mm) B u = Bᵀ K_nmᵀ y``; β = B u."""
    rhs = system.pre.apply_t(Kty)
    bar = SolveProgress("dkern falkon", tol) if progress else None
    try:
        return block_cg_loop(system, lambda r: r, rhs, np.zeros_like(rhs), x0_given=False,
                             tol=tol, max_iter=max_iter, refresh_every=50,
                             callback=callback, progress=bar, checkpoint=checkpoint)
    finally:
        if bar is not None:
            bar.close()


def _fingerprint(op: NystromOperator, pre: FalkonPreconditioner, alpha: float,
                 Kty: np.ndarray, tol: float) -> dict[str, str]:
    """What identifies the solve: X's dask name (y through ``K_nmᵀ y``), the kernel,
    centres and alpha, the preconditioner's factors, and tol."""
    return {"data": tokenize(op.X.name, Kty), "operator": tokenize(op.kernel, op.C, alpha),
            "preconditioner": tokenize(pre.T, pre.A, pre.basis), "settings": tokenize(tol)}


def _normal_residuals(system: _System, Kty: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``‖K_nmᵀ y − (K_nmᵀ K_nm + alpha K_mm) β‖ / ‖K_nmᵀ y‖`` per column at β = B u."""
    gap = np.linalg.norm(Kty - system.product_at(u), axis=0)
    scale = np.linalg.norm(Kty, axis=0)
    return gap / np.where(scale > 0, scale, 1.0)


def sketch_size(n: int, M: int) -> int:
    """Default sample size of the preconditioner: ``min(n, 10 M, 150 n / M)``.

    Ten rows per centre estimate ``K_nmᵀ K_nm`` well at the ridge penalties that
    make M centres worth having; the cap keeps the sample's ``2 s M²`` flops near
    the cost of a few CG iterations (``n M`` kernel values each).
    """
    return int(min(n, SKETCH_PER_CENTER * M, SKETCH_COST * n // max(M, 1)))


def falkon_factors(kernel: Kernel, C: np.ndarray, alpha: float, n: int,
                   sample: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Factors T, A of the preconditioner ``B = T⁻¹ A⁻¹ / √n``.

    Rudi, Carratino & Rosasco (2017), Falkon, Eq. 9 and the "Preconditioning"
    paragraph: with ``λ`` their penalty and ``K_nmᵀ K_nm ≈ (n / M) K_mm²``,
    ``BBᵀ = (n/M K_mm² + λ n K_mm)⁻¹`` for ``T = chol(K_mm)`` and
    ``A = chol(T Tᵀ / M + λ I)``. Our system puts ``alpha`` where they put ``λ n``,
    so ``λ = alpha / n``: ``(B Bᵀ)⁻¹ = n Tᵀ (T Tᵀ / M + alpha / n · I) T
    = (n / M) K_mm² + alpha K_mm``.

    With a ``sample`` S of s rows, ``T Tᵀ / M`` becomes ``Wᵀ W / s`` with
    ``W = K_sm T⁻¹``, so that ``(B Bᵀ)⁻¹ = (n / s) K_smᵀ K_sm + alpha K_mm``: the
    same form, with ``K_nmᵀ K_nm`` estimated from s rows instead of the M centres.

    When K_mm is singular to working precision, ``T = Λ^{1/2} Vᵀ`` over its q
    eigenpairs above rounding, the rank-deficient case of Falkon (their Appendix A).

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
    T : ndarray of shape (q, M)
        ``Tᵀ T = K_mm``; upper triangular when q = M.
    A : ndarray of shape (q, q), upper triangular
    basis : ndarray of shape (M, q) or None
        ``V Λ^{-1/2}`` (T's pseudo-inverse) when K_mm is singular, else None.
    """
    M = len(C)
    T, basis = _kmm_factor(kernel(C, C))
    if sample is None:
        G = T @ T.T / M
    else:  # G = Wᵀ W / s, W = K_sm T⁻¹, accumulated over blocks of the sample's rows
        G = np.zeros((len(T), len(T)))
        for i0 in range(0, len(sample), SKETCH_BLOCK_ROWS):
            Wt = factor_solve_t(T, basis, kernel(sample[i0:i0 + SKETCH_BLOCK_ROWS], C).T)
            # Wt: shape (q, rows); G's upper triangle only (half GEMM's flops), all that
            # the upper Cholesky below reads
            G = sla.blas.dsyrk(1.0, Wt, beta=1.0, c=G, lower=False, overwrite_c=True)
        G /= len(sample)
    A = sla.cholesky(G + (alpha / n) * np.eye(len(T)), lower=False)
    return T, A, basis


def _kmm_factor(Kmm: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``T`` with ``Tᵀ T = K_mm``: its upper Cholesky factor, and None; or, when K_mm is
    singular to working precision, ``Λ^{1/2} Vᵀ`` over its numerical range and ``V Λ^{-1/2}``.
    """
    try:
        return sla.cholesky(Kmm, lower=False), None
    except np.linalg.LinAlgError:
        pass
    lam, V = np.linalg.eigh((Kmm + Kmm.T) / 2)
    if not lam[-1] > 0 or lam[0] < -NOISE_MAX * float(np.mean(np.diag(Kmm))):
        raise NotPositiveDefiniteError(
            f"K_mm ({len(Kmm)} centres) has eigenvalue {lam[0]:.3e} against a largest of "
            f"{lam[-1]:.3e}: the kernel is not positive semi-definite on these centres. Check "
            "it with dkern.kernels.check_psd.")
    keep = lam > max(RANK_RTOL * len(Kmm) * lam[-1], -lam[0])
    lam, V = lam[keep], V[:, keep]
    warnings.warn(f"K_mm is singular to working precision: {len(Kmm)} centres span only "
                  f"{len(lam)} directions (duplicate or near-duplicate centres). The fit uses "
                  "those (an exact solution of the same problem); pick fewer or more distinct "
                  "centres to save work.", stacklevel=3)
    root = np.sqrt(lam)
    return root[:, None] * V.T, V / root
