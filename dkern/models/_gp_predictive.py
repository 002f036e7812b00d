"""The GP regressor's predictive distribution as scikit-learn asks for it: the mean, the
latent standard deviation or covariance, and draws, in the units of y; the prior's before
``fit``.

A prediction for a few thousand in-memory rows runs in this process
(:mod:`dkern.operators.in_process`), as ``KernelRidge.predict`` does: the mean is one pass
over the training rows (the centres for ``"nystrom"``), and so is the std of the exact
and Nyström posteriors. The std of ``"cg"`` and ``"lanczos"`` stays on the client in use:
it runs solver iterations whose dask calls are that client's.

:class:`PosteriorPredictive` is a base of :class:`~dkern.models.GaussianProcessRegressor`:
it asks the estimator's posterior (``_posterior_here()``) and undoes its target scaling
(``_targets``, :mod:`._gp_outputs`).
"""

from __future__ import annotations

import contextlib
from numbers import Integral
from typing import Any

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..io import Rows, is_store_ref
from ..operators.in_process import in_process
from ._gp_outputs import draws, predictive
from ._labels import labelled_output
from ._validation import as_float64, check_out_is_not_input, check_X, in_memory
from .posteriors import PriorPosterior

#: Largest posterior covariance ``predict(return_cov=True)`` builds: m² float64 values.
MAX_COV_BYTES = 2**30


class PosteriorPredictive:
    """``predict`` and ``sample_y`` of a GP regressor over its posterior."""

    _posterior_here: Any
    _given_kernel: Any
    _targets: Any
    solver_: str
    variance_: str
    X_train_: Any
    alpha_: Any
    centers_: Any

    @labelled_output("prediction", "std")
    @worker_failures()
    def predict(self, X: Rows, return_std: bool = False, return_cov: bool = False,
                out: tuple[str, str] | None = None, *, overwrite: bool = False) -> Any:
        """Posterior mean, and the latent standard deviation or covariance, at X.

        Before ``fit``, as scikit-learn, the prior's: mean 0 and ``k(x, x)`` (``kernel``
        or the default), for numpy or dask X (not with ``out``).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)
        return_std : bool, default=False
            Also return ``σ(x*)`` (latent: ``alpha`` not included, as scikit-learn).
        return_cov : bool, default=False
            Also return the latent covariance (m, m); for m up to
            ``sqrt(MAX_COV_BYTES / 8)`` points. Not with ``return_std``. For
            ``"nystrom"`` the SGPR posterior covariance (positive semi-definite; see
            :mod:`dkern.models.posteriors.sparse`), for ``"lanczos"`` ``K** − W H⁻¹ Wᵀ``
            with ``W = K(X*, X) V`` (PSD: it exceeds the exact one), so ``sample_y``
            works for both too.
        out : (url, group), optional
            Write ``mean`` (and, with ``return_std``, ``std``) as arrays of the group
            ``group`` of the Zarr store ``url``, chunk by chunk, published atomically
            (:func:`dkern.io.write_arrays`), and return ``out``.
        overwrite : bool, default=False
            Replace arrays already at ``out``; without it that is refused before any work.

        Returns
        -------
        mean : ndarray of shape (m,) or (m, t)
            (m,) also for y of shape (n, 1), as scikit-learn returns (std and cov alike).
            A lazy dask array for dask/Zarr X.
        std : ndarray of shape (m,) or (m, t), only with ``return_std``
        cov : ndarray of shape (m, m) or (m, m, t), only with ``return_cov``
        """
        if return_std and return_cov:  # scikit-learn's error and message, and the fix
            raise RuntimeError("At most one of return_std or return_cov can be requested. "
                               "Ask for the pointwise std and the joint covariance in two "
                               "calls.")
        if not hasattr(self, "alpha_") and out is None:  # as scikit-learn: the prior
            return self._prior_predict(X, return_std, return_cov)
        check_is_fitted(self, "alpha_")
        if is_store_ref(out):
            check_out_is_not_input(X, out[0], [f"{out[1]}/mean", f"{out[1]}/std"])
        if out is not None and return_cov:
            raise ValueError("out= writes the mean and std; return_cov cannot be written. Use "
                             "return_std=True with out=, or return_cov without out=.")
        Xw = as_float64(check_X(self, X, reset=False))
        if return_cov:
            _check_cov_size(Xw.shape[0])
            return self._mean_and_covariance(Xw)
        posterior = self._posterior_here()
        with self._small_pass(Xw, return_std, out):
            return predictive(posterior, self._targets, Xw, return_std, out, overwrite)

    def _small_pass(self, Xt: Any, return_std: bool,
                    out: Any) -> contextlib.AbstractContextManager[bool]:
        """:func:`~dkern.operators.in_process.in_process` for a prediction at Xt (m, d):
        the mean's pass over the training rows or centres, and the std where it is the
        same kind of pass (module docstring)."""
        if return_std and self.variance_ not in ("exact", "nystrom"):
            return contextlib.nullcontext(False)
        held = self.centers_ if self.solver_ == "nystrom" else self.X_train_
        # a store to write (out) is written where the work runs: the workers' file system
        return in_process(len(Xt) * len(held), Xt, held, self.alpha_, out, name="dk-gp-predict")

    def _mean_and_covariance(self, Xt: Any) -> tuple[np.ndarray, np.ndarray]:
        """Mean (m,) or (m, t) and covariance (m, m) or (m, m, t) in the units of y."""
        posterior, targets = self._posterior_here(), self._targets
        mean = in_memory(targets.squeezed(targets.mean_of(posterior.mean(Xt)), ndim=2))
        cov = targets.scaled(posterior.covariance(in_memory(Xt)), power=2)
        return mean, targets.squeezed(cov, ndim=3)

    def _prior_predict(self, X: Any, return_std: bool, return_cov: bool) -> Any:
        """Mean 0 and the prior's std ``sqrt(k(x, x))`` or covariance ``K(X, X)``."""
        prior = PriorPosterior(self._given_kernel())
        Xw = as_float64(check_X(self, X, reset=False))
        if return_cov:
            _check_cov_size(Xw.shape[0])
            Xm = in_memory(Xw)
            return prior.mean(Xm), prior.covariance(Xm)
        return (prior.mean(Xw), prior.std(Xw)) if return_std else prior.mean(Xw)

    def sample_y(self, X: Rows, n_samples: int = 1, random_state: Any = 0) -> np.ndarray:
        """Draws from the posterior at X (m <= ``sqrt(MAX_COV_BYTES / 8)``), as scikit-learn
        (before ``fit``: from the prior).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)
        n_samples : int, default=1
        random_state : int, RandomState, Generator or None, default=0
            An int or RandomState draws what scikit-learn draws.

        Returns
        -------
        ndarray of shape (m, n_samples) or (m, t, n_samples)
        """
        if isinstance(n_samples, bool) or not isinstance(n_samples, Integral) or n_samples < 0:
            raise ValueError(f"n_samples must be an integer >= 0 (draws per point); got "
                             f"{n_samples!r}.")
        rng = (random_state if isinstance(random_state, np.random.Generator)
               else check_random_state(random_state))  # an int: scikit-learn's draws
        return draws(*self.predict(X, return_cov=True), n_samples, rng)


def _check_cov_size(m: int) -> None:
    if 8 * m * m > MAX_COV_BYTES:
        raise ValueError(f"return_cov=True for {m} test points builds an {m} x {m} covariance "
                         f"({8 * m * m / 2**30:.1f} GiB), more than the {MAX_COV_BYTES / 2**30:g} "
                         "GiB allowed (MAX_COV_BYTES). Use return_std=True for the pointwise "
                         "standard deviations, or ask for the covariance of fewer points.")
