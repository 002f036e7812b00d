"""The kernel base class: parameters, repr, equality and the algebra operators.

A kernel is a symmetric function ``k(x, x')`` of two rows. Every kernel gives

* ``k(X, Z)``: the dense block ``K[i, j] = k(X[i], Z[j])`` as numpy, computed
  in place where it can (the numpy backend evaluates it on cache-sized tiles);
* ``k.diag(X)``: ``k(X[i], X[i])`` without building the block;
* ``k.keops_formula(X, Z)``: the same block as a symbolic KeOps ``LazyTensor``,
  built by dkern so users never write KeOps alias strings;
* ``get_params`` / ``set_params`` as scikit-learn kernels do, and a ``repr``
  that ``dkern.kernels.from_repr`` turns back into an equal kernel;
* its learnable hyperparameters as scikit-learn's ``theta``: ``hyperparameter_names``,
  ``theta`` (natural logs), ``bounds`` (log space), ``with_theta`` and the derivatives
  ``gradient`` / ``diag_gradient`` of the kernel values with respect to ``theta``.
"""

from __future__ import annotations

import inspect
from numbers import Integral, Real
from typing import Any, cast

import numpy as np

Array = np.ndarray
#: Bounds of a learnable parameter when none are given: scikit-learn's default.
DEFAULT_BOUNDS = (1e-5, 1e5)
#: The bounds value that keeps a parameter out of ``theta`` (held at its value).
FIXED = "fixed"


class Kernel:
    """Base class of all dkern kernels.

    Subclasses store each ``__init__`` argument unchanged under its own name
    (scikit-learn's ``clone`` relies on that), implement ``__call__``, ``diag``
    and ``keops_formula``, and check their parameters in ``_validate``. A subclass
    with learnable parameters names them in ``_hyperparameters``, takes their bounds
    as ``<name>_bounds`` and implements ``_value_and_gradient``.
    """

    #: This kernel's own learnable positive parameters (nested kernels add theirs).
    _hyperparameters: tuple[str, ...] = ()

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
        # Default bounds are left out, so reprs (and model files) from before bounds existed
        # stay valid and unchanged.
        args = ", ".join(
            f"{n}={format_bounds(v) if n.endswith('_bounds') else format_param(v)}"
            for n, v in self.get_params(deep=False).items()
            if not (n.endswith("_bounds") and is_default_bounds(v)))
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

    # ----------------------------------------------------- hyperparameters
    def _free(self) -> list[tuple[str, Array, Any]]:
        """(name, value as a float array, bounds) of this kernel's own non-fixed parameters."""
        free = []
        for name in self._hyperparameters:
            bounds = getattr(self, f"{name}_bounds")
            if not isinstance(bounds, str):
                free.append((name, np.asarray(getattr(self, name), dtype=float), bounds))
        return free

    def _children(self) -> list[tuple[str, Kernel]]:
        return [(n, v) for n, v in self.get_params(deep=False).items() if isinstance(v, Kernel)]

    @property
    def hyperparameter_names(self) -> list[str]:
        """Names of the entries of ``theta``, as ``get_params`` keys (``"k1__constant"``,
        ``"lengthscale[2]"`` for an ARD entry); parameters with bounds ``"fixed"`` are left out."""
        names: list[str] = []
        for name, value, _ in self._free():
            names += [name] if value.ndim == 0 else [f"{name}[{i}]" for i in range(value.size)]
        for prefix, child in self._children():
            names += [f"{prefix}__{name}" for name in child.hyperparameter_names]
        return names

    @property
    def theta(self) -> Array:
        """Natural logarithms of the learnable parameters; shape (p,), as scikit-learn's."""
        parts = [np.log(value).ravel() for _, value, _ in self._free()]
        parts += [child.theta for _, child in self._children()]
        return np.concatenate(parts) if parts else np.empty(0)

    @property
    def bounds(self) -> Array:
        """Log-space bounds of ``theta``; shape (p, 2)."""
        rows = [np.tile(np.log(np.asarray(b, dtype=float)), (value.size, 1))
                for _, value, b in self._free()]
        rows += [child.bounds for _, child in self._children()]
        return np.vstack(rows) if rows else np.empty((0, 2))

    def with_theta(self, theta: Any) -> Kernel:
        """A new kernel with learnable parameters ``exp(theta)``; this one is unchanged.

        Parameters
        ----------
        theta : array-like of shape (p,)
            Log-parameters in the order of ``hyperparameter_names``.
        """
        values = np.asarray(theta, dtype=float)
        p = len(self.hyperparameter_names)
        if values.shape != (p,) or not np.all(np.isfinite(values)):
            raise ValueError(f"{type(self).__name__}.with_theta: theta must be {p} finite "
                             f"log-parameters, one per name in {self.hyperparameter_names}; got "
                             f"{np.asarray(theta)!r}.")
        params, start = self.get_params(deep=False), 0
        for name, value, _ in self._free():
            new = np.exp(values[start:start + value.size])
            params[name] = float(new[0]) if value.ndim == 0 else new
            start += value.size
        for prefix, child in self._children():
            size = len(child.hyperparameter_names)
            params[prefix] = child.with_theta(values[start:start + size])
            start += size
        return type(self)(**params)

    def gradient(self, X: Array, Z: Array | None = None) -> Array:
        """``∂K[i, j] / ∂theta_k`` for the dense block of X (n, d) and Z (m, d); shape (n, m, p).

        ``theta`` is in log space (for a lengthscale ``l``: ``l ∂K/∂l``), the layout of
        scikit-learn's ``kernel(X, eval_gradient=True)``. It holds n·m·p values: call it
        on tiles.
        """
        X, Z = as_pair(X, Z)
        return self._value_and_gradient(X.astype(float, copy=False), Z.astype(float, copy=False),
                                        False)[1]

    def diag_gradient(self, X: Array) -> Array:
        """``∂k(X[i], X[i]) / ∂theta_k`` for X of shape (n, d); shape (n, p)."""
        X = np.asarray(X, dtype=float)
        return self._value_and_gradient(X, X, True)[1]

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        """The float64 kernel values and their theta-gradient: (n, m) and (n, m, p), or, with
        ``diag``, (n,) and (n, p) for the pairs (X[i], X[i]). Kernels without learnable
        parameters give p = 0."""
        if self._hyperparameters or self._children():
            raise NotImplementedError(f"{type(self).__name__} has no gradient")
        K = np.asarray(self.diag(X) if diag else self(X, Z), dtype=float)
        return K, np.zeros((*K.shape, 0))

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


def finite_values(K: Array, kernel: Kernel, *inputs: Array | None) -> Array:
    """``K`` (computed by the kernel from ``inputs``) unless some value is infinite or NaN
    while every input is finite: then the kernel's values overflowed float64, as a polynomial,
    product, power or exponential of large values can, and a ValueError says so here,
    not as NaN several steps later in a solver. Non-finite inputs are left to the input
    checks (and pass through where those are turned off)."""
    if np.isfinite(K).all() or not all(np.isfinite(a).all() for a in inputs if a is not None):
        return K
    raise ValueError(
        f"the kernel {kernel!r} overflows float64 on these inputs: some of its values are "
        "infinite. Rescale the features (e.g. with sklearn.preprocessing.StandardScaler), "
        "or use a kernel of lower degree."
    )


def format_param(value: Any) -> str:
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

