"""Kernel logistic regression as a scikit-learn classifier over the lazy Gram operator."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from scipy.special import softmax
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..errors import ConvergenceWarning
from ..io import Rows
from ..kernels import Gaussian, Kernel
from ..operators import gram
from . import _klr
from ._labels import labelled_fit, labelled_output, labelled_score
from ._model_file import DeclaredState, FileLayout, ModelFile, problems_dim, residual_rows_dim
from ._validation import (
    DefaultKernel,
    as_generator,
    check_alpha,
    check_choice,
    check_labels,
    check_optional_int,
    check_tol,
    check_X,
    checked_kernel,
    finite_number,
    refuse_white,
)
from .labels import one_vs_rest_targets
from .logistic import sigmoid
from .logistic.multinomial import multinomial_newton

logger = logging.getLogger(__name__)

SOLVERS = ("newton-cg", "gd")
MULTI_CLASS = ("ovr", "multinomial")


class KernelLogisticRegression(DefaultKernel, DeclaredState, ClassifierMixin, BaseEstimator):
    """Kernel logistic regression (no intercept), binary and one-vs-rest, on data larger
    than memory.

    With ``ỹ = ±1`` the labels of a binary problem and ``f = Kβ`` the training scores,
    ``fit`` finds the dual coefficients β of

    .. math:: \\min_\\beta\\ \\frac1n \\sum_i \\log\\bigl(1 + e^{-\\tilde y_i (K\\beta)_i}\\bigr)
              + \\frac\\alpha2\\, \\beta^\\top K \\beta, \\qquad
              \\hat f(x) = \\sum_i \\beta_i\\, k(x, x_i),\\quad P(+1 \\mid x) = \\sigma(\\hat f(x)).

    With ``kernel=Linear()`` this is :class:`sklearn.linear_model.LogisticRegression`
    with ``fit_intercept=False`` and ``C = 1 / (n · alpha)`` (``w = Xᵀβ``). More than two
    classes are fitted one-vs-rest (each class against the others, all in one pass over
    the data per iteration) with probabilities normalised to sum to one, as
    :class:`sklearn.multiclass.OneVsRestClassifier`. The solvers and the stopping rule
    are derived in :mod:`dkern.models._klr`. Kernel values and coefficients are float64.

    Parameters
    ----------
    kernel : dkern kernel or scikit-learn kernel, optional
        Default ``Gaussian(1.0)``; a scikit-learn kernel object is converted by
        :func:`dkern.kernels.from_sklearn` (logged). A :class:`~dkern.kernels.White` term
        is refused: the logistic likelihood has no noise variance to learn.
    alpha : float, default=1.0
        Weight of the penalty ``α/2 βᵀKβ``; > 0.
    C : float, optional
        scikit-learn's inverse regularisation strength instead of ``alpha``: the fit uses
        ``alpha = 1 / (n · C)`` for n training rows, so ``C`` means what it means in
        :class:`~sklearn.linear_model.LogisticRegression` (above). Leave ``alpha`` at its
        default when giving ``C``.
    multi_class : {"ovr", "multinomial"}, default="ovr"
        More than two classes: one-vs-rest problems (above), or one multinomial (softmax)
        problem, ``P(k | x) ∝ exp(f̂ₖ(x))``, as scikit-learn's ``LogisticRegression`` fits
        them (:mod:`dkern.models.logistic.multinomial`; ``solver="newton-cg"`` only).
        Two classes are one binary problem either way.
    solver : {"newton-cg", "gd"}, default="newton-cg"
        ``"newton-cg"``: Newton's method in function space, each step's SPD system solved
        by CG on the lazy Gram operator, with a step-halving line search: a few Newton
        steps. ``"gd"``: kernelised (RKHS) gradient descent with the step
        ``1 / L`` (L from 20 Lanczos steps): about ``κ ln(1/tol)`` iterations,
        ``κ = 1 + λ_max(K) / (4 n alpha)``, one Gram matvec each.
    tol : float, default=1e-6
        A problem stops when ``‖nαβ + σ(Kβ) − t‖ ≤ tol · ‖t − ½‖`` (its gradient,
        relative to that at β = 0; t the 0/1 targets).
    max_iter : int, optional
        Newton steps (default 100) or gd iterations (default 10 000) at most.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How kernel blocks are computed.
    random_state : int, numpy Generator or RandomState, optional
        Seeds gd's Lanczos start.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    kernel_ : Kernel
    dual_coef_ : ndarray or dask.array.Array of shape (n,) or (n, n_classes)
        β: one column per class for one-vs-rest, one vector for two classes (the
        problem of ``classes_[1]`` against ``classes_[0]``). A persisted dask array
        chunked like X for dask or Zarr X.
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
        The training rows (dask or Zarr input as a lazy dask array, never loaded).
    solver_ : str
    n_iter_ : int
        Newton steps or gd iterations (all problems run together).
    residuals_ : ndarray of shape (n_iter_ + 1, n_problems)
        The relative stationarity residuals (see ``tol``).
    converged_ : bool
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X was a DataFrame with string column names.
    """

    classes_: np.ndarray
    kernel_: Kernel
    dual_coef_: np.ndarray | da.Array
    X_fit_: np.ndarray | da.Array
    solver_: str
    n_iter_: int
    residuals_: np.ndarray
    converged_: bool
    n_features_in_: int

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(ClassifierMixin.score)

    @staticmethod
    def _default_kernel() -> Kernel:
        """``kernel=None``: ``Gaussian(1.0)``."""
        return Gaussian(1.0)

    def __init__(self, kernel: Kernel | None = None, *, alpha: float = 1.0,
                 C: float | None = None, multi_class: str = "ovr", solver: str = "newton-cg",
                 tol: float = 1e-6, max_iter: int | None = None, backend: str = "auto",
                 random_state: Any = None) -> None:
        self.kernel = kernel
        self.alpha = alpha
        self.C = C
        self.multi_class = multi_class
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.backend = backend
        self.random_state = random_state

    @labelled_fit
    @worker_failures()
    def fit(self, X: Rows, y: Rows, *,
            callback: Callable[[int, np.ndarray], None] | None = None) -> KernelLogisticRegression:
        """Fit the model.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
            Training rows; dask and Zarr input is never loaded whole.
        y : array-like, dask array, zarr.Array or (url, path), shape (n,)
            Class labels (any sortable values), at least two classes; read into memory.
        callback : callable, optional
            ``callback(iteration, relative_residuals)`` after each Newton step / gd
            iteration, e.g. a :class:`dkern.solvers.SolveMonitor`.

        Returns
        -------
        self
        """
        kernel = refuse_white(
            checked_kernel(self.kernel, self._default_kernel()), "KernelLogisticRegression",
            "The logistic likelihood has no noise variance to learn; remove the White term "
            "(kernel.without_white()).")
        solver = check_choice(self.solver, "solver", SOLVERS)
        if check_choice(self.multi_class, "multi_class", MULTI_CLASS) == "multinomial" \
                and solver != "newton-cg":
            raise ValueError(f"multi_class='multinomial' is solved by solver='newton-cg'; got "
                             f"solver={solver!r}. Use solver='newton-cg', or multi_class='ovr'.")
        alpha = check_alpha(self.alpha, solver, role="the weight of the penalty α/2 βᵀKβ")
        tol = check_tol(self.tol)
        max_iter = check_optional_int(self.max_iter, "max_iter", 1)
        C = self._checked_C()
        Xv = check_X(self, X, reset=True)
        if C is not None:
            alpha = 1.0 / (Xv.shape[0] * C)  # scikit-learn's C for n rows
        labels = check_labels(y, Xv.shape[0], "KernelLogisticRegression")
        self.classes_, codes = np.unique(labels, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"KernelLogisticRegression needs labels of at least 2 classes in y; "
                             f"got 1 class (only {self.classes_[0]!r} is present). Pass labels "
                             "of two or more classes.")
        out = self._solve(kernel, Xv, codes, solver, alpha, tol, max_iter, callback)
        beta = out.beta[:, 0] if len(self.classes_) == 2 else out.beta
        self.dual_coef_ = np.ascontiguousarray(beta.compute()) if isinstance(Xv, np.ndarray) \
            else beta  # the only n-vectors that leave the cluster: numpy input's, once
        self.X_fit_ = X if isinstance(X, da.Array) else Xv
        self.kernel_, self.solver_ = kernel, solver
        self.n_iter_, self.residuals_ = out.n_iter, out.residuals
        self.converged_ = bool(out.converged.all())
        if not self.converged_ and solver == "newton-cg":
            warnings.warn(f"KernelLogisticRegression: Newton stopped at max_iter={out.n_iter} "
                          f"with a relative stationarity residual {out.residuals[-1].max():.2e}"
                          f" > tol={tol:g}; raise max_iter or loosen tol.",
                          ConvergenceWarning, stacklevel=2)
        logger.info("KernelLogisticRegression: solver=%s, %d iterations, converged=%s", solver,
                    self.n_iter_, self.converged_)
        self._settle_at_close()
        return self

    def _multinomial(self) -> bool:
        """One softmax problem: multi_class='multinomial' with more than two classes."""
        return self.multi_class == "multinomial" and len(self.classes_) > 2

    def _checked_C(self) -> float | None:
        """``C`` as a float > 0 given without a non-default ``alpha``, or None."""
        if self.C is None:
            return None
        C = finite_number(self.C)
        if C is None or C <= 0:
            raise ValueError(f"C must be a finite number > 0 (scikit-learn's inverse "
                             f"regularisation strength); got {self.C!r}.")
        if self.alpha != 1.0:
            raise ValueError(f"give alpha or C, not both: got alpha={self.alpha!r} and "
                             f"C={self.C!r}. C sets alpha = 1 / (n · C); leave alpha at "
                             "its default 1.0, or set C=None.")
        return C

    def _solve(self, kernel: Kernel, X: Any, codes: np.ndarray, solver: str, alpha: float,
               tol: float, max_iter: int | None, callback: Any) -> _klr.KlrFit:
        """Every binary problem's β, side by side as the columns of one solve."""
        Xw = X if X.dtype == np.float64 else X.astype(np.float64)
        K = gram(kernel, Xw, backend=self.backend, name="dk-klr-mv")
        T = da.from_array(one_vs_rest_targets(codes, len(self.classes_)),
                          chunks=(K.col_chunks, -1))
        nalpha = X.shape[0] * alpha
        if self._multinomial():  # one-hot T: the one-vs-rest targets of 3+ classes
            beta, n_iter, residuals, converged = multinomial_newton(
                K, T, nalpha, tol=tol, max_iter=_klr.NEWTON_MAX_ITER if max_iter is None
                else max_iter, callback=callback)
            return _klr.KlrFit(beta, n_iter, residuals, np.array([converged]))
        if solver == "newton-cg":
            return _klr.newton_cg(K, T, nalpha, tol=tol, max_iter=max_iter, callback=callback)
        return _klr.gradient_descent(K, T, nalpha, tol=tol, max_iter=max_iter,
                                     random_state=as_generator(self.random_state),
                                     callback=callback)

    @labelled_output("decision", column_dim="class", columns="classes_")
    @worker_failures()
    def decision_function(self, X: Rows) -> Any:
        """The scores ``K(X, X_fit_) @ dual_coef_`` (the log-odds of each problem).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)

        Returns
        -------
        ndarray of shape (m,) (two classes: positive means ``classes_[1]``) or
        (m, n_classes); a lazy dask array for dask or Zarr X.
        """
        check_is_fitted(self, "dual_coef_")
        Xv = check_X(self, X, reset=False)
        scores = gram(self.kernel_, Xv, self.X_fit_, backend=self.backend, dtype=np.float64,
                      name="dk-predict") @ self.dual_coef_
        return scores.compute() if isinstance(Xv, np.ndarray) else scores

    @labelled_output("probability", column_dim="class", columns="classes_")
    def predict_proba(self, X: Rows) -> Any:
        """Class probabilities, columns in the order of ``classes_``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)

        Returns
        -------
        ndarray of shape (m, n_classes); a lazy dask array for dask or Zarr X.
        """
        scores = self.decision_function(X)
        lib = da if isinstance(scores, da.Array) else np
        if scores.ndim == 2 and self._multinomial():
            return (scores.map_blocks(softmax, axis=1, dtype=np.float64) if lib is da
                    else softmax(scores, axis=1))
        p = sigmoid(scores)
        if scores.ndim == 1:
            return lib.stack([1 - p, p], axis=1)
        return p / p.sum(axis=1, keepdims=True)  # one-vs-rest, normalised as scikit-learn

    @labelled_output("prediction")
    def predict(self, X: Rows) -> Any:
        """The most probable class (two classes: ``classes_[1]`` where the score is > 0).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)

        Returns
        -------
        ndarray of shape (m,), values from ``classes_``; lazy for dask or Zarr X.
        """
        scores = self.decision_function(X)
        index = (scores > 0).astype(np.intp) if scores.ndim == 1 else scores.argmax(axis=1)
        if isinstance(index, da.Array):
            return da.map_blocks(self.classes_.take, index, dtype=self.classes_.dtype)
        return self.classes_[index]

    #: The file :func:`dkern.save` writes: arrays by dimension (``n`` rows, ``d`` features,
    #: ``p`` binary problems, 1 for two classes: ``dual_coef`` is then 1-D; ``r`` =
    #: n_iter_ + 1 residual rows); ``classes_`` as JSON with its dtype.
    _model_file = ModelFile(marker="dual_coef_", kernel="fitted",
                            dims=(problems_dim, residual_rows_dim),
                            layouts=dict.fromkeys(SOLVERS, FileLayout(
                                arrays={"dual_coef": ("n", "p?"), "X_fit": ("n", "d"),
                                        "residuals": ("r", "p")},
                                scalars={"solver_": "str", "n_iter_": "count",
                                         "converged_": "bool", "n_features_in_": "positive",
                                         "classes_": "labels"},
                                lazy=("dual_coef", "X_fit"))))
