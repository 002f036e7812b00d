"""Input checks shared by the estimators: operands, targets, parameters, random state.

In-memory operands go through scikit-learn's ``validate_data`` (its messages,
``n_features_in_`` and ``feature_names_in_``); dask and Zarr operands go through
:func:`dkern.io.as_rows`, which checks them lazily, chunk by chunk, without
loading them.
"""

from __future__ import annotations

import logging
import math
import os
from numbers import Integral, Real
from typing import Any

import dask
import dask.array as da
import numpy as np
from sklearn.utils import assert_all_finite, column_or_1d
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from ..errors import StoreError
from ..io import (
    as_rows,
    checked_values,
    is_lazy,
    is_store_ref,
    list_arrays,
    path_within,
    store_location,
)
from ..kernels import Kernel, from_sklearn
from ..operators.memory import rows_within_tasks

logger = logging.getLogger(__name__)


def check_X(estimator: Any, X: Any, *, reset: bool) -> np.ndarray | da.Array:
    """X as a float64 numpy array (in-memory input) or a row-chunked dask array (lazy input).

    ``reset=True`` records ``n_features_in_``; ``reset=False`` checks X against it
    with scikit-learn's message.
    """
    if not is_lazy(X):
        return check_magnitude(validate_data(estimator, X, reset=reset, dtype=np.float64), "X")
    Xd = rows_within_tasks(X, name="X", check_finite=False)
    Xd = checked_values(Xd, "X", magnitude_limit("X", Xd.shape))
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
    yv = _lazy_y(y) if is_lazy(y) else _numpy_y(y)
    if yv.shape[0] != n_rows:
        raise ValueError(f"y has {yv.shape[0]} rows but X has {n_rows}; pass one target row "
                         "per sample of X.")
    if yv.ndim == 2 and yv.shape[1] == 0:
        raise ValueError(f"y has shape {yv.shape}: no target columns. Pass at least one target, "
                         "shape (n_samples,) or (n_samples, n_targets).")
    return yv


def check_sample_weight(sample_weight: Any, n_rows: int) -> tuple[np.ndarray | da.Array, float]:
    """Sample weights of shape (n_rows,) (a number: the same for every row), finite and
    >= 0 with a positive sum, and that sum.

    Dask and Zarr weights stay lazy; their checks read them once (n numbers).
    """
    lazy = is_lazy(sample_weight)
    w = as_rows(sample_weight, name="sample_weight", ndim=(1,)).astype(np.float64) if lazy \
        else np.asarray(sample_weight, dtype=np.float64)
    if w.ndim == 0:  # one number for every row, as scikit-learn broadcasts it
        w = np.full(n_rows, float(w))
    if w.ndim != 1 or w.shape[0] != n_rows:
        raise ValueError(f"sample_weight must have shape ({n_rows},), one weight per row of X; "
                         f"got shape {w.shape}.")
    lowest, total, finite = (dask.compute(w.min(), w.sum(), da.isfinite(w).all()) if lazy
                             else (w.min(), w.sum(), np.isfinite(w).all()))
    problem = ("NaN or infinity" if not finite else f"a weight {lowest:g}" if lowest < 0
               else "all weights zero" if not total > 0 else None)
    if problem:
        raise ValueError(f"sample_weight must be finite and >= 0 with a positive sum; got "
                         f"{problem}.")
    return w, float(total)


def check_labels(y: Any, n_rows: int, owner: str) -> np.ndarray:
    """Class labels as a 1-D numpy array of length ``n_rows`` (dask/Zarr labels are read)."""
    if y is None:
        raise ValueError(f"{owner} requires y to be passed, but the target y is None. Pass "
                         "the class labels, shape (n_samples,).")
    yv = as_rows(y, name="y", ndim=(1, 2)).compute() if is_lazy(y) else y
    shape = np.asarray(yv).shape  # np.shape would call __array_function__, which not all take
    if len(shape) == 2 and shape[1] > 1:
        raise ValueError(f"{owner} takes one column of class labels, shape (n_samples,); got y "
                         f"of shape {shape}. Fit one model per column, e.g. with "
                         f"sklearn.multioutput.MultiOutputClassifier({owner}(...)).")
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


def _lazy_y(y: Any) -> da.Array:
    """Dask or stored y, checked for non-finite and too large values as its chunks are read."""
    yd = as_rows(y, name="y", ndim=(1, 2), check_finite=False)
    return checked_values(yd, "y", magnitude_limit("y", yd.shape))


def check_magnitude(a: np.ndarray, name: str) -> np.ndarray:
    """``a`` (finite float64, shape (n,) or (n, d)) if its sums of squares cannot overflow.

    Kernels add squares and products of X's values over its d columns (squared
    distances, inner products) and the solvers those of y's over its n·t entries
    (norms, inner products): with every ``|value| <= sqrt(max float64 / (4 · count))``
    none of them overflows to inf, which the solvers would report as NaN, failed
    eigenvalue solves or a matrix that is not positive definite.
    """
    limit = magnitude_limit(name, a.shape)
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


def magnitude_limit(name: str, shape: tuple[int, ...]) -> float:
    """The largest ``|value|`` of X (shape (n, d)) or y (any shape) whose sums of squares
    cannot overflow float64: X's over its d columns, y's over all its entries."""
    count = shape[1] if name == "X" and len(shape) == 2 else math.prod(shape)
    return math.sqrt(np.finfo(np.float64).max / (4 * max(count, 1)))


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
    if np.ndim(alpha) > 0:
        raise ValueError(
            f"alpha must be one number ({role}); got an array of shape {np.shape(alpha)}. "
            "scikit-learn's per-target (KernelRidge) and per-sample (GaussianProcessRegressor) "
            "alpha arrays are not supported; for per-target penalties fit one model per "
            "target column.")
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


def kept_copy(a: Any, given: Any) -> Any:
    """``a`` (rows derived from the caller's ``given``) as an array the caller cannot
    change after fit: a numpy array that is ``given`` itself or a view (of it, or of a
    DataFrame) is copied; lazy rows and arrays made here are kept as they are.

    scikit-learn's Gaussian processes copy their training rows (``copy_X_train=True``):
    a fitted model that kept a reference predicted from rows changed after fit, beside
    factors computed from the old ones."""
    if isinstance(a, np.ndarray) and (a is given or not a.flags.owndata):
        return a.copy()
    return a


def in_memory(a: Any) -> np.ndarray:
    """``a`` as a float64 numpy array (computing it if it is a dask array)."""
    return np.asarray(a.compute() if isinstance(a, da.Array) else a, dtype=np.float64)


def legacy_seed(random_state: Any) -> Any:
    """A seed scikit-learn's ``check_random_state`` takes (Generators give an int)."""
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int32).max))
    return random_state


def checked_kernel(kernel: Any, default: Kernel) -> Kernel:
    """``kernel``, or ``default`` for None; TypeError naming the fix for anything else.

    A scikit-learn kernel object (``sklearn.gaussian_process.kernels``) is converted by
    :func:`dkern.kernels.from_sklearn`, with one INFO log line; the estimator's ``kernel``
    parameter keeps the object as given (scikit-learn's contract: ``fit`` does not modify
    parameters), and the converted kernel is the one ``kernel_`` holds.
    """
    if kernel is None:
        return default
    if is_sklearn_kernel(kernel):
        converted = from_sklearn(kernel)
        logger.info("kernel: converted the scikit-learn kernel %r to the dkern kernel %r",
                    kernel, converted)
        return converted
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a dkern kernel such as dkern.kernels.Gaussian(1.0), "
                        f"a scikit-learn kernel object, or None; got {type(kernel).__name__}.")
    return kernel


class DefaultKernel:
    """An estimator whose ``kernel=None`` means ``_default_kernel()``: ``set_params`` with
    nested ``kernel__…`` keys makes that default explicit first, so a parameter grid for
    the default kernel's hyperparameters (``{"kernel__lengthscale": [...]}``) works where
    it would fail on None ("'NoneType' object has no attribute 'set_params'")."""

    @staticmethod
    def _default_kernel() -> Kernel:
        raise NotImplementedError

    def set_params(self, **params: Any) -> Any:
        nested = any(key.startswith("kernel__") for key in params)
        if not (nested and "kernel" not in params and getattr(self, "kernel", None) is None):
            return super().set_params(**params)  # type: ignore[misc]
        self.kernel = self._default_kernel()  # a fresh one: never a shared default
        try:
            return super().set_params(**params)  # type: ignore[misc]
        except Exception:
            self.kernel = None  # a refused key leaves the estimator as it was
            raise


def is_sklearn_kernel(kernel: Any) -> bool:
    """Whether ``kernel`` is a scikit-learn ``sklearn.gaussian_process.kernels`` object."""
    return type(kernel).__module__.startswith("sklearn.gaussian_process")


def refuse_white(kernel: Kernel, owner: str, fix: str) -> Kernel:
    """``kernel`` if it holds no :class:`~dkern.kernels.White` term, else a ValueError.

    White's blocks ``k(x, z)`` are zero (see :mod:`dkern.kernels.base`), so a model that
    does not add ``kernel.white_noise()`` to its diagonal itself would ignore the noise
    silently; such models refuse it instead, naming ``fix``.
    """
    if kernel.has_white:
        raise ValueError(f"{owner} does not support White noise terms; got kernel {kernel!r} "
                         f"(noise level {kernel.white_noise():.6g}). {fix}")
    return kernel
