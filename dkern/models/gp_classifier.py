"""Gaussian process classification by the Laplace approximation, as a scikit-learn estimator."""

from __future__ import annotations

import logging
from numbers import Integral
from typing import Any

import dask
import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ..io import Rows
from ..kernels import Gaussian, Kernel, Scaled
from ..operators import gram
from ..solvers import EXACT_MAX_N
from . import _gpc_predict, _laplace, _laplace_evidence
from ._gp_optimize import check_optimizer
from ._labels import labelled_fit, labelled_output, labelled_score
from ._model_file import DeclaredState, FileLayout, ModelFile, problems_dim
from ._validation import (
    DefaultKernel,
    check_choice,
    check_labels,
    check_optional_int,
    check_tol,
    check_X,
    checked_kernel,
    in_memory,
    kept_copy,
    legacy_seed,
    refuse_white,
)
from .labels import one_vs_rest_targets
from .logistic import dense_factor
from .posteriors.policy import check_solver_fits, choose_solver

logger = logging.getLogger(__name__)

SOLVERS = ("auto", "exact", "cg")
MULTI_CLASS = ("one_vs_rest", "binary")
PROBABILITIES = ("sklearn", "probit")


class GaussianProcessClassifier(DefaultKernel, DeclaredState, ClassifierMixin, BaseEstimator):
    """Gaussian process classification by the Laplace approximation (logistic link).

    For 0/1 targets ``t``, ``π = σ(f)`` and ``W = diag(π(1 − π))``, Newton's method finds the
    posterior mode f̂ (Rasmussen & Williams 2006, Alg. 3.1, in its stable form with
    ``B = I + W^{1/2} K W^{1/2}``):

    .. math:: f \\leftarrow K (I + W K)^{-1} (W f + t - \\pi(f)),

    and a test point gets the latent mean ``k*ᵀ(t − π̂)`` and variance
    ``k** − k*ᵀ(W⁻¹ + K)⁻¹k*`` (Alg. 3.2), turned into a probability (see ``probabilities``).
    More than two classes are fitted one-vs-rest, each class against the others, with
    probabilities normalised to sum to one, as scikit-learn's
    :class:`~sklearn.gaussian_process.GaussianProcessClassifier` does; with the same
    kernel the two agree (``Gaussian(l)`` is ``RBF(l)``, ``c * Gaussian(l)`` is
    ``ConstantKernel(c) * RBF(l)``), and so do their learned hyperparameters.

    Parameters
    ----------
    kernel : dkern kernel, optional
        Default ``Scaled(1.0, Gaussian(1.0, lengthscale_bounds="fixed"),
        constant_bounds="fixed")``: scikit-learn's default ``1.0 * RBF(1.0)``, nothing to
        learn. The learnable hyperparameters are the kernel's ``theta`` (see
        ``kernel.bounds``). A scikit-learn kernel object is converted by
        :func:`dkern.kernels.from_sklearn` (logged). A :class:`~dkern.kernels.White` term
        is refused: the Laplace engine forms only blocks ``k(x, z)``, where it is zero.
    optimizer : "lbfgs" (or "fmin_l_bfgs_b"), callable or None, default="lbfgs"
        Maximises the Laplace log marginal likelihood (see
        ``log_marginal_likelihood``) over ``theta`` within ``kernel.bounds``: L-BFGS-B in
        log space with the analytic gradient (R&W Alg. 5.1), each evaluation a Newton
        solve with dense n × n factors, so learning needs n <= ``EXACT_MAX_N`` whatever
        the solver (above it is refused: learn on a subsample and refit with
        ``optimizer=None``). A callable ``optimizer(obj_func, initial_theta, bounds) ->
        (theta, min_value)`` as scikit-learn's. Each binary problem of one-vs-rest
        learns its own kernel, as scikit-learn's. A start outside the bounds is refused;
        a run that does not converge warns and keeps the best value found. None keeps
        the kernel's hyperparameters.
    n_restarts_optimizer : int, default=0
        Extra optimizer runs from starts drawn uniformly in the log-bounds.
    max_iter_predict : int, default=100
        Newton steps at most; they stop when ``Ψ(f) = log p(t|f) − ½ fᵀK⁻¹f`` rises by less
        than ``1e-10`` (scikit-learn's test).
    multi_class : {"one_vs_rest", "binary"}, default="one_vs_rest"
        ``"binary"`` refuses labels with more than two classes.
    probabilities : {"sklearn", "probit"}, default="sklearn"
        How ``E[σ(f*)]`` over the Gaussian latent is approximated: ``"sklearn"``, σ as a sum
        of five error functions (Williams & Barber 1998), scikit-learn's; ``"probit"``,
        ``σ(μ / √(1 + π v / 8))`` (MacKay 1992). They differ by up to about 1e-2.
    solver : {"auto", "exact", "cg"}, default="auto"
        ``"exact"``: dense K and Cholesky factors of B (n <= ``dkern.solvers.EXACT_MAX_N``).
        ``"cg"``: B is a lazy operator over ``gram(kernel, X)`` and every B system (one per
        Newton step, one per batch of test points with the columns ``W^{1/2} k(X, x*)`` as
        right-hand sides) is solved by block CG to ``tol``; no n × n matrix. ``"auto"``:
        exact up to ``EXACT_MAX_N`` rows, CG above.
    tol : float, default=1e-8
        Relative residual of the CG solves (unused by ``"exact"``), for a kernel of
        amplitude 1: it is divided by the kernel's largest ``k(x, x)`` when that is above 1,
        since a solve's error reaches the latent mean multiplied by the amplitude.
    max_iter : int, optional
        Iteration cap of each CG solve; default that of :func:`dkern.solvers.cg`.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How kernel blocks are computed by ``"cg"``.
    random_state : int, numpy Generator or RandomState, optional
        Seeds the optimizer's restarts.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    n_classes_ : int
    kernel_ : Kernel, or list of Kernel for more than two classes
        The kernel with the fitted hyperparameters; for one-vs-rest one kernel per class
        (the kernels of scikit-learn's ``CompoundKernel``), in the order of ``classes_``.
    solver_ : str
        ``"exact"`` or ``"cg"``.
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
        The training rows (dask or Zarr input stays lazy for ``"cg"``); in-memory ones
        are copied, as scikit-learn does, so changing the array passed to ``fit`` changes
        nothing.
    y_train_ : ndarray of int, shape (n,)
        The labels as indices into ``classes_``.
    pi_ : ndarray or dask.array.Array of shape (n,) or (n, n_classes)
        ``σ(f̂)`` at the mode: of the binary problem, or one column per class (one-vs-rest).
        A persisted dask array for ``"cg"`` on dask or Zarr rows (numpy for numpy rows).
    log_marginal_likelihood_value_ : float
        The Laplace approximation ``log q(t | X) = Ψ(f̂) − ½ log det B`` (the mean over the
        classes for one-vs-rest, as scikit-learn). ``"cg"`` factors B densely once for
        it when n <= ``EXACT_MAX_N``; NaN above, where ``log det B`` is not computed.
    n_iter_ : ndarray of int, shape (n_problems,)
        Newton steps of each binary problem.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X was a DataFrame with string column names.
    """

    _chols: list[np.ndarray] | None  # Cholesky factors of B at each mode (exact solver)
    X_fit_: np.ndarray | da.Array

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(ClassifierMixin.score)

    @staticmethod
    def _default_kernel() -> Kernel:
        """``kernel=None``: scikit-learn's default, ``1.0 * RBF(1.0)`` with both fixed."""
        return Scaled(1.0, Gaussian(1.0, lengthscale_bounds="fixed"), constant_bounds="fixed")

    def __init__(self, kernel: Kernel | None = None, *, optimizer: Any = "lbfgs",
                 n_restarts_optimizer: int = 0, max_iter_predict: int = 100,
                 multi_class: str = "one_vs_rest", probabilities: str = "sklearn",
                 solver: str = "auto", tol: float = 1e-8, max_iter: int | None = None,
                 backend: str = "auto", random_state: Any = None) -> None:
        self.kernel = kernel
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.max_iter_predict = max_iter_predict
        self.multi_class = multi_class
        self.probabilities = probabilities
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.backend = backend
        self.random_state = random_state

    @labelled_fit
    def fit(self, X: Rows, y: Rows) -> GaussianProcessClassifier:
        """Learn the hyperparameters (if ``optimizer``), then find the Laplace posterior of
        each binary problem.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
        y : array-like or dask array of shape (n,)
            Class labels (any sortable values); read into memory.

        Returns
        -------
        self
        """
        kernel = self._check_params()
        Xv = check_X(self, X, reset=True)
        labels = check_labels(y, Xv.shape[0], "GaussianProcessClassifier")
        self.classes_, codes = np.unique(labels, return_inverse=True)
        self.n_classes_ = len(self.classes_)
        self._check_classes()
        self.solver_ = self._resolve_solver(Xv.shape[0])
        self.y_train_ = codes.astype(np.int64)
        Xw = Xv if Xv.dtype == np.float64 else Xv.astype(np.float64)
        kernels = self._learned_kernels(kernel, Xw)
        self.kernel_ = kernels[0] if self.n_classes_ == 2 else kernels
        targets = self._targets()
        if self.solver_ == "exact":
            Xn = in_memory(Xw)
            modes = [_laplace.solve_dense(K, t, self.max_iter_predict)
                     for K, t in zip(_laplace.dense_grams(kernels, Xn), targets, strict=True)]
            self.X_fit_ = kept_copy(Xn, X)  # not the caller's array (scikit-learn copies)
        else:
            modes = []
            for k, t in zip(kernels, targets, strict=True):
                K = gram(k, Xw, backend=self.backend)
                modes.append(_laplace.solve_cg(K, _laplace.lazy_vector(t, K), self.max_iter_predict,
                                               self.tol, self.max_iter))
            self.X_fit_ = X if isinstance(X, da.Array) else kept_copy(Xv, X)
        pis = [m.pi for m in modes]
        if self.solver_ == "cg" and not isinstance(self.X_fit_, da.Array):
            # in-memory rows: σ(f̂) (n floats, fewer than X's) comes to the client, as
            # KernelRidge's dual_coef_ does, so the model outlives the cluster that fitted it
            pis = [np.asarray(pi) for pi in dask.compute(*pis)]
        stack = da.stack if isinstance(pis[0], da.Array) else np.stack
        self.pi_ = pis[0] if len(pis) == 1 else stack(pis, axis=1)
        self._chols = ([m.chol for m in modes if m.chol is not None]  # all, for exact
                       if self.solver_ == "exact" else None)
        self.n_iter_ = np.array([m.n_iter for m in modes])
        self.log_marginal_likelihood_value_ = self._evidence(modes, kernels, Xw)
        logger.info("GaussianProcessClassifier: solver=%s, Newton steps %s, kernel_=%r, "
                    "lml=%.6g", self.solver_, self.n_iter_.tolist(), self.kernel_,
                    self.log_marginal_likelihood_value_)
        self._settle_at_close()
        return self

    def _learned_kernels(self, kernel: Kernel, X: Any) -> list[Kernel]:
        """One kernel per binary problem: ``kernel`` itself, or the learned one."""
        if self.optimizer is None or len(kernel.theta) == 0:
            return [kernel] * len(self._targets())
        n = X.shape[0]
        if n > EXACT_MAX_N:
            raise ValueError(f"learning hyperparameters (optimizer={self.optimizer!r}) uses the "
                             f"Laplace log marginal likelihood with dense n x n factors, n <= "
                             f"{EXACT_MAX_N}; got n={n}. Learn them on a subsample and refit "
                             "with optimizer=None and the learned model's kernel_.")
        return _laplace_evidence.learn(
            kernel, in_memory(X), self._targets(), max_iter=self.max_iter_predict,
            optimizer=self.optimizer, n_restarts=self.n_restarts_optimizer,
            rng=check_random_state(legacy_seed(self.random_state)))

    def _evidence(self, modes: list[_laplace.Mode], kernels: list[Kernel], X: Any) -> float:
        """The mean Laplace evidence of the problems; NaN for ``"cg"`` above ``EXACT_MAX_N``."""
        if self._chols is not None:
            chols = self._chols
        elif X.shape[0] <= EXACT_MAX_N:  # B at CG's mode, factored densely once
            Ks = _laplace.dense_grams(kernels, in_memory(X))
            chols = [dense_factor(K, np.asarray(in_memory(m.pi)))[1]
                     for K, m in zip(Ks, modes, strict=True)]
        else:
            return float("nan")
        return float(np.mean([_laplace.log_evidence(m.psi, L)
                              for m, L in zip(modes, chols, strict=True)]))

    @labelled_output("probability", column_dim="class", columns="classes_")
    def predict_proba(self, X: Rows) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)
            Processed in batches of ``PREDICT_BATCH`` rows (``"cg"``: at most
            ``CG_BATCH_VALUES / n``, each batch one block CG solve per binary problem; both
            constants in ``dkern.models._gpc_predict``).

        Returns
        -------
        ndarray of shape (m, n_classes)
        """
        proba = _laplace.proba_erf if self.probabilities == "sklearn" else _laplace.proba_probit
        P = np.column_stack([proba(mean, var) for mean, var in self._latent(X)])
        if self.n_classes_ == 2:
            return np.column_stack([1 - P[:, 0], P[:, 0]])
        return P / P.sum(axis=1, keepdims=True)  # one-vs-rest, normalised as scikit-learn

    @labelled_output("prediction")
    def predict(self, X: Rows) -> np.ndarray:
        """The most probable class: for two classes, the sign of the latent mean (R&W §3.4.2).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)

        Returns
        -------
        ndarray of shape (m,), values from ``classes_``
        """
        check_is_fitted(self, "pi_")
        if self.n_classes_ > 2:
            return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
        (mean, _), = self._latent(X)
        return self.classes_[(mean > 0).astype(int)]

    def log_marginal_likelihood(self, theta: Any = None, eval_gradient: bool = False,
                                clone_kernel: bool = True) -> Any:
        """The Laplace approximation ``log q(t | X, θ) = Ψ(f̂) − ½ log det B``.

        For one-vs-rest the mean over the classes' binary problems, as scikit-learn.
        Evaluating it at ``theta`` needs dense n × n factors (n <= ``EXACT_MAX_N``).

        Parameters
        ----------
        theta : array-like of shape (p,) or (p * n_classes,), optional
            Log-hyperparameters in the layout of ``kernel_.theta`` (p of them). For
            one-vs-rest, p values set every class's kernel, p * n_classes values set each
            class's kernel in turn (scikit-learn's ``CompoundKernel`` layout). None returns
            ``log_marginal_likelihood_value_``.
        eval_gradient : bool, default=False
            Also return the gradient in ``theta`` (R&W Alg. 5.1: the explicit term and the
            implicit one through the mode f̂), shape like ``theta``. scikit-learn has it
            for two classes only; here one-vs-rest gets the gradient of the mean too.
        clone_kernel : bool, default=True
            Accepted for scikit-learn compatibility; ``kernel_`` is never modified.

        Returns
        -------
        float, or (float, ndarray) with ``eval_gradient``
        """
        check_is_fitted(self, "pi_")
        if theta is None:
            if eval_gradient:
                raise ValueError("Gradient can only be evaluated for theta!=None")
            return self.log_marginal_likelihood_value_
        kernels, shared = self._kernels_at(theta)
        n = self.X_fit_.shape[0]
        if n > EXACT_MAX_N:
            raise ValueError(f"the Laplace log marginal likelihood at theta needs dense n x n "
                             f"factors, n <= {EXACT_MAX_N}; this model has n={n}. Evaluate it "
                             "on a subsample.")
        Xn = in_memory(self.X_fit_)
        values, grads = zip(*(_laplace_evidence.log_evidence(k, Xn, t, self.max_iter_predict,
                                                              eval_gradient)
                              for k, t in zip(kernels, self._targets(), strict=True)),
                            strict=True)
        value = float(np.mean(values))
        if not eval_gradient:
            return value
        grad = np.mean(grads, axis=0) if shared else np.concatenate(grads) / len(grads)
        return value, grad

    # ------------------------------------------------------------------ internals
    def _check_params(self) -> Kernel:
        check_optimizer(self.optimizer, self.n_restarts_optimizer)
        check_choice(self.solver, "solver", SOLVERS)
        check_choice(self.multi_class, "multi_class", MULTI_CLASS)
        check_choice(self.probabilities, "probabilities", PROBABILITIES)
        check_tol(self.tol)
        check_optional_int(self.max_iter, "max_iter", 1)
        steps = self.max_iter_predict
        if isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 1:
            raise ValueError(f"max_iter_predict must be an integer >= 1 (Newton steps), e.g. 100; "
                             f"got {steps!r}.")
        kernel = checked_kernel(self.kernel, self._default_kernel())
        # dkern's Laplace engine forms only blocks k(x, z), where White is zero: refused
        # rather than ignored (scikit-learn's classifier would add it to the latent prior)
        return refuse_white(kernel, "GaussianProcessClassifier",
                            "The Laplace approximation here uses the latent kernel's blocks "
                            "only; remove the White term (kernel.without_white()), or add a "
                            "small jitter through the kernel's own parameters instead.")

    def _check_classes(self) -> None:
        name = type(self).__name__
        if self.n_classes_ < 2:
            raise ValueError(f"{name} requires 2 or more distinct classes in y; got 1 class "
                             f"(only {self.classes_[0]!r} is present). Pass labels of at least "
                             "two classes.")
        if self.n_classes_ > 2 and self.multi_class == "binary":
            raise ValueError(f"multi_class='binary' allows two classes in y; got "
                             f"{self.n_classes_}: {self.classes_.tolist()}. Use "
                             "multi_class='one_vs_rest' or pass binary labels.")

    def _resolve_solver(self, n: int) -> str:
        if self.solver == "auto":
            solver, why = choose_solver(n, None, exact_max_n=EXACT_MAX_N)
            logger.info("GaussianProcessClassifier: solver='auto' chose %r: %s", solver, why)
            return solver
        check_solver_fits(self.solver, n, None, exact_max_n=EXACT_MAX_N, instead="solver='cg'")
        return self.solver

    def _kernels(self) -> list[Kernel]:
        """The fitted kernel of each binary problem."""
        return [self.kernel_] if isinstance(self.kernel_, Kernel) else list(self.kernel_)

    def _kernels_at(self, theta: Any) -> tuple[list[Kernel], bool]:
        """Each problem's kernel at ``theta``, and whether one theta is shared by all."""
        values = np.asarray(theta, dtype=float)
        kernels = self._kernels()
        p, m = len(kernels[0].theta), len(kernels)
        if values.shape == (p,):
            return [k.with_theta(values) for k in kernels], True
        if m > 1 and values.shape == (p * m,):
            return [k.with_theta(values[i * p:(i + 1) * p]) for i, k in enumerate(kernels)], False
        per_class = f" or {p * m} (each class's kernel in turn)" if m > 1 else ""
        raise ValueError(f"theta must hold {p} log-hyperparameters (one per name in "
                         f"{kernels[0].hyperparameter_names}){per_class}; got shape "
                         f"{values.shape}.")

    def _targets(self) -> list[np.ndarray]:
        """0/1 targets of each binary problem: the second class, or each class vs the rest."""
        T = one_vs_rest_targets(self.y_train_, self.n_classes_)
        return [np.ascontiguousarray(t) for t in T.T]

    def _pis(self) -> list[Any]:
        return [self.pi_] if self.pi_.ndim == 1 else [self.pi_[:, k]
                                                      for k in range(self.pi_.shape[1])]

    def _latent(self, X: Any) -> _gpc_predict.Latent:
        """Latent (mean, variance), each (m,), of every binary problem at the rows of X."""
        check_is_fitted(self, "pi_")
        Xv = check_X(self, X, reset=False)
        Xv = Xv if Xv.dtype == np.float64 else Xv.astype(np.float64)
        if self.solver_ == "exact":
            return _gpc_predict.latent_exact(self.X_fit_, self._kernels(), self._targets(),
                                             self._pis(), self._factors(), Xv)
        return _gpc_predict.latent_cg(self.X_fit_, self._kernels(), self._targets(),
                                      self._pis(), Xv, backend=self.backend, tol=self.tol,
                                      cg_max_iter=self.max_iter)

    def _factors(self) -> list[np.ndarray]:
        """Cholesky factors of B at the modes, rebuilt from ``pi_`` when absent (a loaded
        model: its file stores ``pi_``, never n × n factors)."""
        if getattr(self, "_chols", None) is None:
            Ks = _laplace.dense_grams(self._kernels(), np.asarray(self.X_fit_, dtype=np.float64))
            self._chols = [dense_factor(K, pi)[1] for K, pi in zip(Ks, self._pis(), strict=True)]
        return self._chols

    #: The file :func:`dkern.save` writes (``p`` binary problems, 1 for two classes); never
    #: the n × n factors, rebuilt from ``pi_`` on first use.
    _model_file = ModelFile(marker="pi_", kernel="learned", dims=(problems_dim,),
                            layouts=dict.fromkeys(SOLVERS[1:], FileLayout(
                                arrays={"X_fit": ("n", "d"), "y_train": ("n",), "pi": ("n", "p?")},
                                scalars={"solver_": "str", "n_iter_": "counts",
                                         "n_features_in_": "positive", "n_classes_": "positive",
                                         "log_marginal_likelihood_value_": "number or null",
                                         "classes_": "labels"}, lazy=("X_fit", "pi"))))
