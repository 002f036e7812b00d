"""Kernel hyperparameters: theta, bounds, with_theta and the theta-gradients.

Gradients are checked against central finite differences of the kernel values (an
independent reference for every kernel and composition) and against scikit-learn's
``kernel(X, eval_gradient=True)`` for the kernels both libraries have.
"""

import numpy as np
import pytest
from sklearn.gaussian_process import kernels as sk

import dkern
from dkern.kernels import (
    Constant,
    DotProduct,
    Gaussian,
    Laplacian,
    Linear,
    Matern,
    Periodic,
    Polynomial,
    RationalQuadratic,
    Scaled,
    White,
    exp,
    from_repr,
    warp,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(9, 3))
Z = RNG.normal(size=(6, 3))


def _weight(rows):
    return 1.0 + rows[:, 0] ** 2


KERNELS = [
    Gaussian(0.8), Gaussian([0.5, 1.0, 2.0]), Laplacian(1.3), Laplacian([0.7, 1.1, 0.9]),
    Matern(0.9, nu=0.5), Matern([0.6, 1.2, 2.0], nu=1.5), Matern(1.1, nu=2.5),
    Matern([0.6, 1.2, 2.0], nu=2.5),
    2.5 * Gaussian(0.7), Gaussian(0.6) + 0.3 * Matern(1.5, nu=1.5),
    Gaussian([0.5, 1.0, 2.0]) * Laplacian(2.0), (0.5 * Gaussian(1.2)) ** 3,
    exp(0.4 * Matern(1.0, nu=2.5)), warp(1.5 * Gaussian(0.9), _weight),
    Polynomial(2, 1.0) * Gaussian(2.0) + 0.1 * Linear(),
    Scaled(2.0, Gaussian([1.0, 2.0, 3.0], lengthscale_bounds="fixed")),
    Periodic(0.8, 1.7), Periodic(1.2, 0.9, period_bounds="fixed"),
    0.5 * Periodic(1.0, 2.0) * Gaussian(3.0) + Gaussian(0.4),
    RationalQuadratic(0.9, 1.7), RationalQuadratic([0.5, 1.0, 2.0], 0.6),
    RationalQuadratic(1.1, 2.0, alpha_bounds="fixed"), DotProduct(0.8) * Gaussian(2.0),
    Constant(1.5) * Gaussian(0.7) + 0.5, Gaussian(0.6) + White(0.1),
]
IDS = [repr(k)[:50] for k in KERNELS]


def finite_differences(kernel, A, B, h=1e-6):
    """Central differences of the kernel values along each theta entry; shape (n, m, p)."""
    theta = kernel.theta
    cols = []
    for j in range(len(theta)):
        step = np.zeros_like(theta)
        step[j] = h
        cols.append((kernel.with_theta(theta + step)(A, B)
                     - kernel.with_theta(theta - step)(A, B)) / (2 * h))
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_gradient_equals_central_finite_differences(kernel):
    G = kernel.gradient(X, Z)
    assert G.shape == (len(X), len(Z), len(kernel.theta))
    np.testing.assert_allclose(G, finite_differences(kernel, X, Z), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_diag_gradient_is_the_diagonal_of_the_gradient(kernel):
    np.testing.assert_allclose(kernel.diag_gradient(X),
                               np.einsum("iip->ip", kernel.gradient(X)), atol=1e-14)


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_gradient_belongs_to_the_kernel_values(kernel):
    """gradient recomputes K from differences: it must be the same function as __call__."""
    K, _ = kernel._value_and_gradient(X, Z, False)
    np.testing.assert_allclose(K, kernel(X, Z), rtol=1e-12, atol=1e-14)


ELLS = [0.5, 1.0, 2.0]
SKLEARN_PAIRS = [
    (Gaussian(0.8), sk.RBF(0.8)),
    (Gaussian(ELLS), sk.RBF(ELLS)),
    *[(Matern(0.9, nu=nu), sk.Matern(0.9, nu=nu)) for nu in (0.5, 1.5, 2.5)],
    *[(Matern(ELLS, nu=nu), sk.Matern(ELLS, nu=nu)) for nu in (0.5, 1.5, 2.5)],
    (2.5 * Gaussian(0.7), sk.ConstantKernel(2.5) * sk.RBF(0.7)),
    (2.5 * Gaussian(ELLS), sk.ConstantKernel(2.5) * sk.RBF(ELLS)),
    (Gaussian(0.6) + 0.3 * Matern(1.5, nu=1.5),
     sk.RBF(0.6) + sk.ConstantKernel(0.3) * sk.Matern(1.5, nu=1.5)),
    (Gaussian(ELLS) * Matern(2.0, nu=2.5), sk.RBF(ELLS) * sk.Matern(2.0, nu=2.5)),
    ((0.5 * Gaussian(1.2)) ** 3, (sk.ConstantKernel(0.5) * sk.RBF(1.2)) ** 3),
]


@pytest.mark.parametrize(("ours", "theirs"), SKLEARN_PAIRS, ids=[repr(t) for _, t in SKLEARN_PAIRS])
def test_matches_sklearn_eval_gradient(ours, theirs):
    K, G = theirs(X, eval_gradient=True)
    np.testing.assert_allclose(ours.theta, theirs.theta, rtol=1e-14)
    np.testing.assert_allclose(ours.bounds, theirs.bounds, rtol=1e-14)
    ours_G = ours.gradient(X)
    np.testing.assert_allclose(ours(X), K, rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(ours_G, G, rtol=1e-8, atol=1e-14)
    # a rectangular tile is the matching rows of the square one
    np.testing.assert_allclose(ours.gradient(X[:4], X), G[:4], rtol=1e-8, atol=1e-14)


# scikit-learn's ExpSineSquared alone and composed as in its Mauna Loa CO2 example; rows far
# from the origin (years) as in a time series, where a phase error would show.
PERIODIC_PAIRS = [
    (Periodic(0.8, 1.7), sk.ExpSineSquared(0.8, 1.7)),
    (Periodic(1.3, 1.0, lengthscale_bounds=(1e-2, 1e2), period_bounds=(0.5, 2.0)),
     sk.ExpSineSquared(1.3, 1.0, length_scale_bounds=(1e-2, 1e2),
                       periodicity_bounds=(0.5, 2.0))),
    (2.5 * Periodic(0.8, 1.7) * Gaussian(3.0),
     sk.ConstantKernel(2.5) * sk.ExpSineSquared(0.8, 1.7) * sk.RBF(3.0)),
    (Gaussian(0.6) + 0.3 * Periodic(1.1, 0.9) + 0.2 * Gaussian(1.5),
     sk.RBF(0.6) + sk.ConstantKernel(0.3) * sk.ExpSineSquared(1.1, 0.9)
     + sk.ConstantKernel(0.2) * sk.RBF(1.5)),
]
YEARS = 1990.0 + RNG.uniform(0.0, 30.0, size=(40, 1))


@pytest.mark.parametrize("rows", [X, YEARS], ids=["3-d", "years"])
@pytest.mark.parametrize(("ours", "theirs"), PERIODIC_PAIRS,
                         ids=[repr(t)[:50] for _, t in PERIODIC_PAIRS])
def test_periodic_matches_sklearn_exp_sine_squared(ours, theirs, rows):
    K, G = theirs(rows, eval_gradient=True)
    np.testing.assert_allclose(ours.theta, theirs.theta, rtol=1e-14)
    np.testing.assert_allclose(ours.bounds, theirs.bounds, rtol=1e-14)
    np.testing.assert_allclose(ours(rows), K, rtol=1e-12, atol=1e-12 * np.abs(K).max())
    np.testing.assert_allclose(ours.gradient(rows), G, rtol=1e-12, atol=1e-12 * np.abs(G).max())
    np.testing.assert_allclose(ours.diag(rows), theirs.diag(rows), rtol=1e-15)
    np.testing.assert_allclose(ours.diag_gradient(rows), np.einsum("iip->ip", G), atol=1e-15)
    back = from_repr(repr(ours))
    assert back == ours and repr(back) == repr(ours)
    np.testing.assert_array_equal(back.bounds, ours.bounds)


def test_names_theta_bounds_and_with_theta():
    k = 2.0 * Gaussian([0.5, 4.0], lengthscale_bounds=(1e-2, 1e2)) + Matern(1.0, nu=0.5)
    assert k.hyperparameter_names == ["k1__constant", "k1__kernel__lengthscale[0]",
                                      "k1__kernel__lengthscale[1]", "k2__lengthscale"]
    np.testing.assert_allclose(np.exp(k.theta), [2.0, 0.5, 4.0, 1.0], rtol=1e-15)
    np.testing.assert_allclose(np.exp(k.bounds),
                               [[1e-5, 1e5], [1e-2, 1e2], [1e-2, 1e2], [1e-5, 1e5]], rtol=1e-14)
    new = k.with_theta(np.log([3.0, 1.0, 2.0, 5.0]))
    np.testing.assert_allclose(np.exp(new.theta), [3.0, 1.0, 2.0, 5.0], rtol=1e-14)
    assert k.k1.constant == 2.0  # the original is unchanged
    assert new.k1.kernel.lengthscale_bounds == (1e-2, 1e2)
    fixed = Scaled(2.0, Gaussian(1.0), constant_bounds="fixed")
    assert fixed.hyperparameter_names == ["kernel__lengthscale"]
    assert Polynomial(3).hyperparameter_names == [] and Polynomial(3).theta.shape == (0,)
    assert Polynomial(3).gradient(X).shape == (len(X), len(X), 0)


def test_default_bounds_keep_reprs_unchanged():
    assert repr(Gaussian(0.5)) == "Gaussian(lengthscale=0.5)"
    assert repr(3.0 * Matern(1.0, nu=2.5)) == "(3.0 * Matern(lengthscale=1.0, nu=2.5))"


@pytest.mark.parametrize("kernel", [
    Gaussian([0.5, 2.0], lengthscale_bounds=(0.1, 10.0)),
    Periodic(0.7, 1.0, lengthscale_bounds=(0.1, 10.0), period_bounds="fixed"),
    Scaled(2.0, Laplacian(1.0, lengthscale_bounds="fixed"), constant_bounds=(1e-3, 1e3)),
    Scaled(1.5, Matern(1.0, nu=0.5) * Gaussian(2.0), constant_bounds="fixed") + Linear(),
])
def test_bounds_survive_repr_and_from_repr(kernel):
    back = from_repr(repr(kernel))
    assert back == kernel and repr(back) == repr(kernel)
    np.testing.assert_array_equal(back.bounds, kernel.bounds)
    assert back.hyperparameter_names == kernel.hyperparameter_names


def test_bounds_survive_a_model_file(tmp_path):
    kernel = Scaled(2.0, Gaussian(0.7, lengthscale_bounds=(0.1, 10.0)), constant_bounds="fixed")
    X6 = RNG.normal(size=(30, 3))
    model = dkern.KernelRidge(kernel, alpha=0.1, solver="exact").fit(X6, X6[:, 0])
    dkern.save(model, tmp_path / "m.zarr")
    back = dkern.load(tmp_path / "m.zarr")
    assert back.kernel_ == kernel
    np.testing.assert_array_equal(back.kernel_.bounds, kernel.bounds)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: Gaussian(1.0, lengthscale_bounds=(1.0,)), "lengthscale_bounds must be a pair"),
    (lambda: Gaussian(1.0, lengthscale_bounds=(2.0, 1.0)), r"0 < low <= high"),
    (lambda: Matern(1.0, lengthscale_bounds=(0.0, 1.0)), "lengthscale_bounds"),
    (lambda: Scaled(1.0, Gaussian(), constant_bounds="free"), "constant_bounds.*'fixed'"),
    (lambda: Gaussian(1.0).with_theta([0.0, 1.0]), r"theta must be 1 finite log-parameters"),
    (lambda: Gaussian(1.0).with_theta([np.nan]), r"theta must be 1 finite"),
])
def test_bad_hyperparameter_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()
