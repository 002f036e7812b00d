"""The Newton steps :func:`~.newton.newton_mode` can take, each a system with
``B = I + D K D``, ``D = diag(√(W / c))``, ``W = σ(f)(1 − σ(f))`` (Rasmussen & Williams
2006, Alg. 3.1 lines 4–7, with the prior covariance ``K / c``).

:func:`alg31_point` and :func:`dense_alg31_point` are Alg. 3.1 itself: they solve for the
new point ``a = b − D B⁻¹ D K b``, ``b = W f + t − σ(f)`` (lines 6–7; ``β = a / c``),
by block CG to a fixed tolerance started from the last step's solution (the systems
change less and less as the mode nears, so later steps need fewer CG iterations), or by
a dense Cholesky factor of B.

:func:`forced_step` solves for the step instead. The solution of the nonsingular
``(WK + cI) Δ = −ρ`` (``ρ = cβ + σ(f) − t``) is a Newton step of Φ in β (multiply it by
K: every solution of the singular Newton system gives the same step ``KΔ`` of f), and
with ``W = c D²`` it is one SPD system whatever K's rank::

    B Δz = D K (−ρ),   Δ = (−ρ − D Δz) / c        ((WK + cI)Δ = −ρ ⇔ B Δz = D K (−ρ))

so the CG error shrinks with ρ. A CG residual ``r_B`` leaves the Newton equation the
residual ``D r_B``; CG stops when that is at most ``η ‖ρ‖``, the forcing term ``η =
min(0.1, r)`` (``r`` the relative stationarity residual) keeping the convergence
quadratic (Eisenstat & Walker 1996): its tolerance on B is ``η ‖ρ‖ / (max D · ‖D K ρ‖)``.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ...operators import GramOperator, IdentityPlusScaled
from ...solvers import cg
from .newton import StepFunction, sigmoid

#: The tightest CG tolerance a forced step asks for (float64 rounding in B's matvec).
CG_TOL_FLOOR = 1e-13


def forced_step(K: GramOperator) -> StepFunction:
    """Newton steps by CG on the lazy K to the forcing term's tolerance (module docstring);
    the inactive columns get 0."""

    def step(beta: da.Array, f: da.Array, T: da.Array, c: float, active: np.ndarray,
             forcing: float) -> tuple[da.Array, da.Array]:
        pi = sigmoid(f)
        mask = active.astype(np.float64)
        D, minus_rho = dask.persist(da.sqrt(pi * (1 - pi) / c), (T - pi - c * beta) * mask)
        (rhs,) = dask.persist(D * K.matvec(minus_rho))
        norms = dask.compute(da.sqrt((minus_rho * minus_rho).sum(axis=0)),
                             da.sqrt((rhs * rhs).sum(axis=0)), D.max(axis=0))
        with np.errstate(divide="ignore", invalid="ignore"):  # inactive columns: 0 / 0
            tols = np.where(active, forcing * norms[0] / (norms[1] * norms[2]), np.inf)
        cg_tol = float(np.clip(tols.min(), CG_TOL_FLOOR, 0.1))
        z = cg(IdentityPlusScaled(K, D), rhs, tol=cg_tol).x
        (delta,) = dask.persist((minus_rho - D * z.rechunk(minus_rho.chunks)) / c)
        (delta_f,) = dask.persist(K.matvec(delta))
        return delta, delta_f

    return step


def alg31_point(K: GramOperator, *, tol: float, cg_max_iter: int | None) -> StepFunction:
    """Alg. 3.1's new point by block CG on the lazy K to ``tol``, warm-started; the step
    is the difference to the current point."""
    last: list[Any] = [None]  # the last step's CG solution

    def step(beta: da.Array, f: da.Array, T: da.Array, c: float, active: np.ndarray,
             forcing: float) -> tuple[da.Array, da.Array]:
        pi = sigmoid(f)
        D = da.sqrt(pi * (1 - pi) / c)
        D, b = dask.persist(D, c * D * D * f + (T - pi))  # line 6; D is read by every matvec
        last[0] = z = cg(IdentityPlusScaled(K, D), D * K.matvec(b), x0=last[0], tol=tol,
                         max_iter=cg_max_iter).x  # line 7
        (new_beta,) = dask.persist((b - D * z.rechunk(b.chunks)) / c)
        (new_f,) = dask.persist(K.matvec(new_beta))  # line 8
        return new_beta - beta, new_f - f

    return step


def dense_alg31_point(K: np.ndarray) -> StepFunction:
    """Alg. 3.1's new point with K (n, n) and a Cholesky factor of B (one column)."""

    def step(beta: np.ndarray, f: np.ndarray, T: np.ndarray, c: float, active: np.ndarray,
             forcing: float) -> tuple[np.ndarray, np.ndarray]:
        pi = sigmoid(f)
        d, L = dense_factor(K, pi[:, 0], c)
        D = d[:, None]
        b = c * D * D * f + (T - pi)  # line 6
        new_beta = (b - D * sla.cho_solve((L, True), D * (K @ b), check_finite=False)) / c
        return new_beta - beta, K @ new_beta - f  # line 8

    return step


def dense_factor(K: np.ndarray, pi: np.ndarray, c: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``d = √(W / c)`` for ``π`` (n,) and the lower Cholesky factor of ``B = I + D K D``."""
    d = np.sqrt(pi * (1 - pi) / c)
    B = d[:, None] * K * d[None, :]
    B[np.diag_indices_from(B)] += 1
    return d, sla.cholesky(B, lower=True, overwrite_a=True, check_finite=False)
