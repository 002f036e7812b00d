"""Checks and formatting shared by the kernels: parameters, bounds, operands, values.

Each check raises a ``ValueError``/``TypeError`` that names the parameter, what it
must be, and what came, so a bad kernel is refused when it is built.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .base import Kernel

Array = np.ndarray
#: Bounds of a learnable parameter when none are given: scikit-learn's default.
DEFAULT_BOUNDS = (1e-5, 1e5)
#: The bounds value that keeps a parameter out of ``theta`` (held at its value).
FIXED = "fixed"


def finite_values(K: Array, kernel: Kernel, *inputs: Array | None,
                  computed_in: np.dtype | None = None) -> Array:
    """``K`` (computed by the kernel from ``inputs``) unless some value is infinite or NaN
    while every input is finite: then the kernel's values overflowed K's dtype, as a
    polynomial, product, power or exponential of large values can, and a ValueError says so
    here, not as NaN several steps later in a solver. Non-finite inputs are left to the
    input checks (and pass through where those are turned off). ``computed_in``: the dtype
    the values were computed in, for the message (default K's: a fused product computed
    in float32 may return float64 sums)."""
    if np.isfinite(K).all() or not all(np.isfinite(a).all() for a in inputs if a is not None):
        return K
    dtype = np.dtype(computed_in or K.dtype)
    wider = (" or compute in float64 (float64 rows, or dtype=np.float64)"
             if dtype != np.float64 else "")
    vectors = [a for a in inputs[2:] if a is not None and np.size(a)]
    # a product K v (the third input on) overflows also where k's values are finite
    products, scales = "", ""
    if vectors:
        largest = max(float(np.max(np.abs(v))) for v in vectors)
        products = (f", or of its products with a vector of the solver's (largest |entry| "
                    f"{largest:.3g}),")
        scales = " or the kernel's amplitude (its constant factor), for a regressor the targets,"
    raise ValueError(
        f"the kernel {kernel!r} overflows {dtype} on these inputs: some of its values"
        f"{products} are infinite. Rescale the features (e.g. with "
        f"sklearn.preprocessing.StandardScaler){scales} or use a kernel of lower degree"
        f"{wider}."
    )


def format_param(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return repr(value.tolist())
    if isinstance(value, np.generic):
        return repr(value.item())
    if callable(value) and not isinstance(value, Kernel):
        return getattr(value, "__name__", repr(value))
    return repr(value)


def check_positive_params(values: Any, name: str, owner: str) -> Array:
    """``values`` as a float array, every entry finite and > 0, else a ``ValueError``."""
    if isinstance(values, bool | str) or values is None:
        raise TypeError(f"{owner}: {name} must be a positive number or a sequence of them; "
                        f"got {values!r}.")
    arr = np.asarray(values, dtype=float)
    if arr.ndim > 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{owner}: {name} must be > 0 and finite (a scalar or one per feature); "
                         f"got {values!r}.")
    return arr


def format_bounds(bounds: Any) -> str:
    """``"fixed"`` or ``(low, high)``: one spelling, whether given as a tuple, list or array."""
    return repr(bounds) if isinstance(bounds, str) else repr(tuple(float(b) for b in bounds))


def is_default_bounds(bounds: Any) -> bool:
    return not isinstance(bounds, str) and np.array_equal(np.asarray(bounds), DEFAULT_BOUNDS)


def check_bounds(bounds: Any, name: str, owner: str) -> None:
    """Raise unless ``bounds`` is ``"fixed"`` or a pair ``(low, high)``, 0 < low <= high < inf."""
    if isinstance(bounds, str) and bounds == FIXED:
        return
    arr = np.asarray(None if isinstance(bounds, str | bool) else bounds, dtype=object)
    ok = arr.shape == (2,) and all(isinstance(b, Real) and not isinstance(b, bool) for b in arr)
    if ok:
        low, high = float(arr[0]), float(arr[1])
        ok = 0 < low <= high < np.inf
    if not ok:
        raise ValueError(f"{owner}: {name} must be a pair (low, high) with 0 < low <= high < inf, "
                         f"e.g. {DEFAULT_BOUNDS}, or {FIXED!r} to keep the parameter out of "
                         f"theta; got {bounds!r}.")


def check_integer(value: Any, name: str, owner: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, else a ``TypeError``/``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        if isinstance(value, Real) and float(value).is_integer():
            value = int(float(value))
        else:
            raise TypeError(f"{owner}: {name} must be an integer >= {minimum}; got {value!r}.")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}; got {value!r}.")
    return int(value)


def check_n_features(kernel: Kernel, n_features: int) -> None:
    """Raise now, not inside a task, if an ARD lengthscale anywhere in ``kernel`` does
    not have one entry per feature."""
    for key, value in kernel.get_params(deep=True).items():
        if key.rpartition("__")[2] == "lengthscale" and np.ndim(value) == 1 \
                and len(value) != n_features:
            raise ValueError(f"{kernel!r}: lengthscale has {len(value)} entries but the data has "
                             f"{n_features} features; give one per feature or a scalar.")


def as_pair(X: Array, Z: Array | None) -> tuple[Array, Array]:
    """Check that X and Z are 2-D with the same feature count; Z defaults to X."""
    X = np.asarray(X)
    Z = X if Z is None else np.asarray(Z)
    if X.ndim != 2 or Z.ndim != 2 or X.shape[1] != Z.shape[1]:
        raise ValueError(f"kernel operands must be 2-D with the same number of features; "
                         f"got X of shape {X.shape} and Z of shape {Z.shape}.")
    return X, Z
