"""Hyperparameter learning: maximise a log marginal likelihood over ``theta``.

:func:`learned_exact_kernel` and :func:`learned_sparse_posterior` are the regressor's two
ways (the classifier's Laplace evidence uses :func:`optimize` directly).

The exact one (dense up to ``EXACT_MAX_N`` rows, estimated by CG above it) or the SGPR
bound of the sparse GP; as
scikit-learn's ``GaussianProcessRegressor``: L-BFGS-B in log space within the
kernel's log-bounds, with the analytic gradient, from the kernel's own ``theta`` and
then from ``n_restarts`` starts drawn uniformly in the log-bounds; the best run wins.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from numbers import Integral
from typing import Any

import dask.array as da
import numpy as np
import scipy.optimize
from sklearn.utils import check_random_state

from ..errors import ConvergenceWarning, NotPositiveDefiniteError, caller_stacklevel
from ..kernels import Kernel
from ..solvers import EXACT_MAX_N
from ._validation import as_generator, in_memory, legacy_seed
from .posteriors import SparsePosterior
from .posteriors.evidence import estimated_log_marginal_likelihood
from .posteriors.exact import log_marginal_likelihood
from .posteriors.sparse import SparseBound, centers, training_data

logger = logging.getLogger(__name__)

Objective = Callable[..., Any]
#: ``lml(kernel, eval_gradient) -> (value, gradient (p,))``; -inf where it does not exist.
Likelihood = Callable[[Kernel, bool], tuple[float, np.ndarray]]


#: Probe vectors of each estimated likelihood above ``EXACT_MAX_N`` (solver="cg"): its
#: standard errors fall as 1/√probes, each probe one more CG right-hand side.
EVIDENCE_PROBES = 16
#: Line-search steps of L-BFGS-B on the estimate (scipy's default 20): each is a CG solve,
#: and a search that needs more is lost in the estimate's noise.
ESTIMATE_LINE_SEARCH = 5
#: Centres of the sparse bound whose optimum starts that learning (O(n M²) per evaluation).
WARM_START_CENTERS = 500

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
        raise ValueError(
            f"kernel hyperparameter {kernel.hyperparameter_names[k]} = {np.exp(theta[k]):.6g} "
            f"lies outside its bounds ({np.exp(bounds[k, 0]):.6g}, {np.exp(bounds[k, 1]):.6g}), "
            "so the optimizer cannot start there. Start inside the bounds, widen them (e.g. "
            "lengthscale_bounds=(1e-3, 1e3) or constant_bounds=...), fix the parameter with "
            "bounds 'fixed', or pass optimizer=None.")


def optimize(kernel: Kernel, lml: Likelihood, optimizer: Any, n_restarts: int,
             rng: np.random.RandomState, *, warn_at_bounds: bool = True
             ) -> tuple[np.ndarray, float]:
    """The best ``theta`` found and its ``lml`` value.

    Warns (``ConvergenceWarning``) when a run does not converge, with the best value
    found, and (``warn_at_bounds``) for each hyperparameter fitted onto a bound; raises
    when no run reaches a finite likelihood (never returns NaN).
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
    if warn_at_bounds:
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


def learned_exact_kernel(kernel: Kernel, X: Any, y: Any, alpha: float, *, optimizer: Any,
                         n_restarts: int, random_state: Any, default_kernel: bool,
                         solver: str = "exact", rank: int = 300, tol: float = 1e-8,
                         backend: str = "auto") -> tuple[Kernel, float]:
    """The kernel maximising the exact ``ln p(y | θ)`` (Rasmussen & Williams, eq. 5.8) for
    X (n, d), y (n,) or (n, t), and that value; ``(kernel, nan)`` when nothing is learned
    (no optimizer, or no free hyperparameter): the solve computes it where it can.

    Up to ``EXACT_MAX_N`` rows the likelihood is dense; above it, with ``solver="cg"``, it
    is estimated (:func:`cg_estimated_likelihood`; ``rank`` and ``tol`` are CG's).
    """
    n = X.shape[0]
    learn = optimizer is not None and len(kernel.theta) > 0
    if not learn:
        return kernel, float("nan")
    rng = check_random_state(legacy_seed(random_state))
    if n > EXACT_MAX_N:
        if solver != "cg":
            default = ("kernel=None is scikit-learn's C() * RBF(), whose hyperparameters are "
                       "learned (since scikit-learn 1.9); ") if default_kernel else ""
            raise ValueError(f"{default}learning hyperparameters (optimizer={optimizer!r}) "
                             f"above n = {EXACT_MAX_N} needs solver='cg' (the likelihood "
                             f"estimated by CG) or 'nystrom' (the sparse GP's bound); got "
                             f"solver={solver!r} with n={n}.")
        seed = int(rng.randint(2**31 - 1))
        Xd, Yd = training_data(X, y)  # numpy X is sent to the cluster once
        lml = cg_estimated_likelihood(Xd, Yd, alpha, rank=rank, tol=tol, backend=backend,
                                      seed=seed)
        warm = sparse_warm_start(kernel, Xd, Yd, alpha, backend=backend, seed=seed)
        if lml(warm, False)[0] >= lml(kernel, False)[0]:
            kernel = warm  # else the bound's optimum lies where the exact GP does worse
        if isinstance(optimizer, str):
            optimizer = lbfgs_on_estimate
    else:
        Xn, yn = in_memory(X), in_memory(y).reshape(n, -1)

        def lml(k: Kernel, eval_gradient: bool) -> tuple[float, np.ndarray]:
            return log_marginal_likelihood(k, Xn, yn, alpha, eval_gradient)

    theta, value = optimize(kernel, lml, optimizer, n_restarts, rng)
    return kernel.with_theta(theta), value


def lbfgs_on_estimate(objective: Objective, start: np.ndarray,
                      bounds: np.ndarray) -> tuple[np.ndarray, float]:
    """L-BFGS-B on an estimated likelihood (an ``optimizer`` callable).

    The estimate's value and gradient come from the same probes but are not exactly a
    function and its derivative, so near the optimum, where the gradient is within its
    sampling error, the line search fails ("ABNORMAL"): there that is the expected end,
    logged with the iterations taken rather than warned about.
    """
    result = scipy.optimize.minimize(objective, start, method="L-BFGS-B", jac=True,
                                     bounds=bounds, options={"maxls": ESTIMATE_LINE_SEARCH})
    if not result.success:
        logger.info("L-BFGS-B on the estimated likelihood ended after %d iterations (%s): "
                    "the gradient is within the estimate's sampling error there",
                    result.nit, result.message)
    return np.asarray(result.x, dtype=float), float(result.fun)


def sparse_warm_start(kernel: Kernel, Xd: da.Array, Yd: da.Array, alpha: float, *,
                      backend: str, seed: int) -> Kernel:
    """``kernel`` at the optimum of the sparse GP's bound on ``WARM_START_CENTERS`` centres:
    where learning on the estimated exact likelihood starts above ``EXACT_MAX_N`` rows.

    Each evaluation of the bound is two passes over X with M-sized sums, far cheaper than a
    CG solve with probes, and its optimum is near the exact one when M covers the kernel's
    effective rank; the exact objective then needs a few steps (the caller keeps it only
    where the estimated exact likelihood is not worse than at the kernel's own θ)."""
    Z = centers(Xd, min(WARM_START_CENTERS, Xd.shape[0]), np.random.default_rng(seed))
    bound = SparseBound(Xd, Yd, Z, alpha, backend=backend)
    theta, value = optimize(kernel, bound, "lbfgs", 0, check_random_state(seed),
                            warn_at_bounds=False)
    logger.info("exact GP learning above n = %d starts from the sparse GP's optimum on %d "
                "centres (bound %.6g): %r", EXACT_MAX_N, len(Z), value,
                kernel.with_theta(theta))
    return kernel.with_theta(theta)


def cg_estimated_likelihood(Xd: da.Array, Yd: da.Array, alpha: float, *, rank: int,
                            tol: float, backend: str, seed: int) -> Likelihood:
    """``ln p(y | θ)`` and its gradient estimated by one CG solve each
    (:func:`~.posteriors.evidence.estimated_log_marginal_likelihood`), with
    ``EVIDENCE_PROBES`` probes and the same ``seed`` at every θ, so that the optimizer
    sees one deterministic function; each estimate and its standard errors are logged."""

    def lml(k: Kernel, eval_gradient: bool) -> tuple[float, np.ndarray]:
        estimate = estimated_log_marginal_likelihood(
            k, Xd, Yd, alpha, eval_gradient=eval_gradient, n_probes=EVIDENCE_PROBES,
            rank=rank, tol=tol, random_state=seed, backend=backend)
        logger.info("estimated ln p(y | θ) = %.8g ± %.2g (%d CG steps); gradient's largest "
                    "standard error %.2g", estimate.value, estimate.value_stderr,
                    estimate.n_iter, estimate.gradient_stderr.max(initial=0.0))
        return estimate.value, estimate.gradient

    return lml


def learned_sparse_posterior(kernel: Kernel, X: Any, y: Any, alpha: float, *,
                             n_centers: int | None, optimizer: Any, n_restarts: int,
                             random_state: Any, backend: str = "auto") -> SparsePosterior:
    """SGPR (Titsias 2009): M centres drawn from X's rows, the kernel maximising the bound
    F (if ``optimizer``; each evaluation two passes over X, the centres fixed; the starts
    are :func:`learned_on_bound`'s), and the posterior of its statistics (the optimizer's
    last pass, when it ended there); the passes' blocks computed by ``backend``."""
    Xd, Yd = training_data(X, y)  # numpy X is sent to the cluster once
    Z = centers(Xd, n_centers, as_generator(random_state))
    bound = SparseBound(Xd, Yd, Z, alpha, backend=backend)
    if optimizer is not None and len(kernel.theta) > 0:
        kernel = learned_on_bound(kernel, bound, optimizer, n_restarts,
                                  check_random_state(legacy_seed(random_state)))
    return SparsePosterior(bound.statistics(kernel), alpha, backend)


#: Effective degrees of freedom below which a sparse fit has collapsed: its mean is at most
#: about one constant, the rest of y taken as noise (:meth:`SparseBound.fit_of`). With
#: fewer than 3 centres the threshold is M / 2 (one centre allows at most 1).
COLLAPSED_DOF = 1.5


def learned_on_bound(kernel: Kernel, bound: SparseBound, optimizer: Any, n_restarts: int,
                     rng: np.random.RandomState) -> Kernel:
    """The kernel maximising the SGPR bound, from scikit-learn's starts and, where they
    collapse, one scaled to the data.

    :func:`optimize` runs from ``kernel``'s own theta and ``n_restarts`` random starts. A
    start far from the data's scales (``Gaussian(1.0)`` on standardised data in 10
    dimensions sees almost no correlation between rows) can lead the bound to its
    all-noise optimum: constant -> 0 or lengthscale -> ∞. When the best run ends with
    fewer than ``COLLAPSED_DOF`` effective degrees of freedom (M / 2 with fewer than 3
    centres), one more run starts from :meth:`SparseBound.data_start` (median-heuristic
    lengthscales, the constant at y's mean square) and the higher bound wins (the first
    on a tie), so the result is never worse than scikit-learn's runs alone. The losing
    run's warnings are logged, not shown; a fit that still collapsed warns with the
    cause instead of advice to widen the bounds.

    Parameters
    ----------
    kernel : Kernel
        The start (its bounds bound every run).
    bound : SparseBound
    optimizer : "lbfgs", "fmin_l_bfgs_b" or callable
    n_restarts : int
    rng : numpy.random.RandomState
        Draws the random starts.

    Returns
    -------
    Kernel
    """
    runs = [_recorded_optimize(kernel, bound, optimizer, n_restarts, rng)]
    tried = ["the kernel's own start"] + [f"{n_restarts} random ones"] * (n_restarts > 0)
    own = bound.fit_of(kernel.with_theta(runs[0].theta))
    start = bound.data_start(kernel) if _collapsed(own.dof, len(bound.Z)) else kernel
    if not np.allclose(start.theta, kernel.theta):
        logger.info("SGPR: from %s the optimizer fell into the bound's all-noise optimum "
                    "(bound %.6g, %.3g effective degrees of freedom); trying the data-scaled "
                    "start %r", _listed(tried), own.value, own.dof, start)
        tried.append(f"the data-scaled start {start!r}")
        try:
            runs.append(_recorded_optimize(start, bound, optimizer, 0, rng))
        except NotPositiveDefiniteError as error:
            logger.info("SGPR: the data-scaled start failed: %s", error)
    best = max(runs, key=lambda run: run.value)
    for run in runs:
        if run is not best:
            logger.info("SGPR: dropped the run reaching bound %.6g (best %.6g) and its %d "
                        "warning(s)", run.value, best.value, len(run.warnings))
    fitted = kernel.with_theta(best.theta)
    fit = bound.fit_of(fitted)
    collapsed = _collapsed(fit.dof, len(bound.Z))
    _show(best.warnings, hide_bound_advice=collapsed)
    if collapsed:
        _warn_collapsed(fitted, fit, _listed(tried), len(bound.Z))
    logger.info("SGPR: bound %.6g, %.3g effective degrees of freedom, kernel %r", fit.value,
                fit.dof, fitted)
    return fitted


class _Run:
    """One :func:`optimize` call: the best ``theta``, its bound, and its warnings, held."""

    def __init__(self, theta: np.ndarray, value: float,
                 caught: list[warnings.WarningMessage]) -> None:
        self.theta, self.value, self.warnings = theta, value, caught


def _recorded_optimize(kernel: Kernel, bound: SparseBound, optimizer: Any, n_restarts: int,
                       rng: np.random.RandomState) -> _Run:
    """:func:`optimize` with its warnings held back (shown at once if it raises)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theta, value = optimize(kernel, bound, optimizer, n_restarts, rng)
    except Exception:
        _show(caught, hide_bound_advice=False)
        raise
    return _Run(theta, value, caught)


def _show(caught: list[warnings.WarningMessage], *, hide_bound_advice: bool) -> None:
    """Issue held warnings again, at the user's call; with ``hide_bound_advice``, not
    :func:`optimize`'s advice to widen a bound (wrong for a collapsed fit)."""
    for held in caught:
        if not (hide_bound_advice and issubclass(held.category, ConvergenceWarning)
                and "that bound and fit again" in str(held.message)):
            warnings.warn(held.message, held.category, stacklevel=caller_stacklevel())


def _collapsed(dof: float, M: int) -> bool:
    """Whether a fit with ``dof`` effective degrees of freedom on M centres takes y as
    noise: fewer than ``COLLAPSED_DOF``, or than M / 2 with fewer than 3 centres."""
    return dof < min(COLLAPSED_DOF, M / 2)


def _listed(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " * (len(items) > 1) + items[-1]


def _warn_collapsed(kernel: Kernel, fit: Any, tried: str, M: int) -> None:
    """The ConvergenceWarning of a sparse fit (``fit``: its
    :class:`~dkern.models.posteriors.sparse.BoundFit`) that takes y as noise, naming the cause."""
    if fit.noise >= fit.y_moment:
        cause = (f"The noise variance {fit.noise:.3g} (alpha, plus any White term) is at "
                 f"least y's mean square {fit.y_moment:.3g}, leaving the kernel nothing to "
                 "explain: lower alpha, or learn the noise with a White term")
    else:
        cause = (f"Either y has no structure this kernel sees through these {M} centres, or "
                 "no start led to it: raise n_centers or n_restarts_optimizer, or start the "
                 "kernel near the data's scales (lengthscales near the distances between "
                 "rows, the constant near y's variance)")
    warnings.warn(
        f"solver='nystrom': the learned kernel {kernel!r} takes y as noise: its fit has "
        f"{fit.dof:.3g} effective degrees of freedom (a constant has 1) and bound "
        f"{fit.value:.6g}, against {fit.noise_value:.6g} for pure noise. It is the best of "
        f"the runs from {tried}, so widening the kernel's bounds will not help. {cause}.",
        ConvergenceWarning, stacklevel=caller_stacklevel())


def evidence_at(kernel: Kernel, solver: str, X: Any, y: Any, centers: Any,
                alpha: float, eval_gradient: bool, backend: str) -> tuple[float, np.ndarray]:
    """The fitted regressor's ``ln p(y | X, θ)`` at ``kernel``'s θ and its gradient: exact
    (n <= ``EXACT_MAX_N``), or for ``"nystrom"`` the SGPR bound on the fitted ``centers``
    (two passes over X). X and y are the training data (None in a loaded sparse model)."""
    if solver == "nystrom":
        if X is None:
            raise ValueError("this solver='nystrom' model was loaded from a file, which keeps "
                             "only M-sized statistics, not the training data the bound at "
                             "another theta needs; refit it on the data to evaluate "
                             "log_marginal_likelihood(theta).")
        Xd, Yd = training_data(X, y)
        return SparseBound(Xd, Yd, centers, alpha, backend=backend)(kernel, eval_gradient)
    n = X.shape[0]
    if n > EXACT_MAX_N:
        raise ValueError(f"the exact log marginal likelihood needs n <= {EXACT_MAX_N}; this "
                         f"model has n={n}. Evaluate it on a subsample.")
    return log_marginal_likelihood(kernel, in_memory(X), in_memory(y).reshape(n, -1), alpha,
                                   eval_gradient)
