"""Gaussian process regression as a scikit-learn estimator over dkern's posteriors.

The estimator checks parameters and data, learns the kernel's hyperparameters, and holds
one posterior object (:mod:`dkern.models.posteriors`) that answers the mean, variance and
covariance; ``predict`` and ``sample_y`` (:mod:`._gp_predictive`) undo ``normalize_y`` on the
answers (:mod:`._gp_outputs`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..io import Rows
from ..kernels import Gaussian, Kernel, Scaled
from ..solvers import CHECKPOINT_EVERY, EXACT_MAX_N
from ..solvers.checkpoint import check_checkpoint
from . import _gp_methods
from ._gp_exact_learning import evidence_at, learned_exact_kernel
from ._gp_optimize import check_optimizer
from ._gp_outputs import TargetScaling
from ._gp_posterior import rebuilt, solve, sparse_file_state
from ._gp_predictive import MAX_COV_BYTES, PosteriorPredictive
from ._gp_sparse_learning import learned_sparse_posterior
from ._labels import labelled_fit, labelled_score
from ._model_file import DeclaredState
from ._validation import (
    DefaultKernel,
    as_float64,
    check_tol,
    check_X,
    check_y,
    checked_kernel,
    fixed_seed,
    kept_copy,
    refuse_white,
)
from .kernel_ridge import CG_PRECONDITIONER_RANK
from .posteriors import (
    CGPosterior,
    ExactPosterior,
    LanczosPosterior,
    SparsePosterior,
    variance_posterior,
)
from .posteriors.cg import computing_client_id

__all__ = ["MAX_COV_BYTES", "GaussianProcessRegressor"]

logger = logging.getLogger(__name__)

Posterior = ExactPosterior | CGPosterior | LanczosPosterior | SparsePosterior


class GaussianProcessRegressor(DefaultKernel, DeclaredState, PosteriorPredictive, RegressorMixin,
                               BaseEstimator):
    """Gaussian process regression on data larger than memory.

    With ``t = f(x) + ε``, ``C = K + alpha I`` (``alpha`` added to the diagonal exactly
    as scikit-learn's ``GaussianProcessRegressor(alpha=...)``: the noise variance),

    .. math:: m(x_*) = k_*^\\top C^{-1} t, \\qquad
              \\sigma^2(x_*) = k(x_*, x_*) - k_*^\\top C^{-1} k_*,

    ``predict(return_std=True)`` returning the latent standard deviation ``σ(x*)``
    (the noise ``alpha`` not included), as scikit-learn does.

    Precision: kernel values, solves and predictions are float64 whatever the input
    dtype (float32 data is upcast block by block as it is read).

    Parameters
    ----------
    kernel : dkern kernel or scikit-learn kernel, optional
        Default ``Scaled(1.0, Gaussian(1.0))``, both hyperparameters learnable within
        (1e-5, 1e5): scikit-learn's ``C() * RBF()`` (since 1.9; fixed before), learned
        unless ``optimizer=None`` (needed above ``EXACT_MAX_N`` rows with
        ``solver="exact"``/``"cg"``: see ``optimizer``). The learnable hyperparameters are
        the kernel's ``theta`` (lengthscales, ARD included, and the constant ``c`` of
        ``c * k``; see ``kernel.bounds``). A scikit-learn kernel object is converted by
        :func:`dkern.kernels.from_sklearn` (logged); ``kernel_`` holds the dkern kernel.
        A :class:`~dkern.kernels.White` term is noise as scikit-learn's ``WhiteKernel``:
        the training system is ``K + (alpha + noise) I``, the cross-covariances hold no
        noise, the predictive std includes it (``kernel_.diag``), and its level is
        learned with the rest of ``theta``. Supported by ``solver="exact"``, ``"cg"``
        (``alpha + noise`` on the lazy operator's diagonal) and ``"nystrom"`` (SGPR's σ²
        is ``alpha + noise``); ``variance="lanczos"`` refuses it.
    alpha : float, default=1e-10
        Noise variance added to the diagonal; >= 0 for ``"exact"``, > 0 otherwise.
        Never learned (as in scikit-learn): to learn the noise, add a ``White`` term.
    solver : {"auto", "exact", "cg", "nystrom"}, default="auto"
        How ``C a = t`` is solved. ``"exact"``: dense Cholesky, O(n³) time and n² memory
        (n <= ``dkern.solvers.EXACT_MAX_N``). ``"cg"``: block CG on the lazy
        ``gram(kernel, X) + alpha`` with a rank-``preconditioner_rank`` Nyström
        preconditioner: the same model, to ``tol``, never holding an n × n matrix.
        ``"nystrom"``: the sparse GP of Titsias (2009, "SGPR") on M centres, a
        different, approximate model: one pass over X gives M-sized sums
        (:func:`dkern.solvers.sgpr.sgpr_statistics`), O(n M²) time, O(M²) memory; it
        equals the exact GP when every training row is a centre and alpha is well above
        K(Z, Z)'s jitter (at least 1e-10 · k(z, z); a fit warns when the jitter exceeds
        0.1% of the noise variance, as at scikit-learn's alpha = 1e-10). Its hyperparameters
        are learned on the SGPR bound; when the best of scikit-learn's runs (the
        kernel's own start and the restarts) collapses into the bound's all-noise
        optimum (fewer than 1.5 effective degrees of freedom: constant -> 0 or
        lengthscale -> ∞), one more run starts from the data's scales (lengthscales at
        the median distance between centres, the constant at y's mean square) and the
        higher bound wins; a fit that still takes y as noise warns with the cause.
        ``"auto"``: ``"nystrom"`` only when ``n_centers`` is given (a less accurate
        model is never chosen unasked); otherwise ``"exact"`` up to ``EXACT_MAX_N``
        rows, ``"cg"`` above. The choice is logged at INFO level.
    variance : {"auto", "exact", "cg", "lanczos", "nystrom"}, default="auto"
        How ``k_*ᵀ C⁻¹ k_*`` is computed. ``"exact"``: triangular solves with the
        Cholesky factor, O(n² m), exact to rounding (needs ``solver="exact"``).
        ``"cg"``: block CG with the columns ``k(X, x*)`` of batches of test points as
        right-hand sides, each batch costing one CG solve (exact to ``tol``; for
        moderate numbers of test points). ``"lanczos"`` (with ``"exact"`` or ``"cg"``,
        alpha > 0): LOVE (:mod:`dkern.solvers.lanczos`), ``C⁻¹ ≈ V H⁻¹ Vᵀ`` on the span
        V of the CG preconditioner's r = ``preconditioner_rank`` columns (all rows
        when n <= r) and k = ``lanczos_rank`` Lanczos vectors: k + r matvecs with C
        once, on the first prediction that needs variances (not saved in model files,
        which recompute it); then one product ``K(X*, X) V`` with k + r columns per
        test batch. Its variances lie between the exact ones and the prior
        (``V H⁻¹ Vᵀ ≼ C⁻¹``), and their error does not grow with k; it is small only
        when k + r exceeds the number of eigenvalues of K above alpha, and can be large
        otherwise (measured errors: benchmarks/RESULTS.md). So the decomposition checks
        itself, once: its std at 32 training rows (drawn by ``random_state``) must agree
        with their exact std (dense Cholesky up to 4,000 rows, else one CG solve) to
        1/3 of 1% (relative), so that all points stay within about 1%. At the default
        ranks a larger error doubles r, at most twice (up to three decompositions in
        all); ranks you give are kept. An error still above that is warned about
        (``ConvergenceWarning``, with the measured figure): raise
        ``preconditioner_rank``, or use ``"cg"``. Each choice is logged at INFO level,
        and a loaded model makes the same one (:mod:`dkern.models.posteriors.lanczos`).
        The means still come from ``alpha_``.
        ``"nystrom"`` (with ``solver="nystrom"`` only): the SGPR predictive variance
        ``k** − Q** + k_*uᵀ Σ⁻¹ k_u*``, O(M²) per test point from the M-sized
        statistics, in ``[0, k(x*, x*)]``; its error
        against the exact GP's is that of the sparse model (zero with all rows as
        centres). ``"auto"``: the solver's own method (never ``"lanczos"``).
    n_centers : int, optional
        M for ``"nystrom"``, drawn uniformly from X's rows by
        :func:`dkern.solvers.select_centers` (seeded by ``random_state``). Default
        ``round(√n)``, at most 10,000, as :class:`dkern.KernelRidge`'s. Giving it with
        ``solver="auto"`` asks for ``"nystrom"``; refused with ``"exact"``/``"cg"``.
    lanczos_rank : int, default=100
        k, the Lanczos steps of ``variance="lanczos"`` (at most n − r); unused otherwise.
    preconditioner_rank : int, default=300
        r, the pivoted (randomly pivoted Cholesky) Nyström columns of the preconditioner of
        ``"cg"`` and of the basis of ``"lanczos"`` (at most n). CG's iterations and
        LOVE's error fall once r covers the eigenvalues of K above alpha; each column
        costs n floats of memory and one kernel column, and ``"lanczos"`` one more
        column of every ``K(X*, X) V`` product. Used by ``solver="cg"`` and by
        ``variance="cg"`` or ``"lanczos"``; unused otherwise.
    optimizer : "lbfgs" (or "fmin_l_bfgs_b"), callable or None, default="lbfgs"
        Maximises the log marginal likelihood over ``theta`` within ``kernel.bounds``
        (L-BFGS-B in log space with the analytic gradient): the exact one for
        ``"exact"``/``"cg"`` (dense up to ``EXACT_MAX_N`` rows; above it, with ``"cg"``,
        estimated with its gradient from one CG solve per evaluation:
        :mod:`dkern.models.posteriors.evidence`, the probes seeded by ``random_state``),
        the SGPR bound for ``"nystrom"``
        (any n; each evaluation two passes over X, the centres fixed). A callable
        ``optimizer(obj_func, initial_theta, bounds) -> (theta, min_value)`` as
        scikit-learn's. None keeps the kernel's hyperparameters. A hyperparameter
        fitted onto a bound is warned about (ConvergenceWarning), as scikit-learn does.
    n_restarts_optimizer : int, default=0
        Extra optimizer runs from starts drawn uniformly in the log-bounds.
    normalize_y : bool, default=False
        Centre and scale the targets to unit variance before fitting (as scikit-learn).
    tol : float, default=1e-8
        Relative residual at which CG stops, for the fit and every variance batch; the
        means and variances of ``"cg"`` are exact to about ``tol`` times the condition
        number of the preconditioned system. Unused by ``"exact"``.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How kernel blocks of the lazy operators are computed.
    random_state : int, numpy Generator or RandomState, optional
        Seeds the optimizer's restarts, the preconditioner's pivots and the centres.
    verbose : bool, default=False
        Show a progress bar of the fit's CG iterations (``"cg"``).
    checkpoint : str or os.PathLike, optional
        Where the fit's CG (``"cg"``) saves its state every ``checkpoint_every``
        iterations; a fit of the same problem resumes there (see
        :func:`dkern.solvers.cg`). Unused by the other solvers.
    checkpoint_every : int, default=dkern.solvers.CHECKPOINT_EVERY (50)

    Attributes
    ----------
    kernel_ : Kernel
        The kernel with the fitted hyperparameters.
    alpha_ : ndarray or dask.array.Array of shape (n,) or (n, t); (M,) or (M, t) for nystrom
        ``C⁻¹ t`` (t the normalised targets); lazy for ``"cg"`` on dask/Zarr X. For
        ``"nystrom"`` the centres' weights w, ``mean(x*) = k(x*, centers_) w``.
    L_ : ndarray of shape (n, n)
        ``"exact"`` only: the lower Cholesky factor of ``C``.
    centers_ : ndarray of shape (M, d)
        ``"nystrom"`` only: the centres (inducing points).
    X_train_ : ndarray or dask.array.Array of shape (n, d)
        The training rows: in-memory ones copied (as scikit-learn's
        ``copy_X_train=True``), so changing the array passed to ``fit`` changes nothing;
        lazy ones as given.
    y_train_ : ndarray or dask.array.Array of shape (n,) or (n, t)
        The targets as fitted (normalised when ``normalize_y``). A loaded
        ``"nystrom"`` model has neither (its file holds only M-sized arrays).
    log_marginal_likelihood_value_ : float
        ``ln p(t | θ)`` of ``kernel_``, exact, for n <= ``EXACT_MAX_N`` (``"exact"``
        reads it off its Cholesky factor; ``"cg"`` factors ``C`` densely once for it).
        Above ``EXACT_MAX_N``: the CG estimate at ``kernel_`` when it was learned
        (logged with its standard error), else NaN. For ``"nystrom"``: the
        SGPR bound F, a lower bound of the exact ``ln p(t | θ)`` (the gap is
        ``KL(q ‖ posterior)``), equal to it when every training row is a centre.
    solver_, variance_ : str
        The methods used (``"auto"`` resolved).
    n_iter_ : int
        CG iterations of the fit (1 for exact).
    converged_ : bool
    n_features_in_ : int
    """

    kernel_: Kernel
    alpha_: np.ndarray | da.Array
    X_train_: np.ndarray | da.Array
    y_train_: np.ndarray | da.Array
    log_marginal_likelihood_value_: float
    solver_: str
    variance_: str
    n_iter_: int
    converged_: bool
    n_features_in_: int
    _posterior: Posterior
    _targets: TargetScaling
    _pivot_seed: int

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(RegressorMixin.score)

    @staticmethod
    def _default_kernel() -> Kernel:
        """``kernel=None``: scikit-learn's default ``1.0 * RBF(1.0)``, learnable."""
        return Scaled(1.0, Gaussian(1.0))

    def __init__(self, kernel: Kernel | None = None, *, alpha: float = 1e-10,
                 solver: str = "auto", variance: str = "auto", n_centers: int | None = None,
                 lanczos_rank: int = 100, preconditioner_rank: int = CG_PRECONDITIONER_RANK,
                 optimizer: Any = "lbfgs", n_restarts_optimizer: int = 0,
                 normalize_y: bool = False, tol: float = 1e-8, backend: str = "auto",
                 random_state: Any = None, verbose: bool = False,
                 checkpoint: str | os.PathLike[str] | None = None,
                 checkpoint_every: int = CHECKPOINT_EVERY) -> None:
        self.kernel = kernel
        self.alpha = alpha
        self.solver = solver
        self.variance = variance
        self.n_centers = n_centers
        self.lanczos_rank = lanczos_rank
        self.preconditioner_rank = preconditioner_rank
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.normalize_y = normalize_y
        self.tol = tol
        self.backend = backend
        self.random_state = random_state
        self.verbose = verbose
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.requires_fit = False  # unfitted, predict and sample_y use the prior
        return tags

    # ------------------------------------------------------------------ fit
    @labelled_fit
    @worker_failures()
    def fit(self, X: Rows, y: Rows, *,
            callback: Callable[[int, np.ndarray], None] | None = None
            ) -> GaussianProcessRegressor:
        """Fit the GP: learn the hyperparameters (if ``optimizer``), then solve ``C a = t``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
        y : array-like or dask array of shape (n,) or (n, t)
        callback : callable, optional
            ``callback(iteration, relative_residuals)`` after each CG iteration of
            ``"cg"``, e.g. a :class:`dkern.solvers.SolveMonitor`.

        Returns
        -------
        self
        """
        kernel = self._given_kernel()
        solver, variance = _gp_methods.checked_methods(self.solver, self.variance,
                                                       self.n_centers, self.lanczos_rank,
                                                       self.preconditioner_rank)
        tol = check_tol(self.tol)
        check_optimizer(self.optimizer, self.n_restarts_optimizer)
        check_checkpoint(self.checkpoint, self.checkpoint_every)
        Xv = check_X(self, X, reset=True)
        yv = check_y(y, Xv.shape[0], type(self).__name__)
        solver, variance, alpha = _gp_methods.resolve(solver, variance, self.n_centers,
                                                      Xv.shape[0], self.alpha,
                                                      exact_max_n=EXACT_MAX_N)
        if variance == "lanczos":
            # the dense factor forms k(X) with White's noise on its diagonal, SGPR and CG add
            # it to their diagonal shift; LOVE's basis would leave it out
            refuse_white(kernel, "GaussianProcessRegressor(variance='lanczos')",
                         "Use variance='cg' (or 'exact' up to n = "
                         f"{EXACT_MAX_N}), or remove the White term (kernel.without_white()) "
                         "and pass its noise level as alpha.")
        for stale in ("L_", "centers_"):
            self.__dict__.pop(stale, None)
        # the pivots' seed is fixed per fit: a preconditioner rebuilt after dkern.load or
        # under another client is then the same one, and so are the CG and LOVE stds
        self._pivot_seed = fixed_seed(self.random_state)
        Xw = kept_copy(as_float64(Xv), X)  # the precision rule; not the caller's array
        if solver == "exact" and isinstance(Xw, da.Array):
            Xw = Xw.compute()  # the exact solver holds everything in memory anyway
        self._targets, yw = TargetScaling.of(yv, self.normalize_y)
        self.X_train_, self.y_train_ = Xw, yw
        if solver == "nystrom":
            solved: Posterior = self._fit_sparse(kernel, Xw, yw, alpha)
        else:
            self.kernel_, self.log_marginal_likelihood_value_ = learned_exact_kernel(
                kernel, Xw, yw, alpha, optimizer=self.optimizer,
                n_restarts=self.n_restarts_optimizer, random_state=self.random_state,
                rank=self.preconditioner_rank, tol=tol, backend=self.backend)
            done = solve(solver, self.kernel_, Xw, yw, alpha,
                         lml=self.log_marginal_likelihood_value_,
                         rank=self.preconditioner_rank, pivot_seed=self._pivot_seed, tol=tol,
                         backend=self.backend, progress=bool(self.verbose), callback=callback,
                         checkpoint=self.checkpoint, checkpoint_every=self.checkpoint_every)
            solved, self.alpha_ = done.posterior, done.posterior.weights
            self.n_iter_, self.converged_ = done.n_iter, done.converged
            self.log_marginal_likelihood_value_ = done.log_marginal_likelihood
            if isinstance(done.posterior, ExactPosterior):  # solver "exact": its factor
                self.L_ = done.posterior.L
        self.solver_, self.variance_ = solver, variance
        self._bind(self._answering(solved, variance, alpha))
        logger.info("GaussianProcessRegressor: solver=%s, variance=%s, kernel_=%r, lml=%.6g",
                    solver, variance, self.kernel_, self.log_marginal_likelihood_value_)
        self._settle_at_close()
        return self

    def _given_kernel(self) -> Kernel:
        """``kernel``, or the default: scikit-learn's ``C() * RBF()``."""
        return checked_kernel(self.kernel, self._default_kernel())

    def _checked_alpha(self, solver: str) -> float:
        return _gp_methods.checked_noise(self.alpha, solver)

    def _fit_sparse(self, kernel: Kernel, X: Any, y: Any, alpha: float) -> SparsePosterior:
        """SGPR on ``n_centers`` centres, the kernel learned on its bound (if ``optimizer``)."""
        posterior = learned_sparse_posterior(
            kernel, X, y, alpha, n_centers=self.n_centers, optimizer=self.optimizer,
            n_restarts=self.n_restarts_optimizer, random_state=self.random_state,
            backend=self.backend)
        self.kernel_, self.centers_ = posterior.stats.kernel, posterior.centers
        self.log_marginal_likelihood_value_ = posterior.log_marginal_likelihood()
        w = posterior.weights
        self.alpha_ = np.ascontiguousarray(w[:, 0] if y.ndim == 1 else w)
        self.n_iter_, self.converged_ = 1, True  # direct M x M factorisations
        return posterior

    def _answering(self, solved: Posterior, variance: str, alpha: float) -> Posterior:
        """The posterior that answers ``variance_`` beside the solver's weights."""
        if variance in ("exact", "nystrom"):
            return solved
        return variance_posterior(
            solved, variance, alpha=alpha,
            rank=_gp_methods.checked_preconditioner_rank(self.preconditioner_rank),
            pivot_seed=self._pivot_seed, tol=check_tol(self.tol), y=self.y_train_,
            lanczos_rank=_gp_methods.checked_lanczos_rank(self.lanczos_rank))

    def _bind(self, posterior: Posterior) -> None:
        self._posterior, self._posterior_client = posterior, computing_client_id()

    def _posterior_here(self) -> Posterior:
        """The posterior, re-bound if dask now computes on another client: the CG
        preconditioner and LOVE's basis are persisted where they were built, and a closed
        client's are gone (predicting after a new ``Client`` failed with "lost
        dependencies")."""
        if getattr(self, "_posterior_client", None) != computing_client_id():
            logger.debug("another dask client than the one that built the posterior: "
                         "rebuilding its CG preconditioner (and LOVE's basis) on demand")
            self._bind(self._posterior.rebound())
        return self._posterior

    # ---------------------------------------------------------- likelihood
    def log_marginal_likelihood(self, theta: Any = None, eval_gradient: bool = False,
                                clone_kernel: bool = True) -> Any:
        """``ln p(t | X, θ)`` of the training data, exact (n <= ``EXACT_MAX_N``), or for
        ``solver_ == "nystrom"`` its SGPR lower bound on the fitted centres (any n).

        Parameters
        ----------
        theta : array-like of shape (p,), optional
            Log-hyperparameters of ``kernel_`` (``kernel_.theta`` layout); None returns
            ``log_marginal_likelihood_value_``.
        eval_gradient : bool, default=False
            Also return the gradient ``½ Σ_ij (a aᵀ - C⁻¹)_ij ∂C_ij/∂θ_k``, shape (p,)
            (for ``"nystrom"``: ∂F/∂θ of the bound, two passes over X).
        clone_kernel : bool, default=True
            Accepted for scikit-learn compatibility; ``kernel_`` is never modified.

        Returns
        -------
        float, or (float, ndarray of shape (p,)) with ``eval_gradient``
        """
        check_is_fitted(self, "alpha_")
        if theta is None:
            if eval_gradient:
                raise ValueError("Gradient can only be evaluated for theta!=None")
            return self.log_marginal_likelihood_value_
        value, grad = evidence_at(self.kernel_.with_theta(theta), self.solver_,
                                  getattr(self, "X_train_", None), getattr(self, "y_train_", None),
                                  getattr(self, "centers_", None),
                                  self._checked_alpha(self.solver_), eval_gradient,
                                  self.backend)
        return (value, grad) if eval_gradient else value

    # ------------------------------------------------------------ model file
    _model_file = _gp_methods.MODEL_FILE  # per solver: arrays, scalars, the private state

    def _file_state(self) -> dict[str, Any]:
        """The declared state: the public attributes, the target scaling, and the pivot
        seed or (``"nystrom"``) the posterior's SGPR statistics."""
        state = {**super()._file_state(), "y_train_mean": self._targets.mean,
                 "y_train_std": self._targets.std}
        if self.solver_ != "nystrom":
            return {**state, "pivot_seed": self._pivot_seed}
        return {**state, **sparse_file_state(self._posterior, _gp_methods.SPARSE_SCALARS)}

    def _set_file_state(self, state: dict[str, Any]) -> None:
        """Become the fitted model ``state`` describes (``kernel_`` set): the attributes,
        then the posterior, rebuilt as the fit left it."""
        super()._set_file_state(state)
        a, solver = self.alpha_, self.solver_
        self._targets = TargetScaling(state["y_train_mean"], state["y_train_std"], a.ndim == 1,
                                      a.ndim == 2 and a.shape[1] == 1)
        if solver != "nystrom":
            self._pivot_seed = state["pivot_seed"]
        alpha = self._checked_alpha(solver)
        solved = rebuilt(solver, self.kernel_, state, _gp_methods.SPARSE_SCALARS, alpha=alpha,
                         rank=self.preconditioner_rank, tol=check_tol(self.tol),
                         backend=self.backend)
        self._bind(self._answering(solved, self.variance_, alpha))
