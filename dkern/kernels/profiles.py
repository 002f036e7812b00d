"""scikit-learn's density kernels other than the Gaussian, as radial profiles.

``sklearn.neighbors.KernelDensity`` names six kernels ``k(x, z) = g(‖x − z‖ / h)``; the
Gaussian is dkern's :class:`~dkern.kernels.Gaussian`, the other five are here with their
profiles ``g(r)`` (r in units of the bandwidth, which the smoothing pass divides the rows
by) and ``log ∫ g(‖u‖) du`` over ``R^D``, the density's normalising constant. They are
kernel smoothing weights, not covariance functions (the compact ones are not positive
definite in every dimension), so :mod:`dkern.kernels` does not export them: the density
estimator takes them by name.
"""

from __future__ import annotations

from math import cos, lgamma, log, pi

import numpy as np
from scipy.integrate import quad
from scipy.spatial.distance import cdist

from .base import Kernel
from .checks import Array


def _log_ball_volume(d: int) -> float:
    """``log`` of the volume of the unit ball in ``R^d``."""
    return 0.5 * d * log(pi) - lgamma(0.5 * d + 1)


def _log_sphere_area(d: int) -> float:
    """``log`` of the area of the unit sphere in ``R^(d+1)``."""
    return log(2 * pi) + _log_ball_volume(d - 1)


def _log_cosine_integral(d: int) -> float:
    """``log ∫ cos(π‖u‖/2) du`` over the unit ball of ``R^d``: the sphere's area times the
    radial integral ``∫₀¹ cos(πr/2) r^(d-1) dr``, by quadrature. (Integrating by parts
    ends at ``∫ cos`` for odd d but at ``∫ r cos(πr/2) dr = 2/π − 4/π²`` for even d, the
    term scikit-learn's series leaves out; its recursion also loses digits as d grows.)"""
    radial, _ = quad(lambda r: cos(0.5 * pi * r) * r ** (d - 1), 0.0, 1.0, epsabs=0.0,
                     epsrel=1e-13, limit=200)
    return log(radial) + _log_sphere_area(d - 1)


def _inside(r: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` where ``r < 1`` (scikit-learn's strict inequality), ``-inf`` elsewhere."""
    return np.where(r < 1, values, -np.inf)


#: name -> (log g(r), log ∫ g over R^d as a function of d), scikit-learn's definitions.
PROFILES = {
    "tophat": (lambda r: _inside(r, np.zeros_like(r)), _log_ball_volume),
    "epanechnikov": (lambda r: _inside(r, np.log1p(-np.minimum(r, 1) ** 2)),
                     lambda d: _log_ball_volume(d) + log(2 / (d + 2))),
    "exponential": (lambda r: -r, lambda d: _log_sphere_area(d - 1) + lgamma(d)),
    "linear": (lambda r: _inside(r, np.log1p(-np.minimum(r, 1))),
               lambda d: _log_ball_volume(d) - log(d + 1)),
    "cosine": (lambda r: _inside(r, np.log(np.cos(0.5 * pi * np.minimum(r, 1)))),
               _log_cosine_integral),
}


class RadialProfile(Kernel):
    """``k(x, z) = g(‖x − z‖)`` for one of scikit-learn's density kernels (``PROFILES``).

    Parameters
    ----------
    profile : {"tophat", "epanechnikov", "exponential", "linear", "cosine"}
    """

    _hyperparameters: tuple[str, ...] = ()

    def __init__(self, profile: str = "tophat") -> None:
        self.profile = profile
        super().__init__()

    def _validate(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {sorted(PROFILES)}; "
                             f"got {self.profile!r}.")

    def log_block(self, X: Array, Z: Array) -> np.ndarray:
        """``log k(x, z)`` for X (n, d), Z (m, d), from distances (no underflow); (n, m)."""
        with np.errstate(divide="ignore"):  # log 0 = -inf at the support's edge
            return PROFILES[self.profile][0](cdist(X, Z))

    def log_integral(self, d: int) -> float:
        """``log ∫ g(‖u‖) du`` over ``R^d``."""
        return float(PROFILES[self.profile][1](d))

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X = np.asarray(X, dtype=np.float64)
        return np.exp(self.log_block(X, X if Z is None else np.asarray(Z, dtype=np.float64)))

    def diag(self, X: Array) -> Array:
        return np.ones(len(X))
