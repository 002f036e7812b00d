"""Model files: a fitted estimator as one Zarr group, published atomically, never pickled.

Layout (written by one :func:`dkern.io.write_arrays` call that replaces the whole
group, so readers see the old model or the complete new one, and the store holds
nothing of the old model after)::

    attrs:  {"dkern_model": "KernelRidge", "format": 2, "dkern_version": "0.1.0",
             "arrays": ["X_fit", "dual_coef", "residuals"],
             "kernel": "Gaussian(lengthscale=1.0)", "kernel_is_default": false,
             "params": {... get_params(deep=False) without the kernel ...},
             "fitted": {"solver_": "cg", "n_iter_": 41, "converged_": true,
                        "n_features_in_": 6, "X_fit_lazy": false, "dual_coef_lazy": false}}
    arrays: dual_coef, X_fit (exact, cg) or centers (nystrom), residuals (cg, nystrom)

"arrays" names the model's own arrays: saving over a model refuses to delete any other
array found beside them (e.g. predictions written into the model's store).

What each model's file holds is declared once, on its class (``_model_file``, a
:class:`~dkern.models._model_file.ModelFile`): per solver, its arrays with their
dimensions and its "fitted" scalars with their kinds, and how its kernel is stored.
``save`` and ``load`` walk that declaration and ask the model for its state
(``_file_state`` / ``_set_file_state``); they know no model by name. In short:
``KernelRidge`` stores ``dual_coef``, ``X_fit`` (or the Nyström ``centers``) and the
solver's ``residuals``; ``GaussianProcessRegressor`` ``alpha``, ``X_train``, ``y_train``,
the exact solver's Cholesky factor ``L`` and the CG preconditioner's ``pivot_seed`` (the
preconditioner is rebuilt on first use, from the same pivots, so its stds do not change),
or for ``"nystrom"`` only M-sized arrays (``alpha``, ``centers`` and the SGPR statistics
``L``, ``P``, ``b``, ``yty``, their scalars ``sgpr_trace``, ``sgpr_n``, ``sgpr_jitter``),
with the target normalisation ``y_train_mean`` / ``y_train_std``, its given ``kernel``
(null for the default) and its learned ``fitted_kernel``; ``GaussianProcessClassifier``
``X_fit``, ``y_train`` and ``pi`` (never an n × n factor); ``KernelLogisticRegression``
``dual_coef``, ``X_fit``, ``residuals``; the memory-based ``KernelDensity``,
``NadarayaWatson``, ``KNeighbors*`` and ``RadiusNeighbors*`` their training data.
Classifiers store ``classes_`` as a JSON list with its numpy dtype (:mod:`dkern.models.labels`).

The kernel is stored as its ``repr`` and rebuilt by :func:`dkern.kernels.from_repr`,
which runs no Python beyond kernel names, numbers and the kernel algebra. These
attributes are covered by the store pointer's checksum, so an edited or damaged file
is refused rather than loaded as a different model; ``load`` sets only the fitted
attributes the model declares. What a file must hold before ``load`` reads any array is
checked by :mod:`dkern.models._file_checks`, from the same declarations. Files of
another format than :data:`MODEL_FORMAT` are refused: no earlier format was released.
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
from ..io import check_not_zarr_v2, group_exists, read_attrs, write_arrays
from ..io.read import GroupVersion, read_version
from ..kernels import Kernel, from_repr, from_sklearn
from ._file_checks import MODEL_FORMAT, checked_model_file
from ._model_file import ModelFile, decode_scalars, encode_scalars
from ._validation import existing_arrays, is_sklearn_kernel
from .density import KernelDensity
from .gaussian_process import GaussianProcessRegressor
from .gp_classifier import GaussianProcessClassifier
from .kernel_logistic import KernelLogisticRegression
from .kernel_ridge import KernelRidge
from .nadaraya_watson import NadarayaWatson
from .neighbors import KNeighborsClassifier, KNeighborsRegressor
from .radius_neighbors import RadiusNeighborsClassifier, RadiusNeighborsRegressor

__all__ = ["MODEL_FORMAT", "check_can_save", "load", "save"]

logger = logging.getLogger(__name__)

Model = (KernelRidge | GaussianProcessRegressor | GaussianProcessClassifier
         | KernelLogisticRegression | KernelDensity | NadarayaWatson | KNeighborsRegressor
         | KNeighborsClassifier | RadiusNeighborsRegressor | RadiusNeighborsClassifier)
#: The model classes a file may hold, by its "dkern_model" attribute.
MODELS: dict[str, Any] = {cls.__name__: cls for cls in (
    KernelRidge, GaussianProcessRegressor, GaussianProcessClassifier, KernelLogisticRegression,
    KernelDensity, NadarayaWatson, KNeighborsRegressor, KNeighborsClassifier,
    RadiusNeighborsRegressor, RadiusNeighborsClassifier)}


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
    kind = type(model).__name__
    if MODELS.get(kind) is not type(model):
        raise TypeError(f"save takes a fitted dkern model ({sorted(MODELS)}); got {kind}.")
    declared: ModelFile = model._model_file
    check_is_fitted(model, declared.marker)
    url = os.fspath(url)
    attrs = _kernel_and_params(model, declared.kernel)
    check_can_save(url, overwrite=overwrite)
    state = model._file_state()
    layout = model._file_layout()
    arrays = {name: state[name]
              for name in layout.stored([key for key, value in state.items() if value is not None])}
    fitted = encode_scalars(state, layout.kinds(), kind)
    fitted.update({f"{name}_lazy": isinstance(state.get(name), da.Array) for name in layout.lazy})
    attrs.update({"dkern_model": kind, "format": MODEL_FORMAT, "dkern_version": __version__,
                  "arrays": sorted(arrays), "fitted": fitted})
    write_arrays(url, arrays, attrs=attrs, overwrite=overwrite, replace_all=True)
    logger.info("saved %s%s to %r", kind, f" (solver {fitted['solver_']})"
                if "solver_" in fitted else "", url)


def _kernel_and_params(model: Model, stored: str) -> dict[str, Any]:
    """The attributes "kernel", "kernel_is_default", "params" (and "fitted_kernel" for a
    ``"learned"`` kernel), as :class:`~._model_file.ModelFile`'s ``kernel`` says."""
    if stored == "given":  # a parameter: a dkern kernel's repr, or a name kept in "params"
        params = model.get_params(deep=False)
        kernel = params.get("kernel")
        text = _kernel_text(params.pop("kernel")) \
            if isinstance(kernel, Kernel) or is_sklearn_kernel(kernel) else None
        return {"kernel": text, "kernel_is_default": False, "params": params}
    fitted_text = _fitted_kernel_text(model.kernel_)
    attrs: dict[str, Any] = {"kernel": fitted_text, "kernel_is_default": model.kernel is None,
             "params": _json_params(model)}
    if stored == "learned":  # learned hyperparameters: the fitted kernel differs from the one given
        attrs["kernel"] = _kernel_text(model.kernel) if model.kernel is not None else None
        attrs["fitted_kernel"] = fitted_text
    return attrs


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
        A scikit-learn kernel given as the ``kernel`` parameter comes back as the dkern
        kernel it was converted to (:func:`dkern.kernels.from_sklearn`): a file stores
        dkern kernels only, so ``get_params()["kernel"]`` differs from the saved model's
        while ``kernel_`` and the predictions do not.

    Raises
    ------
    StoreError
        No store at ``url``, a store that is not a dkern model, a model written in
        another format (:data:`MODEL_FORMAT` is the only one; no earlier one was
        released) or by an incompatible (different major) dkern version, a model
        file that was edited or damaged, or one replaced by a ``save(overwrite=True)``
        while it was loading (its attributes and arrays are all read from the one version
        found first, never mixed with the new one's; load again).
    MemoryLimitError
        The arrays loaded into memory claim more bytes than this machine has available
        (checked, like everything above, before any array is read).
    """
    url = os.fspath(url)
    version = read_version(url)  # attributes and arrays all come from this one version
    attrs, fitted = checked_model_file(url, version, MODELS)
    cls = MODELS[attrs["dkern_model"]]
    declared: ModelFile = cls._model_file
    layout = declared.layout(fitted.get("solver_"))
    assert layout is not None  # checked_model_file refuses other solvers
    params = dict(attrs["params"])
    if declared.kernel == "given":
        if attrs["kernel"] is not None:
            params["kernel"] = _kernel(url, attrs, "kernel")
        model = cls(**params)
    else:
        given = None if attrs["kernel_is_default"] else _kernel(url, attrs, "kernel")
        model = cls(kernel=given, **params)
        model.kernel_ = _kernel(url, attrs, "fitted_kernel" if declared.kernel == "learned"
                                else "kernel")
    state = decode_scalars(fitted, layout.kinds())
    state.update({name: None for name in layout.optional})
    state.update(_read_arrays(version, list(layout.stored(attrs.get("arrays"))), fitted))
    model._set_file_state(state)
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


def _fitted_kernel_text(kernel: Kernel | list[Kernel]) -> str | list[str]:
    """:func:`_kernel_text` of a kernel, or of each (a one-vs-rest classifier's list)."""
    return [_kernel_text(k) for k in kernel] if isinstance(kernel, list) else _kernel_text(kernel)


def _kernel_text(kernel: Kernel) -> str:
    """``repr(kernel)``, after checking that ``from_repr`` rebuilds an equal kernel.

    A scikit-learn kernel given as the ``kernel`` parameter is stored as its dkern
    equivalent (:func:`dkern.kernels.from_sklearn`), which the loaded model's parameter
    then holds: a model file never pickles.
    """
    if is_sklearn_kernel(kernel):
        kernel = from_sklearn(kernel)
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
    """``get_params(deep=False)`` without the kernel, as JSON (warnings point at ``save``'s
    caller: four frames up)."""
    params = model.get_params(deep=False)
    params.pop("kernel")
    if callable(params.get("optimizer")):
        warnings.warn(f"optimizer={params['optimizer']!r} (a function) cannot be stored in a "
                      "model file; the loaded model gets optimizer='lbfgs' (this only matters "
                      "if it is refitted).", UserWarning, stacklevel=4)
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
                      "Fit with an int random_state to keep it.", UserWarning, stacklevel=4)
        params["random_state"] = None
    return params


def check_can_save(url: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Raise the error :func:`save` would raise for ``url`` before any work is done.

    Call it before a long fit whose model goes to ``url``, so a name already taken
    is reported at once rather than after the fit.

    Raises
    ------
    StoreError
        The store already holds a model and ``overwrite`` is False, or it holds data
        arrays, beside a model or not (a model file replaces every array of its store's
        top-level group, so that is refused even with ``overwrite``); or its pointer fails
        its checks (edited, damaged or forged: nothing it names can be trusted, so nothing
        is replaced).
    """
    url = os.fspath(url)
    found = _existing_attrs(url)
    if not found:
        check_not_zarr_v2(url, "")
    present = existing_arrays(url)
    model_arrays = found.get("arrays") if "dkern_model" in found else []
    data = sorted(set(present) - set(model_arrays if isinstance(model_arrays, list) else []))
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
    """The attributes of the store at ``url``; ``{}`` if there is none yet. A store that is
    there but whose pointer is damaged or forged raises, as :func:`save` would: before a
    fit, not after it."""
    return read_attrs(url) if group_exists(url) else {}


def _read_arrays(version: GroupVersion, names: list[str], fitted: dict[str, Any]
                 ) -> dict[str, Any]:
    """The arrays ``names`` of ``version``: lazy where they were saved lazy, else in memory.

    A ``save(overwrite=True)`` that publishes meanwhile deletes them: that is reported as
    such (its traces, a missing array or chunk, would otherwise read as a damaged store).
    """
    try:
        return {name: _read(version, name, lazy=fitted.get(f"{name}_lazy", False))
                for name in names}
    except (StoreError, OSError) as err:
        if version.is_latest():
            raise
        raise StoreError(
            f"{version.url!r}: the model was replaced while loading it (another "
            "dkern.save(..., overwrite=True) published a new model and deleted the arrays of "
            "the one being read). Nothing was loaded; call dkern.load again to load the new "
            "model.") from err


def _read(version: GroupVersion, name: str, *, lazy: bool) -> Any:
    """One array: lazy, or read now. One read now is refused if it holds NaN or infinity,
    which ``fit`` never stores: predictions from them were NaN without a word. (A lazy one
    keeps the name of this store's read, which ``save`` recognises; the passes that read it
    check its values as they go, as they check any lazy operand.)"""
    x = version.open_array(name)
    if lazy:
        return x
    values = x.compute()
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise StoreError(f"{version.url!r}: the model's array {name!r} holds NaN or infinity "
                         f"({int(values.size - np.isfinite(values).sum())} of its values), which "
                         "dkern.save never writes: the file was edited or damaged. Save the "
                         "model again.")
    return values
