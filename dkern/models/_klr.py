"""Kernel logistic regression: Newton-CG and gradient descent on the lazy Gram operator.

The problem (one column per binary problem, targets ``t ∈ {0, 1}``, ``ỹ = 2t − 1``)::

    J(β) = 1/n Σᵢ log(1 + exp(−ỹᵢ fᵢ)) + α/2 βᵀKβ,   f = Kβ,
    ∇J   = K (g/n + αβ),   g = σ(f) − t,
    ∇²J  = K (W/n) K + αK,  W = diag(σ(f)(1 − σ(f))).

The Hessian in β is singular wherever K is (and ill-conditioned for any smooth
kernel), so Newton is run in function space. With ``K' = K / (nα)``, ``n J(β) = Σᵢ
ℓ(ỹᵢ fᵢ) + ½ fᵀK'⁻¹f``: the negated Laplace objective Ψ(f) of a GP classifier with
kernel K' (Rasmussen & Williams 2006, §3.4), whose mode has ``f = K'(t − σ(f))``, i.e.
the stationarity residual ``ρ = nαβ + σ(f) − t`` is zero. Newton is affine invariant, so
its steps in β and in f = Kβ are the same. The solution of the nonsingular
``(WK + nαI) Δ = −ρ`` solves the singular Newton system ``∇²J Δ = −∇J`` (multiply it by
K/n; every solution of the latter gives the same step ``KΔ`` of f), and with
``W = nα U²`` it has the form of R&W Alg. 3.1 lines 6–7, one SPD system whatever K's
rank::

    B Δz = U K (−ρ),   B = I + U K U,   U = diag(√(W / (nα)))
    Δ    = (−ρ − U Δz) / (nα)        (check: (WK + nαI)Δ = −ρ ⇔ B Δz = U K (−ρ))

B's eigenvalues lie in ``[1, 1 + λ_max(K) / (4nα)]``. Unlike Alg. 3.1, which solves for
the new point, this solves for the step, so the CG error shrinks with ρ. A CG residual
``r_B`` leaves the Newton equation the residual ``(WK + nαI)Δ + ρ = U r_B``; CG stops
when that is at most ``η ‖ρ‖`` with the forcing term ``η = min(0.1, r)`` (``r`` the
current relative stationarity residual), which keeps the convergence quadratic
(Eisenstat & Walker 1996): its tolerance on ``B`` is ``η ‖ρ‖ / (max U · ‖U K ρ‖)``, far
below η when K is large. B is solved by block CG on the lazy Gram operator (no
preconditioner, as for the GP classifier), one column per problem. A step that does not
lower ``n J`` is halved (the line search needs no matvec: ``f(β + sΔ) = f + s Δf``).

Both solvers stop a column when its stationarity residual ``‖nαβ + σ(f) − t‖`` (``n``
times ``∇J``'s coefficients, exactly zero at the optimum) is at most ``tol`` times its
value ``‖t − ½‖ = √n / 2`` at ``β = 0``.

Gradient descent is the seeds' kernelised one, the RKHS gradient step on
``w = Σ βᵢ φ(xᵢ)``: ``β ← β − η(g/n + αβ)``, i.e. :func:`dkern.solvers.descend` on
``r(β) = t − σ(Kβ) − nαβ`` with ``τ = η/n``. J is L-smooth in w with ``L = λ_max(K) /
(4n) + α``; the 1/L step is ``τ = 4 / λ_max(K + 4nαI)``, from Lanczos.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from scipy.special import expit

from ..errors import DkernError
from ..operators import GramOperator, Operator
from ..solvers import cg, descend, top_eigenvalue

logger = logging.getLogger(__name__)

#: Newton steps at most when ``max_iter`` is None (Newton needs about ten).
NEWTON_MAX_ITER = 100
#: Step halvings of the line search; a step still no better is taken (rounding level).
MAX_HALVINGS = 30
#: A step is accepted if it raises ``n J`` by at most this fraction (summation rounding).
SLACK = 1e-12
#: The tightest CG tolerance a Newton step asks for (float64 rounding in B's matvec).
CG_TOL_FLOOR = 1e-13


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


class NewtonSystem(Operator):
    """``B = I + U K U`` per column, lazily: ``B V = V + U ⊙ K (U ⊙ V)``.

    ``U`` (n, t) holds each problem's ``√(W / (nα))``; column j of V sees column j of U
    only, so block CG solves the t problems' systems side by side.
    """

    def __init__(self, K: GramOperator, U: da.Array) -> None:
        self.K, self.U = K, U.rechunk((K.col_chunks, -1))
        self.shape, self.dtype, self.col_chunks = K.shape, K.dtype, K.col_chunks

    @property
    def is_square(self) -> bool:
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        return V + self.U * self.K._matvec(self.U * V)


def sigmoid(f: da.Array) -> da.Array:
    """σ(f) elementwise, without overflow."""
    return da.map_blocks(expit, f, dtype=np.float64)


def _scalars(beta: da.Array, f: da.Array, T: da.Array, nalpha: float,
             norm0: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column, in one compute: ``n J(β)`` and the relative stationarity residual."""
    rho = nalpha * beta + sigmoid(f) - T
    objective = da.logaddexp(0, -(2 * T - 1) * f).sum(axis=0) + nalpha / 2 * (beta * f).sum(axis=0)
    obj, r2 = dask.compute(objective, (rho * rho).sum(axis=0))
    if not (np.isfinite(obj).all() and np.isfinite(r2).all()):
        raise DkernError("kernel logistic regression: the objective became NaN or infinite; "
                         "check the data, the kernel parameters and alpha.")
    return obj, np.sqrt(r2) / norm0


def newton_cg(K: GramOperator, T: da.Array, nalpha: float, *, tol: float,
              max_iter: int | None,
              callback: Callable[[int, np.ndarray], None] | None = None) -> KlrFit:
    """Newton's method with CG-solved steps (module docstring) from ``β = 0``.

    ``T`` (n, t) 0/1 targets chunked like K's columns; ``nalpha`` is ``n · alpha``.
    """
    max_iter = NEWTON_MAX_ITER if max_iter is None else max_iter
    norm0 = np.sqrt(T.shape[0]) / 2  # ‖t − ½‖ for t ∈ {0, 1}
    beta, f = dask.persist(da.zeros_like(T), da.zeros_like(T))
    obj, rel = _scalars(beta, f, T, nalpha, norm0)
    history, k = [rel], 0
    while True:
        active = rel > tol
        _report(k, rel, callback)
        if not active.any() or k >= max_iter:
            break
        with dask.annotate(dkern_iteration=k):
            delta, delta_f = _newton_direction(K, T, beta, f, nalpha, active,
                                               min(0.1, float(rel[active].min())))
            beta, f, obj, rel = _line_search(beta, f, delta, delta_f, T, nalpha, obj, norm0)
        history.append(rel)
        k += 1
    logger.info("kernel logistic regression (newton-cg): %d Newton steps, largest relative "
                "stationarity residual %.3e", k, rel.max())
    return KlrFit(beta, k, np.vstack(history), rel <= tol)


def _newton_direction(K: GramOperator, T: da.Array, beta: da.Array, f: da.Array, nalpha: float,
                      active: np.ndarray, forcing: float) -> tuple[da.Array, da.Array]:
    """The Newton step ``(Δβ, Δf = KΔβ)`` of the active columns (module docstring); the
    inactive columns get 0."""
    pi = sigmoid(f)
    mask = active.astype(np.float64)
    U, c = dask.persist(da.sqrt(pi * (1 - pi) / nalpha), (T - pi - nalpha * beta) * mask)
    (rhs,) = dask.persist(U * K.matvec(c))
    norms = dask.compute(da.sqrt((c * c).sum(axis=0)), da.sqrt((rhs * rhs).sum(axis=0)),
                         U.max(axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):  # inactive columns: 0 / 0
        tols = np.where(active, forcing * norms[0] / (norms[1] * norms[2]), np.inf)
    cg_tol = float(np.clip(tols.min(), CG_TOL_FLOOR, 0.1))
    z = cg(NewtonSystem(K, U), rhs, tol=cg_tol).x
    (delta,) = dask.persist((c - U * z.rechunk(c.chunks)) / nalpha)
    (delta_f,) = dask.persist(K.matvec(delta))
    return delta, delta_f


def _line_search(beta: da.Array, f: da.Array, delta: da.Array, delta_f: da.Array, T: da.Array,
                 nalpha: float, obj: np.ndarray, norm0: float) -> tuple[Any, ...]:
    """Halve each column's step until ``n J`` does not rise; the new β, f and scalars."""
    s = np.ones(obj.shape)
    for _ in range(MAX_HALVINGS):
        trial = beta + delta * s, f + delta_f * s
        new_obj, rel = _scalars(*trial, T, nalpha, norm0)
        worse = new_obj > obj + SLACK * np.abs(obj)
        if not worse.any():
            break
        s = np.where(worse, s / 2, s)
        logger.debug("newton-cg: halving the step of columns %s", np.flatnonzero(worse))
    beta, f = dask.persist(*trial)
    return beta, f, new_obj, rel


def gradient_descent(K: GramOperator, T: da.Array, nalpha: float, *, tol: float,
                     max_iter: int | None, random_state: Any = None,
                     callback: Callable[[int, np.ndarray], None] | None = None) -> KlrFit:
    """The seeds' kernelised gradient descent (module docstring) from ``β = 0``."""
    step = 4.0 / top_eigenvalue(K + 4 * nalpha, random_state=random_state)
    logger.info("kernel logistic regression (gd): step τ = 4 / λ_max(K + 4nαI) = %.6g", step)

    def residual(beta: da.Array) -> da.Array:
        return T - sigmoid(K.matvec(beta)) - nalpha * beta

    out = descend(residual, da.zeros_like(T), step=step, tol=tol, max_iter=max_iter,
                  callback=callback, name="kernel logistic regression gd")
    return KlrFit(out.x, out.n_iter, out.residuals, out.converged)


def _report(k: int, rel: np.ndarray, callback: Callable[[int, np.ndarray], None] | None) -> None:
    if callback is not None:
        callback(k, rel.copy())
    logger.debug("newton-cg step %d: max relative stationarity residual %.3e", k, rel.max())
