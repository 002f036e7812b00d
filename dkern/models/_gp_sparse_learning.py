"""The sparse GP's hyperparameters: the SGPR bound maximised from scikit-learn's starts,
and from one scaled to the data where those collapse; also the start of exact learning
above ``EXACT_MAX_N`` rows (:func:`sparse_warm_start`).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import dask.array as da
import numpy as np
from sklearn.utils import check_random_state

from ..errors import ConvergenceWarning, NotPositiveDefiniteError, caller_stacklevel
from ..kernels import Kernel
from ..solvers import EXACT_MAX_N
from ..solvers.sgpr import total_noise
from ._gp_optimize import optimize
from ._validation import as_generator, legacy_seed
from .posteriors import SparsePosterior
from .posteriors.sparse import SGPR_JITTERS, SparseBound, centers, jitter_to_noise, training_data

logger = logging.getLogger(__name__)

#: Centres of the sparse bound whose optimum starts exact learning above ``EXACT_MAX_N``
#: rows (O(n M²) per evaluation).
WARM_START_CENTERS = 500

def learned_sparse_posterior(kernel: Kernel, X: Any, y: Any, alpha: float, *,
                             n_centers: int | None, optimizer: Any, n_restarts: int,
                             random_state: Any, backend: str = "auto") -> SparsePosterior:
    """SGPR (Titsias 2009): M centres drawn from X's rows, the kernel maximising the bound
    F (if ``optimizer``; each evaluation two passes over X, the centres fixed; the starts
    are :func:`learned_on_bound`'s), and the posterior of its statistics (the optimizer's
    last pass, when it ended there); the passes' blocks computed by ``backend``."""
    if kernel.without_white() is None:
        raise ValueError(f"the kernel {kernel!r} is White noise only: solver='nystrom' has no "
                         "signal to carry on its centres. Use solver='exact', or add a signal "
                         "term (e.g. 1.0 * RBF(1.0) + WhiteKernel()).")
    Xd, Yd = training_data(X, y)  # numpy X is sent to the cluster once
    Z = centers(Xd, n_centers, as_generator(random_state))
    bound = SparseBound(Xd, Yd, Z, alpha, backend=backend)
    if optimizer is not None and len(kernel.theta) > 0:
        kernel = learned_on_bound(kernel, bound, optimizer, n_restarts,
                                  check_random_state(legacy_seed(random_state)))
    stats = bound.statistics(kernel)
    if (ratio := jitter_to_noise(stats, alpha)) > JITTER_TO_NOISE_WARN:
        warnings.warn(
            f"solver='nystrom': K(Z, Z) was factored with a jitter of {stats.jitter:g} times "
            f"k(z, z) (the smallest of {SGPR_JITTERS} with which it factors), {ratio:.3g} "
            f"times the noise variance {total_noise(stats.kernel, alpha):.3g}. A jitter not "
            "small next to the noise biases the bound, the posterior and any kernel learned on "
            "the bound (they miss the exact GP's even with every row a centre). Raise alpha "
            "(or learn the noise with a White term), use fewer or more spread centres, or "
            "solver='exact'.", ConvergenceWarning, stacklevel=caller_stacklevel())
    return SparsePosterior(stats, alpha, backend)


#: The ratio of K_uu's jitter to the noise variance above which a sparse fit warns.
JITTER_TO_NOISE_WARN = 1e-3


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
    with warnings.catch_warnings(record=True) as caught:  # a start's, not the user's fit's
        warnings.simplefilter("always")
        warm = learned_on_bound(kernel, bound, "lbfgs", 0, check_random_state(seed))
    logger.info("exact GP learning above n = %d starts from the sparse GP's optimum on %d "
                "centres: %r (%d warning(s) of that fit: %s)", EXACT_MAX_N, len(Z), warm,
                len(caught), "; ".join(str(w.message) for w in caught))
    return warm
