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

A ``GaussianProcessRegressor`` stores ``alpha`` (``alpha_``), ``X_train``, ``y_train``
(with ``pivot_seed`` in "fitted": the CG preconditioner is rebuilt on first use, and
from the same pivots, so its stds do not change) and, for the exact solver, its
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
attributes it knows.
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
from ..io._store import Url, open_group, read_pointer
from ..kernels import Kernel, from_repr
from . import _gp_sparse, _gpc_store, _klr_store, _toolbox_store
from ._validation import (
    check_file_values,
    check_fits_in_memory,
    check_stored_shapes,
    existing_arrays,
    fixed_seed,
)
from .density import KernelDensity
from .gaussian_process import GaussianProcessRegressor
from .gp_classifier import GaussianProcessClassifier
from .kernel_logistic import KernelLogisticRegression
from .kernel_ridge import KernelRidge
from .nadaraya_watson import NadarayaWatson
from .neighbors import KNeighborsClassifier, KNeighborsRegressor

__all__ = ["MODEL_FORMAT", "check_can_save", "load", "save"]

logger = logging.getLogger(__name__)

#: Layout version of model stores; ``load`` refuses any other.
MODEL_FORMAT = 1
_MODELS = {"KernelRidge": KernelRidge, "GaussianProcessRegressor": GaussianProcessRegressor,
           "GaussianProcessClassifier": GaussianProcessClassifier,
           "KernelLogisticRegression": KernelLogisticRegression, "KernelDensity": KernelDensity,
           "NadarayaWatson": NadarayaWatson, "KNeighborsRegressor": KNeighborsRegressor,
           "KNeighborsClassifier": KNeighborsClassifier}
Model = (KernelRidge | GaussianProcessRegressor | GaussianProcessClassifier
         | KernelLogisticRegression | KernelDensity | NadarayaWatson | KNeighborsRegressor
         | KNeighborsClassifier)
_COMMON = frozenset({"solver_", "n_iter_", "converged_", "n_features_in_", "feature_names_in_"})
#: What ``_fitted_scalars`` writes and ``load`` accepts in the "fitted" attribute, per model.
_FITTED_NAMES = {
    "KernelRidge": _COMMON | {"dual_coef_lazy", "X_fit_lazy"},
    "GaussianProcessRegressor": _COMMON | {
        "variance_", "log_marginal_likelihood_value_", "y_train_mean", "y_train_std",
        "alpha_lazy", "X_train_lazy", "y_train_lazy", "pivot_seed"},
    "GaussianProcessClassifier": _gpc_store.FITTED_NAMES,
    "KernelLogisticRegression": _klr_store.FITTED_NAMES,
    **_toolbox_store.FITTED_NAMES,
}
#: The GP's "fitted" names that depend on the solver: training data and the seed of the CG
#: preconditioner's pivots (rebuilt on first use), or SGPR's scalars.
_GP_DATA = frozenset({"X_train_lazy", "y_train_lazy", "pivot_seed"})
_GP_SPARSE = frozenset({"sgpr_trace", "sgpr_n", "sgpr_jitter"})
#: "fitted" names a file may lack: feature names (fitted on arrays without them) and the
#: pivot seed (files written before dkern stored it).
_OPTIONAL = frozenset({"feature_names_in_", "pivot_seed"})
#: The array that marks each model as fitted.
_FITTED_ARRAY = {"KernelRidge": "dual_coef_", "GaussianProcessRegressor": "alpha_",
                 "GaussianProcessClassifier": "pi_", "KernelLogisticRegression": "dual_coef_",
                 **_toolbox_store.FITTED_ARRAY}
_REQUIRED = ("kernel", "kernel_is_default", "params", "fitted")
#: The kind (a key of ``_validation.FILE_VALUE_KINDS``) of each "fitted" scalar; every
#: ``*_lazy`` flag is a bool. The classifier's ``n_iter_`` has one count per binary problem.
_FITTED_KINDS = {
    "solver_": "str", "n_iter_": "count", "converged_": "bool", "n_features_in_": "positive",
    "feature_names_in_": "strings", "variance_": "str",
    "log_marginal_likelihood_value_": "number or null", "y_train_mean": "numbers",
    "y_train_std": "numbers", "pivot_seed": "count", "sgpr_trace": "number",
    "sgpr_n": "positive", "sgpr_jitter": "number", "n_classes_": "positive",
    "classes_": "labels", "classes_dtype": "label dtype", "log_norm_": "number",
    "n_samples_fit_": "positive"}
#: The solvers whose arrays ``load`` knows, per model (the memory-based models have none).
_SOLVERS = {"KernelRidge": ("exact", "cg", "nystrom"),
            "GaussianProcessRegressor": ("exact", "cg", "nystrom"),
            "GaussianProcessClassifier": _gpc_store.SOLVERS,
            "KernelLogisticRegression": _klr_store.SOLVERS}


def save(model: Model, url: Url, *, overwrite: bool = False) -> None:
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
    if not isinstance(model, tuple(_MODELS.values())):
        raise TypeError(f"save takes a fitted dkern model ({sorted(_MODELS)}); got "
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
        arrays = _gp_arrays(model) if is_gp else _krr_arrays(model)
    attrs = {"dkern_model": type(model).__name__, "format": MODEL_FORMAT,
             "dkern_version": __version__, "arrays": sorted(arrays), "kernel": kernel_text,
             "kernel_is_default": model.kernel is None, "params": _json_params(model),
             "fitted": _fitted_scalars(model)}
    if is_gp:  # learned hyperparameters: the fitted kernel differs from the one given
        attrs["kernel"] = _kernel_text(model.kernel) if model.kernel is not None else None
        attrs["fitted_kernel"] = kernel_text
    write_arrays(url, arrays, attrs=attrs, overwrite=overwrite, replace_all=True)
    logger.info("saved %s (solver %s) to %r", type(model).__name__, model.solver_, url)


#: The arrays of a KernelRidge file per solver, by dimension (``n`` training rows, ``m``
#: centres, ``d`` features, ``t`` targets, ``r`` residual rows); "t?": (n,) or (n, t).
_KRR_SHAPES = {
    "exact": {"X_fit": ("n", "d"), "dual_coef": ("n", "t?")},
    "cg": {"X_fit": ("n", "d"), "dual_coef": ("n", "t?"), "residuals": ("r", "t")},
    "nystrom": {"centers": ("m", "d"), "dual_coef": ("m", "t?"), "residuals": ("r", "t")}}
_GP_SHAPES = {
    "exact": {"X_train": ("n", "d"), "y_train": ("n", "t?"), "alpha": ("n", "t?"),
              "L": ("n", "n")},
    "cg": {"X_train": ("n", "d"), "y_train": ("n", "t?"), "alpha": ("n", "t?")},
    "nystrom": {"centers": ("m", "d"), "alpha": ("m", "t?"), "L": ("m", "m"), "P": ("m", "m"),
                "b": ("m", "t"), "yty": ("t",)}}


def _krr_arrays(model: KernelRidge) -> dict[str, Any]:
    arrays: dict[str, Any] = {"dual_coef": model.dual_coef_}
    if model.solver_ == "nystrom":
        arrays["centers"] = model.centers_
    else:
        arrays["X_fit"] = model.X_fit_
    if model.residuals_ is not None:
        arrays["residuals"] = model.residuals_
    return arrays


def _gp_arrays(model: GaussianProcessRegressor) -> dict[str, Any]:
    if model.solver_ == "nystrom":
        stats = model._stats
        return {"alpha": model.alpha_, "centers": model.centers_, "L": stats.L, "P": stats.P,
                "b": stats.b, "yty": stats.yty}
    arrays = {"alpha": model.alpha_, "X_train": model.X_train_, "y_train": model.y_train_}
    if model.solver_ == "exact":
        arrays["L"] = model.L_
    return arrays


def load(url: Url) -> Model:
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
    """
    url = os.fspath(url)
    attrs, manifest = _stored(url)
    kind = attrs["dkern_model"]
    fitted = _checked_fitted(url, attrs)
    _check_arrays(url, attrs, fitted, manifest)
    if kind in _toolbox_store.FITTED_NAMES:
        model = _toolbox_store.restore(_MODELS[kind], attrs, fitted,
                                       lambda name, lazy: _read(url, name, lazy=lazy))
        _set_fitted(model, fitted)
        return model
    given = None if attrs["kernel_is_default"] else _kernel(url, attrs, "kernel")
    model = _MODELS[kind](kernel=given, **attrs["params"])
    model.kernel_ = _kernel(url, attrs, "fitted_kernel" if attrs.get("fitted_kernel") else "kernel")
    if isinstance(model, GaussianProcessRegressor):
        _restore_gp(model, url, fitted)
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
    """Set the fitted scalars ``_checked_fitted`` let through."""
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


def _restore_gp(model: GaussianProcessRegressor, url: str, fitted: dict[str, Any]) -> None:
    """Set the GP's fitted arrays and private state; pop their entries from ``fitted``."""
    model.alpha_ = _read(url, "alpha", lazy=fitted.pop("alpha_lazy"))
    if fitted["solver_"] == "nystrom":
        names = ("centers", "L", "P", "b", "yty")
        arrays = {name: _read(url, name, lazy=False) for name in names}
        scalars = {name: fitted.pop(name) for name in _GP_SPARSE}
        model._stats = _gp_sparse.restore(model.kernel_, arrays, scalars)
        model.centers_ = arrays["centers"]
    else:
        model.X_train_ = _read(url, "X_train", lazy=fitted.pop("X_train_lazy"))
        model.y_train_ = _read(url, "y_train", lazy=fitted.pop("y_train_lazy"))
        # files written before the seed was stored: the pivots random_state gives
        seed = fitted.pop("pivot_seed", None)
        model._pivot_seed = fixed_seed(model.random_state) if seed is None else int(seed)
    if fitted["solver_"] == "exact":
        model.L_ = _read(url, "L", lazy=False)
    model._y_train_mean = np.asarray(fitted.pop("y_train_mean"), dtype=np.float64)
    model._y_train_std = np.asarray(fitted.pop("y_train_std"), dtype=np.float64)
    model._preconditioner = None  # rebuilt on first use by "cg" variances
    lml = fitted["log_marginal_likelihood_value_"]
    fitted["log_marginal_likelihood_value_"] = float("nan") if lml is None else float(lml)


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
        lml = float(model.log_marginal_likelihood_value_)
        fitted.update({
            "variance_": model.variance_,
            "log_marginal_likelihood_value_": lml if np.isfinite(lml) else None,
            "y_train_mean": model._y_train_mean.tolist(),
            "y_train_std": model._y_train_std.tolist(),
            "alpha_lazy": isinstance(model.alpha_, da.Array)})
        if model.solver_ == "nystrom":
            fitted.update({"sgpr_trace": model._stats.trace, "sgpr_n": model._stats.n,
                           "sgpr_jitter": model._stats.jitter})
        else:
            fitted.update({f"{name}_lazy": isinstance(getattr(model, f"{name}_"), da.Array)
                           for name in ("X_train", "y_train")})
            fitted["pivot_seed"] = model._pivot_seed
    else:
        fitted.update({"dual_coef_lazy": isinstance(model.dual_coef_, da.Array),
                       "X_fit_lazy": isinstance(getattr(model, "X_fit_", None), da.Array)})
    if hasattr(model, "feature_names_in_"):
        fitted["feature_names_in_"] = [str(name) for name in model.feature_names_in_]
    return fitted


def check_can_save(url: Url, *, overwrite: bool = False) -> None:
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


def _stored(url: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The model attributes of ``url``, checked, and its arrays' manifest entries (shape,
    dtype, chunks), both from one read of the store's pointer, before any array is read."""
    pointer = read_pointer(open_group(url, "", mode="r"), url, "")
    attrs, manifest = dict(pointer.get("attrs", {})), dict(pointer.get("arrays", {}))
    kind = attrs.get("dkern_model")
    if kind not in _MODELS:
        raise StoreError(
            f"{url!r} is not a dkern model store: expected the attribute 'dkern_model' (one of "
            f"{sorted(_MODELS)}) written by dkern.save; found {kind!r}, attributes "
            f"{sorted(attrs)} and arrays {sorted(manifest)}. Open data arrays with "
            "dkern.io.open_array instead.")
    if attrs.get("format") != MODEL_FORMAT:
        raise StoreError(f"{url!r} holds a {kind} model of format {attrs.get('format')!r}; this "
                         f"dkern {__version__} reads model format {MODEL_FORMAT}. Load it with the "
                         f"dkern version that wrote it ({attrs.get('dkern_version')}) and refit.")
    saved_major = str(attrs.get("dkern_version", "?")).split(".")[0]
    if saved_major != __version__.split(".")[0]:
        raise StoreError(f"{url!r} holds a model saved by dkern {attrs.get('dkern_version')}; "
                         f"this is dkern {__version__}, a different major version. Load it with "
                         "a matching dkern and refit.")
    missing = [key for key in _REQUIRED if key not in attrs]
    if missing:
        raise StoreError(f"{url!r} holds a {kind} model without the attributes {missing} that "
                         "dkern.save writes; the file was not written by dkern.save. Save the "
                         "model again.")
    _check_attr_types(url, attrs)
    return attrs, manifest


def _check_attr_types(url: str, attrs: dict[str, Any]) -> None:
    """StoreError naming the attribute when one is not of the type ``save`` writes."""
    kind, kernel = attrs["dkern_model"], attrs["kernel"]
    fitted_kernel = attrs.get("fitted_kernel") or kernel  # the GPs store both
    memory_based = kind in _toolbox_store.FITTED_NAMES  # their kernel may be a name: null
    checks = {
        "kernel_is_default": ("true or false", isinstance(attrs["kernel_is_default"], bool)),
        "params": ("a JSON object", isinstance(attrs["params"], dict)),
        "fitted": ("a JSON object", isinstance(attrs["fitted"], dict)),
        "kernel": ("a kernel's repr (a string), null only for a default kernel",
                   isinstance(kernel, str) or (kernel is None and (
                       memory_based or attrs["kernel_is_default"] is True))),
        "fitted_kernel": ("a kernel's repr (a string), or a list of them", memory_based
                          or isinstance(fitted_kernel, str) or (isinstance(fitted_kernel, list)
                          and all(isinstance(text, str) for text in fitted_kernel)))}
    for key, (expected, ok) in checks.items():
        if not ok:
            found = attrs.get(key, kernel)
            raise StoreError(f"{url!r}: the {kind} model's attribute {key!r} is {found!r} "
                             f"({type(found).__name__}); dkern.load expected {expected}. The file "
                             "was not written by dkern.save (or was edited after); save the model "
                             "again.")
    _check_params(url, kind, attrs["params"])


def _check_params(url: str, kind: str, params: dict[str, Any]) -> None:
    """StoreError when "params" names a parameter the model does not take."""
    takes = set(_MODELS[kind]().get_params(deep=False))
    if kind not in _toolbox_store.FITTED_NAMES:
        takes.discard("kernel")  # stored in "kernel"
    unknown = sorted(set(params) - takes)
    if unknown:
        raise StoreError(f"{url!r}: the {kind} model's 'params' name {unknown}, which {kind} does "
                         f"not take (it takes {sorted(takes)}): the file holds another model's "
                         "parameters, or was edited after dkern.save wrote it. Load it only as "
                         "the model it was saved as; save the model again.")


def _checked_fitted(url: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """The file's fitted scalars, refusing any name ``save`` does not write: ``load``
    calls ``setattr`` with them, which must never reach methods or dunders."""
    fitted, known = attrs["fitted"], _FITTED_NAMES[attrs["dkern_model"]]
    if attrs["dkern_model"] == "GaussianProcessRegressor" and isinstance(fitted, dict):
        sparse = fitted.get("solver_") == "nystrom"
        known = (known - _GP_DATA) | _GP_SPARSE if sparse else known
    unknown = sorted(set(fitted) - known) if isinstance(fitted, dict) else fitted
    missing = sorted(known - _OPTIONAL - set(fitted)) if not unknown else []
    if unknown or missing:
        raise StoreError(
            f"{url!r}: the model's 'fitted' attributes name {unknown or missing} "
            f"({'unknown to' if unknown else 'missing, needed by'} dkern.load, which sets only "
            f"{sorted(known)}). The file was not written by dkern.save; save the "
            "model again.")
    kinds = {**{name: "bool" for name in known if name.endswith("_lazy")}, **_FITTED_KINDS,
             **(_gpc_store.FITTED_KINDS if attrs["dkern_model"] == "GaussianProcessClassifier"
                else {})}
    check_file_values(repr(url), "fitted", fitted, kinds)
    return dict(fitted)


def _check_arrays(url: str, attrs: dict[str, Any], fitted: dict[str, Any],
                  manifest: dict[str, dict[str, Any]]) -> None:
    """Refuse, before any array is read, arrays whose claimed shapes the model's attributes
    contradict (``StoreError``) or that this machine cannot hold (``MemoryLimitError``)."""
    kind, where = attrs["dkern_model"], repr(url)
    solvers = _SOLVERS.get(kind)
    if solvers is not None and fitted["solver_"] not in solvers:
        raise StoreError(f"{where}: the {kind} model's 'fitted' attribute 'solver_' is "
                         f"{fitted['solver_']!r}; dkern.load knows {list(solvers)}. The file was "
                         "not written by dkern.save (or was edited after); save the model again.")
    d = fitted["n_features_in_"]
    names = fitted.get("feature_names_in_", [None] * d)
    if len(names) != d:
        raise StoreError(f"{where}: the {kind} model has n_features_in_ = {d} but "
                         f"{len(names)} feature_names_in_; they must match. The file was edited "
                         "or damaged; save the model again.")
    spec, known = _shapes(kind, attrs["params"], fitted)
    check_stored_shapes(where, manifest, spec,
                        {"d": (d, f"n_features_in_ = {d} in 'fitted'"), **known})
    check_fits_in_memory(where, manifest, [name for name in spec
                                           if not fitted.get(f"{name}_lazy", False)])


def _shapes(kind: str, params: dict[str, Any], fitted: dict[str, Any]
            ) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[int, str]]]:
    """The model's arrays as ``check_stored_shapes`` takes them: their dimensions by
    symbol (``d`` is n_features_in_) and the symbols the attributes fix."""
    if kind in _toolbox_store.FITTED_NAMES:
        return _toolbox_store.shapes(kind, fitted)
    if kind == "GaussianProcessClassifier":
        return _gpc_store.shapes(fitted)
    if kind == "KernelLogisticRegression":
        return _klr_store.shapes(fitted)
    solver, known = fitted["solver_"], {}
    if solver == "nystrom" and params.get("n_centers") is not None:
        known["m"] = (params["n_centers"], f"n_centers = {params['n_centers']} in 'params'")
    if kind == "KernelRidge":
        if solver != "exact":
            known["r"] = (fitted["n_iter_"] + 1, f"n_iter_ + 1 = {fitted['n_iter_'] + 1}")
        return _KRR_SHAPES[solver], known
    t = len(fitted["y_train_mean"])
    known["t"] = (t, f"{t} target mean(s) in y_train_mean")
    return _GP_SHAPES[solver], known


def _read(url: str, name: str, *, lazy: bool) -> Any:
    x = open_array(url, name)
    return x if lazy else x.compute()
