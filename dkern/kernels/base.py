"""The kernel base class: parameters, repr, equality and the algebra operators.

A kernel is a symmetric function ``k(x, x')`` of two rows. Every kernel gives

* ``k(X, Z)``: the dense block ``K[i, j] = k(X[i], Z[j])`` as numpy, computed
  in place where it can (the numpy backend evaluates it on cache-sized tiles);
* ``k.diag(X)``: ``k(X[i], X[i])`` without building the block;
* ``k.keops_formula(X, Z)``: the same block as a symbolic KeOps ``LazyTensor``,
  built by dkern so users never write KeOps alias strings;
* ``get_params`` / ``set_params`` as scikit-learn kernels do, and a ``repr``
  that ``dkern.kernels.from_repr`` turns back into an equal kernel.
"""

from __future__ import annotations

import inspect
from numbers import Integral, Real
from typing import Any, cast

import numpy as np

Array = np.ndarray


class Kernel:
    """Base class of all dkern kernels.

    Subclasses store each ``__init__`` argument unchanged under its own name
    (scikit-learn's ``clone`` relies on that), implement ``__call__``, ``diag``
    and ``keops_formula``, and check their parameters in ``_validate``.
    """

    def __init__(self) -> None:
        self._validate()

    # ----------------------------------------------------------- parameters
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind != p.VAR_KEYWORD]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Parameters of this kernel; with ``deep``, nested kernels' as ``name__param``."""
        params = {name: getattr(self, name) for name in self._param_names()}
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Kernel):
                    params.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return params

    def set_params(self, **params: Any) -> Kernel:
        """Set parameters (nested ones as ``kernel__lengthscale``) and re-validate."""
        valid = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {name!r}; "
                                 f"valid parameters are {valid}.")
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub_params in nested.items():
            getattr(self, name).set_params(**sub_params)
        self._validate()
        return self

    def _validate(self) -> None:
        """Raise ``ValueError``/``TypeError`` naming the bad parameter."""

    # ------------------------------------------------------ repr and equality
    def __repr__(self) -> str:
        args = ", ".join(f"{n}={_format_param(getattr(self, n))}" for n in self._param_names())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        mine, theirs = self.get_params(deep=False), cast(Kernel, other).get_params(deep=False)
        return all(_param_equal(mine[k], theirs[k]) for k in mine)

    __hash__ = None  # type: ignore[assignment]  # mutable through set_params

    def __dask_tokenize__(self) -> tuple[str, ...]:
        return (type(self).__name__, repr(self))

    # ------------------------------------------------------------- algebra
    def __add__(self, other: Kernel) -> Kernel:
        from .algebra import Sum
        return Sum(self, other) if isinstance(other, Kernel) else NotImplemented

    def __mul__(self, other: Kernel | float) -> Kernel:
        from .algebra import Product, Scaled
        if isinstance(other, Kernel):
            return Product(self, other)
        if isinstance(other, Real):
            return Scaled(float(other), self)
        return NotImplemented

    def __rmul__(self, other: float) -> Kernel:
        from .algebra import Scaled
        return Scaled(float(other), self) if isinstance(other, Real) else NotImplemented

    def __pow__(self, power: int) -> Kernel:
        from .algebra import Power
        return Power(self, power)

    # ----------------------------------------------------- to be overridden
    def __call__(self, X: Array, Z: Array | None = None) -> Array:
        """Dense kernel block of shape (n, m) for X (n, d) and Z (m, d); Z defaults to X."""
        raise NotImplementedError

    def diag(self, X: Array) -> Array:
        """``k(X[i], X[i])`` for X of shape (n, d); returns shape (n,)."""
        raise NotImplementedError

    def keops_formula(self, X: Array, Z: Array) -> Any:
        """Symbolic KeOps ``LazyTensor`` of shape (n, m) equal to ``self(X, Z)``."""
        raise NotImplementedError


def _format_param(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return repr(value.tolist())
    if isinstance(value, np.generic):
        return repr(value.item())
    if callable(value) and not isinstance(value, Kernel):
        return getattr(value, "__name__", repr(value))
    return repr(value)


def _param_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Kernel) or isinstance(b, Kernel):
        return a == b
    if callable(a) or callable(b):
        return a is b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


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

