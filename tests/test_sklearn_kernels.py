"""scikit-learn's kernels in dkern: from_sklearn, White's noise, the spellings and the API.

The oracle is scikit-learn itself: every converted kernel must give its values, its
``theta``/``bounds`` and its ``eval_gradient`` gradients to 1e-10.
"""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.gaussian_process import kernels as sk

from dkern import kernels as K

RNG = np.random.default_rng(7)
X = RNG.normal(size=(11, 2))
Y = RNG.normal(size=(5, 2))
YEARS = np.sort(RNG.uniform(1958, 2001, size=(13, 1)), axis=0)  # the Mauna Loa scale

MAUNA_LOA = (66.0**2 * sk.RBF(67.0)
             + 2.4**2 * sk.RBF(90.0) * sk.ExpSineSquared(1.3, 1.0)
             + 0.66**2 * sk.RationalQuadratic(1.2, 0.78)
             + 0.18**2 * sk.RBF(0.134) + sk.WhiteKernel(0.19**2))
SUPPORTED = [
    sk.ConstantKernel(2.0), sk.ConstantKernel(0.5, "fixed"), sk.RBF(1.3), sk.RBF([0.7, 2.0]),
    *[sk.Matern(0.9, nu=nu) for nu in (0.5, 1.5, 2.5, np.inf)], sk.Matern([0.6, 1.4], nu=1.5),
    sk.RationalQuadratic(1.2, 0.78), sk.RationalQuadratic(0.7, 3.0, alpha_bounds="fixed"),
    sk.ExpSineSquared(1.3, 1.0), sk.DotProduct(0.7), sk.WhiteKernel(0.1),
    sk.WhiteKernel(0.2, "fixed"), sk.ConstantKernel(1.0) * sk.RBF([1.0, 2.0]) + sk.WhiteKernel(0.1),
    sk.RBF(1.0, "fixed") * sk.ConstantKernel(2.0), sk.Exponentiation(sk.RBF(0.8), 3),
    sk.ConstantKernel(0.5) * sk.WhiteKernel(0.2),
    sk.ConstantKernel(1.5) * (sk.Matern(1.1, nu=2.5) + sk.WhiteKernel(0.3)),
    sk.DotProduct(0.3) * sk.RBF(2.0) + sk.RBF(0.5, length_scale_bounds=(1e-2, 1e2)),
]


def assert_same_kernel(ours, theirs, A, B):
    np.testing.assert_allclose(ours.theta, theirs.theta, rtol=1e-14)
    # (scikit-learn's bounds of a kernel with every parameter fixed have shape (0,))
    np.testing.assert_allclose(ours.bounds, np.reshape(theirs.bounds, (-1, 2)), rtol=1e-14)
    assert ours.n_dims == theirs.n_dims
    K_sk, G_sk = theirs(A, eval_gradient=True)
    K_ours, G_ours = ours(A, eval_gradient=True)
    scale = np.abs(K_sk).max()
    g_scale = max(np.abs(G_sk).max(initial=0.0), 1.0)
    np.testing.assert_allclose(K_ours, K_sk, rtol=1e-10, atol=1e-10 * scale)
    np.testing.assert_allclose(G_ours, G_sk, rtol=1e-10, atol=1e-10 * g_scale)
    np.testing.assert_allclose(ours(A, B), theirs(A, B), rtol=1e-10, atol=1e-10 * scale)
    np.testing.assert_allclose(ours.diag(A), theirs.diag(A), rtol=1e-10)
    np.testing.assert_allclose(ours.diag_gradient(A), np.einsum("iip->ip", G_sk), rtol=1e-10,
                               atol=1e-10 * g_scale)


@pytest.mark.parametrize("theirs", SUPPORTED, ids=[repr(k)[:60] for k in SUPPORTED])
def test_from_sklearn_gives_scikit_learns_values_theta_and_gradients(theirs):
    ours = K.from_sklearn(theirs)
    assert_same_kernel(ours, theirs, X, Y)
    assert [h.n_elements for h in ours.hyperparameters] == \
        [h.n_elements for h in theirs.hyperparameters]
    assert [h.fixed for h in ours.hyperparameters] == [h.fixed for h in theirs.hyperparameters]
    # the same theta moves both the same way: clone_with_theta at a random point
    theta = theirs.theta + RNG.uniform(-0.5, 0.5, size=theirs.n_dims)
    assert_same_kernel(ours.clone_with_theta(theta), theirs.clone_with_theta(theta), X, Y)
    assert K.from_repr(repr(ours)) == ours


def test_the_mauna_loa_kernel_converts_and_matches():
    ours = K.from_sklearn(MAUNA_LOA)
    assert_same_kernel(ours, MAUNA_LOA, YEARS, YEARS[::3] + 0.4)
    assert ours.white_noise() == pytest.approx(0.19**2, rel=1e-15)
    assert K.from_repr(repr(ours)) == ours
    assert ours.n_dims == MAUNA_LOA.n_dims == 12


def test_from_sklearn_refuses_what_dkern_has_not_by_name():
    with pytest.raises(TypeError, match="PairwiseKernel has no dkern equivalent"):
        K.from_sklearn(sk.PairwiseKernel(metric="laplacian"))
    with pytest.raises(TypeError, match="CompoundKernel"):
        K.from_sklearn(sk.CompoundKernel([sk.RBF()]))
    with pytest.raises(ValueError, match="nu=1.0"):
        K.from_sklearn(sk.Matern(1.0, nu=1.0))
    with pytest.raises(ValueError, match="exponent 0.5"):
        K.from_sklearn(sk.Exponentiation(sk.RBF(), 0.5))
    with pytest.raises(ValueError, match="White term"):
        K.from_sklearn(sk.RBF() * sk.WhiteKernel())
    with pytest.raises(ValueError, match="same bounds"):
        K.from_sklearn(sk.RBF([1.0, 2.0], length_scale_bounds=[(1e-2, 1e2), (1e-3, 1e3)]))
    k = K.Gaussian(2.0)
    assert K.from_sklearn(k) is k


# ------------------------------------------------------------------ White
def test_white_is_noise_on_the_gram_diagonal_and_zero_in_blocks():
    w = K.White(0.3)
    np.testing.assert_array_equal(w(X), 0.3 * np.eye(len(X)))
    np.testing.assert_array_equal(w(X, X), np.zeros((len(X), len(X))))  # a given Z: other points
    np.testing.assert_array_equal(w(X, Y), np.zeros((len(X), len(Y))))
    np.testing.assert_array_equal(w.diag(X), np.full(len(X), 0.3))
    k = 2.0 * K.Gaussian(0.8) + w
    np.testing.assert_allclose(k(X), 2.0 * K.Gaussian(0.8)(X) + 0.3 * np.eye(len(X)))
    np.testing.assert_array_equal(k(X, Y), 2.0 * K.Gaussian(0.8)(X, Y))


def test_white_noise_adds_in_sums_and_scales_with_constants():
    k = (K.Gaussian(1.0) + K.White(0.1)) + 2.0 * (K.White(0.2) + K.Matern(1.0))
    assert k.white_noise() == pytest.approx(0.1 + 2.0 * 0.2)
    # theta: [l, noise1, c, noise2, l2]; d noise / d log noise1 = 0.1, d / d log c = 0.4, ...
    np.testing.assert_allclose(k.white_noise_gradient(), [0.0, 0.1, 0.4, 0.4, 0.0])
    assert K.Gaussian(1.0).white_noise() == 0.0 and not K.Gaussian(1.0).has_white
    c_white = K.Constant(3.0) * K.White(0.5, noise_level_bounds="fixed")
    assert c_white.white_noise() == pytest.approx(1.5)
    np.testing.assert_allclose(c_white.white_noise_gradient(), [1.5])  # only log c is free


def test_without_white_keeps_every_other_term():
    k = 2.0 * (K.Gaussian(0.8) + K.White(0.2)) + K.Constant(1.5) * K.White(0.1)
    clean = k.without_white()
    assert clean == 2.0 * K.Gaussian(0.8) and not clean.has_white
    assert clean.kernel is not k.k1.kernel.k1  # a copy: tuning one leaves the other
    assert K.White(1.0).without_white() is None
    assert (K.White(0.1) + K.White(0.2)).without_white() is None
    g = K.Gaussian(1.0)
    assert g.without_white() == g


@pytest.mark.parametrize("build", [lambda w: K.Gaussian(1.0) * w, lambda w: w * w,
                                   lambda w: w ** 2, K.exp,
                                   lambda w: K.warp(w, np.linalg.norm)],
                         ids=["k*W", "W*W", "W**2", "exp", "warp"])
def test_white_outside_sums_and_constant_scaling_is_refused(build):
    with pytest.raises(ValueError, match="White"):
        build(K.White(0.1) + K.Gaussian(1.0))


def test_white_terms_stay_out_of_the_keops_formula():
    """Building a LazyTensor compiles nothing: the formulas are compared as text."""
    g = K.Gaussian(0.8)
    assert str((g + K.White(0.1)).keops_formula(X, Y)) == str(g.keops_formula(X, Y))
    with pytest.raises(ValueError, match="white noise only"):
        (2.0 * K.White(0.1)).keops_formula(X, Y)
    with pytest.raises(ValueError, match="zero"):
        K.White(0.1).keops_formula(X, Y)


# ------------------------------------------------------------ the spellings
def test_scikit_learn_spellings_are_aliases():
    assert K.Gaussian(length_scale=2.0, length_scale_bounds="fixed") == \
        K.Gaussian(2.0, lengthscale_bounds="fixed")
    assert K.Matern(length_scale=[1.0, 2.0], nu=2.5) == K.Matern([1.0, 2.0], 2.5)
    assert K.Periodic(length_scale=1.3, periodicity=2.0, periodicity_bounds=(1, 3)) == \
        K.Periodic(1.3, 2.0, period_bounds=(1, 3))
    assert K.Scaled(2.0, K.Linear(), constant_value_bounds="fixed") == \
        K.Scaled(2.0, K.Linear(), constant_bounds="fixed")
    assert K.RationalQuadratic(length_scale=0.5, alpha=2.0) == K.RationalQuadratic(0.5, 2.0)
    assert K.Polynomial(3, coef0=0.5) == K.Polynomial(3, c=0.5)
    k = K.Gaussian(length_scale=2.0)
    assert k.get_params() == {"lengthscale": 2.0, "lengthscale_bounds": K.DEFAULT_BOUNDS}
    assert clone(k) == k


def test_a_scikit_learn_param_grid_sets_dkern_kernels():
    k = K.from_sklearn(sk.ConstantKernel(1.0) * sk.RBF(1.0) + sk.WhiteKernel(0.1))
    k.set_params(k1__k2__length_scale=3.0, k2__noise_level=0.5, k1__k1__constant_value=2.0)
    assert k == K.Constant(2.0) * K.Gaussian(3.0) + K.White(0.5)
    p = K.Periodic(1.0, 1.0).set_params(periodicity=4.0, length_scale_bounds="fixed")
    assert p == K.Periodic(1.0, 4.0, lengthscale_bounds="fixed")


def test_an_alias_and_its_dkern_name_together_are_refused():
    with pytest.raises(TypeError, match="'lengthscale' was given twice.*'length_scale'"):
        K.Gaussian(lengthscale=1.0, length_scale=2.0)
    with pytest.raises(TypeError, match="given twice"):
        K.Gaussian(1.0, length_scale=2.0)  # positionally too
    with pytest.raises(ValueError, match="given twice"):
        K.Gaussian().set_params(lengthscale=1.0, length_scale=2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'lenght_scale'.*length_scale"):
        K.Gaussian(lenght_scale=1.0)
    with pytest.raises(ValueError, match="no parameter 'scale'"):
        K.Gaussian().set_params(scale=1.0)


# ---------------------------------------------------- the scikit-learn kernel API
def test_theta_is_settable_in_place_and_hyperparameters_list_every_parameter():
    k = K.Constant(2.0) * K.Gaussian([1.0, 2.0], lengthscale_bounds="fixed") + K.White(0.1)
    inner = k.k1.k2
    k.theta = np.log([3.0, 0.2])
    assert k.k1.k1.constant_value == pytest.approx(3.0) and k.k2.noise_level == pytest.approx(0.2)
    assert k.k1.k2 is inner  # in place, as scikit-learn's setter
    hp = k.hyperparameters
    assert [h.name for h in hp] == ["k1__k1__constant_value", "k1__k2__lengthscale",
                                    "k2__noise_level"]
    assert [h.fixed for h in hp] == [False, True, False] and hp[1].n_elements == 2
    np.testing.assert_array_equal(hp[0].bounds, [[1e-5, 1e5]])
    with pytest.raises(ValueError, match="theta must be 2 finite"):
        k.theta = [0.0]


def test_eval_gradient_is_for_the_gram_of_x_only():
    with pytest.raises(ValueError, match="eval_gradient=True"):
        K.Gaussian(1.0)(X, Y, eval_gradient=True)


def test_numbers_add_as_constants():
    g = K.Gaussian(1.0)
    assert g + 2.0 == K.Sum(g, K.Constant(2.0))
    assert 2.0 + g == K.Sum(K.Constant(2.0), g)
    assert sum([g, K.Linear()]) == g + K.Linear()  # sum() starts from 0
    np.testing.assert_allclose((g + 2.0)(X, Y), g(X, Y) + 2.0)
    with pytest.raises(ValueError, match="constant_value must be > 0"):
        g + (-1.0)


def test_rational_quadratic_keeps_its_digits_far_from_the_origin():
    """Rows near 1e8 with differences of order 1: the expanded form alone would lose them."""
    A = 1e8 + RNG.normal(size=(20, 2))
    k = K.RationalQuadratic(0.7, 1.3)
    d2 = ((A[:, None, :] - A[None, 3:9, :]) ** 2).sum(axis=2)  # exact differences
    np.testing.assert_allclose(k(A, A[3:9]), (1 + d2 / (2 * 1.3 * 0.49)) ** -1.3, rtol=1e-12)
