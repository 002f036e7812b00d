"""Kernels a fused loop can compute in one form: ``c · Gaussian(ℓ)`` plus White terms.

A fused product (the CPU's C loop, :mod:`dkern.backends.fused_cpu`) and the expanded
derivative products (:mod:`dkern.operators.gradients`) handle one family of kernels, a
constant times a Gaussian with White terms beside it (whose cross blocks are zero);
:func:`gaussian_form` is the one place that decides membership and reads its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .algebra import Scaled, Sum
from .base import Kernel
from .stationary import Gaussian

__all__ = ["GaussianForm", "gaussian_form"]


@dataclass(frozen=True)
class GaussianForm:
    """Where ``c · Gaussian(ℓ)``'s parameters sit in a kernel's ``theta``."""

    constant: float
    lengthscale: np.ndarray  # (d,)
    constant_index: int | None  # None: c fixed (or absent)
    lengthscale_index: list[int]  # [] fixed, [k] one shared ℓ, or one per feature


def gaussian_form(kernel: Kernel, d: int, offset: int = 0) -> GaussianForm | None:
    """``kernel``'s form as ``c · Gaussian(ℓ)`` plus White terms, or None if it has another."""
    if type(kernel) is Gaussian:
        free = len(kernel.hyperparameter_names)
        return GaussianForm(1.0, np.broadcast_to(np.asarray(kernel.lengthscale, float), (d,)),
                            None, list(range(offset, offset + free)))
    if type(kernel) is Scaled and type(kernel.kernel) is Gaussian:
        own = int("constant" in kernel.hyperparameter_names)
        inner = gaussian_form(kernel.kernel, d, offset + own)
        assert inner is not None
        return GaussianForm(float(kernel.constant), inner.lengthscale,
                            offset if own else None, inner.lengthscale_index)
    if type(kernel) is Sum:
        for first, second in ((kernel.k1, kernel.k2), (kernel.k2, kernel.k1)):
            if second.has_white and second.without_white() is None:  # White noise only
                start = offset if first is kernel.k1 else offset + kernel.k1.n_dims
                return gaussian_form(first, d, start)
    return None
