"""Parzen kernel density estimation as a scikit-learn estimator over the row chunks."""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..backends import resolve_backend
from ..io import Rows, is_lazy
from ..kernels import Gaussian, Kernel
from ..kernels.profiles import PROFILES, RadialProfile
from ..solvers.sampling import gather_rows
from . import _smoothing
from ._labels import labelled_fit, labelled_output, labelled_score
from ._model_file import DeclaredState, FileLayout, ModelFile
from ._validation import as_generator, check_sample_weight, check_X, in_memory

logger = logging.getLogger(__name__)


class KernelDensity(DeclaredState, BaseEstimator):
    """Parzen kernel density estimation on data larger than memory.

    The density of the N training rows xₙ (D features) at x is Parzen's estimate
    (Bishop 2006, §2.5.1)

    .. math:: p(x) = \\frac1N \\sum_{n=1}^N \\frac1{h^D}\\, k\\Bigl(\\frac{x - x_n}{h}\\Bigr),

    with k normalised to integrate to 1, so p does too. ``score_samples`` returns
    ``log p(x)`` by a log-sum-exp over the training rows, read chunk by chunk: no
    underflow to ``-inf`` far from the data with the Gaussian kernel (``-inf`` only where
    ``‖x − xₙ‖² / h²`` overflows float64 for every training row, as scikit-learn's).

    Kernels: ``"gaussian"``, ``k(u) = (2π)^{-D/2} exp(-‖u‖²/2)``, equal to
    :class:`sklearn.neighbors.KernelDensity` with ``kernel="gaussian"`` and the same
    bandwidth; ``"box"``, Bishop's hypercube ``k(u) = 1`` where every ``|uᵢ| ≤ 1/2``
    (side h, volume h^D), else 0; scikit-learn's other kernels by their names and
    definitions, ``k(u) ∝ g(‖u‖)`` with ``g(r)`` = ``"tophat"`` 1, ``"epanechnikov"``
    ``1 − r²``, ``"linear"`` ``1 − r``, ``"cosine"`` ``cos(πr/2)`` (each for r < 1, else 0),
    ``"exponential"`` ``e^{−r}`` (:mod:`dkern.kernels.profiles`), equal to scikit-learn's;
    a dkern ``Gaussian(lengthscale=ℓ)`` (ARD allowed), the normal density of covariance
    ``diag(h²ℓ²)``.

    Parameters
    ----------
    kernel : {"gaussian", "box", "tophat", "epanechnikov", "exponential", "linear", \
"cosine"} or dkern Gaussian, default="gaussian"
    bandwidth : float or {"scott", "silverman"}, default=1.0
        h > 0, or a rule of thumb computed at fit from the N rows and D features as
        scikit-learn does: Scott's ``N^(-1/(D+4))``, Silverman's
        ``(N (D+2) / 4)^(-1/(D+4))`` (for standardised features).
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the log-sum-exp over the training rows is computed: numpy tiles, or KeOps
        reductions (:mod:`dkern.backends.blocks`); ``"auto"`` logs its choice and reason.

    Attributes
    ----------
    X_fit_ : ndarray or dask.array.Array of shape (N, D)
        The training rows as given (numpy in memory; dask or Zarr rows stay lazy).
    bandwidth_ : float
        The h used: ``bandwidth``, or its rule's value.
    sample_weight_ : ndarray or dask.array.Array of shape (N,), or None
        The row weights given to ``fit`` (None: every row weighs 1).
    log_norm_ : float
        ``log p(x) = log Σₙ wₙ κ((x − xₙ)/h) + log_norm_`` with κ the kernel without its
        constant (``exp(−‖u‖²/2ℓ²)``, or the box's 1): ``−log Σₙ wₙ − log(h^D ∫κ)``.
    n_features_in_ : int
    """

    def __init__(self, kernel: Any = "gaussian", *, bandwidth: float | str = 1.0,
                 backend: str = "auto") -> None:
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.backend = backend

    @labelled_fit
    def fit(self, X: Rows, y: Rows | None = None,
            sample_weight: Rows | None = None) -> KernelDensity:
        """Keep the training rows (nothing is computed until a density is asked for).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (N, D)
        y : None
            Ignored.
        sample_weight : array-like or dask array of shape (N,), optional
            Row weights ``wₙ >= 0`` (a positive sum), as scikit-learn's:
            ``p(x) = Σ wₙ h⁻ᴰ k((x − xₙ)/h) / Σ wₙ``. Dask weights stay lazy.

        Returns
        -------
        self
        """
        rule = self.bandwidth if isinstance(self.bandwidth, str) else None
        if rule not in (None, *BANDWIDTH_RULES):
            raise ValueError(f"bandwidth must be a number > 0 or one of "
                             f"{sorted(BANDWIDTH_RULES)}; got {self.bandwidth!r}.")
        if rule is None:
            _smoothing.check_bandwidth(self.bandwidth)
        kernel, box = _smoothing.smoothing_kernel(self.kernel, any_kernel=False)
        resolve_backend(self.backend)
        Xv = check_X(self, X, reset=True)
        n, d = Xv.shape
        weights, total = (None, n) if sample_weight is None else \
            check_sample_weight(sample_weight, n)
        h = BANDWIDTH_RULES[rule](n, d) if rule else float(self.bandwidth)
        self.bandwidth_ = h
        if box:
            volume = d * np.log(h)
        elif isinstance(kernel, RadialProfile):
            volume = d * np.log(h) + kernel.log_integral(d)
        else:
            ell = _lengthscales(kernel, d)
            volume = d / 2 * np.log(2 * np.pi) + np.log(h * ell).sum()
        self.log_norm_ = float(-np.log(total) - volume)
        self.X_fit_ = X if isinstance(X, da.Array) else Xv
        self.sample_weight_ = weights
        logger.info("KernelDensity: %d rows, %d features, %s kernel, bandwidth %g%s", n, d,
                    "box" if box else getattr(kernel, "profile", "Gaussian"), h,
                    "" if weights is None else ", weighted rows")
        self._settle_at_close()
        return self

    @labelled_output("log_density")
    @worker_failures()
    def score_samples(self, X: Rows) -> Any:
        """The log-density ``log p(x)`` of each row of X.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, D)

        Returns
        -------
        ndarray of shape (m,); a lazy dask array for dask or Zarr X
            ``-inf`` where the density is 0 (the box kernel, no training row in reach).
        """
        check_is_fitted(self, "log_norm_")
        Xv = check_X(self, X, reset=False)
        kernel, box = _smoothing.smoothing_kernel(self.kernel, any_kernel=False)
        weights = self.sample_weight_
        with _smoothing.in_process_when_small(Xv, self.X_fit_, weights, name="dk-kde"):
            sums = _smoothing.log_sums(Xv, self.X_fit_, weights, kernel=kernel, box=box,
                                       bandwidth=self.bandwidth_, name="dk-kde",
                                       backend=resolve_backend(self.backend))
            # [m, Σk, Σkw]/e^m: the weighted sum is the last column
            logp = da.map_blocks(_log_density, sums, offset=self.log_norm_, drop_axis=1,
                                 dtype=np.float64, meta=np.empty(0))
            return _smoothing.finish(logp, is_lazy(X))

    @labelled_score
    def score(self, X: Rows, y: Rows | None = None) -> float:
        """The total log-likelihood ``Σ log p(x)`` of the rows of X (as scikit-learn's).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, D)
        y : None
            Ignored.
        """
        logp = self.score_samples(X)
        return float(logp.sum().compute() if isinstance(logp, da.Array) else logp.sum())

    def sample(self, n_samples: int = 1, random_state: Any = None) -> np.ndarray:
        """Draw from the density: a random training row plus a draw from the kernel.

        Parameters
        ----------
        n_samples : int, default=1
        random_state : int, numpy Generator or RandomState, optional

        Returns
        -------
        ndarray of shape (n_samples, D)
        """
        check_is_fitted(self, "log_norm_")
        if isinstance(self.kernel, str) and self.kernel in PROFILES and self.kernel != "tophat":
            raise NotImplementedError(f"sample() draws from the 'gaussian', 'box' and 'tophat' "
                                      f"kernels (as scikit-learn, which also refuses the "
                                      f"others); got kernel={self.kernel!r}.")
        if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) \
                or n_samples < 1:
            raise ValueError(f"n_samples must be an integer >= 1; got {n_samples!r}.")
        rng = as_generator(random_state)
        kernel, box = _smoothing.smoothing_kernel(self.kernel, any_kernel=False)
        weights = self.sample_weight_
        if weights is None:
            idx = rng.integers(self.X_fit_.shape[0], size=int(n_samples))
        else:  # rows drawn in proportion to their weights, as scikit-learn's
            cumulative = np.cumsum(in_memory(weights))
            idx = np.searchsorted(cumulative, rng.uniform(0, cumulative[-1], int(n_samples)),
                                  side="right")
        rows = (gather_rows(self.X_fit_, idx) if isinstance(self.X_fit_, da.Array)
                else in_memory(self.X_fit_)[idx])
        h, shape = self.bandwidth_, rows.shape
        if box:
            return rows + h * rng.uniform(-0.5, 0.5, size=shape)
        if isinstance(kernel, RadialProfile):
            return rows + h * _uniform_in_ball(rng, shape)
        return rows + h * _lengthscales(kernel, shape[1]) * rng.standard_normal(size=shape)

    def _set_file_state(self, state: dict[str, Any]) -> None:
        """Files saved before ``bandwidth_`` existed held only a number in ``bandwidth``."""
        super()._set_file_state(state)
        if "bandwidth_" not in state:
            self.bandwidth_ = _smoothing.check_bandwidth(self.bandwidth)

    #: The file :func:`dkern.save` writes: the training rows (``n`` × ``d``) and, when
    #: given, their weights (``n``). "kernel" is a dkern kernel's repr, or null for a named
    #: one (then in "params").
    _model_file = ModelFile(marker="log_norm_", kernel="given", layouts=FileLayout(
        arrays={"X_fit": ("n", "d"), "sample_weight": ("n",)}, lazy=("X_fit", "sample_weight"),
        optional=("sample_weight",),
        scalars={"n_features_in_": "positive", "log_norm_": "number",
                 "bandwidth_": "number"}))


#: scikit-learn's rules of thumb for the bandwidth, from N rows and D features.
BANDWIDTH_RULES: dict[str, Any] = {
    "scott": lambda n, d: n ** (-1 / (d + 4)),
    "silverman": lambda n, d: (n * (d + 2) / 4) ** (-1 / (d + 4)),
}


def _lengthscales(kernel: Kernel | None, d: int) -> np.ndarray:
    """The Gaussian's lengthscale per feature: ``h·ℓ`` is the kernel's standard deviation."""
    assert isinstance(kernel, Gaussian)
    return np.broadcast_to(np.asarray(kernel.lengthscale, dtype=np.float64), (d,))


def _log_density(sums: np.ndarray, offset: float) -> np.ndarray:
    """``m + log s + offset`` per row of the log-scaled sums, s their last column (s₀, or
    the weighted s₁); ``-inf`` where s = 0."""
    with np.errstate(divide="ignore"):
        return sums[:, 0] + np.log(sums[:, -1]) + offset


def _uniform_in_ball(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Points uniform in the unit ball of ``R^shape[1]``: a normal direction, radius
    ``U^(1/D)``."""
    direction = rng.standard_normal(size=shape)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    return direction * rng.uniform(size=(shape[0], 1)) ** (1 / shape[1])
