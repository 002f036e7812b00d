"""Dot-product kernels: ``Linear``, ``DotProduct`` and ``Polynomial``."""

from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np

from .base import Kernel
from .checks import (
    DEFAULT_BOUNDS,
    Array,
    as_pair,
    check_bounds,
    check_integer,
    check_positive_params,
    finite_values,
)


class Linear(Kernel):
    """Linear kernel ``k(x, x') = x · x'``."""

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        return finite_values(X @ Z.T, self, X, Z)

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return finite_values(np.einsum("ij,ij->i", X, X), self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        return LazyTensor(np.ascontiguousarray(X)[:, None, :]) | LazyTensor(
            np.ascontiguousarray(Z)[None, :, :])


class DotProduct(Kernel):
    """Dot-product kernel ``k(x, x') = sigma_0² + x · x'``, scikit-learn's ``DotProduct``.

    Parameters
    ----------
    sigma_0 : float, default=1.0
        Inhomogeneity ``sigma_0 > 0``; learnable, ``theta = log sigma_0`` as scikit-learn's.
    sigma_0_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Range of ``sigma_0`` when hyperparameters are learned; ``"fixed"`` keeps it out
        of ``theta``.
    """

    _hyperparameters = ("sigma_0",)

    def __init__(self, sigma_0: float = 1.0, sigma_0_bounds: Any = DEFAULT_BOUNDS) -> None:
        self.sigma_0 = sigma_0
        self.sigma_0_bounds = sigma_0_bounds
        super().__init__()

    def _validate(self) -> None:
        if check_positive_params(self.sigma_0, "sigma_0", "DotProduct").ndim != 0:
            raise ValueError(f"DotProduct: sigma_0 must be one number; got {self.sigma_0!r}.")
        check_bounds(self.sigma_0_bounds, "sigma_0_bounds", "DotProduct")

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        K = X @ Z.T
        K += float(self.sigma_0) ** 2
        return finite_values(K, self, X, Z)

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return finite_values(np.einsum("ij,ij->i", X, X) + float(self.sigma_0) ** 2, self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        dot = LazyTensor(np.ascontiguousarray(X)[:, None, :]) | LazyTensor(
            np.ascontiguousarray(Z)[None, :, :])
        return dot + float(self.sigma_0) ** 2

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K = np.asarray(self.diag(X) if diag else self._block(X, Z), dtype=float)
        # dK / d log sigma_0 = 2 sigma_0²
        return K, np.full((*K.shape, self.n_dims), 2.0 * float(self.sigma_0) ** 2)


class Polynomial(Kernel):
    """Polynomial kernel ``k(x, x') = (x · x' + c) ** degree``.

    Parameters
    ----------
    degree : int, default=2
        Integer ``>= 1``.
    c : float, default=1.0
        Offset ``c >= 0`` (a negative offset can make the Gram matrix indefinite);
        scikit-learn's ``coef0`` is an alias.
    """

    _aliases = {"coef0": "c"}

    def __init__(self, degree: int = 2, c: float = 1.0, **aliases: Any) -> None:
        self.degree = degree
        self.c = c
        super().__init__(**aliases)

    def _validate(self) -> None:
        check_integer(self.degree, "degree", "Polynomial", minimum=1)
        c = self.c
        if isinstance(c, bool) or not isinstance(c, Real) or not np.isfinite(c) or c < 0:
            raise ValueError(f"Polynomial: c must be a finite number >= 0; got {self.c!r}.")

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        K = X @ Z.T
        K += self.c
        with np.errstate(over="ignore"):  # overflow is reported by finite_values
            return finite_values(_int_power(K, int(self.degree)), self, X, Z)

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        with np.errstate(over="ignore"):
            return finite_values(
                _int_power(np.einsum("ij,ij->i", X, X) + self.c, int(self.degree)), self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        dot = LazyTensor(np.ascontiguousarray(X)[:, None, :]) | LazyTensor(
            np.ascontiguousarray(Z)[None, :, :])
        return (dot + float(self.c)) ** int(self.degree)


def _int_power(A: Array, p: int) -> Array:
    """``A ** p`` for an integer ``p >= 1``, in place."""
    return np.power(A, p, out=A) if p > 1 else A
