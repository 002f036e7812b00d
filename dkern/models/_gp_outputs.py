"""What the GP regressor returns: ``normalize_y``'s scaling undone on the posterior's
answers, scikit-learn's output shapes, and predictions written to a Zarr group.

With ``t = (y − μ) / s`` per target column, a latent mean m, std σ and covariance Σ of t
are ``m s + μ``, ``σ s`` and ``Σ s²`` in the units of y (as scikit-learn's
``GaussianProcessRegressor(normalize_y=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from ..errors import StoreError
from ..io import is_store_ref, write_arrays
from ..operators.in_process import pass_scheduler
from ._labels import written_arrays
from ._validation import as_float64, existing_arrays


@dataclass(frozen=True)
class TargetScaling:
    """Per-column mean and std of the targets (zeros and ones without ``normalize_y``).

    Parameters
    ----------
    mean, std : ndarray of shape (t,)
    one_dimensional : bool
        y was (n,): answers have no target axis.
    one_column : bool
        y was (n, 1): answers lose their target axis, as scikit-learn returns them.
    """

    mean: np.ndarray
    std: np.ndarray
    one_dimensional: bool
    one_column: bool

    @classmethod
    def of(cls, y: Any, normalize: bool) -> tuple[TargetScaling, Any]:
        """The scaling of y (n,) or (n, t), and the normalised targets."""
        y = as_float64(y)
        t = 1 if y.ndim == 1 else y.shape[1]
        mean, std = np.zeros(t), np.ones(t)
        if normalize:
            mean, std = (np.asarray(v, dtype=np.float64).reshape(t)
                         for v in dask.compute(y.mean(axis=0), y.std(axis=0)))
            # constant targets: a spread within the mean's rounding (relative, so that y in
            # any unit is scaled alike, as scikit-learn's one-target path is)
            constant = std <= 10 * np.finfo(np.float64).eps * np.abs(mean)
            std = np.where(constant, 1.0, std)
        scaling = cls(mean, std, y.ndim == 1, y.ndim == 2 and t == 1)
        return scaling, (y - scaling._per_column(mean)) / scaling._per_column(std)

    def _per_column(self, v: np.ndarray) -> Any:
        return v[0] if self.one_dimensional else v

    def mean_of(self, latent: Any) -> Any:
        """Means in the units of y."""
        return latent * self._per_column(self.std) + self._per_column(self.mean)

    def scaled(self, latent: Any, power: int) -> Any:
        """A latent std (power 1, shape (m,)) or covariance (power 2, (m, m)) in the units
        of y: per target column, on a new last axis, unless y was (n,)."""
        if self.one_dimensional:
            return latent * self.std[0] ** power
        return latent[..., None] * self.std ** power

    def squeezed(self, a: Any, ndim: int) -> Any:
        """``a`` without its target axis when y was one column (n, 1). ``ndim`` is ``a``'s
        with a target axis: 2 for a mean or std, 3 for a covariance (the sparse GP's mean
        has none already)."""
        return a[..., 0] if a.ndim == ndim and self.one_column else a


def write_prediction(out: Any, mean: Any, std: Any, overwrite: bool) -> None:
    """Write ``mean`` (and ``std`` unless None) to the group ``out = (url, group)``."""
    if not is_store_ref(out):
        raise TypeError(f"out must be a (url, group) tuple: a str or path-like store and a str "
                        f"group path, e.g. ('preds.zarr', 'gp'); got {out!r}.")
    if std is None and overwrite and "std" in existing_arrays(*out):
        raise StoreError(f"the group {out[1]!r} of {out[0]!r} holds a 'std' from an earlier "
                         "prediction, which a new mean alone would leave beside it, no longer "
                         "matching. Pass return_std=True to replace both, or write to another "
                         "group (nothing was written).")
    arrays = {"mean": mean} if std is None else {"mean": mean, "std": std}
    group = out[1].strip("/")
    arrays, dims, coordinates = written_arrays(out[0], group, arrays,
                                               base=group.rpartition("/")[2] or "prediction")
    write_arrays(out[0], arrays, group=group, overwrite=overwrite, dims=dims,
                 coordinates=coordinates)


def predictive(posterior: Any, targets: TargetScaling, Xt: Any, return_std: bool, out: Any,
               overwrite: bool) -> Any:
    """The mean (and std) of ``posterior`` at Xt (m, d) in the units of y: numpy for numpy
    Xt, lazy for dask Xt, or written to ``out`` (then ``out`` is returned)."""
    lazy = isinstance(Xt, da.Array)
    if not return_std:
        mean = targets.squeezed(targets.mean_of(posterior.mean(Xt)), ndim=2)
        if out is not None:
            write_prediction(out, mean, None, overwrite)
            return out
        return mean if lazy else _computed(mean)
    latent, var = posterior.mean_and_variance(Xt)
    mean = targets.mean_of(latent)
    if isinstance(var, da.Array) and not lazy and out is None:  # one pass (SGPR)
        mean, var = dask.compute(mean, var, scheduler=pass_scheduler())
    sqrt = da.sqrt if isinstance(var, da.Array) else np.sqrt
    mean = targets.squeezed(mean, ndim=2)
    std = targets.squeezed(targets.scaled(sqrt(var), power=1), ndim=2)
    if out is not None:
        write_prediction(out, mean, std, overwrite)
        return out
    return (mean, std) if lazy else (_computed(mean), std)


def _computed(a: Any) -> np.ndarray:
    """``a`` as a float64 numpy array, a dask array computed by the scheduler of the pass
    (:func:`~dkern.operators.in_process.pass_scheduler`)."""
    return np.asarray(a.compute(scheduler=pass_scheduler()) if isinstance(a, da.Array) else a,
                      dtype=np.float64)


def draws(mean: np.ndarray, cov: np.ndarray, n_samples: int,
          rng: np.random.Generator | np.random.RandomState) -> np.ndarray:
    """``n_samples`` draws of N(mean, cov): (m, n_samples), or (m, t, n_samples) for mean
    (m, t) and cov (m, m, t), in scikit-learn's order (so a RandomState draws its values)."""
    if mean.ndim == 1:
        return rng.multivariate_normal(mean, cov, n_samples).T
    return np.hstack([rng.multivariate_normal(mean[:, k], cov[..., k], n_samples).T[:, np.newaxis]
                      for k in range(mean.shape[1])])
