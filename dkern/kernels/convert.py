"""``from_sklearn``: scikit-learn's Gaussian-process kernel objects as dkern kernels.

Every supported kernel converts to the dkern kernel of the same values and the same
``theta`` (same order, same log-space bounds), so ``from_sklearn(k).theta == k.theta``
and the gradients of ``k(X, eval_gradient=True)`` agree entry by entry:

=====================================  ==========================================
scikit-learn                           dkern
=====================================  ==========================================
``ConstantKernel(c)``                  ``Constant(c)``
``RBF(l)`` (isotropic or ARD)          ``Gaussian(l)``
``Matern(l, nu)``, nu 0.5/1.5/2.5/inf  ``Matern(l, nu)`` (``Gaussian(l)`` for inf)
``RationalQuadratic(l, alpha)``        ``RationalQuadratic(l, alpha)``
``ExpSineSquared(l, p)``               ``Periodic(l, p)``
``DotProduct(sigma_0)``                ``DotProduct(sigma_0)``
``WhiteKernel(noise)``                 ``White(noise)``
``k1 + k2``, ``k1 * k2``               ``Sum``, ``Product``
``k ** p`` (integer p >= 1)            ``Power``
=====================================  ==========================================
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .algebra import Power, Product, Sum
from .base import Kernel
from .checks import FIXED
from .constant import Constant, White
from .dot import DotProduct
from .periodic import Periodic
from .rational import RationalQuadratic
from .stationary import Gaussian, Matern

logger = logging.getLogger(__name__)


def from_sklearn(kernel: Any) -> Kernel:
    """The dkern kernel equal to a scikit-learn ``sklearn.gaussian_process.kernels`` object.

    Parameters
    ----------
    kernel : sklearn.gaussian_process.kernels.Kernel or dkern Kernel
        A dkern kernel is returned unchanged.

    Returns
    -------
    Kernel
        Same values, ``theta``, ``bounds`` and gradient layout (module docstring table).

    Raises
    ------
    TypeError
        A kernel class dkern has no equivalent of (named in the message).
    ValueError
        A supported class with a setting dkern lacks: Matern's ``nu`` outside
        {0.5, 1.5, 2.5, inf}, a non-integer exponent, per-feature bounds that differ,
        or a product with a WhiteKernel (ill-defined on dkern's blocks).
    """
    if isinstance(kernel, Kernel):
        return kernel
    from sklearn.gaussian_process import kernels as sk

    kind = type(kernel)  # exact classes: a subclass may compute something else
    if kind in (sk.Sum, sk.Product):
        k1, k2 = from_sklearn(kernel.k1), from_sklearn(kernel.k2)
        return Sum(k1, k2) if kind is sk.Sum else Product(k1, k2)
    if kind is sk.Exponentiation:
        p = kernel.exponent
        if not float(p).is_integer() or p < 1:
            raise ValueError(f"from_sklearn: {kernel!r} has exponent {p!r}; dkern's k ** p takes "
                             "integers p >= 1 (a fractional power of a kernel need not be one).")
        return Power(from_sklearn(kernel.kernel), int(p))
    leaf = _LEAVES.get(kind.__name__) if kind.__module__ == sk.__name__ else None
    if leaf is None:
        raise TypeError(
            f"from_sklearn: scikit-learn's {kind.__name__} has no dkern equivalent; supported: "
            "ConstantKernel, RBF, Matern, RationalQuadratic, ExpSineSquared, DotProduct, "
            "WhiteKernel, and their sums, products and integer powers.")
    return leaf(kernel)


def _bounds(kernel: Any, name: str) -> Any:
    """scikit-learn's bounds of ``name`` as dkern's: ``"fixed"`` or one (low, high) pair."""
    bounds = getattr(kernel, f"{name}_bounds")
    if isinstance(bounds, str):
        return FIXED
    rows = np.atleast_2d(np.asarray(bounds, dtype=float))
    if rows.shape[1] != 2 or not np.all(rows == rows[0]):
        raise ValueError(f"from_sklearn: {kernel!r} has {name}_bounds {bounds!r}; dkern takes one "
                         "(low, high) pair for every entry. Give the same bounds to all.")
    return (float(rows[0, 0]), float(rows[0, 1]))


def _length_scale(kernel: Any) -> Any:
    value = kernel.length_scale
    if np.iterable(value):  # scikit-learn reads a 1-element sequence as isotropic
        value = np.asarray(value, dtype=float)
        return float(value[0]) if value.size == 1 else value
    return float(value)


def _matern(kernel: Any) -> Kernel:
    if np.isinf(kernel.nu):  # scikit-learn's Matern(nu=inf) is its RBF
        return Gaussian(_length_scale(kernel), _bounds(kernel, "length_scale"))
    if kernel.nu not in (0.5, 1.5, 2.5):
        raise ValueError(f"from_sklearn: {kernel!r} has nu={kernel.nu!r}; dkern's Matern takes "
                         "nu in (0.5, 1.5, 2.5) (closed forms) or inf (the RBF).")
    return Matern(_length_scale(kernel), float(kernel.nu), _bounds(kernel, "length_scale"))


_LEAVES = {
    "ConstantKernel": lambda k: Constant(float(k.constant_value),
                                         _bounds(k, "constant_value")),
    "RBF": lambda k: Gaussian(_length_scale(k), _bounds(k, "length_scale")),
    "Matern": _matern,
    "RationalQuadratic": lambda k: RationalQuadratic(
        _length_scale(k), float(k.alpha), _bounds(k, "length_scale"), _bounds(k, "alpha")),
    "ExpSineSquared": lambda k: Periodic(
        float(k.length_scale), float(k.periodicity), _bounds(k, "length_scale"),
        _bounds(k, "periodicity")),
    "DotProduct": lambda k: DotProduct(float(k.sigma_0), _bounds(k, "sigma_0")),
    "WhiteKernel": lambda k: White(float(k.noise_level), _bounds(k, "noise_level")),
}
