"""Nadaraya–Watson kernel regression as a scikit-learn estimator over the row chunks."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..backends import resolve_backend
from ..io import Rows, is_lazy
from ..kernels import Gaussian
from ..operators.in_process import pass_scheduler
from . import _smoothing
from ._labels import labelled_fit, labelled_output, labelled_score
from ._model_file import DeclaredState, FileLayout, ModelFile
from ._validation import check_X, check_y

logger = logging.getLogger(__name__)


class NadarayaWatson(DeclaredState, RegressorMixin, BaseEstimator):
    """Nadaraya–Watson kernel regression on data larger than memory.

    The prediction at x is the kernel-weighted mean of the training targets, as Bishop
    (2006, §6.3.1) derives it from a Parzen estimate of the joint density of (x, t):

    .. math:: y(x) = \\frac{\\sum_n k\\bigl((x - x_n)/h\\bigr)\\, t_n}
                          {\\sum_m k\\bigl((x - x_m)/h\\bigr)}.

    The sums are taken in log-scaled form (a softmax-weighted mean), one pass over the
    training rows chunk by chunk: with the Gaussian kernel the prediction stays finite
    and equal to the targets' softmax-weighted mean at any distance from the data (no
    0/0) whose ``‖x − xₙ‖² / h²`` float64 can hold (below ~1.8e308). Where no training
    row is within a kernel's reach — the box kernel, weights that underflow to 0 for a
    non-Gaussian kernel, or that squared distance overflowing for every row — the
    prediction is NaN, deliberately:
    no number would be right there. For in-memory X ``predict`` also warns with how many
    rows got NaN; for lazy X the NaN rows are the signal.

    Parameters
    ----------
    kernel : {"gaussian", "box"} or dkern kernel, default="gaussian"
        ``"gaussian"``: ``exp(−‖u‖²/2)``; ``"box"``: the hypercube of side 1 (all
        ``|uᵢ| ≤ 1/2``); a dkern kernel ``k(x/h, xₙ/h)`` with non-negative values (a
        dkern ``Gaussian``, ARD included, is taken in the log domain like ``"gaussian"``).
    bandwidth : float, default=1.0
        h > 0: rows are divided by it before the kernel.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the weighted sums over the training rows are computed: numpy tiles, or KeOps
        reductions (:mod:`dkern.backends.blocks`); ``"auto"`` logs its choice and reason.
        Only a Gaussian has a KeOps log form: other kernels run numpy's block under
        ``"keops"``, logged once.

    Attributes
    ----------
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
        The training rows as given (numpy in memory; dask or Zarr rows stay lazy).
    y_fit_ : ndarray or dask.array.Array of shape (n,) or (n, T)
        The training targets, likewise.
    n_features_in_ : int
    """

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(RegressorMixin.score)

    def __init__(self, kernel: Any = "gaussian", *, bandwidth: float = 1.0,
                 backend: str = "auto") -> None:
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.backend = backend

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    @labelled_fit
    def fit(self, X: Rows, y: Rows) -> NadarayaWatson:
        """Keep the training rows and targets (nothing is computed until ``predict``).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
        y : array-like, dask array, zarr.Array or (url, path), shape (n,) or (n, T)

        Returns
        -------
        self
        """
        _smoothing.check_bandwidth(self.bandwidth)
        _smoothing.smoothing_kernel(self.kernel, any_kernel=True)
        resolve_backend(self.backend)
        Xv = check_X(self, X, reset=True)
        self.y_fit_ = check_y(y, Xv.shape[0], "NadarayaWatson")
        self.X_fit_ = X if isinstance(X, da.Array) else Xv
        self._settle_at_close()
        return self

    @labelled_output("prediction")
    @worker_failures()
    def predict(self, X: Rows) -> Any:
        """The kernel-weighted mean of the training targets at each row of X.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d)

        Returns
        -------
        ndarray of shape (m,) or (m, T); a lazy dask array for dask or Zarr X
            NaN where no training row is within the kernel's reach.
        """
        check_is_fitted(self, "y_fit_")
        Xv = check_X(self, X, reset=False)
        kernel, box = _smoothing.smoothing_kernel(self.kernel, any_kernel=True)
        with _smoothing.in_process_when_small(Xv, self.X_fit_, self.y_fit_, name="dk-nw"):
            sums = _smoothing.log_sums(Xv, self.X_fit_, self.y_fit_, kernel=kernel, box=box,
                                       bandwidth=float(self.bandwidth), name="dk-nw",
                                       backend=resolve_backend(self.backend))
            pred = da.map_blocks(_weighted_mean, sums, dtype=np.float64,
                                 chunks=(sums.chunks[0], (sums.shape[1] - 2,)))
            if self.y_fit_.ndim == 1:
                pred = pred[:, 0]
            if is_lazy(X):
                return pred
            out = pred.compute(scheduler=pass_scheduler())
        missing = int(np.isnan(out.reshape(len(out), -1)[:, 0]).sum())
        if missing:
            advice = ("their squared distances to every training row, over h², overflow "
                      "float64: rescale X" if isinstance(kernel, Gaussian) and not box else
                      f"widen the bandwidth (now {self.bandwidth}) or use the Gaussian kernel")
            warnings.warn(f"NadarayaWatson: {missing} of {len(out)} rows of X have no training "
                          f"row within the kernel's reach (all weights 0); their predictions "
                          f"are NaN: {advice}.", RuntimeWarning, stacklevel=2)
        return out

    #: The file :func:`dkern.save` writes: the training rows and targets (``n`` rows, ``d``
    #: features, ``t`` targets; "t?": (n,) or (n, t)). "kernel" as :class:`KernelDensity`'s.
    _model_file = ModelFile(marker="y_fit_", kernel="given", layouts=FileLayout(
        arrays={"X_fit": ("n", "d"), "y_fit": ("n", "t?")}, lazy=("X_fit", "y_fit"),
        scalars={"n_features_in_": "positive"}))


def _weighted_mean(sums: np.ndarray) -> np.ndarray:
    """``Σ k t / Σ k`` per row of the log-scaled sums ``[m, s₀, s₁ … s_T]``; NaN where s₀ = 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = sums[:, 2:] / sums[:, 1:2]
    out[sums[:, 1] == 0] = np.nan
    return out
