"""Dot-product kernels: ``Linear`` and ``Polynomial``."""

from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np

from .base import Array, Kernel, as_pair, check_integer, finite_values


class Linear(Kernel):
    """Linear kernel ``k(x, x') = x · x'``."""

    def __call__(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        return finite_values(X @ Z.T, self, X, Z)

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return finite_values(np.einsum("ij,ij->i", X, X), self, X)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        return LazyTensor(np.ascontiguousarray(X)[:, None, :]) | LazyTensor(
            np.ascontiguousarray(Z)[None, :, :])


class Polynomial(Kernel):
    """Polynomial kernel ``k(x, x') = (x · x' + c) ** degree``.

    Parameters
    ----------
    degree : int, default=2
        Integer ``>= 1``.
    c : float, default=1.0
        Offset ``c >= 0`` (a negative offset can make the Gram matrix indefinite).
    """

    def __init__(self, degree: int = 2, c: float = 1.0) -> None:
        self.degree = degree
        self.c = c
        super().__init__()

    def _validate(self) -> None:
        check_integer(self.degree, "degree", "Polynomial", minimum=1)
        c = self.c
        if isinstance(c, bool) or not isinstance(c, Real) or not np.isfinite(c) or c < 0:
            raise ValueError(f"Polynomial: c must be a finite number >= 0; got {self.c!r}.")

    def __call__(self, X: Array, Z: Array | None = None) -> Array:
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
