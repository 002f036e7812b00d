"""Hyperparameter learning's engine: maximise a log marginal likelihood over ``theta``.

As scikit-learn's ``GaussianProcessRegressor``: L-BFGS-B in log space within the kernel's
log-bounds, with the analytic gradient, from the kernel's own ``theta`` and then from
``n_restarts`` starts drawn uniformly in the log-bounds; the best run wins. The objectives
are the regressor's (:mod:`._gp_exact_learning`, :mod:`._gp_sparse_learning`) and the
classifier's Laplace evidence.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from numbers import Integral
from typing import Any

import numpy as np
import scipy.optimize

from ..errors import ConvergenceWarning, NotPositiveDefiniteError, caller_stacklevel
from ..kernels import Kernel

logger = logging.getLogger(__name__)

Objective = Callable[..., Any]
#: ``lml(kernel, eval_gradient) -> (value, gradient (p,))``; -inf where it does not exist.
Likelihood = Callable[[Kernel, bool], tuple[float, np.ndarray]]

#: L-BFGS-B's names: dkern's, and scikit-learn's (its default) for code written for it.
LBFGS_NAMES = ("lbfgs", "fmin_l_bfgs_b")

def check_optimizer(optimizer: Any, n_restarts: Any) -> None:
    """Raise unless ``optimizer`` is "lbfgs" ("fmin_l_bfgs_b"), None or a callable, and
    ``n_restarts`` >= 0."""
    if not (optimizer is None or callable(optimizer)
            or (isinstance(optimizer, str) and optimizer in LBFGS_NAMES)):
        raise ValueError(f"optimizer must be 'lbfgs' (or scikit-learn's name 'fmin_l_bfgs_b'), "
                         f"a callable optimizer(obj_func, initial_theta, bounds) -> (theta, "
                         f"value), or None; got {optimizer!r}.")
    if isinstance(n_restarts, bool) or not isinstance(n_restarts, Integral) or n_restarts < 0:
        raise ValueError(f"n_restarts_optimizer must be an integer >= 0; got {n_restarts!r}.")


def check_start_in_bounds(kernel: Kernel) -> None:
    """Raise if a learnable parameter starts outside its bounds, naming it and the fix."""
    theta, bounds = kernel.theta, kernel.bounds
    slack = 1e-12 * np.maximum(1.0, np.abs(bounds))
    outside = (theta < bounds[:, 0] - slack[:, 0]) | (theta > bounds[:, 1] + slack[:, 1])
    if outside.any():
        k = int(np.argmax(outside))
        name = kernel.hyperparameter_names[k]
        low, high = np.exp(bounds[k])
        raise ValueError(
            f"kernel hyperparameter {name} = {np.exp(theta[k]):.6g} lies outside its bounds "
            f"({low:.6g}, {high:.6g}), so the optimizer cannot start there. Start inside the "
            f"bounds, widen them (the kernel's {name.rpartition('__')[2]}_bounds), fix the "
            "parameter with bounds 'fixed', or pass optimizer=None.")


def optimize(kernel: Kernel, lml: Likelihood, optimizer: Any, n_restarts: int,
             rng: np.random.RandomState) -> tuple[np.ndarray, float]:
    """The best ``theta`` found and its ``lml`` value.

    Warns (``ConvergenceWarning``) when a run does not converge, with the best value
    found; raises when no run reaches a finite likelihood (never returns NaN).
    """
    check_start_in_bounds(kernel)
    bounds = kernel.bounds

    def objective(theta: np.ndarray, eval_gradient: bool = True) -> Any:
        if not np.all(np.isfinite(theta)):
            value, grad = -np.inf, np.zeros(len(theta))
        else:
            value, grad = lml(kernel.with_theta(theta), eval_gradient)
        if not np.isfinite(value):  # steer the search away; scikit-learn returns -inf too
            return (np.inf, np.zeros(len(theta))) if eval_gradient else np.inf
        return (-value, -grad) if eval_gradient else -value

    starts = [kernel.theta] + [rng.uniform(bounds[:, 0], bounds[:, 1]) for _ in range(n_restarts)]
    runs = [_run(objective, start, bounds, optimizer) for start in starts]
    theta, neg_value = min(runs, key=lambda run: run[1] if np.isfinite(run[1]) else np.inf)
    if not np.isfinite(neg_value):
        raise NotPositiveDefiniteError(
            f"no hyperparameters tried by the optimizer ({len(runs)} runs) gave a finite log "
            "marginal likelihood: every factorisation of the kernel matrix failed. Narrow the "
            "kernel's bounds, increase alpha (regression), or pass optimizer=None.")
    logger.info("GP optimizer: best log marginal likelihood %.6g over %d runs", -neg_value,
                len(runs))
    _warn_at_bounds(kernel, theta)
    return np.asarray(theta, dtype=float), float(-neg_value)


def _warn_at_bounds(kernel: Kernel, theta: np.ndarray) -> None:
    """Warn for each hyperparameter that ends on a bound: a better value may lie beyond it
    (scikit-learn's test: ``np.isclose`` in log space)."""
    at_bound = np.isclose(kernel.bounds, np.asarray(theta)[:, None])
    for k, side in zip(*np.nonzero(at_bound), strict=True):
        bound = np.exp(kernel.bounds[k, side])
        warnings.warn(
            f"the fitted {kernel.hyperparameter_names[k]} = {np.exp(theta[k]):.6g} is at its "
            f"{'lower' if side == 0 else 'upper'} bound {bound:.6g}: a better value may lie "
            f"beyond it. {'Decrease' if side == 0 else 'Increase'} that bound and fit again.",
            ConvergenceWarning, stacklevel=caller_stacklevel())


def _run(objective: Objective, start: np.ndarray, bounds: np.ndarray,
         optimizer: Any) -> tuple[np.ndarray, float]:
    """One optimizer run from ``start``: (theta, minimum of -ln p)."""
    if callable(optimizer):
        return _checked_result(optimizer(objective, start, bounds), optimizer, len(start))
    result = scipy.optimize.minimize(objective, start, method="L-BFGS-B", jac=True,
                                     bounds=bounds)
    if not result.success:
        warnings.warn(
            f"L-BFGS-B stopped without converging ({result.message}) after {result.nit} "
            f"iterations; keeping the best log marginal likelihood found, {-result.fun:.6g}. "
            "Raise n_restarts_optimizer, narrow the kernel's bounds, or increase alpha.",
            ConvergenceWarning, stacklevel=caller_stacklevel())
    return np.asarray(result.x, dtype=float), float(result.fun)


def _checked_result(result: Any, optimizer: Any, p: int) -> tuple[np.ndarray, float]:
    """A callable optimizer's ``(theta (p,), value)``, or a ValueError naming what it returned."""
    try:
        theta, value = result
        theta, value = np.asarray(theta, dtype=float), float(value)
    except (TypeError, ValueError):
        theta, value = None, np.nan
    if theta is None or theta.shape != (p,) or not np.all(np.isfinite(theta)) or np.isnan(value):
        raise ValueError(
            f"optimizer={optimizer!r} returned {result!r:.200}; expected (theta, value): the "
            f"best finite log-hyperparameters found, shape ({p},), and obj_func's value there "
            "(minus the log marginal likelihood, a number).")
    return theta, value
