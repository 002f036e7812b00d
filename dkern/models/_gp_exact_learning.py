"""The exact GP's hyperparameters: the dense log marginal likelihood up to ``EXACT_MAX_N``
rows, and above it (``solver="cg"``) its estimate from one CG solve per evaluation
(:mod:`.posteriors.evidence`), started at the sparse bound's optimum.
"""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import numpy as np
import scipy.optimize
from sklearn.utils import check_random_state

from ..kernels import Kernel
from ..solvers import EXACT_MAX_N
from ._gp_optimize import Likelihood, Objective, optimize
from ._gp_sparse_learning import sparse_warm_start
from ._validation import in_memory, legacy_seed
from .posteriors.evidence import estimated_log_marginal_likelihood
from .posteriors.exact import log_marginal_likelihood
from .posteriors.sparse import SparseBound, training_data

logger = logging.getLogger(__name__)

#: Probe vectors of each estimated likelihood above ``EXACT_MAX_N`` (solver="cg"): its
#: standard errors fall as 1/√probes, each probe one more CG right-hand side.
EVIDENCE_PROBES = 16
#: Line-search steps of L-BFGS-B on the estimate (scipy's default 20): each is a CG solve,
#: and a search that needs more is lost in the estimate's noise.
ESTIMATE_LINE_SEARCH = 5
#: Largest move of a log-hyperparameter in one trust region of :func:`lbfgs_on_estimate`
#: (a factor e), and the regions at most.
ESTIMATE_TRUST_RADIUS = 1.0
ESTIMATE_ROUNDS = 6
#: A round that gained nothing because a trial estimate stopped unconverged (see
#: ``ESTIMATE_STEP_FACTOR``) is retried from the same θ with the radius divided by this.
ESTIMATE_SHRINK = 4.0
#: CG steps an estimate may take, as a multiple of the first estimate's (at the start),
#: and at least: a trial θ where CG needs more counts as worse than the start (-inf). At
#: n = 100,000 one trial point's solve ran 46 minutes unconverged against 4 minutes at the
#: start (benchmarks/RESULTS.md), so a budget of estimates did not bound the time.
ESTIMATE_STEP_FACTOR = 5
ESTIMATE_MIN_STEPS = 16


def learned_exact_kernel(kernel: Kernel, X: Any, y: Any, alpha: float, *, optimizer: Any,
                         n_restarts: int, random_state: Any, rank: int = 300,
                         tol: float = 1e-8, backend: str = "auto") -> tuple[Kernel, float]:
    """The kernel maximising the exact ``ln p(y | θ)`` (Rasmussen & Williams, eq. 5.8) for
    X (n, d), y (n,) or (n, t), and that value; ``(kernel, nan)`` when nothing is learned
    (no optimizer, or no free hyperparameter): the solve computes it where it can.

    Up to ``EXACT_MAX_N`` rows the likelihood is dense; above it (where the solver is CG)
    it is estimated (:func:`cg_estimated_likelihood`; ``rank`` and ``tol`` are CG's).
    """
    n = X.shape[0]
    learn = optimizer is not None and len(kernel.theta) > 0
    if not learn:
        return kernel, float("nan")
    rng = check_random_state(legacy_seed(random_state))
    if n > EXACT_MAX_N:
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
    """L-BFGS-B on an estimated likelihood (an ``optimizer`` callable), in trust regions.

    Each round runs L-BFGS-B in the box of ``ESTIMATE_TRUST_RADIUS`` about its start
    (within the kernel's bounds); when the best θ a round evaluated lies on the box's edge,
    the next round starts there, up to ``ESTIMATE_ROUNDS``. The box keeps every trial θ
    near one where C was well conditioned: a far trial step (L-BFGS-B's first is a unit
    step along the gradient, and from a good start its scale is unknown) can land where
    CG needs hundreds of steps. Such a trial counts as ``inf``, on which L-BFGS-B stops
    at once; a round that gained nothing because of one is retried from the same θ in a
    box ``ESTIMATE_SHRINK`` times smaller.

    The estimate's value and gradient come from the same probes but are not exactly a
    function and its derivative, so near the optimum, where the gradient is within its
    sampling error, the line search fails ("ABNORMAL"): there that is the expected end,
    logged rather than warned about.
    """
    evaluate = _Remembered(objective)
    evaluate(start)
    theta, value = evaluate.best
    radius = ESTIMATE_TRUST_RADIUS
    for round_ in range(1, ESTIMATE_ROUNDS + 1):
        box = np.column_stack([np.maximum(bounds[:, 0], theta - radius),
                               np.minimum(bounds[:, 1], theta + radius)])
        failed = evaluate.failed
        result = scipy.optimize.minimize(evaluate, theta, method="L-BFGS-B", jac=True,
                                         bounds=box,
                                         options={"maxls": ESTIMATE_LINE_SEARCH})
        logger.info("trust region %d (radius %g): -ln p %.8g -> %.8g in %d iterations (%s)",
                    round_, radius, value, evaluate.best[1], result.nit, result.message)
        if not evaluate.best[1] < value:
            if evaluate.failed == failed:
                break  # no trial was lost to conditioning: θ is the region's optimum
            radius /= ESTIMATE_SHRINK
            continue
        theta, value = evaluate.best
        on_edge = (((bounds[:, 0] < box[:, 0]) & np.isclose(theta, box[:, 0]))
                   | ((box[:, 1] < bounds[:, 1]) & np.isclose(theta, box[:, 1])))
        if not on_edge.any():
            break
    return theta, value


class _Remembered:
    """``objective(theta)`` computing each θ once (a round starts where the last ended),
    and the best θ it has seen: L-BFGS-B returns its last iterate, which after a failed
    line search on the estimate need not be the best one evaluated."""

    def __init__(self, objective: Objective) -> None:
        self.objective = objective
        self.seen: dict[bytes, Any] = {}
        self.best: tuple[np.ndarray, float] = (np.empty(0), np.inf)
        self.failed = 0  # evaluations that came back inf (an estimate stopped unconverged)

    def __call__(self, theta: np.ndarray) -> Any:
        theta = np.array(theta, dtype=float)
        key = theta.tobytes()
        if key not in self.seen:
            self.seen[key] = self.objective(theta)
            value = float(self.seen[key][0])
            self.failed += value == np.inf
            if value < self.best[1] or self.best[0].size == 0:
                self.best = (theta, value)
        return self.seen[key]


def cg_estimated_likelihood(Xd: da.Array, Yd: da.Array, alpha: float, *, rank: int,
                            tol: float, backend: str, seed: int) -> Likelihood:
    """``ln p(y | θ)`` and its gradient estimated by one CG solve each
    (:func:`~.posteriors.evidence.estimated_log_marginal_likelihood`), with
    ``EVIDENCE_PROBES`` probes and the same ``seed`` at every θ, so that the optimizer
    sees one deterministic function; each estimate and its standard errors are logged.
    After the first, an estimate whose CG solve reaches ``ESTIMATE_STEP_FACTOR`` times the
    first's steps (at least ``ESTIMATE_MIN_STEPS``) stops there and counts as ``-inf``."""
    first_steps: list[int] = []

    def lml(k: Kernel, eval_gradient: bool) -> tuple[float, np.ndarray]:
        cap = max(ESTIMATE_MIN_STEPS, ESTIMATE_STEP_FACTOR * first_steps[0]) \
            if first_steps else None
        estimate = estimated_log_marginal_likelihood(
            k, Xd, Yd, alpha, eval_gradient=eval_gradient, n_probes=EVIDENCE_PROBES,
            rank=rank, tol=tol, random_state=seed, backend=backend, max_iter=cap)
        if cap is None:
            first_steps.append(max(1, estimate.n_iter))
        elif estimate.n_iter >= cap:
            logger.info("estimate at θ = %s stopped unconverged after %d CG steps (%d× the "
                        "first estimate's): counted as -inf", np.round(k.theta, 3),
                        estimate.n_iter, ESTIMATE_STEP_FACTOR)
            return -np.inf, np.zeros(len(k.theta))
        logger.info("estimated ln p(y | θ) = %.8g ± %.2g (%d CG steps); gradient's largest "
                    "standard error %.2g", estimate.value, estimate.value_stderr,
                    estimate.n_iter, estimate.gradient_stderr.max(initial=0.0))
        return estimate.value, estimate.gradient

    return lml


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
