"""The closure rules of kernel algebra; each result is again a kernel.

If ``k``, ``k1`` and ``k2`` are positive semi-definite, so are ``c * k`` (c > 0),
``k1 + k2``, ``k1 * k2`` (Schur product theorem), ``k ** p`` (integer p >= 1),
``exp(k)`` (a limit of sums of powers) and ``f(x) k(x, x') f(x')`` (a congruence
by ``diag(f)``).

An expression nests at most ``MAX_DEPTH`` operations: its ``repr``, ``==``, the model
file's parser (:func:`dkern.kernels.from_repr`) and the kernel's evaluation on the
workers each recurse once per level, so a deeper one is refused when it is built,
never later when it is saved or sent to the cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real
from typing import Any, cast

import numpy as np

from . import fastexp
from .base import Kernel
from .checks import (
    DEFAULT_BOUNDS,
    Array,
    as_pair,
    check_bounds,
    check_integer,
    finite_values,
    format_bounds,
    is_default_bounds,
)
from .constant import Constant

#: Most operations (``+``, ``*``, ``**``, ``c *``, ``exp``, ``warp``) one path of a kernel
#: expression may nest. A chain ``k1 + k2 + ... + kn`` nests n - 1; a balanced tree of
#: the same sum nests log2(n). 100 keeps the repr within Python's 200 nested parentheses
#: (the model file) and the recursion far below Python's default limit of 1000 frames.
MAX_DEPTH = 100


class Scaled(Kernel):
    """``constant * kernel`` with ``constant > 0``; written ``c * k``.

    The constant is a learnable hyperparameter (the output scale, scikit-learn's
    ``ConstantKernel() * k``) with ``constant_bounds`` (default (1e-5, 1e5), or
    ``"fixed"``); ``Scaled(c, k, constant_bounds="fixed")`` keeps it out of ``theta``.
    scikit-learn's spellings ``constant_value`` / ``constant_value_bounds`` are aliases.
    """

    _hyperparameters = ("constant",)
    _aliases = {"constant_value": "constant", "constant_value_bounds": "constant_bounds"}

    def __init__(self, constant: float, kernel: Kernel,
                 constant_bounds: Any = DEFAULT_BOUNDS, **aliases: Any) -> None:
        self.constant = constant
        self.kernel = kernel
        self.constant_bounds = constant_bounds
        super().__init__(**aliases)

    def _validate(self) -> None:
        _check_kernel(self.kernel, "kernel", "Scaled")
        c = self.constant
        if isinstance(c, bool) or not isinstance(c, Real) or not np.isfinite(c) or c <= 0:
            raise ValueError(f"Scaled: the constant c in c * k must be a finite number > 0 "
                             f"(a non-positive c breaks positive definiteness); got {c!r}.")
        check_bounds(self.constant_bounds, "constant_bounds", "Scaled")

    def __repr__(self) -> str:
        if is_default_bounds(self.constant_bounds):
            return f"({self.constant!r} * {self.kernel!r})"
        return (f"Scaled(constant={self.constant!r}, kernel={self.kernel!r}, "
                f"constant_bounds={format_bounds(self.constant_bounds)})")

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K0, G0 = self.kernel._value_and_gradient(X, Z, diag)
        K = self.constant * K0
        own = [K[..., None]] if self._free() else []  # d(c K0) / d log c = c K0
        return K, np.concatenate([*own, self.constant * G0], axis=-1)

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        K = self.kernel(X, Z)
        K *= self.constant
        return K

    def diag(self, X: Array) -> Array:
        return self.constant * self.kernel.diag(X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        if self.has_white:  # White's blocks are zero: its terms stay out of the formula
            return _white_free(self).keops_formula(X, Z)
        return float(self.constant) * self.kernel.keops_formula(X, Z)

    def _white(self) -> tuple[float, Array]:
        noise, grad = self.kernel._white()
        own = [self.constant * noise] if self._free() else []  # ∂(c n) / ∂log c = c n
        return self.constant * noise, np.concatenate([own, self.constant * grad])

    def _strip_white(self) -> Kernel | None:
        if not self.has_white:
            return self
        inner = self.kernel._strip_white()
        return None if inner is None else Scaled(self.constant, inner, self.constant_bounds)


class _Binary(Kernel):
    symbol = ""

    def __init__(self, k1: Kernel, k2: Kernel) -> None:
        self.k1 = k1
        self.k2 = k2
        super().__init__()

    def _validate(self) -> None:
        _check_kernel(self.k1, "k1", type(self).__name__)
        _check_kernel(self.k2, "k2", type(self).__name__)

    def __repr__(self) -> str:
        return f"({self.k1!r} {self.symbol} {self.k2!r})"


class Sum(_Binary):
    """``k1 + k2``."""

    symbol = "+"

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        K = self.k1(X, Z)
        K += self.k2(X, Z)
        return K

    def diag(self, X: Array) -> Array:
        return self.k1.diag(X) + self.k2.diag(X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        if self.has_white:  # White's blocks are zero: its terms stay out of the formula
            return _white_free(self).keops_formula(X, Z)
        return self.k1.keops_formula(X, Z) + self.k2.keops_formula(X, Z)

    def _white(self) -> tuple[float, Array]:
        (n1, g1), (n2, g2) = self.k1._white(), self.k2._white()
        return n1 + n2, np.concatenate([g1, g2])

    def _strip_white(self) -> Kernel | None:
        if not self.has_white:
            return self
        a, b = self.k1._strip_white(), self.k2._strip_white()
        return b if a is None else a if b is None else Sum(a, b)

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K1, G1 = self.k1._value_and_gradient(X, Z, diag)
        K2, G2 = self.k2._value_and_gradient(X, Z, diag)
        return K1 + K2, np.concatenate([G1, G2], axis=-1)


class Product(_Binary):
    """``k1 * k2`` (elementwise product of the Gram matrices)."""

    symbol = "*"

    def _validate(self) -> None:
        super()._validate()
        for this, other, name in ((self.k1, self.k2, "k1"), (self.k2, self.k1, "k2")):
            if this.has_white and not isinstance(other, Constant):
                raise ValueError(
                    f"Product: {name} holds a White term and the other factor is a "
                    f"{type(other).__name__}; such a product is ill-defined on dkern's blocks "
                    "(scikit-learn's value, diag(k(x, x)) · noise, is a noise varying by point, "
                    "not one noise level). Add the noise instead (k + White()), or scale it by "
                    "a number or a Constant (c * White()).")

    def _white(self) -> tuple[float, Array]:
        if not self.has_white:
            return super()._white()
        # one factor holds White, the other is a Constant: the product rule on (c, noise)
        (v1, g1), (v2, g2) = (
            k._white() if k.has_white else (cast(Constant, k)._level(),
                                            cast(Constant, k)._level_gradient())
            for k in (self.k1, self.k2))
        return v1 * v2, np.concatenate([g1 * v2, v1 * g2])

    def _strip_white(self) -> Kernel | None:
        if not self.has_white:
            return self
        a, b = self.k1._strip_white(), self.k2._strip_white()
        return None if a is None or b is None else Product(a, b)

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        K = self.k1(X, Z)
        with np.errstate(over="ignore"):  # overflow is reported by finite_values
            K *= self.k2(X, Z)
        return finite_values(K, self, X, Z)

    def diag(self, X: Array) -> Array:
        with np.errstate(over="ignore"):
            return finite_values(self.k1.diag(X) * self.k2.diag(X), self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        if self.has_white:  # White's blocks are zero: its terms stay out of the formula
            return _white_free(self).keops_formula(X, Z)
        return self.k1.keops_formula(X, Z) * self.k2.keops_formula(X, Z)

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K1, G1 = self.k1._value_and_gradient(X, Z, diag)
        K2, G2 = self.k2._value_and_gradient(X, Z, diag)
        return K1 * K2, np.concatenate([G1 * K2[..., None], K1[..., None] * G2], axis=-1)


class Power(Kernel):
    """``kernel ** power`` for an integer ``power >= 1``."""

    def __init__(self, kernel: Kernel, power: int) -> None:
        self.kernel = kernel
        self.power = power
        super().__init__()

    def _validate(self) -> None:
        _check_kernel(self.kernel, "kernel", "Power")
        _refuse_white(self.kernel, "Power (k ** p)")
        check_integer(self.power, "power", "Power (k ** p)", minimum=1)

    def __repr__(self) -> str:
        return f"({self.kernel!r} ** {self.power!r})"

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        K = self.kernel(X, Z)
        with np.errstate(over="ignore"):  # overflow is reported by finite_values
            return finite_values(np.power(K, int(self.power), out=K), self, X, Z)

    def diag(self, X: Array) -> Array:
        with np.errstate(over="ignore"):
            return finite_values(self.kernel.diag(X) ** int(self.power), self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        return self.kernel.keops_formula(X, Z) ** int(self.power)

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K0, G0 = self.kernel._value_and_gradient(X, Z, diag)
        p = int(self.power)
        return K0 ** p, (p * K0 ** (p - 1))[..., None] * G0


class Exp(Kernel):
    """``exp(kernel(x, x'))``; written ``dkern.kernels.exp(k)``."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        super().__init__()

    def _validate(self) -> None:
        _check_kernel(self.kernel, "kernel", "Exp")
        _refuse_white(self.kernel, "exp(k)")

    def __repr__(self) -> str:
        return f"exp({self.kernel!r})"

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        K = self.kernel(X, Z)
        with np.errstate(over="ignore"):  # overflow is reported by finite_values
            return finite_values(fastexp.exp(K, out=K), self, X, Z)

    def diag(self, X: Array) -> Array:
        with np.errstate(over="ignore"):
            return finite_values(np.exp(self.kernel.diag(X)), self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        return self.kernel.keops_formula(X, Z).exp()

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K0, G0 = self.kernel._value_and_gradient(X, Z, diag)
        K = np.exp(K0)
        return K, K[..., None] * G0


class Warp(Kernel):
    """``f(x) kernel(x, x') f(x')`` with ``f`` mapping rows (n, d) to values (n,).

    ``f`` must be a vectorised, picklable function (it runs on the workers);
    this kernel's ``repr`` names ``f`` but cannot recreate it.
    """

    def __init__(self, kernel: Kernel, f: Callable[[Array], Array]) -> None:
        self.kernel = kernel
        self.f = f
        super().__init__()

    def _validate(self) -> None:
        _check_kernel(self.kernel, "kernel", "Warp")
        _refuse_white(self.kernel, "warp(k, f)")
        if not callable(self.f):
            raise TypeError(f"warp: f must be a function of the rows (n, d) -> (n,); "
                            f"got {type(self.f).__name__}.")

    def __repr__(self) -> str:
        return f"warp({self.kernel!r}, {getattr(self.f, '__name__', repr(self.f))})"

    def __dask_tokenize__(self) -> tuple[str, ...]:
        from dask.base import tokenize

        return ("Warp", repr(self.kernel), tokenize(self.f))

    def _weights(self, X: Array) -> Array:
        fx = np.asarray(self.f(X), dtype=X.dtype)
        if fx.shape != (len(X),):
            raise ValueError(f"warp: f must map rows of shape (n, d) to shape (n,); "
                             f"got {fx.shape} for {len(X)} rows.")
        return fx

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        K = self.kernel(X, Z)
        K *= self._weights(X)[:, None]
        K *= self._weights(Z)[None, :]
        return K

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return self._weights(X) ** 2 * self.kernel.diag(X)

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K0, G0 = self.kernel._value_and_gradient(X, Z, diag)
        fx = self._weights(X)
        w = fx * fx if diag else fx[:, None] * self._weights(Z)[None, :]
        return w * K0, w[..., None] * G0

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        fx = LazyTensor(np.ascontiguousarray(self._weights(X))[:, None, None])
        fz = LazyTensor(np.ascontiguousarray(self._weights(Z))[None, :, None])
        return fx * self.kernel.keops_formula(X, Z) * fz


def exp(kernel: Kernel) -> Exp:
    """The kernel ``exp(kernel(x, x'))``."""
    return Exp(kernel)


def warp(kernel: Kernel, f: Callable[[Array], Array]) -> Warp:
    """The kernel ``f(x) kernel(x, x') f(x')``; ``f`` maps rows (n, d) to (n,)."""
    return Warp(kernel, f)


def _check_kernel(value: object, name: str, owner: str) -> None:
    if not isinstance(value, Kernel):
        raise TypeError(f"{owner}: {name} must be a dkern kernel; got {type(value).__name__}.")
    if depth(value) >= MAX_DEPTH:
        raise ValueError(
            f"{owner}: this kernel expression would nest {depth(value) + 1} operations; dkern "
            f"allows at most dkern.kernels.MAX_DEPTH = {MAX_DEPTH}, so that every kernel it "
            "builds can be printed, saved in a model file and loaded. Combine many kernels "
            "pairwise, as a balanced tree (log2(n) levels), not as one chain k1 + k2 + ... + kn.")


def _refuse_white(kernel: Kernel, owner: str) -> None:
    if kernel.has_white:
        raise ValueError(f"{owner}: the kernel {kernel!r} holds a White term, whose {owner} is "
                         "ill-defined on dkern's blocks (not one noise level); apply it to the "
                         "kernel without White and add the noise afterwards: "
                         "f(k) + White(noise_level).")


def _white_free(kernel: Kernel) -> Kernel:
    """``kernel`` without its White terms, whose blocks are zero; a ValueError if nothing
    else is left."""
    stripped = kernel._strip_white()
    if stripped is None:
        raise ValueError(f"{kernel!r} is white noise only: its blocks k(x, z) are zero, and "
                         "its noise enters through white_noise(); there is no KeOps formula.")
    return stripped


def depth(kernel: Kernel) -> int:
    """Operations nested on the longest path of ``kernel``'s expression (0 for a base kernel).

    Recursive, but bounded: every composite kernel checks ``MAX_DEPTH`` when it is built.
    """
    nested = [v for v in kernel.get_params(deep=False).values() if isinstance(v, Kernel)]
    return 1 + max(depth(k) for k in nested) if nested else 0
