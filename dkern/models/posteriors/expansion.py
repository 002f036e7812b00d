"""What every posterior of ``(K + alpha I) a = y`` shares: the mean ``K(X*, X) a``.

The representer theorem's kernel expansion ``f(x*) = Σ_i a_i k(x*, x_i)`` is kernel ridge's
prediction and the GP's posterior mean (Rasmussen & Williams 2006, eq. 2.25); the
posteriors differ in how ``a`` is found and in how they answer ``k_*ᵀ C⁻¹ k_*``.
"""

from __future__ import annotations

import warnings
from typing import Any

import dask.array as da
import numpy as np

from ...kernels import Kernel
from ...operators import gram


class KernelExpansion:
    """``f(x*) = K(x*, X) a`` for training rows X (n, d) and weights a (n,) or (n, t).

    Parameters
    ----------
    kernel : Kernel
    X : ndarray or dask.array.Array of shape (n, d)
    weights : ndarray or dask.array.Array of shape (n,) or (n, t)
    backend : {"auto", "numpy", "keops", "triton"}
        How the kernel blocks of ``K(X*, X)`` are computed.
    """

    def __init__(self, kernel: Kernel, X: Any, weights: Any, *, backend: str = "auto") -> None:
        self.kernel, self.X, self.weights, self.backend = kernel, X, weights, backend

    def mean(self, Xt: Any) -> da.Array:
        """``K(Xt, X) a``, lazy; shape (m,) or (m, t) as the weights."""
        return gram(self.kernel, Xt, self.X, backend=self.backend, dtype=np.float64,
                    name="dk-predict") @ self.weights

    def mean_and_variance(self, Xt: Any) -> tuple[Any, Any]:
        """The mean (lazy) and the latent variance at Xt (see the subclass's ``variance``)."""
        return self.mean(Xt), self.variance(Xt)  # type: ignore[attr-defined]


def clip_variance(var: np.ndarray) -> np.ndarray:
    """Variances with rounding's small negative values set to 0, with scikit-learn's warning."""
    negative = var < 0
    if np.any(negative):
        warnings.warn("Predicted variances smaller than 0. Setting those variances to 0 "
                      f"({int(negative.sum())} of {var.size}, the smallest {var.min():.3e}); "
                      "a larger alpha makes them positive.", UserWarning, stacklevel=4)
        var = np.where(negative, 0.0, var)
    return var
