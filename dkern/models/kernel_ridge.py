"""Kernel ridge regression as a scikit-learn estimator over dkern's solvers."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
import scipy.linalg as sla
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..errors import NotPositiveDefiniteError
from ..io import Rows, is_store_ref, write_arrays
from ..kernels import Gaussian, Kernel
from ..operators import gram
from ..operators.in_process import in_process, pass_scheduler
from ..operators.nystrom import NystromOperator
from ..solvers import CHECKPOINT_EVERY, EXACT_MAX_N, falkon, gd, select_centers
from ..solvers.checkpoint import check_checkpoint
from ._labels import labelled_fit, labelled_output, labelled_score, written_arrays
from ._model_file import DeclaredState, FileLayout, ModelFile, centers_dim, residual_rows_dim
from ._validation import (
    DefaultKernel,
    as_float64,
    as_generator,
    check_alpha,
    check_choice,
    check_optional_int,
    check_out_is_not_input,
    check_sample_weight,
    check_tol,
    check_X,
    check_y,
    checked_kernel,
    in_memory,
    refuse_white,
)
from .posteriors import (
    CGPosterior,
    ExactPosterior,
    KernelExpansion,
    check_solver_fits,
    choose_solver,
)

logger = logging.getLogger(__name__)

SOLVERS = ("auto", "exact", "cg", "nystrom", "gd")
CENTERS = ("uniform", "leverage")
#: Rank r of the Nyström preconditioner of ``solver="cg"``. It leaves CG a condition
#: number of about ``(λ_{r+1} + alpha) / alpha`` (Frangella, Tropp & Udell 2023,
#: Thm 5.1), and each CG step costs a full pass of n² kernel values, so iterations are
#: what to save; the factor costs r float64 values per row on the cluster. The rank
#: sweep behind 300 is in benchmarks/RESULTS.md ("Figures behind two defaults").
CG_PRECONDITIONER_RANK = 300


class KernelRidge(DefaultKernel, DeclaredState, RegressorMixin, BaseEstimator):
    """Kernel ridge regression on data larger than memory.

    With ``alpha`` exactly as in :class:`sklearn.kernel_ridge.KernelRidge`, the
    ``"exact"``, ``"cg"`` and ``"gd"`` solvers find the dual coefficients ``c`` of

    .. math:: (K + \\alpha I)\\, c = y, \\qquad \\hat f(x) = \\sum_i c_i\\, k(x, x_i),

    and ``"nystrom"`` (Falkon) restricts the solution to M centres ``C``:

    .. math:: \\min_\\beta \\|K_{nm} \\beta - y\\|^2 + \\alpha\\, \\beta^\\top K_{mm} \\beta,
              \\qquad \\hat f(x) = \\sum_j \\beta_j\\, k(x, C_j),

    which is the exact solution when every training point is a centre.

    Precision: whatever the input dtype, kernel values, coefficients and
    predictions are computed in float64, in ``fit`` and ``predict`` alike, by
    every solver. float32 data is upcast block by block as it is read (the store
    is not rewritten), so a fit on float32 data is the fit on those rounded values.

    Parameters
    ----------
    kernel : dkern kernel or scikit-learn kernel, optional
        Default ``Gaussian(1.0)``. Tune nested parameters as ``kernel__lengthscale``
        (pass a kernel explicitly for that). ``Gaussian(l)`` is scikit-learn's
        ``"rbf"`` with ``gamma = 1 / (2 l²)``. A scikit-learn kernel object is converted
        by :func:`dkern.kernels.from_sklearn` (logged). A :class:`~dkern.kernels.White`
        term's noise joins the diagonal, ``(K + (alpha + noise) I) c = y``, as in the GP
        regressor (scikit-learn's ``KernelRidge`` drops a ``WhiteKernel``: its
        ``pairwise_kernels`` passes ``Y = X``); only ``solver="exact"`` takes it, the
        others refuse it.
    alpha : float, default=1.0
        Ridge penalty; > 0 (``>= 0`` for ``solver="exact"``).
    solver : {"auto", "exact", "cg", "nystrom", "gd"}, default="auto"
        ``"exact"``: dense Cholesky (n <= ``dkern.solvers.EXACT_MAX_N``, in memory).
        ``"cg"``: CG on the lazy ``K + alpha I`` with a rank-``CG_PRECONDITIONER_RANK``
        Nyström preconditioner (randomly pivoted Cholesky). ``"nystrom"``: Falkon with M
        centres, an approximation of the model (see above). ``"gd"``: kernelised gradient
        descent (Yao, Rosasco & Caponnetto 2007), ``c ← c + τ (y − (K + αI) c)`` from
        ``c = 0`` with ``τ = 1 / λ_max(K + αI)`` estimated by 20 Lanczos steps
        (:func:`dkern.solvers.gd`); the same solution as ``"cg"`` to ``tol`` but after about
        ``κ ln(1/tol)`` iterations, ``κ = λ_max(K + αI) / α``, against CG's ``√κ``, so
        ``"auto"`` never picks it. ``"auto"`` never trades accuracy: exact up to
        ``EXACT_MAX_N`` rows, ``"cg"`` above (the same solution, to ``tol``);
        ``"nystrom"`` only when ``n_centers`` is given. It logs its choice and the
        reason at INFO level.
    n_centers : int, optional
        M for ``"nystrom"``; default ``round(√n)`` (see :func:`dkern.solvers.select_centers`).
        Giving it with ``solver="auto"`` asks for ``"nystrom"``.
    centers : {"uniform", "leverage"}, default="uniform"
        How centres are drawn: uniformly, or by approximate ridge leverage scores.
    tol : float, default=1e-6
        Relative residual at which CG / Falkon / gd stop (unused by ``"exact"``). For
        ``"nystrom"``, ``tol`` and ``residuals_`` refer to the preconditioned system
        Falkon solves; the relative residual of the normal equations themselves,
        ``‖K_nmᵀy − (K_nmᵀK_nm + αK_mm)β‖ / ‖K_nmᵀy‖``, can be larger by up to the
        preconditioner's condition number (:func:`dkern.solvers.falkon` reports it as
        ``NystromResult.normal_residuals``).
    max_iter : int, optional
        Iteration cap of CG / Falkon / gd; default that of :func:`~dkern.solvers.cg` /
        ``falkon`` / ``gd`` (10 000).
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How kernel blocks are computed.
    random_state : int, numpy Generator or RandomState, optional
        Seeds centre selection, the preconditioner's pivots and gd's Lanczos start.
    verbose : bool, default=False
        Show a progress bar of the CG / Falkon iterations (iteration, relative
        residual, elapsed time).
    checkpoint : str or os.PathLike, optional
        A folder or fsspec URL (seen by the client and every worker) where ``"cg"``,
        ``"gd"`` and ``"nystrom"`` save their solver state every ``checkpoint_every``
        iterations; a fit of the same problem resumes there (see
        :func:`dkern.solvers.cg`). Unused by ``"exact"``. The finished fit's checkpoint
        is marked complete and kept; delete it with :func:`dkern.solvers.remove_checkpoint`.
    checkpoint_every : int, default=dkern.solvers.CHECKPOINT_EVERY (50)

    Attributes
    ----------
    solver_ : str
        The solver used (``"auto"`` resolved).
    kernel_ : Kernel
        The kernel used (``kernel`` or the default).
    dual_coef_ : ndarray or dask.array.Array of shape (n,) or (n, t); (M,) or (M, t) for nystrom
        ``c`` or ``β``. numpy, except for ``"cg"`` and ``"gd"`` on dask/Zarr X, where the n-sized
        solution stays on the cluster as a persisted dask array, chunked like X.
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
        ``"exact"``, ``"cg"`` and ``"gd"``: the training rows as given (numpy in memory; dask or
        Zarr input as a lazy dask array, never loaded).
    centers_ : ndarray of shape (M, d)
        ``"nystrom"`` only: the centres.
    n_iter_ : int
        Solver iterations (1 for ``"exact"``: one direct solve).
    residuals_ : ndarray of shape (n_iter_ + 1, t) or None
        Relative residual history of CG / Falkon / gd (the last row recomputed); None for
        exact.
    converged_ : bool
        Whether every target column reached ``tol`` (True for exact). False also when
        the solver stopped at the system's rounding floor above ``tol`` (with a
        ConvergenceWarning that names the tol it can reach).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X was a DataFrame with string column names.
    """

    solver_: str
    kernel_: Kernel
    dual_coef_: np.ndarray | da.Array
    X_fit_: np.ndarray | da.Array
    centers_: np.ndarray
    n_iter_: int
    residuals_: np.ndarray | None
    converged_: bool
    n_features_in_: int

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(RegressorMixin.score)

    @staticmethod
    def _default_kernel() -> Kernel:
        """``kernel=None``: ``Gaussian(1.0)``."""
        return Gaussian(1.0)

    def __init__(self, kernel: Kernel | None = None, *, alpha: float = 1.0, solver: str = "auto",
                 n_centers: int | None = None, centers: str = "uniform", tol: float = 1e-6,
                 max_iter: int | None = None, backend: str = "auto",
                 random_state: Any = None, verbose: bool = False,
                 checkpoint: str | os.PathLike[str] | None = None,
                 checkpoint_every: int = CHECKPOINT_EVERY) -> None:
        self.kernel = kernel
        self.alpha = alpha
        self.solver = solver
        self.n_centers = n_centers
        self.centers = centers
        self.tol = tol
        self.max_iter = max_iter
        self.backend = backend
        self.random_state = random_state
        self.verbose = verbose
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    @labelled_fit
    @worker_failures()
    def fit(self, X: Rows, y: Rows, sample_weight: Rows | None = None, *,
            callback: Callable[[int, np.ndarray], None] | None = None) -> KernelRidge:
        """Fit the model.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
            Training rows; dask and Zarr input is never loaded whole (except by
            ``"exact"``, which needs it in memory anyway).
        y : array-like or dask array of shape (n,) or (n, t)
            Targets; NaN and infinity are rejected.
        sample_weight : array-like of shape (n,), optional
            Row weights ``wᵢ >= 0`` as scikit-learn's ``KernelRidge`` takes them: with
            ``S = diag(√w)`` the dual solves ``(S K S + alpha I) c = S y``, ``dual_coef_ = S c``
            (each row's squared error weighted by ``wᵢ``). With ``solver="exact"`` only
            (``"auto"`` picks it up to ``EXACT_MAX_N`` rows); the iterative solvers refuse it.
        callback : callable, optional
            ``callback(iteration, relative_residuals)`` after each CG / Falkon iteration,
            e.g. a :class:`dkern.solvers.SolveMonitor` to watch the fit from a notebook.

        Returns
        -------
        self
        """
        kernel = checked_kernel(self.kernel, self._default_kernel())
        solver = check_choice(self.solver, "solver", SOLVERS)
        check_choice(self.centers, "centers", CENTERS)
        tol = check_tol(self.tol)
        check_optional_int(self.max_iter, "max_iter", 1)
        check_optional_int(self.n_centers, "n_centers", 1)
        if self.n_centers is not None and solver in ("exact", "cg", "gd"):
            raise ValueError(f"n_centers={self.n_centers!r} sets the centres of "
                             f"solver='nystrom'; solver={solver!r} uses every training row. "
                             "Leave n_centers=None, or use solver='nystrom'.")
        check_checkpoint(self.checkpoint, self.checkpoint_every)
        Xv = check_X(self, X, reset=True)
        yv = check_y(y, Xv.shape[0], type(self).__name__)
        weights = None
        if sample_weight is not None:
            weights = in_memory(check_sample_weight(sample_weight, Xv.shape[0])[0])
            if solver == "auto" and self.n_centers is None:
                solver = "exact"
            if solver != "exact":
                given = f"solver={self.solver!r}" + ("" if self.n_centers is None
                                                     else f", n_centers={self.n_centers}")
                raise ValueError(f"sample_weight is supported by solver='exact' (scikit-learn's "
                                 f"KernelRidge), up to {EXACT_MAX_N} rows; got {given}. Use "
                                 "solver='exact', or fit without weights.")
        solver = self._resolve_solver(solver, Xv.shape[0])
        alpha = check_alpha(self.alpha, solver)
        if solver != "exact":  # the exact factor alone forms k(X), with White's noise
            refuse_white(kernel, f"KernelRidge(solver={solver!r})",
                         "Use solver='exact', or remove the White term "
                         "(kernel.without_white()) and add its noise level to alpha.")
        for stale in ("X_fit_", "centers_"):
            self.__dict__.pop(stale, None)
        self.kernel_ = kernel
        Xw, yw = as_float64(Xv), as_float64(yv)  # the precision rule (class docstring)
        if solver == "exact":
            self._fit_exact(Xw, yw, alpha, weights)
        elif solver == "cg":
            self._fit_cg(Xw, yw, alpha, tol, callback)
        elif solver == "gd":
            self._fit_gd(Xw, yw, alpha, tol, callback)
        else:
            self._fit_nystrom(Xw, yw, alpha, tol, callback)
        if solver != "nystrom":
            self.X_fit_ = X if isinstance(X, da.Array) else Xv  # a dask X is kept as given
        self.solver_ = solver
        logger.info("KernelRidge: solver=%s, %d iterations, converged=%s", solver, self.n_iter_,
                    self.converged_)
        self._settle_at_close()
        return self

    @labelled_output("prediction")
    @worker_failures()
    def predict(self, X: Rows, out: tuple[str, str] | None = None, *,
                overwrite: bool = False) -> Any:
        """Predict ``K(X, X_fit_) @ dual_coef_`` (or ``K(X, centers_) @ dual_coef_``).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)
        out : (url, path), optional
            Write the predictions, chunk by chunk, to the array ``path`` of the store
            at ``url`` (a str or path-like; published atomically by
            :func:`dkern.io.write_array`) instead of returning them.
        overwrite : bool, default False
            Replace an array already at ``out``; without it that is refused before any
            work. Readers see the old array until the new one is complete.

        Returns
        -------
        ndarray of shape (m,) or (m, t) for in-memory X; a lazy dask array for dask or
        Zarr X; the ``out`` location ``(url, path)`` when ``out`` is given. float64
        whatever X's dtype (see Precision in the class docstring).
        """
        check_is_fitted(self, "dual_coef_")
        if is_store_ref(out):
            check_out_is_not_input(X, out[0], [out[1]])
        Xv = check_X(self, X, reset=False)
        held = (self.centers_,) if self.solver_ == "nystrom" else (self.X_fit_, self.dual_coef_)
        # a store to write (out) is written where the work runs: the workers' file system
        with in_process(Xv.shape[0] * len(held[0]), Xv, *held, out, name="dk-predict"):
            if self.solver_ == "nystrom":
                beta = np.asarray(self.dual_coef_)  # (M,) or (M, t): always in memory
                pred = NystromOperator(self.kernel_, Xv, self.centers_, self.backend,
                                       dtype=np.float64, name="dk-predict").matvec(beta)
            else:  # exact, cg and gd: the kernel expansion of their posteriors' means
                pred = KernelExpansion(self.kernel_, self.X_fit_, self.dual_coef_,
                                       backend=self.backend).mean(Xv)
            if out is not None:
                return _write_predictions(pred, out, overwrite)
            if isinstance(Xv, np.ndarray):
                return pred.compute(scheduler=pass_scheduler())
            return pred

    # ------------------------------------------------------------------ fitting
    def _resolve_solver(self, solver: str, n: int) -> str:
        if solver == "auto":  # the policy the GP regressor shares: never trades accuracy
            solver, why = choose_solver(n, self.n_centers, exact_max_n=EXACT_MAX_N)
            logger.info("KernelRidge: solver='auto' chose %r (%s)", solver, why)
        check_solver_fits(solver, n, self.n_centers, exact_max_n=EXACT_MAX_N)
        return solver

    def _fit_exact(self, X: Any, y: Any, alpha: float, weights: np.ndarray | None) -> None:
        Xn = X.compute() if isinstance(X, da.Array) else X
        yn = y.compute() if isinstance(y, da.Array) else y
        self.dual_coef_ = ExactPosterior.fit(self.kernel_, Xn, yn, alpha).weights \
            if weights is None else _weighted_dual(self.kernel_, Xn, yn, alpha, weights)
        self.n_iter_, self.residuals_, self.converged_ = 1, None, True  # one direct solve

    def _fit_cg(self, X: Any, y: Any, alpha: float, tol: float, callback: Any) -> None:
        posterior, result = CGPosterior.fit(
            self.kernel_, X, y, alpha=alpha, rank=CG_PRECONDITIONER_RANK,
            pivot_seed=self.random_state, tol=tol, backend=self.backend,
            max_iter=self.max_iter, progress=bool(self.verbose), callback=callback,
            checkpoint=self.checkpoint, checkpoint_every=self.checkpoint_every)
        self.dual_coef_ = posterior.weights
        self.n_iter_, self.residuals_ = result.n_iter, result.residuals
        self.converged_ = bool(result.converged.all())

    def _fit_gd(self, X: Any, y: Any, alpha: float, tol: float, callback: Any) -> None:
        A = gram(self.kernel_, X, backend=self.backend) + alpha  # K + alpha I, lazy
        result = gd(A, y, tol=tol, max_iter=self.max_iter, callback=callback,
                    progress=bool(self.verbose), random_state=as_generator(self.random_state),
                    checkpoint=self.checkpoint, checkpoint_every=self.checkpoint_every)
        self.dual_coef_ = (np.ascontiguousarray(result.x.compute()) if isinstance(X, np.ndarray)
                           else result.x)
        self.n_iter_, self.residuals_ = result.n_iter, result.residuals
        self.converged_ = bool(result.converged.all())

    def _fit_nystrom(self, X: Any, y: Any, alpha: float, tol: float, callback: Any) -> None:
        rng = as_generator(self.random_state)  # one stream: centres, then the sketch rows
        C = select_centers(X, self.n_centers, method=self.centers, kernel=self.kernel_,
                           alpha=alpha, random_state=rng, backend=self.backend)
        result = falkon(self.kernel_, X, y, C, alpha, tol=tol, max_iter=self.max_iter,
                        backend=self.backend, progress=bool(self.verbose), random_state=rng,
                        callback=callback, checkpoint=self.checkpoint,
                        checkpoint_every=self.checkpoint_every)
        beta = result.beta[:, 0] if y.ndim == 1 else result.beta
        self.dual_coef_, self.centers_ = np.ascontiguousarray(beta), np.ascontiguousarray(C)
        self.n_iter_, self.residuals_ = result.n_iter, result.residuals
        self.converged_ = bool(result.converged.all())

    # ------------------------------------------------------------ model file
    #: The file :func:`dkern.save` writes: arrays by dimension (``n`` rows, ``m`` centres,
    #: ``d`` features, ``t`` targets, "t?": (n,) or (n, t), ``r`` = n_iter_ + 1 residual rows).
    _model_file = ModelFile(
        marker="dual_coef_", kernel="fitted", dims=(centers_dim, residual_rows_dim),
        layouts={solver: FileLayout(
            arrays=({"centers": ("m", "d"), "dual_coef": ("m", "t?")} if solver == "nystrom"
                    else {"X_fit": ("n", "d"), "dual_coef": ("n", "t?")})
            | ({} if solver == "exact" else {"residuals": ("r", "t")}),
            scalars={"solver_": "str", "n_iter_": "count", "converged_": "bool",
                     "n_features_in_": "positive"},
            lazy=("dual_coef", "X_fit")) for solver in SOLVERS[1:]})

    def _set_file_state(self, state: dict[str, Any]) -> None:
        super()._set_file_state(state)
        if self.solver_ == "exact":
            self.residuals_ = None  # one direct solve: no residual history


def _weighted_dual(kernel: Kernel, X: np.ndarray, y: np.ndarray, alpha: float,
                   weights: np.ndarray) -> np.ndarray:
    """The dual coefficients of weighted kernel ridge regression, as scikit-learn computes
    them: ``(S K S + alpha I) c = S y`` with ``S = diag(√w)``, then ``S c``; shape of y."""
    root = np.sqrt(weights)
    s = root if y.ndim == 1 else root[:, None]
    C = np.array(kernel(X), dtype=np.float64)  # scaled in place: one n × n array
    C *= root[:, None]
    C *= root[None, :]
    C[np.diag_indices_from(C)] += alpha
    try:
        c = sla.solve(C, y * s, assume_a="pos", overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError as err:
        raise NotPositiveDefiniteError(
            f"the weighted system S K S + alpha I is singular ({err}): with alpha={alpha:g} "
            "the rows of weight 0 leave it without a full rank. Use alpha > 0, e.g. 1e-6 "
            "times the largest kernel value, or drop those rows.") from None
    return np.ascontiguousarray(c * s)


def _write_predictions(pred: da.Array, out: Any, overwrite: bool) -> tuple[str, str]:
    """Write ``pred`` to the array ``out = (url, path)``; return ``out``."""
    if not is_store_ref(out):
        raise TypeError(f"out must be a (url, path) tuple: a str or path-like store and a str "
                        f"array path, e.g. ('preds.zarr', 'pred'); got {out!r}.")
    group, _, name = out[1].strip("/").rpartition("/")
    arrays, dims, coordinates = written_arrays(out[0], group, {name: pred}, base=name)
    # refuses a taken name before computing
    write_arrays(out[0], arrays, group=group, overwrite=overwrite, dims=dims,
                 coordinates=coordinates)
    return out
