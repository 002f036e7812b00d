"""Kernels that ignore where the points are: ``Constant`` and the ``White`` noise term."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Kernel
from .checks import DEFAULT_BOUNDS, Array, as_pair, check_bounds, check_positive_params


class _Level(Kernel):
    """Shared code of the kernels with one positive scalar parameter ``<name>``."""

    _name = ""

    def _validate(self) -> None:
        owner = type(self).__name__
        value = check_positive_params(getattr(self, self._name), self._name, owner)
        if value.ndim != 0:
            raise ValueError(f"{owner}: {self._name} must be one number; got "
                             f"{getattr(self, self._name)!r}.")
        check_bounds(getattr(self, f"{self._name}_bounds"), f"{self._name}_bounds", owner)

    def _level(self) -> float:
        return float(getattr(self, self._name))

    def _level_gradient(self) -> Array:
        """``∂ level / ∂theta``: the level itself if it is learnable; shape (p,)."""
        return np.full(self.n_dims, self._level())

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return np.full(len(X), self._level(), dtype=np.result_type(X.dtype, np.float32))


class Constant(_Level):
    """Constant kernel ``k(x, x') = c``, scikit-learn's ``ConstantKernel``.

    ``k + c`` and ``c + k`` for a number ``c`` give ``k + Constant(c)``, as in scikit-learn;
    ``c * k`` stays :class:`~dkern.kernels.Scaled` (same values and theta layout as
    scikit-learn's ``ConstantKernel(c) * k``).

    Parameters
    ----------
    constant_value : float, default=1.0
        ``c > 0``.
    constant_value_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Range of ``c`` when hyperparameters are learned; ``"fixed"`` keeps it out of
        ``theta``.
    """

    _hyperparameters = ("constant_value",)
    _name = "constant_value"

    def __init__(self, constant_value: float = 1.0,
                 constant_value_bounds: Any = DEFAULT_BOUNDS) -> None:
        self.constant_value = constant_value
        self.constant_value_bounds = constant_value_bounds
        super().__init__()

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        return np.full((len(X), len(Z)), self._level(),
                       dtype=np.result_type(X.dtype, Z.dtype, np.float32))

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        # an i-variable times a j-variable, so the formula has both indices, as a reduction
        # over j needs (a bare number has none)
        ci = LazyTensor(np.full((len(X), 1, 1), self._level(), dtype=X.dtype))
        return ci * LazyTensor(np.ones((1, len(Z), 1), dtype=X.dtype))

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        K = self.diag(X).astype(float) if diag else np.full((len(X), len(Z)), self._level())
        return K, np.repeat(K[..., None], self.n_dims, axis=-1)  # ∂c / ∂log c = c


class White(_Level):
    """White noise ``k(x, x') = noise_level`` if x and x' are the same point, else 0.

    scikit-learn's ``WhiteKernel``: ``k(X)`` is ``noise_level · I``, ``k(X, Z)`` is zero
    (even for Z = X: a given Z means other points), and ``diag(X)`` is ``noise_level``,
    so predictive variances include the noise, as scikit-learn's do. dkern's blocks are
    always ``k(x_i, z_j)``, so White reaches a model through ``white_noise()``, which
    the model adds to its diagonal ``alpha`` (see :mod:`dkern.kernels.base`), and its
    derivative ``white_noise_gradient()``, with which the model learns the noise.
    Use it in sums (``C * RBF() + White()``), scaled (``c * White()``) or times a
    :class:`Constant`; other products, powers, ``exp`` and ``warp`` of it are refused.

    Parameters
    ----------
    noise_level : float, default=1.0
        The noise variance, > 0.
    noise_level_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Range of the noise when hyperparameters are learned; ``"fixed"`` keeps it out
        of ``theta``.
    """

    _hyperparameters = ("noise_level",)
    _name = "noise_level"

    def __init__(self, noise_level: float = 1.0, noise_level_bounds: Any = DEFAULT_BOUNDS) -> None:
        self.noise_level = noise_level
        self.noise_level_bounds = noise_level_bounds
        super().__init__()

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        same = Z is None
        X, Z = as_pair(X, Z)
        dtype = np.result_type(X.dtype, Z.dtype, np.float32)
        return self._level() * np.eye(len(X), dtype=dtype) if same \
            else np.zeros((len(X), len(Z)), dtype)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        raise ValueError("White's blocks k(x, z) are zero (its noise enters through "
                         "white_noise(), on the diagonal): there is no KeOps formula to "
                         "evaluate; use kernel.without_white() for the blocks.")

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        if diag:
            K = np.full(len(X), self._level())
            return K, np.repeat(K[:, None], self.n_dims, axis=1)
        return np.zeros((len(X), len(Z))), np.zeros((len(X), len(Z), self.n_dims))

    @property
    def has_white(self) -> bool:
        return True

    def _strip_white(self) -> Kernel | None:
        return None

    def _white(self) -> tuple[float, Array]:
        return self._level(), self._level_gradient()
