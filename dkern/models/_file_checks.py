"""What a model file must hold before :func:`dkern.load` reads it, checked from its metadata.

``load`` sets attributes by name from a file's "fitted" scalars, rebuilds a model from its
"params" and allocates its arrays from the shapes the pointer table claims. Every one of
those comes from the file, so each is checked first, all from one verified read of the
store's pointer (:func:`dkern.io.read_manifest`) and before any array is read: the model
kind, format and dkern major version; the attributes' types; the "fitted" names (only
those ``save`` writes, so ``setattr`` never reaches methods or dunders) and each value's
kind; the solver; the arrays' claimed shapes against each other and the attributes; and
that the arrays loaded into memory fit in this machine's free memory. An edited,
damaged or foreign file is refused with a :class:`~dkern.errors.StoreError` naming what
is wrong (:class:`~dkern.errors.MemoryLimitError` for memory), not loaded as something
else or left to fail deep in a read.

These checks live here, apart from :mod:`dkern.models.persist` (which writes and restores
model files) and :mod:`dkern.models._validation` (which checks fit and predict inputs).
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import Any

import numpy as np
import psutil

from .._version import __version__
from ..errors import MemoryLimitError, StoreError
from ..io import read_manifest
from . import _gpc_store, _klr_store, _toolbox_store
from ._validation import finite_number
from .density import KernelDensity
from .gaussian_process import GaussianProcessRegressor
from .gp_classifier import GaussianProcessClassifier
from .kernel_logistic import KernelLogisticRegression
from .kernel_ridge import KernelRidge
from .nadaraya_watson import NadarayaWatson
from .neighbors import KNeighborsClassifier, KNeighborsRegressor

#: Layout version of model stores; ``load`` refuses any other.
MODEL_FORMAT = 1
#: The model classes a file may hold, by its "dkern_model" attribute.
MODELS = {"KernelRidge": KernelRidge, "GaussianProcessRegressor": GaussianProcessRegressor,
          "GaussianProcessClassifier": GaussianProcessClassifier,
          "KernelLogisticRegression": KernelLogisticRegression, "KernelDensity": KernelDensity,
          "NadarayaWatson": NadarayaWatson, "KNeighborsRegressor": KNeighborsRegressor,
          "KNeighborsClassifier": KNeighborsClassifier}
_COMMON = frozenset({"solver_", "n_iter_", "converged_", "n_features_in_", "feature_names_in_"})
#: What ``persist._fitted_scalars`` writes and ``load`` accepts in "fitted", per model.
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
GP_SPARSE = frozenset({"sgpr_trace", "sgpr_n", "sgpr_jitter"})
#: "fitted" names a file may lack: feature names (fitted on arrays without them) and the
#: pivot seed (files written before dkern stored it).
_OPTIONAL = frozenset({"feature_names_in_", "pivot_seed"})
#: The attributes ``load`` needs beyond the model kind, format and dkern version.
_REQUIRED = ("kernel", "kernel_is_default", "params", "fitted")
#: The kind (a key of :data:`FILE_VALUE_KINDS`) of each "fitted" scalar; every
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
_SOLVERS = {"KernelRidge": ("exact", "cg", "nystrom", "gd"),
            "GaussianProcessRegressor": ("exact", "cg", "nystrom"),
            "GaussianProcessClassifier": _gpc_store.SOLVERS,
            "KernelLogisticRegression": _klr_store.SOLVERS}

#: The arrays of a KernelRidge file per solver, by dimension (``n`` training rows, ``m``
#: centres, ``d`` features, ``t`` targets, ``r`` residual rows); "t?": (n,) or (n, t).
_KRR_SHAPES = {
    "exact": {"X_fit": ("n", "d"), "dual_coef": ("n", "t?")},
    "cg": {"X_fit": ("n", "d"), "dual_coef": ("n", "t?"), "residuals": ("r", "t")},
    "gd": {"X_fit": ("n", "d"), "dual_coef": ("n", "t?"), "residuals": ("r", "t")},
    "nystrom": {"centers": ("m", "d"), "dual_coef": ("m", "t?"), "residuals": ("r", "t")}}
_GP_SHAPES = {
    "exact": {"X_train": ("n", "d"), "y_train": ("n", "t?"), "alpha": ("n", "t?"),
              "L": ("n", "n")},
    "cg": {"X_train": ("n", "d"), "y_train": ("n", "t?"), "alpha": ("n", "t?")},
    "nystrom": {"centers": ("m", "d"), "alpha": ("m", "t?"), "L": ("m", "m"), "P": ("m", "m"),
                "b": ("m", "t"), "yty": ("t",)}}


def checked_model_file(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model attributes of the store at ``url`` and a copy of their "fitted" scalars,
    once the file passes every check this module makes; no array has been read.

    Raises
    ------
    StoreError
        No store at ``url``, a store that is not a dkern model, a model of another format
        or dkern major version, or a file that was edited or damaged.
    MemoryLimitError
        The arrays loaded into memory claim more bytes than this machine has available.
    """
    attrs, manifest = _stored(url)
    fitted = _checked_fitted(url, attrs)
    _check_arrays(url, attrs, fitted, manifest)
    return attrs, fitted


def _stored(url: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The model attributes of ``url``, checked, and its arrays' manifest entries (shape,
    dtype, chunks), both from one read of the store's pointer, before any array is read."""
    attrs, manifest = read_manifest(url)
    kind = attrs.get("dkern_model")
    if kind not in MODELS:
        raise StoreError(
            f"{url!r} is not a dkern model store: expected the attribute 'dkern_model' (one of "
            f"{sorted(MODELS)}) written by dkern.save; found {kind!r}, attributes "
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
    takes = set(MODELS[kind]().get_params(deep=False))
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
        known = (known - _GP_DATA) | GP_SPARSE if sparse else known
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



def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= minimum


def _is_dtype(value: Any, kinds: str) -> bool:
    try:
        return isinstance(value, str) and np.dtype(value).kind in kinds
    except TypeError:
        return False


#: What a model file's "fitted" scalar of each kind must be: (test, how messages say it).
FILE_VALUE_KINDS: dict[str, tuple[Any, str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: _is_count(v, 0), "an integer >= 0"),
    "positive": (lambda v: _is_count(v, 1), "an integer >= 1"),
    "counts": (lambda v: isinstance(v, list) and all(_is_count(i, 0) for i in v),
               "a list of integers >= 0"),
    "number": (lambda v: finite_number(v) is not None, "a finite number"),
    "number or null": (lambda v: v is None or finite_number(v) is not None,
                       "a finite number or null"),
    "numbers": (lambda v: isinstance(v, list) and all(finite_number(i) is not None for i in v),
                "a list of finite numbers"),
    "strings": (lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
                "a list of strings"),
    "labels": (lambda v: isinstance(v, list) and len(v) >= 2
               and all(isinstance(i, str | bool) or finite_number(i) is not None for i in v),
               "a list of at least 2 labels (strings, numbers or booleans)"),
    "label dtype": (lambda v: _is_dtype(v, "biufU"),
                    "a numpy dtype string of numbers, booleans or strings, e.g. '<i8'"),
}


def check_file_values(where: str, attribute: str, values: dict[str, Any],
                      kinds: dict[str, str]) -> None:
    """StoreError unless each ``values[name]`` is of the kind ``kinds[name]`` names
    (a key of :data:`FILE_VALUE_KINDS`); ``where`` names the store in the message."""
    for name, value in values.items():
        test, expected = FILE_VALUE_KINDS[kinds[name]]
        if not test(value):
            raise StoreError(
                f"{where}: the model's {attribute!r} attribute {name!r} is {value!r} "
                f"({type(value).__name__}); dkern.load expected {expected}. The file was not "
                "written by dkern.save (or was edited after); save the model again.")


def check_stored_shapes(where: str, manifest: dict[str, dict[str, Any]],
                        spec: dict[str, tuple[str, ...]],
                        known: dict[str, tuple[int, str]]) -> None:
    """StoreError unless each array of ``spec`` is in ``manifest`` with the shape it claims.

    Parameters
    ----------
    where : str
        How messages name the store.
    manifest : dict
        The store's array entries (``"shape"`` and ``"dtype"`` each), read before any array.
    spec : dict of str to tuple of str
        Each array's dimensions by symbol, e.g. ``("n", "d")``; a last symbol ending in
        ``"?"`` may be absent (a 1-D array then has that dimension 1).
    known : dict of str to (int, str)
        Symbols fixed by the file's attributes, with where each value comes from, e.g.
        ``{"d": (3, "n_features_in_ = 3")}``; the others are fixed by the first array
        that has them, and every later one must agree.
    """
    bound = dict(known)
    for name, dims in spec.items():
        shape = _claimed_shape(where, manifest, name, dims)
        sizes = shape + (1,) * (len(dims) - len(shape))
        for axis, (dim, size) in enumerate(zip(dims, sizes, strict=True)):
            symbol = dim.rstrip("?")
            value, source = bound.setdefault(symbol, (size, f"{name}.shape[{axis}] = {size}"))
            if size != value:
                raise StoreError(
                    f"{where}: array {name!r} claims shape {shape}, but the model needs shape "
                    f"({', '.join(dims)}) with {symbol} = {value} ({source}); found "
                    f"{symbol} = {size}. The file's arrays do not match its model (it was "
                    "edited or damaged, or not written by dkern.save); save the model again.")


def _claimed_shape(where: str, manifest: dict[str, dict[str, Any]], name: str,
                   dims: tuple[str, ...]) -> tuple[int, ...]:
    """The shape the manifest claims for ``name``, checked to be numeric with ``dims``'s rank."""
    entry = manifest.get(name)
    if entry is None:
        raise StoreError(f"{where}: the model needs the array {name!r}, which the store lacks "
                         f"(it has {sorted(manifest)}). The file is damaged or was not written "
                         "by dkern.save; save the model again.")
    shape, dtype = entry.get("shape"), entry.get("dtype")
    ranks = (len(dims) - 1, len(dims)) if dims[-1].endswith("?") else (len(dims),)
    if (not isinstance(shape, list) or len(shape) not in ranks
            or not all(_is_count(s, 0) for s in shape) or not _is_dtype(dtype, "biuf")):
        raise StoreError(
            f"{where}: array {name!r} claims shape {shape!r} and dtype {dtype!r}, but the "
            f"model needs a numeric array of shape ({', '.join(dims)}). The file was edited "
            "or damaged, or not written by dkern.save; save the model again.")
    return tuple(int(s) for s in shape)


def check_fits_in_memory(where: str, manifest: dict[str, dict[str, Any]],
                         names: list[str]) -> None:
    """MemoryLimitError when the arrays ``names`` (loaded into memory) claim more bytes
    than this machine has available, before any of them is read."""
    claimed = {name: math.prod(manifest[name]["shape"]) * np.dtype(manifest[name]["dtype"]).itemsize
               for name in names}
    available = psutil.virtual_memory().available
    if sum(claimed.values()) > available:
        sizes = ", ".join(f"{name} {_gib(size)}" for name, size in claimed.items())
        raise MemoryLimitError(
            f"{where}: loading this model needs {_gib(sum(claimed.values()))} in memory "
            f"({sizes}), more than the {_gib(available)} available on this machine. Load it "
            "on a machine with more free memory; if the model should be small, the file "
            "claims shapes it was not saved with: save the model again.")


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"
