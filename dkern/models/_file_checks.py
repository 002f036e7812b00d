"""What a model file must hold before :func:`dkern.load` reads it, checked from its metadata.

``load`` sets attributes by name from a file's "fitted" scalars, rebuilds a model from its
"params" and allocates its arrays from the shapes the pointer table claims. Every one of
those comes from the file, so each is checked first, all from one verified read of the
store's pointer (:func:`dkern.io.read.read_version`) and before any array is read: the model
kind, format and dkern major version; the attributes' types; the "fitted" names (only
those ``save`` writes, so ``setattr`` never reaches methods or dunders) and each value's
kind; the solver; the arrays' claimed shapes against each other and the attributes; and
that the arrays loaded into memory fit in this machine's free memory. What each model's
file must hold comes from its class's declaration (``_model_file``,
:mod:`dkern.models._model_file`), the one ``save`` and ``load`` walk. An edited,
damaged or foreign file is refused with a :class:`~dkern.errors.StoreError` naming what
is wrong (:class:`~dkern.errors.MemoryLimitError` for memory), not loaded as something
else or left to fail deep in a read.

These checks live here, apart from :mod:`dkern.models.persist` (which writes and restores
model files) and :mod:`dkern.models._validation` (which checks fit and predict inputs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import psutil

from .._version import __version__
from ..errors import MemoryLimitError, StoreError
from ..io.read import GroupVersion
from ._model_file import OPTIONAL, VALUE_KINDS, ModelFile, is_dtype

#: Layout version of model stores; ``load`` refuses any other. Format 2 is the first
#: released one: files of format 1 (never released) are refused.
MODEL_FORMAT = 2
#: The attributes ``load`` needs beyond the model kind, format and dkern version.
_REQUIRED = ("kernel", "kernel_is_default", "params", "fitted")


def checked_model_file(url: str, version: GroupVersion, models: Mapping[str, type]
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model attributes of ``version`` (the store at ``url`` as one read of its pointer
    found it) and a copy of their "fitted" scalars, once the file passes every check this
    module makes; no array has been read.

    ``models`` are the estimator classes a file may hold, by their "dkern_model" name;
    each declares its file (``_model_file``, :mod:`dkern.models._model_file`).

    Raises
    ------
    StoreError
        A store that is not a dkern model, a model of another format or dkern major
        version, or a file that was edited or damaged.
    MemoryLimitError
        The arrays loaded into memory claim more bytes than this machine has available.
    """
    attrs, manifest = _stored(url, version, models)
    declared: ModelFile = models[attrs["dkern_model"]]._model_file  # type: ignore[attr-defined]
    fitted = _checked_fitted(url, attrs, declared)
    _check_arrays(url, attrs, fitted, manifest, declared)
    return attrs, fitted


def _stored(url: str, version: GroupVersion, models: Mapping[str, type]
            ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The model attributes of ``version``, checked, and its arrays' manifest entries (shape,
    dtype, chunks), both from one read of the store's pointer, before any array is read."""
    attrs, manifest = version.attrs, version.manifest
    kind = attrs.get("dkern_model")
    if not isinstance(kind, str) or kind not in models:
        raise StoreError(
            f"{url!r} is not a dkern model store: expected the attribute 'dkern_model' (one of "
            f"{sorted(models)}) written by dkern.save; found {kind!r}, attributes "
            f"{sorted(attrs)} and arrays {sorted(manifest)}. Open data arrays with "
            "dkern.io.open_array instead.")
    if attrs.get("format") != MODEL_FORMAT:
        raise StoreError(
            f"{url!r} holds a {kind} model file of format {attrs.get('format')!r} (written by "
            f"dkern {attrs.get('dkern_version')}); this dkern {__version__} reads model format "
            f"{MODEL_FORMAT} only (no earlier format was released, so none is converted). "
            "Refit the model and save it again with this dkern.")
    saved_major = str(attrs.get("dkern_version", "?")).split(".")[0]
    if saved_major != __version__.split(".")[0]:
        raise StoreError(f"{url!r} holds a model saved by dkern {attrs.get('dkern_version')}; "
                         f"this is dkern {__version__}, a different major version. Load it with "
                         "a matching dkern and refit.")
    declared: ModelFile = models[kind]._model_file  # type: ignore[attr-defined]
    _check_required(url, kind, attrs, _REQUIRED)
    _check_attr_types(url, attrs, declared)
    _check_params(url, kind, attrs["params"], models[kind], declared)
    if declared.kernel == "learned":  # the kernel given and the one learned
        _check_required(url, kind, attrs, ("fitted_kernel",))
    return attrs, manifest


def _check_required(url: str, kind: str, attrs: dict[str, Any], required: tuple[str, ...]
                    ) -> None:
    missing = [key for key in required if key not in attrs]
    if missing:
        raise StoreError(f"{url!r} holds a {kind} model without the attributes {missing} that "
                         "dkern.save writes; the file was not written by dkern.save. Save the "
                         "model again.")


def _check_attr_types(url: str, attrs: dict[str, Any], declared: ModelFile) -> None:
    """StoreError naming the attribute when one is not of the type ``save`` writes."""
    kind, kernel = attrs["dkern_model"], attrs["kernel"]
    fitted_kernel = attrs.get("fitted_kernel") or kernel  # "learned" kernels: both
    given = declared.kernel == "given"  # a parameter: a kernel's name is stored as null
    checks = {
        "kernel_is_default": ("true or false", isinstance(attrs["kernel_is_default"], bool)),
        "params": ("a JSON object", isinstance(attrs["params"], dict)),
        "fitted": ("a JSON object", isinstance(attrs["fitted"], dict)),
        "kernel": ("a kernel's repr (a string), null only for a default kernel",
                   isinstance(kernel, str) or (kernel is None and (
                       given or attrs["kernel_is_default"] is True))),
        "fitted_kernel": ("a kernel's repr (a string), or a list of them", given
                          or isinstance(fitted_kernel, str) or (isinstance(fitted_kernel, list)
                          and all(isinstance(text, str) for text in fitted_kernel)))}
    for key, (expected, ok) in checks.items():
        if not ok:
            found = attrs.get(key, kernel)
            raise StoreError(f"{url!r}: the {kind} model's attribute {key!r} is {found!r} "
                             f"({type(found).__name__}); dkern.load expected {expected}. The file "
                             "was not written by dkern.save (or was edited after); save the model "
                             "again.")


def _check_params(url: str, kind: str, params: dict[str, Any], cls: type,
                  declared: ModelFile) -> None:
    """StoreError when "params" names a parameter the model does not take."""
    takes = set(cls().get_params(deep=False))
    if declared.kernel != "given":
        takes.discard("kernel")  # stored in "kernel"
    unknown = sorted(set(params) - takes)
    if unknown:
        raise StoreError(f"{url!r}: the {kind} model's 'params' name {unknown}, which {kind} does "
                         f"not take (it takes {sorted(takes)}): the file holds another model's "
                         "parameters, or was edited after dkern.save wrote it. Load it only as "
                         "the model it was saved as; save the model again.")


def _checked_fitted(url: str, attrs: dict[str, Any], declared: ModelFile) -> dict[str, Any]:
    """The file's fitted scalars, refusing any name ``save`` does not write: ``load``
    calls ``setattr`` with them, which must never reach methods or dunders."""
    fitted = attrs["fitted"]
    kinds = declared.names(fitted.get("solver_") if isinstance(fitted, dict) else None)
    known = set(kinds)
    unknown = sorted(set(fitted) - known) if isinstance(fitted, dict) else fitted
    missing = sorted(known - OPTIONAL - set(fitted)) if not unknown else []
    if unknown or missing:
        raise StoreError(
            f"{url!r}: the model's 'fitted' attributes name {unknown or missing} "
            f"({'unknown to' if unknown else 'missing, needed by'} dkern.load, which sets only "
            f"{sorted(known)}). The file was not written by dkern.save; save the "
            "model again.")
    check_file_values(repr(url), "fitted", fitted, kinds)
    return dict(fitted)


def _check_arrays(url: str, attrs: dict[str, Any], fitted: dict[str, Any],
                  manifest: dict[str, dict[str, Any]], declared: ModelFile) -> None:
    """Refuse, before any array is read, arrays whose claimed shapes the model's attributes
    contradict (``StoreError``) or that this machine cannot hold (``MemoryLimitError``)."""
    kind, where = attrs["dkern_model"], repr(url)
    layout = declared.layout(fitted.get("solver_"))
    if layout is None:
        raise StoreError(f"{where}: the {kind} model's 'fitted' attribute 'solver_' is "
                         f"{fitted['solver_']!r}; dkern.load knows {list(declared.solvers or ())}."
                         " The file was not written by dkern.save (or was edited after); save "
                         "the model again.")
    try:
        known = declared.known_dims(attrs["params"], fitted)
    except StoreError as err:
        raise StoreError(f"{where}: {err}") from None
    stored = layout.stored(attrs.get("arrays"))
    # n_features_in_ is only a number in the file: checked against the arrays' shapes
    # before anything is sized by it
    check_stored_shapes(where, manifest, stored, known)
    d, names = fitted["n_features_in_"], fitted.get("feature_names_in_")
    if names is not None and len(names) != d:
        raise StoreError(f"{where}: the {kind} model has n_features_in_ = {d} but "
                         f"{len(names)} feature_names_in_; they must match. The file was edited "
                         "or damaged; save the model again.")
    check_fits_in_memory(where, manifest, [name for name in stored
                                           if not fitted.get(f"{name}_lazy", False)])


def check_file_values(where: str, attribute: str, values: dict[str, Any],
                      kinds: dict[str, str]) -> None:
    """StoreError unless each ``values[name]`` is of the kind ``kinds[name]`` names
    (a key of :data:`._model_file.VALUE_KINDS`); ``where`` names the store in the message."""
    for name, value in values.items():
        kind = VALUE_KINDS[kinds[name]]
        if not kind.test(value):
            raise StoreError(
                f"{where}: the model's {attribute!r} attribute {name!r} is {value!r} "
                f"({type(value).__name__}); dkern.load expected {kind.expected}. The file was not "
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
            or not all(_is_size(s) for s in shape) or not is_dtype(dtype, "biuf")):
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


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"
