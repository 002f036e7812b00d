"""The periodic kernel ``k(x, x') = exp(-2 sin²(π ||x - x'|| / p) / l²)``.

scikit-learn's ``ExpSineSquared``: functions repeating exactly with period ``p``,
``l`` setting how much they vary within one period. It depends on the distance
itself, not on its square, so the block takes exact pairwise distances
(``scipy.spatial.distance.cdist``) rather than the stationary kernels' expanded
form, whose cancellation the sine would turn into phase errors far from the origin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.spatial.distance import cdist

from .base import Kernel
from .checks import DEFAULT_BOUNDS, Array, as_pair, check_bounds, check_positive_params


class Periodic(Kernel):
    """Periodic kernel ``k(x, x') = exp(-2 sin²(π ||x - x'|| / p) / l²)``.

    scikit-learn's ``ExpSineSquared(length_scale=l, periodicity=p)``: the same values,
    ``theta = (log l, log p)`` in that order, the same gradient layout. Isotropic
    (one lengthscale for all features), as scikit-learn's; for a seasonal component
    that may drift, multiply it by a :class:`~dkern.kernels.Gaussian`.

    Parameters
    ----------
    lengthscale : float, default=1.0
        ``l > 0``: small ``l`` lets the function vary fast within a period.
    period : float, default=1.0
        ``p > 0``, in the units of the features' distance.
    lengthscale_bounds, period_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Ranges of ``l`` and ``p`` when hyperparameters are learned; ``"fixed"`` keeps
        the parameter out of ``theta``.
    **aliases
        scikit-learn's spellings ``length_scale``, ``periodicity`` and their ``_bounds``.
    """

    _hyperparameters = ("lengthscale", "period")
    _aliases = {"length_scale": "lengthscale", "length_scale_bounds": "lengthscale_bounds",
                "periodicity": "period", "periodicity_bounds": "period_bounds"}

    def __init__(self, lengthscale: float = 1.0, period: float = 1.0,
                 lengthscale_bounds: Any = DEFAULT_BOUNDS,
                 period_bounds: Any = DEFAULT_BOUNDS, **aliases: Any) -> None:
        self.lengthscale = lengthscale
        self.period = period
        self.lengthscale_bounds = lengthscale_bounds
        self.period_bounds = period_bounds
        super().__init__(**aliases)

    def _validate(self) -> None:
        for name in self._hyperparameters:
            value = check_positive_params(getattr(self, name), name, "Periodic")
            if value.ndim != 0:
                raise ValueError(f"Periodic: {name} must be one number (the kernel is "
                                 f"isotropic, as scikit-learn's ExpSineSquared); got "
                                 f"{getattr(self, name)!r}. Scale the features instead.")
            check_bounds(getattr(self, f"{name}_bounds"), f"{name}_bounds", "Periodic")

    def _phase(self, X: Array, Z: Array) -> Array:
        """``π ||x - z|| / p`` for every pair; shape (n, m), float64."""
        arg = cdist(np.asarray(X, dtype=float), np.asarray(Z, dtype=float))
        arg *= np.pi / float(self.period)
        return arg

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        K = np.sin(self._phase(X, Z))
        np.square(K, out=K)
        K *= -2.0 / float(self.lengthscale) ** 2
        np.exp(K, out=K)
        return K.astype(np.result_type(X.dtype, Z.dtype, np.float32), copy=False)

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return np.ones(len(X), dtype=np.result_type(X.dtype, np.float32))

    def keops_formula(self, X: Array, Z: Array) -> Any:
        from pykeops.numpy import LazyTensor

        x = LazyTensor(np.ascontiguousarray(X)[:, None, :])
        z = LazyTensor(np.ascontiguousarray(Z)[None, :, :])
        s = (float(np.pi / self.period) * x.sqdist(z).sqrt()).sin()
        return (float(-2.0 / self.lengthscale ** 2) * s * s).exp()

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        free = [name for name, _, _ in self._free()]
        if diag:  # k(x, x) = 1 whatever l and p
            return np.ones(len(X)), np.zeros((len(X), len(free)))
        arg = self._phase(X, Z)
        s, c = np.sin(arg), np.cos(arg)
        inv_l2 = 1.0 / float(self.lengthscale) ** 2
        K = np.exp(-2.0 * inv_l2 * s * s)
        # dK/d log l = 4 sin² K / l²; dK/d log p = 4 (π r / p) sin cos K / l²
        G = np.empty((*K.shape, len(free)))
        for j, name in enumerate(free):
            G[..., j] = s * s if name == "lengthscale" else arg * s * c
        G *= (4.0 * inv_l2 * K)[..., None]
        return K, G
