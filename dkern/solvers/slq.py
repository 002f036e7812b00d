"""Log-determinants by stochastic Lanczos quadrature, read off a preconditioned CG solve.

For an SPD operator C known by its matvec and a preconditioner with ``C ≈ S = c P``
whose ``log det P`` and ``P^{1/2}`` are exact (:class:`~dkern.solvers.NystromPreconditioner`,
c its ``scale``)::

    log det C = log det S + tr log Ĉ,      Ĉ = S^{-1/2} C S^{-1/2}.

The trace is Hutchinson's estimate over s standard normal vectors g, ``E[gᵀ log(Ĉ) g]``,
and each quadratic form is Gauss quadrature on the Lanczos tridiagonal T of Ĉ started at g:
``‖g‖² e₁ᵀ log(T) e₁`` (Ubaru, Chen & Saad 2017). Preconditioned CG on ``C x = z`` with
``z = S^{1/2} g`` *is* that Lanczos process (its residual ``P^{-1/2} r₀ = √c g``), so T
comes from CG's own step lengths, and the same solve returns ``C⁻¹ z`` for the trace terms
of a gradient (Gardner et al. 2018, "GPyTorch", mBCG; ``E[z zᵀ] = S``). Preconditioning
both shortens the solve and shrinks the estimate's variance: only ``log Ĉ``, near 0 for a
good preconditioner, is sampled (Wenger et al. 2022).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ._checks import integer
from ._iteration import Coefficients
from .cg import cg

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbedSolve:
    """The outcome of :func:`solve_with_logdet`.

    Attributes
    ----------
    solutions : dask.array.Array of shape (n, t + s)
        ``C⁻¹ [B, Z]``, persisted: the t right-hand sides' solutions, then the probes'.
    probes : dask.array.Array of shape (n, s)
        ``Z = S^{1/2} G``, samples of N(0, S).
    scaled_probes : dask.array.Array of shape (n, s)
        ``S⁻¹ Z``: ``E[(C⁻¹z)ᵀ D (S⁻¹z)] = tr(C⁻¹ D)`` for any matrix D.
    logdet : float
        The estimate of ``log det C``.
    logdet_stderr : float
        Its standard error, from the s probes' spread.
    n_iter : int
        CG steps of the solve.
    """

    solutions: da.Array
    probes: da.Array
    scaled_probes: da.Array
    logdet: float
    logdet_stderr: float
    n_iter: int


def solve_with_logdet(A: Any, B: Any, preconditioner: Any, *, n_probes: int, tol: float,
                      random_state: int, max_iter: int | None = None) -> ProbedSolve:
    """Solve ``C X = B`` and estimate ``log det C`` in one preconditioned block-CG run.

    Parameters
    ----------
    A : Operator
        C, square, e.g. ``gram(kernel, X) + alpha``.
    B : dask.array.Array of shape (n, t)
    preconditioner : NystromPreconditioner
        Needs ``apply``, ``logdet``, ``sqrt_apply`` and ``scale``.
    n_probes : int
        s, the random vectors of the estimate (its standard error falls as 1/√s).
    tol : float
        CG's relative residual for every column: the Lanczos tridiagonals have as many
        steps as their column took.
    random_state : int
        Seeds the probes (the same seed and chunking give the same probes).
    max_iter : int, optional
        As :func:`dkern.solvers.cg`.

    Returns
    -------
    ProbedSolve
    """
    n_probes = integer(n_probes, "n_probes", low=2, hint=" The standard error needs two.")
    chunks = B.chunks[0]
    G = da.random.RandomState(random_state).standard_normal((B.shape[0], n_probes),
                                                            chunks=(chunks, n_probes))
    scale = preconditioner.scale
    Z = np.sqrt(scale) * preconditioner.sqrt_apply(G)
    Z, SZ = dask.persist(Z, preconditioner.apply(Z) / scale)
    t = B.shape[1]
    result = cg(A, da.concatenate([B, Z], axis=1), preconditioner=preconditioner, tol=tol,
                max_iter=max_iter)
    assert result.coefficients is not None  # no checkpoint: the recurrence is complete
    quadratures = quadrature_log_forms(result.coefficients, scale)[t:]
    logdet = (preconditioner.logdet() + B.shape[0] * np.log(scale)
              + float(quadratures.mean()))
    stderr = float(quadratures.std(ddof=1) / np.sqrt(n_probes))
    logger.info("log det by SLQ: %.8g ± %.2g (%d probes, %d CG steps)", logdet, stderr,
                n_probes, result.n_iter)
    return ProbedSolve(result.x, Z, SZ, logdet, stderr, result.n_iter)


def quadrature_log_forms(coefficients: Coefficients, scale: float = 1.0) -> np.ndarray:
    """``‖g‖² e₁ᵀ log(T / c) e₁`` per column: the Lanczos quadrature of ``gᵀ log(Ĉ) g``,
    ``Ĉ = (c P)^{-1/2} C (c P)^{-1/2}``, for the g each column started from
    (``‖g‖² = γ₀ / c``, c = ``scale``); shape (t,)."""
    gamma0, alpha, beta = coefficients
    out = np.zeros(len(gamma0))
    for j in range(len(gamma0)):
        moving = alpha[:, j] != 0
        steps = int(np.argmin(moving)) if not moving.all() else len(moving)
        if steps == 0:
            continue  # a zero right-hand side: its form is 0
        diag, off = lanczos_tridiagonal(alpha[:steps, j], beta[:steps, j])
        theta, vectors = sla.eigh_tridiagonal(diag, off)
        out[j] = gamma0[j] / scale * float(vectors[0] ** 2 @ np.log(theta / scale))
    return out


def lanczos_tridiagonal(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The diagonal (k,) and off-diagonal (k - 1,) of Lanczos' T from k CG steps.

    With step lengths α and direction coefficients β (``p_i = u_i + β_i p_{i-1}``)::

        T[i, i] = 1/α_i + β_i/α_{i-1},      T[i, i+1] = √β_{i+1} / α_i.
    """
    diag = 1.0 / alpha
    diag[1:] += beta[1:] / alpha[:-1]
    return diag, np.sqrt(beta[1:]) / alpha[:-1]
