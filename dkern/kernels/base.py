"""The kernel base class: parameters, repr, equality and the algebra operators.

A kernel is a symmetric function ``k(x, x')`` of two rows. Every kernel gives

* ``k(X, Z)``: the dense block ``K[i, j] = k(X[i], Z[j])`` as numpy, computed
  in place where it can (the numpy backend evaluates it on cache-sized tiles);
  ``k(X)`` is the Gram matrix of X with itself, the only block a
  :class:`~dkern.kernels.White` noise term enters (see *White noise* below);
* ``k.diag(X)``: ``k(X[i], X[i])`` without building the block;
* ``k.keops_formula(X, Z)``: the same block as a symbolic KeOps ``LazyTensor``,
  built by dkern so users never write KeOps alias strings;
* ``get_params`` / ``set_params`` as scikit-learn kernels do (scikit-learn's spellings,
  e.g. ``length_scale``, accepted as aliases), and a ``repr`` that
  ``dkern.kernels.from_repr`` turns back into an equal kernel;
* its learnable hyperparameters as scikit-learn's ``theta``: ``hyperparameter_names``,
  ``hyperparameters``, ``theta`` (natural logs, settable), ``bounds`` (log space),
  ``with_theta`` / ``clone_with_theta`` and the derivatives ``gradient`` /
  ``diag_gradient`` of the kernel values with respect to ``theta``
  (``k(X, eval_gradient=True)`` as scikit-learn's).

White noise
-----------
A :class:`~dkern.kernels.White` term adds ``noise · I`` to ``k(X)`` (Z None) and
nothing to the blocks ``k(x_i, z_j)`` dkern's operators evaluate; models add its
``white_noise()`` to their diagonal ``alpha`` (see ``White``).
"""

from __future__ import annotations

import copy
import inspect
from numbers import Real
from typing import Any, ClassVar, Literal, NamedTuple, cast, overload

import numpy as np

from .checks import Array, as_pair, format_bounds, format_param, is_default_bounds
from .checks import finite_values as finite_values  # re-exported: the backends' overflow check


class Hyperparameter(NamedTuple):
    """One learnable parameter, as scikit-learn's ``kernels.Hyperparameter``.

    ``bounds`` is ``"fixed"`` or the natural-space (not log) bounds, shape (n_elements, 2).
    """

    name: str
    value_type: str
    bounds: Any
    n_elements: int
    fixed: bool


class Kernel:
    """Base class of all dkern kernels.

    Subclasses store each ``__init__`` argument unchanged under its own name
    (scikit-learn's ``clone`` relies on that), implement ``_block``, ``diag``
    and ``keops_formula``, and check their parameters in ``_validate``. A subclass
    with learnable parameters names them in ``_hyperparameters``, takes their bounds
    as ``<name>_bounds`` and implements ``_value_and_gradient``. A subclass with
    scikit-learn spellings lists them in ``_aliases``, takes ``**aliases`` and passes
    them on to ``super().__init__``. Overriding ``__call__`` (as a wrapper calling
    ``super().__call__(X, Z)``) keeps working, without ``eval_gradient``.
    """

    #: This kernel's own learnable positive parameters (nested kernels add theirs).
    _hyperparameters: tuple[str, ...] = ()
    #: scikit-learn's spellings of this kernel's parameters, ``{alias: dkern name}``:
    #: accepted by ``__init__`` and ``set_params``; ``get_params`` keeps dkern's names.
    _aliases: ClassVar[dict[str, str]] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Kernel:
        # Only here are the given arguments seen as given (not as defaults): refuse a
        # parameter given twice, once by its scikit-learn spelling.
        for alias, name in cls._aliases.items():
            if alias in kwargs and (name in kwargs or cls._param_names().index(name) < len(args)):
                raise TypeError(f"{cls.__name__}: {name!r} was given twice, also as "
                                f"scikit-learn's spelling {alias!r}; give only one of them.")
        return super().__new__(cls)

    def __init__(self, **aliases: Any) -> None:
        for alias, value in aliases.items():
            if alias not in self._aliases:
                raise TypeError(f"{type(self).__name__} got an unexpected keyword argument "
                                f"{alias!r}; its parameters are {self._param_names()}"
                                + (f" (or scikit-learn's {sorted(self._aliases)})"
                                   if self._aliases else "") + ".")
            setattr(self, self._aliases[alias], value)
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
        """Set parameters (nested ones as ``kernel__lengthscale``) and re-validate.

        scikit-learn's spellings (``length_scale``, ``k2__length_scale``) are accepted, so a
        parameter grid written for scikit-learn's kernels works.
        """
        valid = self._param_names()
        given = [key.partition("__")[0] for key in params]
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name in self._aliases:
                if self._aliases[name] in given:
                    raise ValueError(f"{type(self).__name__}.set_params: {self._aliases[name]!r} "
                                     f"was given twice, also as scikit-learn's {name!r}; give "
                                     "only one of them.")
                name = self._aliases[name]
            if name not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {name!r}; "
                                 f"valid parameters are {valid}"
                                 + (f" (or scikit-learn's {sorted(self._aliases)})"
                                    if self._aliases else "") + ".")
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
    def __add__(self, other: Kernel | float) -> Kernel:
        from .algebra import Sum
        from .constant import Constant
        if isinstance(other, Kernel):
            return Sum(self, other)
        if isinstance(other, Real) and not isinstance(other, bool):
            return Sum(self, Constant(float(other)))  # k + c, as scikit-learn's
        return NotImplemented

    def __radd__(self, other: float) -> Kernel:
        from .algebra import Sum
        from .constant import Constant
        if isinstance(other, bool) or not isinstance(other, Real):
            return NotImplemented
        # 0 + k is k, so Python's sum(kernels) works (it starts from 0)
        return self if other == 0 else Sum(Constant(float(other)), self)

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
        """Natural logarithms of the learnable parameters; shape (p,), as scikit-learn's.

        Settable, as scikit-learn's: ``k.theta = t`` sets ``exp(t)`` in place (nested
        kernels included); ``with_theta`` returns a new kernel instead.
        """
        parts = [np.log(value).ravel() for _, value, _ in self._free()]
        parts += [child.theta for _, child in self._children()]
        return np.concatenate(parts) if parts else np.empty(0)

    @theta.setter
    def theta(self, theta: Any) -> None:
        self._take_values(self.with_theta(theta))  # with_theta checks theta

    def _take_values(self, other: Kernel) -> None:
        for name, _, _ in self._free():
            setattr(self, name, getattr(other, name))
        for prefix, child in self._children():
            child._take_values(getattr(other, prefix))

    @property
    def n_dims(self) -> int:
        """Number of learnable (non-fixed) log-parameters, ``len(theta)``."""
        return len(self.hyperparameter_names)

    @property
    def hyperparameters(self) -> list[Hyperparameter]:
        """Every hyperparameter, fixed ones included, as scikit-learn's list: this kernel's
        own (in ``theta`` order), then each nested kernel's with its ``k1__`` prefix."""
        own = []
        for name in self._hyperparameters:
            size = np.size(getattr(self, name))
            bounds = getattr(self, f"{name}_bounds")
            fixed = isinstance(bounds, str)
            own.append(Hyperparameter(name, "numeric", bounds if fixed else np.tile(
                np.asarray(bounds, dtype=float), (size, 1)), size, fixed))
        for prefix, child in self._children():
            own += [h._replace(name=f"{prefix}__{h.name}") for h in child.hyperparameters]
        return own

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

    def clone_with_theta(self, theta: Any) -> Kernel:
        """scikit-learn's name of :meth:`with_theta`."""
        return self.with_theta(theta)

    def gradient(self, X: Array, Z: Array | None = None) -> Array:
        """``∂K[i, j] / ∂theta_k`` for the dense block of X (n, d) and Z (m, d); shape (n, m, p).

        ``theta`` is in log space (for a lengthscale ``l``: ``l ∂K/∂l``), the layout of
        scikit-learn's ``kernel(X, eval_gradient=True)``. It holds n·m·p values: call it
        on tiles. With Z given, White terms contribute zero (module docstring); with Z
        None, as ``k(X)``, their ``white_noise_gradient()`` is on the diagonal.
        """
        same = Z is None
        X, Z = as_pair(X, Z)
        G = self._value_and_gradient(X.astype(float, copy=False), Z.astype(float, copy=False),
                                     False)[1]
        if same and self.has_white:
            G[np.arange(len(X)), np.arange(len(X))] += self.white_noise_gradient()
        return G

    def diag_gradient(self, X: Array) -> Array:
        """``∂k(X[i], X[i]) / ∂theta_k`` for X of shape (n, d); shape (n, p)."""
        X = np.asarray(X, dtype=float)
        return self._value_and_gradient(X, X, True)[1]

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        """The float64 kernel values and their theta-gradient: (n, m) and (n, m, p), or, with
        ``diag``, (n,) and (n, p) for the pairs (X[i], X[i]). Kernels without learnable
        parameters give p = 0. The (n, m) block is the one of distinct operands: White
        terms give zero there (module docstring)."""
        if self._hyperparameters or self._children():
            raise NotImplementedError(f"{type(self).__name__} has no gradient")
        K = np.asarray(self.diag(X) if diag else self(X, Z), dtype=float)
        return K, np.zeros((*K.shape, 0))

    # --------------------------------------------------------- white noise
    @property
    def has_white(self) -> bool:
        """Whether a :class:`~dkern.kernels.White` term is part of this kernel."""
        return any(child.has_white for _, child in self._children())

    def white_noise(self) -> float:
        """The noise variance the White terms add to ``k(X)``'s diagonal (0.0 without any).

        A model adds it to its training system's diagonal ``alpha``; blocks ``k(x, z)``
        never hold it (module docstring). Sums add, ``c * k`` scales it; a product with
        White other than by a :class:`~dkern.kernels.Constant` is refused when built.
        """
        return self._white()[0]

    def white_noise_gradient(self) -> Array:
        """``∂ white_noise() / ∂theta``; shape (p,), the layout of ``theta``."""
        return self._white()[1]

    def without_white(self) -> Kernel | None:
        """A copy of this kernel with its White terms removed (for cross-covariances and
        noise-free predictions), or None if it is white noise only."""
        stripped = self._strip_white()
        return None if stripped is None else copy.deepcopy(stripped)

    def _strip_white(self) -> Kernel | None:
        """``without_white`` sharing the unchanged parts; composites with White override it."""
        if self.has_white:
            raise ValueError(f"{type(self).__name__} cannot separate its White terms; "
                             "use White only in sums, c * k and products with Constant.")
        return self

    def _white(self) -> tuple[float, Array]:
        """(``white_noise()``, ``white_noise_gradient()``); composites override it."""
        if self.has_white:
            self._strip_white()  # raises, naming the kernel
        return 0.0, np.zeros(self.n_dims)

    # ----------------------------------------------------- to be overridden
    @overload
    def __call__(self, X: Array, Z: Array | None = None,
                 eval_gradient: Literal[False] = False) -> Array: ...

    @overload
    def __call__(self, X: Array, Z: Array | None, eval_gradient: Literal[True]) \
        -> tuple[Array, Array]: ...

    def __call__(self, X: Array, Z: Array | None = None,
                 eval_gradient: bool = False) -> Array | tuple[Array, Array]:
        """Dense kernel block of shape (n, m) for X (n, d) and Z (m, d).

        ``Z`` None is ``k(X)``, the Gram matrix of X with itself (White terms on its
        diagonal); a given Z, even X itself, is the block of distinct operands.
        ``eval_gradient=True`` (Z None, small X) returns ``(K, dK)`` with ``dK`` of shape
        (n, n, p), as scikit-learn's. Subclasses implement ``_block``.
        """
        if not eval_gradient:
            return self._block(X, Z)
        if Z is not None:
            raise ValueError(f"{type(self).__name__}(X, Z, eval_gradient=True): the gradient is "
                             "given for k(X) only, as scikit-learn's; call k(X, "
                             "eval_gradient=True), or k.gradient(X, Z) for a block.")
        return np.asarray(self._block(X, None), dtype=float), self.gradient(X)

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        """The dense block (see ``__call__``); Z None is the Gram matrix of X."""
        raise NotImplementedError

    def diag(self, X: Array) -> Array:
        """``k(X[i], X[i])`` for X of shape (n, d); returns shape (n,)."""
        raise NotImplementedError

    def keops_formula(self, X: Array, Z: Array) -> Any:
        """Symbolic KeOps ``LazyTensor`` of shape (n, m) equal to ``self(X, Z)``."""
        raise NotImplementedError


def _param_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Kernel) or isinstance(b, Kernel):
        return a == b
    if callable(a) or callable(b):
        return a is b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))
