"""Fitting a :class:`~dkern.models.GaussianProcessRegressor` by its solver: the learned
kernel (exact log marginal likelihood, or the SGPR bound for ``"nystrom"``), then the
weights ``alpha_ = C⁻¹ t`` by Cholesky (:mod:`._gp_exact`) or block CG, or the sparse
GP's statistics (:mod:`._gp_sparse`). Each function sets the fitted attributes on ``gp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.linalg as sla
from sklearn.utils import check_random_state

from ..kernels import Kernel
from ..solvers import EXACT_MAX_N, cg
from ..solvers.sgpr import sgpr_bound
from . import _gp_exact, _gp_sparse
from ._gp_optimize import optimize
from ._validation import as_generator, in_memory, legacy_seed

if TYPE_CHECKING:
    from .gaussian_process import GaussianProcessRegressor


def learned_kernel(gp: GaussianProcessRegressor, kernel: Kernel, X: Any, y: Any,
                   alpha: float, n: int) -> Kernel:
    """The kernel with the learned hyperparameters; sets the LML unless the solve will."""
    gp.log_marginal_likelihood_value_ = float("nan")  # above EXACT_MAX_N: not computed
    learn = gp.optimizer is not None and len(kernel.theta) > 0
    if learn and n > EXACT_MAX_N:
        default = ("kernel=None is scikit-learn's C() * RBF(), whose hyperparameters are "
                   "learned (since scikit-learn 1.9); ") if gp.kernel is None else ""
        raise ValueError(f"{default}learning hyperparameters (optimizer={gp.optimizer!r}) uses "
                         f"the exact log marginal likelihood, n <= {EXACT_MAX_N}; got n={n}. "
                         "Learn them on a subsample and refit with optimizer=None, or "
                         "maximise the sparse GP's bound with solver='nystrom'.")
    if not learn:
        return kernel
    Xn, yn = in_memory(X), in_memory(y).reshape(n, -1)

    def lml(k: Kernel, eval_gradient: bool) -> tuple[float, np.ndarray]:
        return _gp_exact.log_marginal_likelihood(k, Xn, yn, alpha, eval_gradient)

    theta, value = optimize(kernel, lml, gp.optimizer, gp.n_restarts_optimizer,
                            check_random_state(legacy_seed(gp.random_state)))
    gp.log_marginal_likelihood_value_ = value
    return kernel.with_theta(theta)


def fit_sparse(gp: GaussianProcessRegressor, kernel: Kernel, X: Any, y: Any,
               alpha: float) -> None:
    """SGPR: centres, the kernel maximising the bound (if ``optimizer``), its statistics."""
    Xd, Yd = _gp_sparse.training_data(X, y)  # numpy X is sent to the cluster once
    Z = _gp_sparse.centers(Xd, gp.n_centers, as_generator(gp.random_state))
    bound = _gp_sparse.SparseBound(Xd, Yd, Z, alpha)
    if gp.optimizer is not None and len(kernel.theta) > 0:
        theta, _ = optimize(kernel, bound, gp.optimizer, gp.n_restarts_optimizer,
                            check_random_state(legacy_seed(gp.random_state)))
        kernel = kernel.with_theta(theta)
    gp.kernel_ = kernel
    gp._stats = bound.statistics(kernel)  # the optimizer's last pass, when it ended here
    gp.log_marginal_likelihood_value_ = sgpr_bound(gp._stats, alpha)
    w = _gp_sparse.weights(gp._stats, alpha)
    gp.alpha_ = np.ascontiguousarray(w[:, 0] if y.ndim == 1 else w)
    gp.centers_ = Z
    gp.n_iter_, gp.converged_ = 1, True  # direct M x M factorisations


def fit_exact(gp: GaussianProcessRegressor, X: np.ndarray, y: Any, alpha: float) -> None:
    """Cholesky ``C = L Lᵀ`` and ``alpha_ = C⁻¹ t``; the LML from the factor if not set."""
    L = _gp_exact.cholesky(gp.kernel_, X, alpha)
    yn = in_memory(y)
    gp.L_ = L
    gp.alpha_ = np.ascontiguousarray(sla.cho_solve((L, True), yn, check_finite=False))
    if np.isnan(gp.log_marginal_likelihood_value_):  # free from this factor
        yt = yn.reshape(len(yn), -1)
        gp.log_marginal_likelihood_value_ = _gp_exact.lml_from_factor(
            L, yt, gp.alpha_.reshape(yt.shape))
    gp.n_iter_, gp.converged_ = 1, True


def fit_cg(gp: GaussianProcessRegressor, X: Any, y: Any, alpha: float, tol: float,
           callback: Callable[[int, np.ndarray], None] | None = None) -> None:
    """``alpha_`` by preconditioned block CG; the exact LML too for n <= ``EXACT_MAX_N``."""
    result = cg(gp._operator(alpha), y, preconditioner=gp._cg_preconditioner(alpha), tol=tol,
                callback=callback, progress=bool(gp.verbose), checkpoint=gp.checkpoint,
                checkpoint_every=gp.checkpoint_every)
    gp.alpha_ = (np.ascontiguousarray(result.x.compute()) if isinstance(X, np.ndarray)
                 else result.x)
    gp.n_iter_, gp.converged_ = result.n_iter, bool(result.converged.all())
    n = X.shape[0]
    if np.isnan(gp.log_marginal_likelihood_value_) and n <= EXACT_MAX_N:
        gp.log_marginal_likelihood_value_ = _gp_exact.log_marginal_likelihood(
            gp.kernel_, in_memory(X), in_memory(y).reshape(n, -1), alpha, False)[0]
