"""Kernel logistic regression's solvers: Newton in function space, and gradient descent.

The problem (one column per binary problem, targets ``t ∈ {0, 1}``, ``ỹ = 2t − 1``)::

    J(β) = 1/n Σᵢ log(1 + exp(−ỹᵢ fᵢ)) + α/2 βᵀKβ,   f = Kβ,
    ∇J   = K (g/n + αβ),   g = σ(f) − t,
    ∇²J  = K (W/n) K + αK,  W = diag(σ(f)(1 − σ(f))).

The Hessian in β is singular wherever K is (and ill-conditioned for any smooth
kernel), so Newton is run in function space: ``n J(β)`` is the negated Laplace
objective Ψ(f) of a GP classifier with prior covariance ``K / (nα)`` (Rasmussen &
Williams 2006, §3.4), whose mode :func:`dkern.models.logistic.newton_mode` finds with
``c = nα`` and :func:`~dkern.models.logistic.forced_step` steps (Newton is affine
invariant, so its steps in β and in f = Kβ are the same). B's eigenvalues lie in
``[1, 1 + λ_max(K) / (4nα)]``; it is solved by block CG on the lazy Gram operator (no
preconditioner, as for the GP classifier), one column per problem.

Both solvers stop a column when its stationarity residual ``‖nαβ + σ(f) − t‖`` (``n``
times ``∇J``'s coefficients, exactly zero at the optimum) is at most ``tol`` times its
value ``‖t − ½‖ = √n / 2`` at ``β = 0``.

Gradient descent is the kernelised (RKHS) gradient step on ``w = Σ βᵢ φ(xᵢ)``:
``β ← β − η(g/n + αβ)``, i.e. :func:`dkern.solvers.descend` on ``r(β) = t − σ(Kβ) −
nαβ`` with ``τ = η/n``. J is L-smooth in w with ``L = λ_max(K) / (4n) + α``; the 1/L
step is ``τ = 4 / λ_max(K + 4nαI)``, from Lanczos.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from ..operators import GramOperator
from ..solvers import descend, top_eigenvalue
from .logistic import forced_step, newton_mode, sigmoid, stationary

logger = logging.getLogger(__name__)

#: Newton steps at most when ``max_iter`` is None (Newton needs about ten).
NEWTON_MAX_ITER = 100


@dataclass(frozen=True)
class KlrFit:
    """The fitted coefficients of all binary problems.

    ``beta`` (n, t) persisted on the cluster; ``residuals`` (n_iter + 1, t) relative
    stationarity residuals; ``converged`` (t,).
    """

    beta: da.Array
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray


def newton_cg(K: GramOperator, T: da.Array, nalpha: float, *, tol: float,
              max_iter: int | None,
              callback: Callable[[int, np.ndarray], None] | None = None) -> KlrFit:
    """Newton's method with CG-solved, forcing-term steps (module docstring) from ``β = 0``.

    ``T`` (n, t) 0/1 targets chunked like K's columns; ``nalpha`` is ``n · alpha``.
    """
    fit = newton_mode(T, nalpha, forced_step(K), active_while=stationary(tol),
                      max_iter=NEWTON_MAX_ITER if max_iter is None else max_iter,
                      callback=callback, name="kernel logistic regression (newton-cg)")
    return KlrFit(fit.coef, fit.n_iter, fit.residuals, fit.converged)


def gradient_descent(K: GramOperator, T: da.Array, nalpha: float, *, tol: float,
                     max_iter: int | None, random_state: Any = None,
                     callback: Callable[[int, np.ndarray], None] | None = None) -> KlrFit:
    """Kernelised gradient descent with the 1/L step (module docstring) from ``β = 0``."""
    step = 4.0 / top_eigenvalue(K + 4 * nalpha, random_state=random_state)
    logger.info("kernel logistic regression (gd): step τ = 4 / λ_max(K + 4nαI) = %.6g", step)

    def residual(beta: da.Array) -> da.Array:
        return T - sigmoid(K.matvec(beta)) - nalpha * beta

    out = descend(residual, da.zeros_like(T), step=step, tol=tol, max_iter=max_iter,
                  callback=callback, name="kernel logistic regression gd")
    return KlrFit(out.x, out.n_iter, out.residuals, out.converged)
