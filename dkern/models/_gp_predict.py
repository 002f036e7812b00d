"""Predictions of a fitted :class:`~dkern.models.GaussianProcessRegressor`.

The mean ``K(X*, X) alpha_`` (or the sparse GP's), and the latent variance or covariance
by the model's ``variance_`` method: ``"exact"`` (triangular solves with ``L_``,
:mod:`._gp_exact`), ``"cg"`` (block CG per batch of test points, :mod:`._gp_cg`),
``"lanczos"`` (LOVE's decomposition, cached on the model, :mod:`._gp_lanczos`) or
``"nystrom"`` (the SGPR predictive, :mod:`._gp_sparse`); then undone ``normalize_y``
and delivered as numpy, lazy dask, or written chunk by chunk to a Zarr group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import numpy as np

from ..errors import StoreError
from ..io import is_store_ref, write_arrays
from ..operators import gram
from ..solvers.sgpr import sgpr_predict
from . import _gp_exact, _gp_lanczos, _gp_sparse
from ._gp_cg import cg_covariance, cg_variance
from ._validation import check_tol, existing_arrays, in_memory

if TYPE_CHECKING:
    from .gaussian_process import GaussianProcessRegressor


def predict(gp: GaussianProcessRegressor, X: Any, return_std: bool, return_cov: bool,
            out: Any, overwrite: bool) -> Any:
    """``gp.predict`` on checked float64 test rows X (m, d); see its docstring."""
    lazy = isinstance(X, da.Array)
    mean: Any
    var: Any
    if gp.solver_ == "nystrom":  # mean and variance from one pass over the test rows
        latent, var = sgpr_predict(gp._stats, gp._checked_alpha("nystrom"), X)
        mean, var = _unnormalized(gp, latent), var if return_std else None
        if return_std and not lazy and out is None:
            mean, var = dask.compute(mean, var)
    else:
        mean = _unnormalized(gp, gram(gp.kernel_, X, gp.X_train_, backend=gp.backend,
                                      dtype=np.float64, name="dkern-predict") @ gp.alpha_)
        var = _latent_variance(gp, X) if return_std else None
    mean = _single_target_squeezed(gp, mean, ndim=2)
    if return_cov:
        cov = _latent_covariance(gp, in_memory(X))
        return in_memory(mean), _single_target_squeezed(gp, _scaled(gp, cov, power=2), ndim=3)
    std = None if var is None else _single_target_squeezed(gp, _scaled(
        gp, da.sqrt(var) if isinstance(var, da.Array) else np.sqrt(var), power=1), ndim=2)
    if out is not None:
        _write_prediction(out, mean, std, overwrite)
        return out
    if lazy:
        return mean if std is None else (mean, std)
    return in_memory(mean) if std is None else (in_memory(mean), std)


def _unnormalized(gp: GaussianProcessRegressor, latent: Any) -> Any:
    """Means in the units of y (undoing ``normalize_y``)."""
    if gp.alpha_.ndim == 1:
        return latent * gp._y_train_std[0] + gp._y_train_mean[0]
    return latent * gp._y_train_std + gp._y_train_mean


def _scaled(gp: GaussianProcessRegressor, latent: Any, power: int) -> Any:
    """Latent std (power 1) or covariance (power 2) in the units of y, per target."""
    if gp.alpha_.ndim == 1:
        return latent * gp._y_train_std[0] ** power
    factor = gp._y_train_std ** power
    return latent[..., None] * factor


def _single_target_squeezed(gp: GaussianProcessRegressor, a: Any, ndim: int) -> Any:
    """``a`` without its target axis when y was one column (n, 1), as scikit-learn returns.

    ``ndim`` is ``a``'s with a target axis: 2 for a mean or std, 3 for a covariance (the
    sparse GP's mean has none already).
    """
    if a.ndim == ndim and gp.alpha_.ndim == 2 and gp.alpha_.shape[1] == 1:
        return a[..., 0]
    return a


def _latent_variance(gp: GaussianProcessRegressor, X: Any) -> Any:
    """``k(x*, x*) - k_*ᵀ C⁻¹ k_*``: numpy (m,) for numpy X, dask for dask X."""
    if gp.variance_ == "exact":
        if isinstance(X, np.ndarray):
            return _gp_exact.variance(gp.kernel_, np.asarray(gp.X_train_), gp.L_, X)
        return da.map_blocks(_gp_exact.variance_block, X, drop_axis=1, dtype=np.float64,
                             meta=np.empty((0,)), kernel=gp.kernel_,
                             X=dask.delayed(gp.X_train_), L=dask.delayed(gp.L_))
    alpha = gp._checked_alpha("cg")
    if gp.variance_ == "lanczos":
        return _gp_lanczos.variance(gp._lanczos_decomposition(alpha), gp.kernel_, gp.X_train_,
                                    X, gp.backend)
    var = cg_variance(gp.kernel_, gp.X_train_, gp._operator(alpha),
                      gp._cg_preconditioner(alpha), in_memory(X),
                      tol=check_tol(gp.tol), backend=gp.backend)
    return da.from_array(var, chunks=(X.chunks[0],)) if isinstance(X, da.Array) else var


def _latent_covariance(gp: GaussianProcessRegressor, Xt: np.ndarray) -> np.ndarray:
    if gp.variance_ == "nystrom":
        return _gp_sparse.covariance(gp._stats, gp._checked_alpha("nystrom"), Xt)
    if gp.variance_ == "exact":
        return _gp_exact.covariance(gp.kernel_, np.asarray(gp.X_train_), gp.L_, Xt)
    alpha = gp._checked_alpha("cg")
    if gp.variance_ == "lanczos":
        return _gp_lanczos.covariance(gp._lanczos_decomposition(alpha), gp.kernel_,
                                      gp.X_train_, Xt, gp.backend)
    return cg_covariance(gp.kernel_, gp.X_train_, gp._operator(alpha),
                         gp._cg_preconditioner(alpha), Xt, tol=check_tol(gp.tol),
                         backend=gp.backend)


def _write_prediction(out: Any, mean: da.Array, std: Any, overwrite: bool) -> None:
    if not is_store_ref(out):
        raise TypeError(f"out must be a (url, group) tuple: a str or path-like store and a str "
                        f"group path, e.g. ('preds.zarr', 'gp'); got {out!r}.")
    if std is None and overwrite and "std" in existing_arrays(*out):
        raise StoreError(f"the group {out[1]!r} of {out[0]!r} holds a 'std' from an earlier "
                         "prediction, which a new mean alone would leave beside it, no longer "
                         "matching. Pass return_std=True to replace both, or write to another "
                         "group (nothing was written).")
    arrays = {"mean": mean} if std is None else {"mean": mean, "std": std}
    write_arrays(out[0], arrays, group=out[1], overwrite=overwrite)

