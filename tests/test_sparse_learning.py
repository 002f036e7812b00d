"""Learning the sparse GP's kernel (``solver="nystrom"``): its starts, and what a fit explains."""

import numpy as np
import pytest
from scipy.spatial.distance import pdist

from dkern.kernels import Gaussian, Matern, Periodic, Scaled, White
from dkern.models.posteriors.sparse import data_scaled_theta
from dkern.solvers.sgpr import (
    sgpr_bound,
    sgpr_effective_dof,
    sgpr_noise_bound,
    sgpr_statistics,
)


def test_the_data_scaled_start():
    Z = np.random.default_rng(0).normal(size=(40, 3)) * [1.0, 3.0, 0.1]
    Z[:, 2] = 0.5  # a feature that does not vary
    median = np.median(pdist(Z))
    theta = data_scaled_theta(Scaled(1.0, Gaussian(1.0)), Z, 4.0)
    np.testing.assert_allclose(np.exp(theta), [4.0, median], rtol=1e-12)
    # ARD: the median distance of the standardised features, times each feature's sigma
    sigma = Z[:, :2].std(axis=0)
    scaled = np.median(pdist(Z[:, :2] / sigma))
    ard = Scaled(1.0, Gaussian(np.ones(3))) + White(0.3)
    np.testing.assert_allclose(np.exp(data_scaled_theta(ard, Z, 4.0)),
                               [4.0, *(scaled * sigma), median, 0.3], rtol=1e-12)
    # the summands share y's mean square; a periodic kernel's lengthscale and a constant
    # below a product keep their values; every entry stays within its bounds
    mixed = (Scaled(1.0, Matern(1.0, lengthscale_bounds=(1e-3, 0.5)))
             + Scaled(2.0, Periodic(1.0, 3.0) * Scaled(5.0, Gaussian(1.0))))
    want = [2.0, 0.5, 2.0, 1.0, 3.0, 5.0, median]
    np.testing.assert_allclose(np.exp(data_scaled_theta(mixed, Z, 4.0)), want, rtol=1e-12)
    one = data_scaled_theta(Scaled(1.0, Gaussian(1.0)), Z[:1], 4.0)  # no distances
    np.testing.assert_allclose(np.exp(one), [4.0, 1.0])


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
