"""The memory-based estimators' part of a model file (see :mod:`dkern.models.persist`).

``KernelDensity``, ``NadarayaWatson`` and the ``KNeighbors*`` models are their training
data: arrays ``X_fit`` (lazy rows are written chunk by chunk) and ``y_fit`` (targets) or
``y_codes`` (a classifier's label indices, with ``classes_`` as JSON in "fitted").
"kernel" holds a dkern kernel's repr, or null for a named kernel (``"gaussian"``,
``"box"``: then in "params") and for the neighbour models, which have none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da
from sklearn.base import BaseEstimator

from ..kernels import Kernel, from_repr
from ._klr_store import decode_classes, encode_classes

#: The "fitted" names each model's file has.
_COMMON = frozenset({"n_features_in_", "feature_names_in_", "X_fit_lazy"})
FITTED_NAMES = {
    "KernelDensity": _COMMON | {"log_norm_"},
    "NadarayaWatson": _COMMON | {"y_fit_lazy"},
    "KNeighborsRegressor": _COMMON | {"n_samples_fit_"},
    "KNeighborsClassifier": _COMMON | {"n_samples_fit_", "classes_", "classes_dtype"},
}
#: The attribute that marks each model as fitted.
FITTED_ARRAY = {"KernelDensity": "log_norm_", "NadarayaWatson": "y_fit_",
                "KNeighborsRegressor": "y_fit_", "KNeighborsClassifier": "y_codes_"}
#: The training targets' array per model (the density has none).
_TARGETS = {"NadarayaWatson": "y_fit", "KNeighborsRegressor": "y_fit",
            "KNeighborsClassifier": "y_codes"}
#: The arrays by dimension: ``n`` training rows, ``d`` features, ``t`` targets ("t?": the
#: targets may be 1-D).
_SHAPES = {"X_fit": ("n", "d"), "y_fit": ("n", "t?"), "y_codes": ("n",)}


def arrays(model: BaseEstimator) -> dict[str, Any]:
    """The arrays of the model file."""
    out = {"X_fit": model.X_fit_}
    target = _TARGETS.get(type(model).__name__)
    if target is not None:
        out[target] = getattr(model, f"{target}_")
    return out


def shapes(kind: str, fitted: dict[str, Any]) -> tuple[dict[str, tuple[str, ...]],
                                                        dict[str, tuple[int, str]]]:
    """The model's arrays by dimension, and the one its attributes fix (the neighbour
    models' ``n``)."""
    names = ["X_fit"] + ([_TARGETS[kind]] if kind in _TARGETS else [])
    n = fitted.get("n_samples_fit_")
    return ({name: _SHAPES[name] for name in names},
            {} if n is None else {"n": (n, f"n_samples_fit_ = {n}")})


def attrs(model: BaseEstimator, kernel_text: Callable[[Kernel], str]) -> dict[str, Any]:
    """"kernel", "kernel_is_default", "params" and "fitted" of the model file.

    ``kernel_text`` is the repr a model file stores, checked to rebuild the kernel.
    """
    params = model.get_params(deep=False)
    kernel = params.get("kernel")
    text = None
    if isinstance(kernel, Kernel):
        text = kernel_text(params.pop("kernel"))
    fitted: dict[str, Any] = {"n_features_in_": int(model.n_features_in_),
                              "X_fit_lazy": isinstance(model.X_fit_, da.Array)}
    kind = type(model).__name__
    if kind == "KernelDensity":
        fitted["log_norm_"] = float(model.log_norm_)
    elif kind == "NadarayaWatson":
        fitted["y_fit_lazy"] = isinstance(model.y_fit_, da.Array)
    else:
        fitted["n_samples_fit_"] = int(model.n_samples_fit_)
    if kind == "KNeighborsClassifier":
        fitted.update(encode_classes(model.classes_, kind))
    if hasattr(model, "feature_names_in_"):
        fitted["feature_names_in_"] = [str(name) for name in model.feature_names_in_]
    return {"kernel": text, "kernel_is_default": False, "params": params, "fitted": fitted}


def restore(cls: type[BaseEstimator], attrs: dict[str, Any], fitted: dict[str, Any],
            read: Callable[[str, bool], Any]) -> BaseEstimator:
    """The model of the file; pops the arrays' entries from ``fitted`` (the caller sets
    the rest). ``read(name, lazy)`` opens an array (dask if ``lazy``, else numpy)."""
    params = dict(attrs["params"])
    if attrs["kernel"] is not None:
        params["kernel"] = from_repr(attrs["kernel"])
    model = cls(**params)
    model.X_fit_ = read("X_fit", fitted.pop("X_fit_lazy"))
    kind = cls.__name__
    if kind == "NadarayaWatson":
        model.y_fit_ = read("y_fit", fitted.pop("y_fit_lazy"))
    elif kind in _TARGETS:
        setattr(model, f"{_TARGETS[kind]}_", read(_TARGETS[kind], False))
    if kind == "KNeighborsClassifier":
        model.classes_ = decode_classes(fitted)
    return model
