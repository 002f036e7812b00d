"""One Newton loop for the mode of a logistic likelihood with a Gaussian prior.

For ``t`` binary problems side by side (0/1 targets ``T`` of shape (n, t), ``ỹ = 2T − 1``),
a square kernel matrix K and a scale ``c > 0``, each column minimises

.. math:: \\Phi(\\beta) = \\sum_i \\log(1 + e^{-\\tilde y_i f_i}) + \\tfrac c2 \\beta^\\top f,
          \\qquad f = K\\beta,

the negated Laplace objective ``−Ψ(f) = −log p(t|f) + ½ fᵀ(K/c)⁻¹f`` of a GP classifier
with prior covariance ``K / c`` (Rasmussen & Williams 2006, §3.4; ``a = cβ`` is the ``a``
of their Alg. 3.1). Its stationarity residual ``ρ = cβ + σ(f) − T`` is zero at the mode.
Kernel logistic regression is ``c = nα`` (``Φ = n J``); the Laplace GP classifier is
``c = 1``.

:func:`newton_mode` runs the loop every caller shares: from ``β = 0``, ask a step
function (:mod:`.steps`) for a direction ``(Δβ, Δf = KΔβ)``, halve each column's step
until Φ does not rise (the line search needs no matvec: ``f(β + sΔβ) = f + sΔf``), and
stop a column by a rule on Φ's decrease and ρ (:func:`stationary`, :func:`objective_settled`).
The arrays are numpy (dense K) or dask (the lazy Gram operator); on dask every iterate is
persisted and all scalars of one trial point come in one ``dask.compute``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import dask
import numpy as np
from scipy.special import expit

from ...errors import DkernError

logger = logging.getLogger(__name__)

#: Step halvings of the line search; a step still no better is taken (rounding level).
MAX_HALVINGS = 30
#: A step is accepted if it raises Φ by at most this fraction (summation rounding).
SLACK = 1e-12


class StepFunction(Protocol):
    """``(Δβ, Δf)`` of shape (n, t) at ``(β, f)``; inactive columns may get anything
    finite. ``forcing`` is the forcing term ``min(0.1, r)`` of the active columns."""

    def __call__(self, beta: Any, f: Any, T: Any, c: float, active: np.ndarray,
                 forcing: float) -> tuple[Any, Any]: ...


#: ``active(decrease, relative_residual) -> bool (t,)``: which columns still step.
StopRule = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class NewtonFit:
    """The mode of each column.

    ``coef`` β and ``latent`` f = Kβ, (n, t), numpy or persisted dask; ``objective`` Φ at
    the mode and ``decrease`` Φ's decrease by the last step (inf before any), (t,);
    ``residuals`` (n_iter + 1, t) relative stationarity residuals ``‖ρ‖ / (√n / 2)``;
    ``converged`` (t,) by the stopping rule.
    """

    coef: Any
    latent: Any
    objective: np.ndarray
    decrease: np.ndarray
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray


def sigmoid(f: Any) -> Any:
    """σ(f) elementwise without overflow (numpy or dask: ``expit`` is a ufunc)."""
    return expit(f)


def stationary(tol: float) -> StopRule:
    """Columns step while their relative stationarity residual exceeds ``tol``."""
    return lambda decrease, rel: rel > tol


def objective_settled(tol: float) -> StopRule:
    """Columns step while a step lowers Φ by ``tol`` or more (scikit-learn's Laplace test)."""
    return lambda decrease, rel: decrease >= tol


def newton_mode(T: Any, c: float, step: StepFunction, *, active_while: StopRule,
                max_iter: int, callback: Callable[[int, np.ndarray], None] | None = None,
                name: str = "newton") -> NewtonFit:
    """Newton's method from ``β = 0`` (module docstring) on 0/1 targets ``T`` (n, t).

    ``T`` is chunked like K's columns when dask; ``callback(k, relative_residuals)`` after
    each step (and at the start).
    """
    norm0 = np.sqrt(T.shape[0]) / 2  # ‖t − ½‖ for t ∈ {0, 1}: ‖ρ‖ at β = 0
    beta, f = dask.persist(np.zeros_like(T), np.zeros_like(T))
    obj, rel = _scalars(beta, f, T, c, norm0, name)
    history, decrease, k = [rel], np.full(rel.shape, np.inf), 0
    while True:
        active = active_while(decrease, rel)
        _report(k, rel, callback, name)
        if not active.any() or k >= max_iter:
            break
        with dask.annotate(dkern_iteration=k):
            delta, delta_f = step(beta, f, T, c, active, min(0.1, float(rel[active].min())))
            beta, f, new_obj, rel = _line_search(beta, f, delta, delta_f, T, c, obj, norm0, name)
        decrease, obj = obj - new_obj, new_obj
        history.append(rel)
        k += 1
    logger.info("%s: %d Newton steps, largest relative stationarity residual %.3e", name, k,
                rel.max())
    return NewtonFit(beta, f, obj, decrease, k, np.vstack(history), ~active)


def _scalars(beta: Any, f: Any, T: Any, c: float, norm0: float,
             name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per column, in one compute: Φ(β) and the relative stationarity residual."""
    rho = c * beta + sigmoid(f) - T
    objective = np.logaddexp(0, -(2 * T - 1) * f).sum(axis=0) + c / 2 * (beta * f).sum(axis=0)
    obj, r2 = dask.compute(objective, (rho * rho).sum(axis=0))
    obj, r2 = np.asarray(obj, dtype=np.float64), np.asarray(r2, dtype=np.float64)
    if not (np.isfinite(obj).all() and np.isfinite(r2).all()):
        raise DkernError(f"{name}: the objective became NaN or infinite; check the data, the "
                         "kernel parameters and the regularisation.")
    return obj, np.sqrt(r2) / norm0


def _line_search(beta: Any, f: Any, delta: Any, delta_f: Any, T: Any, c: float,
                 obj: np.ndarray, norm0: float, name: str) -> tuple[Any, ...]:
    """Halve each column's step until Φ does not rise; the new β, f and scalars."""
    s = np.ones(obj.shape)
    for _ in range(MAX_HALVINGS):
        trial = beta + delta * s, f + delta_f * s
        new_obj, rel = _scalars(*trial, T, c, norm0, name)
        worse = new_obj > obj + SLACK * np.abs(obj)
        if not worse.any():
            break
        s = np.where(worse, s / 2, s)
        logger.debug("%s: halving the step of columns %s", name, np.flatnonzero(worse))
    beta, f = dask.persist(*trial)
    return beta, f, new_obj, rel


def _report(k: int, rel: np.ndarray, callback: Callable[[int, np.ndarray], None] | None,
            name: str) -> None:
    if callback is not None:
        callback(k, rel.copy())
    logger.debug("%s step %d: max relative stationarity residual %.3e", name, k, rel.max())
