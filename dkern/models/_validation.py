"""Input checks shared by the estimators: operands, targets, parameters, random state.

In-memory operands go through scikit-learn's ``validate_data`` (its messages,
``n_features_in_`` and ``feature_names_in_``); dask and Zarr operands go through
:func:`dkern.io.as_rows`, which checks them lazily, chunk by chunk, without
loading them.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real
from typing import Any

import dask.array as da
import numpy as np
import psutil
from sklearn.utils import assert_all_finite, column_or_1d
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from ..errors import MemoryLimitError, StoreError
from ..io import as_rows, is_lazy, is_store_ref, list_arrays, path_within, store_location
from ..kernels import Kernel


def check_X(estimator: Any, X: Any, *, reset: bool) -> np.ndarray | da.Array:
    """X as a float64 numpy array (in-memory input) or a row-chunked dask array (lazy input).

    ``reset=True`` records ``n_features_in_``; ``reset=False`` checks X against it
    with scikit-learn's message.
    """
    if not is_lazy(X):
        return check_magnitude(validate_data(estimator, X, reset=reset, dtype=np.float64), "X")
    Xd = as_rows(X, name="X")
    if reset:
        estimator.n_features_in_ = Xd.shape[1]
        if hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
    elif Xd.shape[1] != getattr(estimator, "n_features_in_", Xd.shape[1]):  # unfitted: any
        raise ValueError(f"X has {Xd.shape[1]} features, but {type(estimator).__name__} is "
                         f"expecting {estimator.n_features_in_} features as input.")
    return Xd


def check_y(y: Any, n_rows: int, owner: str) -> np.ndarray | da.Array:
    """y of shape (n,) or (n, t) matching X's ``n_rows``; numpy is checked for NaN/Inf now.

    Dask and Zarr targets stay lazy (and are checked as their chunks are read).
    """
    if y is None:
        raise ValueError(f"{owner} requires y to be passed, but the target y is None. "
                         "Pass the targets, shape (n_samples,) or (n_samples, n_targets).")
    yv = as_rows(y, name="y", ndim=(1, 2)) if is_lazy(y) else _numpy_y(y)
    if yv.shape[0] != n_rows:
        raise ValueError(f"y has {yv.shape[0]} rows but X has {n_rows}; pass one target row "
                         "per sample of X.")
    if yv.ndim == 2 and yv.shape[1] == 0:
        raise ValueError(f"y has shape {yv.shape}: no target columns. Pass at least one target, "
                         "shape (n_samples,) or (n_samples, n_targets).")
    return yv


def check_labels(y: Any, n_rows: int, owner: str) -> np.ndarray:
    """Class labels as a 1-D numpy array of length ``n_rows`` (dask/Zarr labels are read)."""
    if y is None:
        raise ValueError(f"{owner} requires y to be passed, but the target y is None. Pass "
                         "the class labels, shape (n_samples,).")
    yv = as_rows(y, name="y", ndim=(1, 2)).compute() if is_lazy(y) else y
    yv = column_or_1d(yv, warn=True)
    if yv.dtype.kind in "fc":
        assert_all_finite(yv, input_name="y")
    check_classification_targets(yv)
    if yv.shape[0] != n_rows:
        raise ValueError(f"y has {yv.shape[0]} rows but X has {n_rows}; pass one label per "
                         "sample of X.")
    return yv


def _numpy_y(y: Any) -> np.ndarray:
    yn = np.asarray(y)
    if yn.dtype.kind not in "biuf":
        try:
            yn = yn.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"y must hold numbers (a regression target); got dtype {yn.dtype}. "
                             "Encode or convert the targets first.") from None
    yn = yn.astype(np.float64, copy=False)
    if yn.ndim not in (1, 2) or yn.shape[0] == 0:
        raise ValueError(f"y must have shape (n_samples,) or (n_samples, n_targets) with at least "
                         f"one sample; got shape {yn.shape}.")
    bad = ~np.isfinite(yn).reshape(len(yn), -1).all(axis=1)
    if bad.any():
        raise ValueError(f"y contains NaN or infinity in {int(bad.sum())} rows, the first at row "
                         f"{int(np.argmax(bad))}. Drop or impute those samples.")
    return check_magnitude(yn, "y")


def check_magnitude(a: np.ndarray, name: str) -> np.ndarray:
    """``a`` (finite float64, shape (n,) or (n, d)) if its sums of squares cannot overflow.

    Kernels add squares and products of X's values over its d columns (squared
    distances, inner products) and the solvers those of y's over its n·t entries
    (norms, inner products): with every ``|value| <= sqrt(max float64 / (4 · count))``
    none of them overflows to inf, which the solvers would report as NaN, failed
    eigenvalue solves or a matrix that is not positive definite.
    """
    count = a.shape[1] if name == "X" and a.ndim == 2 else a.size
    limit = math.sqrt(np.finfo(np.float64).max / (4 * max(count, 1)))
    big = np.abs(a) > limit
    if big.any():
        where = np.unravel_index(int(np.argmax(big)), a.shape)
        index = ", ".join(str(int(i)) for i in where)
        raise ValueError(
            f"{name}[{index}] = {a[where]:.6g} is too large: dkern sums squares and products of "
            f"{name}'s values, which overflow float64 for |values| above {limit:.3g} ({name} has "
            f"{int(big.sum())} such entries). Rescale {name} (e.g. with "
            "sklearn.preprocessing.StandardScaler, or by a power of 10) and fit again.")
    return a


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        return None
    return float(value)


def check_alpha(alpha: Any, solver: str, *,
                role: str = "the ridge penalty added to the Gram diagonal",
                example: str = "1e-3") -> float:
    """``alpha`` as a float: > 0 for the iterative solvers, >= 0 for exact (as scikit-learn).

    ``role`` says in the message what alpha is to this estimator."""
    value = finite_number(alpha)
    if value is None or value < 0 or (value == 0 and solver != "exact"):
        bound = ">= 0" if solver == "exact" else "> 0"
        raise ValueError(f"alpha must be a finite number {bound} for solver={solver!r} ({role}); "
                         f"got {alpha!r}. Use e.g. alpha={example}.")
    return value


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}.")
    return value


def check_optional_int(value: Any, name: str, minimum: int) -> int | None:
    """None, or ``value`` as an int >= ``minimum``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be None or an integer >= {minimum}; got {value!r}.")
    return int(value)


def check_tol(tol: Any) -> float:
    """``tol`` as a float > 0."""
    value = finite_number(tol)
    if value is None or value <= 0:
        raise ValueError(f"tol must be a finite number > 0, e.g. 1e-6; got {tol!r}.")
    return value


def as_generator(random_state: Any) -> np.random.Generator:
    """A numpy Generator from None, an int, a Generator or a legacy ``RandomState``."""
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(np.iinfo(np.int32).max))
    try:
        return np.random.default_rng(random_state)
    except (TypeError, ValueError):
        raise ValueError(f"random_state must be None, an int, a numpy Generator or RandomState; "
                         f"got {random_state!r}.") from None


def fixed_seed(random_state: Any) -> int:
    """An int seed: ``random_state`` itself when it is an int, else one drawn from it.

    Kept by a fitted model for the random draws of caches it may rebuild later (after
    ``dkern.load``, or under another dask client), so a rebuilt cache is the same one
    and the model's predictions do not change. A drawn seed is below 2³²: JSON readers
    that parse numbers as doubles keep it exact.
    """
    if isinstance(random_state, Integral) and not isinstance(random_state, bool):
        return int(random_state)
    return int(as_generator(random_state).integers(2**32))


def check_out_is_not_input(X: Any, url: Any, paths: list[str]) -> None:
    """A ValueError when writing the arrays ``paths`` of the store ``url`` would replace
    X given as ``(url, path)`` (the input read while the output is written)."""
    if not is_store_ref(X) or not isinstance(url, str | os.PathLike):
        return
    if store_location(X[0]) != store_location(url):
        return
    x = X[1].strip("/")
    for path in (p.strip("/") for p in paths):
        if path_within(x, path):
            raise ValueError(f"out would replace the input X {X!r} (writing {path!r}); write "
                             "the predictions to another array or store.")


def existing_arrays(url: Any, group: str = "") -> list[str]:
    """The arrays of ``group`` in the store at ``url``; ``[]`` if there is none yet."""
    try:
        return list_arrays(url, group)
    except StoreError:
        return []


def as_float64(a: Any) -> Any:
    """``a`` in float64 (the precision rule); a dask array is cast lazily, chunk by chunk,
    as it is read."""
    return a if a.dtype == np.float64 else a.astype(np.float64)


def in_memory(a: Any) -> np.ndarray:
    """``a`` as a float64 numpy array (computing it if it is a dask array)."""
    return np.asarray(a.compute() if isinstance(a, da.Array) else a, dtype=np.float64)


def legacy_seed(random_state: Any) -> Any:
    """A seed scikit-learn's ``check_random_state`` takes (Generators give an int)."""
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int32).max))
    return random_state


def checked_kernel(kernel: Any, default: Kernel) -> Kernel:
    """``kernel``, or ``default`` for None; TypeError naming the fix for anything else."""
    if kernel is None:
        return default
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a dkern kernel such as dkern.kernels.Gaussian(1.0), "
                        f"or None; got {type(kernel).__name__}.")
    return kernel


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
