"""SGPR (Titsias) bound, predictive and gradient against dense numpy/scipy references."""


import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg as sla
from scipy.stats import multivariate_normal

from dkern.errors import NotPositiveDefiniteError
from dkern.kernels import Gaussian
from dkern.solvers import sgpr
from dkern.solvers.sgpr import (
    sgpr_bound,
    sgpr_bound_gradient,
    sgpr_predict,
    sgpr_statistics,
)

RNG = np.random.default_rng(11)
N, D, SIGMA2 = 150, 2, 0.05
X = RNG.uniform(-3, 3, size=(N, D))
Y = np.sin(X).sum(axis=1) + 0.2 * RNG.standard_normal(N)
X_TEST = RNG.uniform(-3.5, 3.5, size=(60, D))
CENTERS = X[RNG.choice(N, 20, replace=False)]
THETA = np.log([1.5, 0.8, 1.2])  # log c, log lengthscale per feature


def kernel_at(theta):
    return float(np.exp(theta[0])) * Gaussian(np.exp(theta[1:]))


KERNEL = kernel_at(THETA)


def chunked(A, rows=40):
    return da.from_array(A, chunks=(rows, -1) if A.ndim == 2 else rows)


def exact_gp(kernel, X, y, X_test, s):
    """Dense log marginal likelihood and posterior (Rasmussen & Williams, Alg. 2.1)."""
    L = np.linalg.cholesky(kernel(X) + s * np.eye(len(X)))
    a = sla.cho_solve((L, True), y)
    lml = -0.5 * y @ a - np.log(np.diag(L)).sum() - 0.5 * len(X) * np.log(2 * np.pi)
    Ks = kernel(X_test, X)
    V = sla.solve_triangular(L, Ks.T, lower=True)
    return lml, Ks @ a, kernel.diag(X_test) - (V * V).sum(axis=0)


def dense_titsias(kernel, X, y, Z, X_test, s, jitter):
    """The SGPR bound and predictive written from Titsias (2009) eqs. 9-10, densely."""
    Kuu = kernel(Z) + jitter * np.mean(kernel.diag(Z)) * np.eye(len(Z))
    Kun = kernel(Z, X)
    Qnn = Kun.T @ np.linalg.solve(Kuu, Kun)
    F = multivariate_normal(np.zeros(len(X)), Qnn + s * np.eye(len(X))).logpdf(y) \
        - np.trace(kernel(X) - Qnn) / (2 * s)
    Sigma = Kuu + Kun @ Kun.T / s
    Ksu = kernel(X_test, Z)
    mean = Ksu @ np.linalg.solve(Sigma, Kun @ y) / s
    var = kernel.diag(X_test) - np.einsum("ij,ji->i", Ksu, np.linalg.solve(Kuu, Ksu.T)) \
        + np.einsum("ij,ji->i", Ksu, np.linalg.solve(Sigma, Ksu.T))
    return F, mean, var


def test_all_points_as_centres_give_the_exact_gp():
    """Z = X: the bound is log p(y) and q(f*) the exact posterior, up to the jitter: at 1e-12
    the measured offsets are 4e-11 (bound, relative) and 4e-8 (mean), shrinking with it."""
    stats = sgpr_statistics(KERNEL, chunked(X), chunked(Y), X, jitter=1e-12)
    lml, mean, var = exact_gp(KERNEL, X, Y, X_TEST, SIGMA2)
    assert abs(sgpr_bound(stats, SIGMA2) - lml) <= 1e-6 * abs(lml)
    m, v = dask.compute(*sgpr_predict(stats, SIGMA2, X_TEST))
    assert np.max(np.abs(m - mean)) <= 1e-6 * np.max(np.abs(mean))
    assert np.max(np.abs(v - var)) <= 1e-6 * 1.5


def test_subset_of_centres_matches_the_dense_titsias_formulas():
    stats = sgpr_statistics(KERNEL, chunked(X), Y, CENTERS)
    F, mean, var = dense_titsias(KERNEL, X, Y, CENTERS, X_TEST, SIGMA2, 1e-6)
    bound = sgpr_bound(stats, SIGMA2)
    assert abs(bound - F) <= 1e-8 * abs(F)
    assert bound <= exact_gp(KERNEL, X, Y, X_TEST, SIGMA2)[0]  # a lower bound
    m, v = dask.compute(*sgpr_predict(stats, SIGMA2, chunked(X_TEST, 25)))
    assert np.max(np.abs(m - mean)) <= 1e-8 * np.max(np.abs(mean))
    assert np.max(np.abs(v - var)) <= 1e-8 * 1.5
    assert np.all(v >= 0) and np.all(v <= KERNEL.diag(X_TEST))


@pytest.mark.parametrize("n_centers", [21, 20])
def test_statistics_equal_the_dense_whitened_sums_over_many_tiles(n_centers, monkeypatch):
    """Tiles of 256 rows (several per chunk), odd and even M: the sums are
    P = L⁻¹ K_un K_nu L⁻ᵀ, exactly symmetric (its Cholesky factorisations need that), and
    b = L⁻¹ K_un y."""
    monkeypatch.setattr(sgpr, "WHITENING_TILE_BYTES", 1)  # the 256-row floor
    Xl = np.repeat(X, 4, axis=0)  # 600 rows: 3 tiles in a chunk of 600
    Yl = np.repeat(Y, 4)
    Z = X[:n_centers]
    stats = sgpr_statistics(KERNEL, chunked(Xl, 600), Yl, Z)
    A = sla.solve_triangular(stats.L, KERNEL(Z, Xl), lower=True)
    np.testing.assert_allclose(stats.P, A @ A.T, rtol=1e-12, atol=1e-12 * np.abs(stats.P).max())
    np.testing.assert_array_equal(stats.P, stats.P.T)
    np.testing.assert_allclose(stats.b[:, 0], A @ Yl, rtol=1e-12, atol=1e-12)


def test_variances_stay_in_zero_to_prior_when_nystrom_is_nearly_exact():
    """Test points on the centres: the Nyström gap k** − Q** is 0 up to rounding, and the
    naive Nyström covariance could go negative there; SGPR's stays in [0, prior]."""
    stats = sgpr_statistics(KERNEL, X, Y, CENTERS, jitter=1e-12)
    _, v = dask.compute(*sgpr_predict(stats, 1e-8, CENTERS))
    assert np.all(v >= 0) and np.all(v <= KERNEL.diag(CENTERS))


def test_several_targets_sum_their_bounds():
    Y2 = np.column_stack([Y, 2 * Y + 1])
    stats = sgpr_statistics(KERNEL, X, Y2, CENTERS)
    each = [sgpr_bound(sgpr_statistics(KERNEL, X, col, CENTERS), SIGMA2) for col in Y2.T]
    assert sgpr_bound(stats, SIGMA2) == pytest.approx(sum(each), rel=1e-12)
    m, _ = dask.compute(*sgpr_predict(stats, SIGMA2, X_TEST))
    m1, _ = dask.compute(*sgpr_predict(sgpr_statistics(KERNEL, X, Y2[:, 1], CENTERS),
                                       SIGMA2, X_TEST))
    assert m.shape == (len(X_TEST), 2)
    assert np.max(np.abs(m[:, 1] - m1)) <= 1e-12 * np.max(np.abs(m1))


def bound_at(params):
    stats = sgpr_statistics(kernel_at(params[:-1]), chunked(X), Y, CENTERS)
    return sgpr_bound(stats, float(np.exp(params[-1])))


def test_gradient_matches_finite_differences_of_the_bound():
    """Central differences (h = 1e-5) of the bound in (log c, log ℓ₁, log ℓ₂, log σ²), the
    kernel's own ∂k/∂θ (kernel.gradient) on the cluster side."""
    assert np.allclose(KERNEL.theta, THETA)  # the kernel's θ order is the one differenced
    stats = sgpr_statistics(KERNEL, chunked(X), Y, CENTERS)
    value, grad = sgpr_bound_gradient(stats, chunked(X), chunked(Y), SIGMA2)
    params, h = np.append(THETA, np.log(SIGMA2)), 1e-5
    fd = [(bound_at(params + h * e) - bound_at(params - h * e)) / (2 * h)
          for e in np.eye(len(params))]
    assert value == pytest.approx(sgpr_bound(stats, SIGMA2), rel=1e-14)
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"centers must be a finite array of shape \(M, 2\)"):
        sgpr_statistics(KERNEL, X, Y, CENTERS[:, :1])
    with pytest.raises(ValueError, match="y must have 150 rows"):
        sgpr_statistics(KERNEL, X, Y[:10], CENTERS)
    with pytest.raises(ValueError, match="jitter must be a finite number > 0"):
        sgpr_statistics(KERNEL, X, Y, CENTERS, jitter=0.0)
    with pytest.raises(TypeError, match="kernel must be a dkern kernel"):
        sgpr_statistics("rbf", X, Y, CENTERS)
    with pytest.raises(NotPositiveDefiniteError, match="Raise jitter, or drop duplicate"):
        sgpr_statistics(KERNEL, X, Y, np.vstack([CENTERS, CENTERS]), jitter=1e-30)
    stats = sgpr_statistics(KERNEL, X, Y, CENTERS)
    with pytest.raises(ValueError, match="sigma2 must be a finite number > 0"):
        sgpr_bound(stats, -1.0)
    with pytest.raises(ValueError, match="X_test must have 2 features"):
        sgpr_predict(stats, SIGMA2, X_TEST[:, :1])


@pytest.mark.distributed
def test_statistics_and_predictive_on_a_cluster(cluster_client):
    """The block functions travel to worker processes and give the local results."""
    stats = sgpr_statistics(KERNEL, chunked(X), Y, CENTERS)
    F, mean, var = dense_titsias(KERNEL, X, Y, CENTERS, X_TEST, SIGMA2, 1e-6)
    assert abs(sgpr_bound(stats, SIGMA2) - F) <= 1e-8 * abs(F)
    m, v = dask.compute(*sgpr_predict(stats, SIGMA2, chunked(X_TEST, 25)))
    assert np.max(np.abs(m - mean)) <= 1e-8 * np.max(np.abs(mean))
    assert np.max(np.abs(v - var)) <= 1e-8 * 1.5


def test_passes_take_small_arrays_as_one_broadcast_key_each():
    """L, the predictive's factors and the gradient's weights reach every block task as one
    key each (``pairwise_reduce``'s broadcast operands), however many row chunks there are."""
    stats = sgpr_statistics(KERNEL, chunked(X), Y, CENTERS)
    _, var = sgpr_predict(stats, SIGMA2, chunked(X_TEST, 10))
    keys = [k[0] for k in dict(var.__dask_graph__()) if str(k[0]).startswith("dk-bc-")]
    assert sorted(k.rsplit("-", 1)[0] for k in keys) == [
        "dk-bc-L", "dk-bc-LB", "dk-bc-c", "dk-bc-z"]
    assert var.numblocks == (6,)
