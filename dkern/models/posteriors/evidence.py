"""The exact GP's log marginal likelihood at any n, estimated from one preconditioned CG solve.

With ``C = K + σ² I`` (σ² = alpha plus the kernel's White noise) and targets Y (n, t)::

    ln p(Y) = -½ Σ_k y_kᵀ C⁻¹ y_k - t/2 log det C - t n/2 log 2π,
    ∂ ln p / ∂θ = ½ Σ_k u_kᵀ ∂C u_k - t/2 tr(C⁻¹ ∂C),        u = C⁻¹ y

(Rasmussen & Williams 2006, eqs. 5.8-5.9). One block-CG solve of ``C [Y, Z]`` with the
RPCholesky Nyström preconditioner ``S`` gives ``u``, the log-determinant by stochastic
Lanczos quadrature (:mod:`dkern.solvers.slq`, the preconditioner's own log det exact) and
``C⁻¹ z`` for s probes ``z ~ N(0, S)``; the traces are Hutchinson's
``tr(C⁻¹ ∂C) = E[(C⁻¹z)ᵀ ∂C (S⁻¹z)]`` (Gardner et al. 2018), their ``∂K`` products one
more pass over the chunk pairs (:func:`dkern.operators.gradients.gram_gradient_products`).
The data-fit term is CG's, to ``tol``; the log-determinant and trace terms carry the
probes' standard errors, reported with the estimate. The kernel blocks are cached on the
workers for the solve when they fit their persist budget (numpy backend), and recomputed at
every step otherwise: nothing n × n is held beyond what the workers' memory allows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from ...errors import NotPositiveDefiniteError
from ...kernels import Kernel
from ...operators import gram
from ...operators.gradients import gram_gradient_products
from ...operators.memory import persist_budget
from ...solvers import NystromPreconditioner
from ...solvers.slq import solve_with_logdet

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvidenceEstimate:
    """``ln p(Y | X, θ)`` and its gradient in ``kernel.theta``, with standard errors.

    Attributes
    ----------
    value, value_stderr : float
    gradient, gradient_stderr : ndarray of shape (p,)
        Zeros when the gradient was not asked for.
    n_iter : int
        CG steps of the solve.
    """

    value: float
    value_stderr: float
    gradient: np.ndarray
    gradient_stderr: np.ndarray
    n_iter: int


def estimated_log_marginal_likelihood(kernel: Kernel, X: Any, y: Any, alpha: float, *,
                                      eval_gradient: bool, n_probes: int, rank: int,
                                      tol: float, random_state: int, backend: str = "auto",
                                      max_iter: int | None = None) -> EvidenceEstimate:
    """Estimate ``ln p(y | X, θ)`` (and its gradient) of the exact GP without factorising.

    Parameters
    ----------
    kernel : Kernel
        White terms are noise on the diagonal, as in the exact GP.
    X : array-like of shape (n, d)
    y : array-like of shape (n,) or (n, t)
    alpha : float
        Added to the diagonal besides the White noise.
    eval_gradient : bool
    n_probes : int
        s, the probe vectors (standard errors fall as 1/√s).
    rank : int
        The preconditioner's columns (at most n): a higher rank means fewer CG steps and
        a smaller variance, for a pass over X per ``rank / 25`` columns.
    tol : float
        CG's relative residual for the targets and the probes.
    random_state : int
        Seeds the preconditioner's pivots and the probes: the same seed gives the same
        estimate, so an optimizer sees one smooth function of θ.
    backend : {"auto", "numpy", "keops", "triton"}
    max_iter : int, optional

    Returns
    -------
    EvidenceEstimate
        ``value = -inf`` (zero gradient) when C is not positive definite, as the exact
        likelihood does, so an optimizer steps away.
    """
    base = kernel.without_white()
    if base is None:
        raise ValueError("the kernel is White noise only; its likelihood needs no estimate: "
                         "use solver='exact'.")
    sigma2 = alpha + kernel.white_noise()
    p = len(kernel.theta)
    K = gram(base, X, backend=backend, dtype=np.float64)
    # (16 + t) columns times the CG steps: products of cached blocks beat evaluating the
    # kernel at each step when K fits the workers (KeOps streams kernel values instead)
    cached = K.backend == "numpy" and K.cache_blocks(persist_budget())
    logger.debug("estimated LML: kernel blocks %s", "cached" if cached else "recomputed")
    A = K + sigma2
    n = A.shape[0]
    Y = da.asarray(y).astype(np.float64).reshape(n, -1).rechunk((A.col_chunks, -1))
    t = Y.shape[1]
    try:
        P = NystromPreconditioner(base, X, sigma2, min(n, rank), pivots="rpcholesky",
                                  random_state=random_state, backend=backend)
        solve = solve_with_logdet(A, Y, P, n_probes=n_probes, tol=tol,
                                  random_state=random_state, max_iter=max_iter)
    except NotPositiveDefiniteError:
        return EvidenceEstimate(-np.inf, 0.0, np.zeros(p), np.zeros(p), 0)
    U, W = solve.solutions[:, :t], solve.solutions[:, t:]
    fit: float
    (fit,) = dask.compute((Y * U).sum())
    value = -0.5 * fit - 0.5 * t * solve.logdet - 0.5 * t * n * math.log(2 * math.pi)
    value_stderr = 0.5 * t * solve.logdet_stderr
    if not eval_gradient:
        return EvidenceEstimate(value, value_stderr, np.zeros(p), np.zeros(p), solve.n_iter)
    # the full kernel's ∂K: White's derivative blocks are zero, its noise is on C's diagonal
    D = gram_gradient_products(kernel, X, da.concatenate([U, solve.scaled_probes], axis=1),
                               backend=backend, cached=K if cached else None)  # (n, t + s, p)
    quad, traces, uu, ws = dask.compute(
        da.einsum("nk,nkp->p", U, D[:, :t]), da.einsum("nj,njp->jp", W, D[:, t:]),
        (U * U).sum(), (W * solve.scaled_probes).sum(axis=0))
    white = kernel.white_noise_gradient()
    traces = traces + np.outer(ws, white)  # shape: (s, p), one Hutchinson sample per probe
    gradient = 0.5 * (quad + uu * white) - 0.5 * t * traces.mean(axis=0)
    stderr = 0.5 * t * traces.std(axis=0, ddof=1) / math.sqrt(len(traces))
    return EvidenceEstimate(value, value_stderr, gradient, stderr, solve.n_iter)
