"""Newton's method for multinomial (softmax) kernel logistic regression.

With one-hot targets ``T`` (n, t) over t classes, ``F = Kβ`` (n, t) and ``c = nα``, β
minimises

.. math:: \\Phi(\\beta) = \\sum_i \\Bigl(\\log \\sum_j e^{F_{ij}} - T_i^\\top F_i\\Bigr)
          + \\tfrac c2 \\operatorname{tr}(\\beta^\\top F),

scikit-learn's multinomial ``LogisticRegression`` with ``C = 1/c`` for the linear kernel.
Its stationarity residual is ``ρ = cβ + π − T`` (π the row-wise softmax of F). As for the
binary problems (:mod:`.steps`), Newton's step in β solves ``(WK + cI)Δ = −ρ``, now with
``W`` the per-row Hessians ``Wᵢ = diag(πᵢ) − πᵢπᵢᵀ`` coupling the classes; with
``Sᵢ = (Wᵢ / c)^{1/2}`` it is one SPD system of n·t unknowns
(:class:`~dkern.operators.IdentityPlusRowScaled`, on flattened vectors)::

    (I + S K S) z = S K (−ρ),    Δ = (−ρ − S z) / c,

solved by block CG on the lazy Gram operator. A step is halved until Φ does not rise; the
loop stops when every class's column of ρ has ``‖ρⱼ‖ ≤ tol · ‖Tⱼ − 1/t‖`` (its value at
β = 0), the one-vs-rest problems' rule class by class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np
from scipy.special import logsumexp, softmax

from ...errors import DkernError
from ...operators import GramOperator, IdentityPlusRowScaled, flat_rows, rows_times, unflat_rows
from ...solvers import cg
from .newton import MAX_HALVINGS, SLACK
from .steps import CG_TOL_FLOOR

logger = logging.getLogger(__name__)


def multinomial_newton(K: GramOperator, T: da.Array, c: float, *, tol: float, max_iter: int,
                       callback: Callable[[int, np.ndarray], None] | None = None
                       ) -> tuple[da.Array, int, np.ndarray, bool]:
    """β (n, t) persisted, the Newton steps taken, each class's relative residuals
    (steps + 1, t) and whether ``tol`` was reached (module docstring)."""
    norm0 = np.sqrt(((T - 1 / T.shape[1]) ** 2).sum(axis=0).compute())
    beta, f = dask.persist(da.zeros_like(T), da.zeros_like(T))
    obj, rel = _scalars(beta, f, T, c, norm0)
    history, k = [rel], 0
    while True:
        if callback is not None:
            callback(k, rel.copy())
        if rel.max() <= tol or k >= max_iter:
            break
        with dask.annotate(dkern_iteration=k):
            delta, delta_f = _step(K, beta, f, T, c, min(0.1, float(rel.max())))
            beta, f, obj, rel = _line_search(beta, f, delta, delta_f, T, c, obj, norm0)
        history.append(rel)
        k += 1
    logger.info("multinomial kernel logistic regression: %d Newton steps, largest relative "
                "stationarity residual %.3e", k, rel.max())
    return beta, k, np.vstack(history), bool(rel.max() <= tol)


def _step(K: GramOperator, beta: da.Array, f: da.Array, T: da.Array, c: float,
          forcing: float) -> tuple[da.Array, da.Array]:
    """The Newton step ``(Δ, KΔ)`` at ``(β, f)``, CG solved to the forcing term."""
    pi = da.map_blocks(softmax, f, axis=1, dtype=np.float64)
    S = da.map_blocks(_hessian_sqrt, pi, c=c, new_axis=2,
                      chunks=(pi.chunks[0], pi.chunks[1], (pi.shape[1],)), dtype=np.float64)
    S, minus_rho = dask.persist(S, T - pi - c * beta)
    (rhs,) = dask.persist(flat_rows(rows_times(S, K.matvec(minus_rho))))
    z = cg(IdentityPlusRowScaled(K, S), rhs, tol=max(CG_TOL_FLOOR, 0.1 * forcing)).x
    z = unflat_rows(z.rechunk((rhs.chunks[0], -1)), T.shape[1])
    (delta,) = dask.persist((minus_rho - rows_times(S, z)) / c)
    (delta_f,) = dask.persist(K.matvec(delta))
    return delta, delta_f


def _hessian_sqrt(pi: np.ndarray, c: float) -> np.ndarray:
    """Per row, the symmetric square root of ``(diag(π) − ππᵀ) / c``; shape (n, t, t)."""
    W = (pi[:, :, None] * np.eye(pi.shape[1]) - pi[:, :, None] * pi[:, None, :]) / c
    lam, U = np.linalg.eigh(W)
    return np.einsum("nij,nj,nkj->nik", U, np.sqrt(np.clip(lam, 0.0, None)), U)


def _scalars(beta: da.Array, f: da.Array, T: da.Array, c: float,
             norm0: np.ndarray) -> tuple[float, np.ndarray]:
    """Φ(β) and each class's relative stationarity residual, in one compute."""
    pi = da.map_blocks(softmax, f, axis=1, dtype=np.float64)
    rho = c * beta + pi - T
    lse = da.map_blocks(logsumexp, f, axis=1, drop_axis=1, dtype=np.float64)
    objective = (lse - (T * f).sum(axis=1)).sum() + c / 2 * (beta * f).sum()
    obj, r2 = dask.compute(objective, (rho * rho).sum(axis=0))
    obj, r2 = float(obj), np.asarray(r2, dtype=np.float64)
    if not (np.isfinite(obj) and np.isfinite(r2).all()):
        raise DkernError("multinomial kernel logistic regression: the objective became NaN or "
                         "infinite; check the data, the kernel parameters and alpha.")
    return obj, np.sqrt(r2) / norm0


def _line_search(beta: da.Array, f: da.Array, delta: da.Array, delta_f: da.Array,
                 T: da.Array, c: float, obj: float, norm0: np.ndarray) -> tuple[Any, ...]:
    """Halve the step until Φ does not rise; the new β, f, Φ and residual."""
    s = 1.0
    for _ in range(MAX_HALVINGS):
        trial = beta + s * delta, f + s * delta_f
        new_obj, rel = _scalars(*trial, T, c, norm0)
        if new_obj <= obj + SLACK * abs(obj):
            break
        s /= 2
    beta, f = dask.persist(*trial)
    return beta, f, new_obj, rel
