"""Model files: a fitted estimator as one Zarr group, published atomically, never pickled.

Layout (written by one :func:`dkern.io.write_arrays` call that replaces the whole
group, so readers see the old model or the complete new one, and the store holds
nothing of the old model after)::

    attrs:  {"dkern_model": "KernelRidge", "format": 1, "dkern_version": "0.1.0",
             "arrays": ["X_fit", "dual_coef", "residuals"],
             "kernel": "Gaussian(lengthscale=1.0)", "kernel_is_default": false,
             "params": {... get_params(deep=False) without the kernel ...},
             "fitted": {"solver_": "cg", "n_iter_": 41, "converged_": true,
                        "n_features_in_": 6, "X_fit_lazy": false, "dual_coef_lazy": false}}
    arrays: dual_coef, X_fit (exact, cg) or centers (nystrom), residuals (cg, nystrom)

"arrays" names the model's own arrays: saving over a model refuses to delete any other
array found beside them (e.g. predictions written into the model's store).

A ``GaussianProcessRegressor`` stores (:mod:`dkern.models._gp_store`) ``alpha``
(``alpha_``), ``X_train``, ``y_train`` (with ``pivot_seed`` in "fitted": the CG
preconditioner is rebuilt on first use, and from the same pivots, so its stds do not
change) and, for the exact solver, its
Cholesky factor ``L``; for ``"nystrom"`` only M-sized
arrays: ``alpha`` (the centres' weights), ``centers`` and the SGPR statistics ``L``,
``P``, ``b``, ``yty`` (their scalars ``sgpr_trace``, ``sgpr_n``, ``sgpr_jitter`` in
"fitted"), and no training data; ``kernel`` is the kernel it was
given (null for the default) and ``fitted_kernel`` its ``kernel_``; "fitted" adds
``variance_``, ``log_marginal_likelihood_value_`` (null for NaN) and the target
normalisation ``y_train_mean`` / ``y_train_std``. A ``GaussianProcessClassifier``
stores ``X_fit``, ``y_train`` and ``pi`` and its labels in "fitted" (see
:mod:`dkern.models._gpc_store`), never an n × n factor; a ``KernelLogisticRegression``
``dual_coef``, ``X_fit``, ``residuals`` and its labels (:mod:`dkern.models._klr_store`);
the memory-based ``KernelDensity``, ``NadarayaWatson`` and ``KNeighbors*`` their training
data (:mod:`dkern.models._toolbox_store`).

The kernel is stored as its ``repr`` and rebuilt by :func:`dkern.kernels.from_repr`,
which runs no Python beyond kernel names, numbers and the kernel algebra. These
attributes are covered by the store pointer's checksum, so an edited or damaged file
is refused rather than loaded as a different model; ``load`` sets only the fitted
attributes it knows. What a file must hold before ``load`` reads any array is checked
by :mod:`dkern.models._file_checks`.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import dask.array as da
import numpy as np
from sklearn.utils.validation import check_is_fitted

from .._version import __version__
from ..errors import DkernError, StoreError
from ..io import open_array, read_attrs, write_arrays
from ..kernels import Kernel, from_repr
from . import _gp_store, _gpc_store, _klr_store, _toolbox_store
from ._file_checks import MODEL_FORMAT, MODELS, checked_model_file
from ._validation import existing_arrays
from .density import KernelDensity
from .gaussian_process import GaussianProcessRegressor
from .gp_classifier import GaussianProcessClassifier
from .kernel_logistic import KernelLogisticRegression
from .kernel_ridge import KernelRidge
from .nadaraya_watson import NadarayaWatson
from .neighbors import KNeighborsClassifier, KNeighborsRegressor

__all__ = ["MODEL_FORMAT", "check_can_save", "load", "save"]

logger = logging.getLogger(__name__)

Model = (KernelRidge | GaussianProcessRegressor | GaussianProcessClassifier
         | KernelLogisticRegression | KernelDensity | NadarayaWatson | KNeighborsRegressor
         | KNeighborsClassifier)
#: The array that marks each model as fitted.
_FITTED_ARRAY = {"KernelRidge": "dual_coef_", "GaussianProcessRegressor": "alpha_",
                 "GaussianProcessClassifier": "pi_", "KernelLogisticRegression": "dual_coef_",
                 **_toolbox_store.FITTED_ARRAY}


def save(model: Model, url: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Save a fitted model to a Zarr store, all of it published in one atomic step.

    Parameters
    ----------
    model : a fitted dkern estimator
        KernelRidge, GaussianProcessRegressor, GaussianProcessClassifier,
        KernelLogisticRegression, KernelDensity, NadarayaWatson, KNeighborsRegressor or
        KNeighborsClassifier. Lazy (dask/Zarr) training rows and coefficients are written
        chunk by chunk, never gathered on the client.
    url : str or os.PathLike
        A local path or fsspec URL; the model is the store's top-level group.
    overwrite : bool, default False
        Replace a model already there. Readers see the old model until the new one
        is complete; then the store holds exactly the new model (the old one's arrays
        are deleted). Lazy arrays of ``model`` that are this store's own arrays (a
        model loaded from ``url``) are kept in place, so the model stays usable.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        The model is not fitted.
    DkernError
        The kernel cannot be rebuilt from its ``repr`` (``warp`` with a Python function).
    StoreError
        The store already holds a model and ``overwrite`` is False.
    """
    if not isinstance(model, tuple(MODELS.values())):
        raise TypeError(f"save takes a fitted dkern model ({sorted(MODELS)}); got "
                        f"{type(model).__name__}.")
    kind = type(model).__name__
    check_is_fitted(model, _FITTED_ARRAY[kind])
    url = os.fspath(url)
    if kind in _toolbox_store.FITTED_NAMES:  # the memory-based models: their training data
        check_can_save(url, overwrite=overwrite)
        arrays = _toolbox_store.arrays(model)
        write_arrays(url, arrays, overwrite=overwrite, replace_all=True,
                     attrs={"dkern_model": kind, "format": MODEL_FORMAT,
                            "dkern_version": __version__, "arrays": sorted(arrays),
                            **_toolbox_store.attrs(model, _kernel_text)})
        logger.info("saved %s to %r", kind, url)
        return
    kernel_text = _fitted_kernel_text(model.kernel_)
    is_gp = isinstance(model, GaussianProcessRegressor | GaussianProcessClassifier)
    check_can_save(url, overwrite=overwrite)
    if isinstance(model, GaussianProcessClassifier):
        arrays = _gpc_store.arrays(model)
    elif isinstance(model, KernelLogisticRegression):
        arrays = _klr_store.arrays(model)
    else:
        arrays = _gp_store.arrays(model) if is_gp else _krr_arrays(model)
    attrs = {"dkern_model": type(model).__name__, "format": MODEL_FORMAT,
             "dkern_version": __version__, "arrays": sorted(arrays), "kernel": kernel_text,
             "kernel_is_default": model.kernel is None, "params": _json_params(model),
             "fitted": _fitted_scalars(model)}
    if is_gp:  # learned hyperparameters: the fitted kernel differs from the one given
        attrs["kernel"] = _kernel_text(model.kernel) if model.kernel is not None else None
        attrs["fitted_kernel"] = kernel_text
    write_arrays(url, arrays, attrs=attrs, overwrite=overwrite, replace_all=True)
    logger.info("saved %s (solver %s) to %r", type(model).__name__, model.solver_, url)


def _krr_arrays(model: KernelRidge) -> dict[str, Any]:
    arrays: dict[str, Any] = {"dual_coef": model.dual_coef_}
    if model.solver_ == "nystrom":
        arrays["centers"] = model.centers_
    else:
        arrays["X_fit"] = model.X_fit_
    if model.residuals_ is not None:
        arrays["residuals"] = model.residuals_
    return arrays


def load(url: str | os.PathLike[str]) -> Model:
    """Load a model saved with :func:`save`.

    Parameters
    ----------
    url : str or os.PathLike

    Returns
    -------
    a dkern estimator (any that :func:`save` takes)
        Fitted; its predictions equal the saved model's. Arrays that were lazy when
        saved (dask/Zarr training rows, cg's dask coefficients) come back as lazy dask
        arrays reading this store; the others are loaded into memory.

    Raises
    ------
    StoreError
        No store at ``url``, a store that is not a dkern model, a model written in
        another format or by an incompatible (different major) dkern version, or a
        model file that was edited or damaged.
    MemoryLimitError
        The arrays loaded into memory claim more bytes than this machine has available
        (checked, like everything above, before any array is read).
    """
    url = os.fspath(url)
    attrs, fitted = checked_model_file(url)
    kind = attrs["dkern_model"]
    if kind in _toolbox_store.FITTED_NAMES:
        model = _toolbox_store.restore(MODELS[kind], attrs, fitted,
                                       lambda name, lazy: _read(url, name, lazy=lazy))
        _set_fitted(model, fitted)
        return model
    given = None if attrs["kernel_is_default"] else _kernel(url, attrs, "kernel")
    model = MODELS[kind](kernel=given, **attrs["params"])
    model.kernel_ = _kernel(url, attrs, "fitted_kernel" if attrs.get("fitted_kernel") else "kernel")
    if isinstance(model, GaussianProcessRegressor):
        _gp_store.restore(model, fitted, lambda name, lazy: _read(url, name, lazy=lazy))
    elif isinstance(model, GaussianProcessClassifier):
        _gpc_store.restore(model, fitted, lambda name, lazy: _read(url, name, lazy=lazy))
    elif isinstance(model, KernelLogisticRegression):
        _klr_store.restore(model, fitted, lambda name, lazy: _read(url, name, lazy=lazy))
    else:
        _restore_krr(model, url, fitted)
    _set_fitted(model, fitted)
    return model


def _kernel(url: str, attrs: dict[str, Any], key: str) -> Kernel | list[Kernel]:
    """The kernel (a list of them for a one-vs-rest classifier) the attribute ``key`` holds."""
    text = attrs[key]
    try:
        return [from_repr(t) for t in text] if isinstance(text, list) else from_repr(text)
    except ValueError as err:
        raise StoreError(f"{url!r}: the model's attribute {key!r} is not a kernel dkern can "
                         f"rebuild ({err}). The file was not written by dkern.save (or was "
                         "edited after); save the model again.") from None


def _set_fitted(model: Model, fitted: dict[str, Any]) -> None:
    """Set the fitted scalars :func:`._file_checks.checked_model_file` let through."""
    if "feature_names_in_" in fitted:
        fitted["feature_names_in_"] = np.asarray(fitted["feature_names_in_"], dtype=object)
    for name, value in fitted.items():
        setattr(model, name, value)


def _restore_krr(model: KernelRidge, url: str, fitted: dict[str, Any]) -> None:
    """Set KernelRidge's fitted arrays; pop their entries from ``fitted``."""
    model.dual_coef_ = _read(url, "dual_coef", lazy=fitted.pop("dual_coef_lazy"))
    x_fit_lazy = fitted.pop("X_fit_lazy")
    if fitted["solver_"] == "nystrom":
        model.centers_ = _read(url, "centers", lazy=False)
    else:
        model.X_fit_ = _read(url, "X_fit", lazy=x_fit_lazy)
    model.residuals_ = _read(url, "residuals", lazy=False) if fitted["solver_"] != "exact" else None


def _fitted_kernel_text(kernel: Kernel | list[Kernel]) -> str | list[str]:
    """:func:`_kernel_text` of a kernel, or of each (a one-vs-rest classifier's list)."""
    return [_kernel_text(k) for k in kernel] if isinstance(kernel, list) else _kernel_text(kernel)


def _kernel_text(kernel: Kernel) -> str:
    """``repr(kernel)``, after checking that ``from_repr`` rebuilds an equal kernel."""
    text = repr(kernel)
    try:
        same = from_repr(text) == kernel
    except ValueError:
        same = False
    if not same:
        raise DkernError(
            f"cannot save a model whose kernel is {text}: a model file stores the kernel as its "
            "repr and rebuilds it with dkern.kernels.from_repr, and this one does not round-trip "
            "(warp(k, f) holds an arbitrary Python function, and dkern never pickles). Fit with "
            "a kernel built from dkern's kernels and their algebra (+, *, **, exp) to save it.")
    return text


def _json_params(model: Model) -> dict[str, Any]:
    params = model.get_params(deep=False)
    params.pop("kernel")
    if callable(params.get("optimizer")):
        warnings.warn(f"optimizer={params['optimizer']!r} (a function) cannot be stored in a "
                      "model file; the loaded model gets optimizer='lbfgs' (this only matters "
                      "if it is refitted).", UserWarning, stacklevel=3)
        params["optimizer"] = "lbfgs"
    # numpy scalars (from np.arange/np.logspace grids) and one-value arrays (alpha, as
    # scikit-learn takes it) are stored as the Python numbers they are
    params = {k: v.item() if isinstance(v, (np.generic, np.ndarray)) and np.size(v) == 1
              else v for k, v in params.items()}
    params = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in params.items()}
    seed = params["random_state"]
    if seed is not None and not isinstance(seed, int):
        warnings.warn(f"random_state={seed!r} cannot be stored in a model file; the loaded "
                      "model gets random_state=None (this only matters if it is refitted). "
                      "Fit with an int random_state to keep it.", UserWarning, stacklevel=3)
        params["random_state"] = None
    return params


def _fitted_scalars(model: Model) -> dict[str, Any]:
    if isinstance(model, GaussianProcessClassifier):
        return _gpc_store.fitted(model)
    if isinstance(model, KernelLogisticRegression):
        return _klr_store.fitted(model)
    fitted: dict[str, Any] = {
        "solver_": model.solver_, "n_iter_": int(model.n_iter_),
        "converged_": bool(model.converged_), "n_features_in_": int(model.n_features_in_)}
    if isinstance(model, GaussianProcessRegressor):
        fitted.update(_gp_store.fitted(model))
    else:
        fitted.update({"dual_coef_lazy": isinstance(model.dual_coef_, da.Array),
                       "X_fit_lazy": isinstance(getattr(model, "X_fit_", None), da.Array)})
    if hasattr(model, "feature_names_in_"):
        fitted["feature_names_in_"] = [str(name) for name in model.feature_names_in_]
    return fitted


def check_can_save(url: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Raise the error :func:`save` would raise for ``url`` before any work is done.

    Call it before a long fit whose model goes to ``url``, so a name already taken
    is reported at once rather than after the fit.

    Raises
    ------
    StoreError
        The store already holds a model and ``overwrite`` is False, or it holds data
        arrays, beside a model or not (a model file replaces every array of its store's
        top-level group, so that is refused even with ``overwrite``).
    """
    url = os.fspath(url)
    found = _existing_attrs(url)
    present = existing_arrays(url)
    # files written before "arrays" was stored: all their arrays count as the model's
    data = sorted(set(present) - set(found.get("arrays", present))) if "dkern_model" in found \
        else present
    if data:  # never offer overwrite here: it would delete the data arrays
        beside = f"a saved {found['dkern_model']} model and " if "dkern_model" in found else ""
        raise StoreError(f"{url!r} holds {beside}data arrays {data}, not part of a saved "
                         "model; a model file replaces every array of its store. Save the "
                         "model to a store of its own, e.g. a new path ending in .zarr, or "
                         "move those arrays.")
    if "dkern_model" in found and not overwrite:
        raise StoreError(f"{url!r} already holds a saved {found['dkern_model']} model; pass "
                         "overwrite=True to replace it (the old one stays readable until the "
                         "new one is complete).")


def _existing_attrs(url: str) -> dict[str, Any]:
    """The attributes of the store at ``url``; ``{}`` if there is none yet."""
    try:
        return read_attrs(url)
    except StoreError:
        return {}


def _read(url: str, name: str, *, lazy: bool) -> Any:
    x = open_array(url, name)
    return x if lazy else x.compute()
