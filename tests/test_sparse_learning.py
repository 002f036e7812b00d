"""Learning the sparse GP's kernel (``solver="nystrom"``): what a fit explains."""

import numpy as np
import pytest

from dkern.kernels import Gaussian
from dkern.solvers.sgpr import (
    sgpr_bound,
    sgpr_effective_dof,
    sgpr_noise_bound,
    sgpr_statistics,
)


def test_effective_degrees_of_freedom_and_the_all_noise_bound():
    rng = np.random.default_rng(1)
    X = rng.uniform(-3, 3, size=(120, 2))
    y = np.sin(X).sum(axis=1) + 0.3 * rng.standard_normal(120)
    Z, s = X[:15], 0.09
    kernel = 1.5 * Gaussian(0.8)
    stats = sgpr_statistics(kernel, X, y, Z)
    Kuu = kernel(Z) + stats.jitter * np.eye(15) * 1.5
    Q = kernel(X, Z) @ np.linalg.solve(Kuu, kernel(Z, X))
    dense = np.trace(Q @ np.linalg.inv(Q + s * np.eye(120)))  # tr Q (Q + sI)⁻¹
    assert sgpr_effective_dof(stats, s) == pytest.approx(dense, rel=1e-9)
    assert 1.5 < dense < 15
    noise = -0.5 * 120 * np.log(2 * np.pi * s) - 0.5 * y @ y / s
    assert sgpr_noise_bound(stats, s) == pytest.approx(noise, rel=1e-12)
    faint = sgpr_statistics(1e-12 * Gaussian(0.8), X, y, Z)  # the signal vanishes
    assert sgpr_bound(faint, s) == pytest.approx(noise, rel=1e-9)
    assert sgpr_effective_dof(faint, s) < 1e-9
