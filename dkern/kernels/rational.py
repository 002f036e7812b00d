"""The rational quadratic kernel, a scale mixture of Gaussian kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from .checks import DEFAULT_BOUNDS, Array, as_pair, check_bounds, check_positive_params
from .stationary import Stationary


class RationalQuadratic(Stationary):
    """Rational quadratic kernel ``k(x, x') = (1 + r² / (2 alpha))^(-alpha)``, r = |x - x'| / l.

    scikit-learn's ``RationalQuadratic``: the same values, ``theta = (log alpha, log l)``
    in that order, the same gradient layout. A mixture of Gaussian kernels of many
    lengthscales, ``alpha`` weighting the large ones; ``alpha → ∞`` is the Gaussian.
    Its block takes the far-row-robust squared distances of :class:`Gaussian` (a
    rounding error δ in r²/2 moves k by at most δ, as it moves e^{-r²/2}).

    Parameters
    ----------
    lengthscale : float or sequence of float, default=1.0
        ``l > 0``; a sequence gives one per feature (ARD; scikit-learn's is isotropic).
    alpha : float, default=1.0
        Scale-mixture parameter, > 0.
    lengthscale_bounds, alpha_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Ranges when hyperparameters are learned; ``"fixed"`` keeps the parameter out of
        ``theta``.
    **aliases
        scikit-learn's spellings ``length_scale`` and ``length_scale_bounds``.
    """

    _hyperparameters = ("alpha", "lengthscale")  # scikit-learn's (alphabetical) order

    def __init__(self, lengthscale: float | Array = 1.0, alpha: float = 1.0,
                 lengthscale_bounds: Any = DEFAULT_BOUNDS, alpha_bounds: Any = DEFAULT_BOUNDS,
                 **aliases: Any) -> None:
        self.alpha = alpha
        self.alpha_bounds = alpha_bounds
        super().__init__(lengthscale, lengthscale_bounds, **aliases)

    def _validate(self) -> None:
        super()._validate()
        if check_positive_params(self.alpha, "alpha", "RationalQuadratic").ndim != 0:
            raise ValueError(f"RationalQuadratic: alpha must be one number; got {self.alpha!r}.")
        check_bounds(self.alpha_bounds, "alpha_bounds", "RationalQuadratic")

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        K = self.half_neg_sqdist(X, Z)  # -r²/2
        alpha = float(self.alpha)
        K *= -1.0 / alpha
        K += 1.0  # 1 + r² / (2 alpha)
        return np.power(K, -alpha, out=K)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        alpha = float(self.alpha)
        base = 1.0 + self._keops_sqdist(X, Z) * (0.5 / alpha)
        return (-alpha * base.log()).exp()  # KeOps' integer Pow cannot take -alpha

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        free = [name for name, _, _ in self._free()]
        if diag:  # k(x, x) = 1 whatever l and alpha
            return np.ones(len(X)), np.zeros((len(X), self.n_dims))
        r2, S = self._scaled_sq_differences(X, Z)
        alpha = float(self.alpha)
        base = 1.0 + r2 / (2.0 * alpha)
        K = base ** -alpha
        parts = []
        if "alpha" in free:  # dK/d log alpha = K (r² / (2 base) - alpha log base)
            parts.append((K * (r2 / (2.0 * base) - alpha * np.log(base)))[:, :, None])
        if "lengthscale" in free:  # dK/d log l_k = base^(-alpha-1) s_k²
            parts.append((K / base)[:, :, None] * S)
        return K, np.concatenate(parts, axis=2) if parts else np.zeros((*K.shape, 0))
