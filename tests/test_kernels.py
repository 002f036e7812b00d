"""Kernels against independent dense formulas (scipy's cdist), algebra, params, repr, bad input."""

import re

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from dkern import kernels as K
from dkern.backends import matvec_block_keops, matvec_block_numpy

RNG = np.random.default_rng(42)
X = RNG.normal(size=(70, 4)) * 2.0 + 1.0
Z = RNG.normal(size=(45, 4))
ELL = np.array([0.5, 1.0, 2.0, 3.0])


def _r(A, B, ell=1.0):
    return cdist(A / ell, B / ell)


def weight(rows):
    """A positive row function for warp tests (module level: picklable)."""
    return 1.0 + np.tanh(rows[:, 0])


# (kernel, independent dense reference of k(A, B))
LEAVES = [
    (K.Gaussian(0.8), lambda A, B: np.exp(-_r(A, B) ** 2 / (2 * 0.8**2))),
    (K.Gaussian(ELL), lambda A, B: np.exp(-_r(A, B, ELL) ** 2 / 2)),
    (K.Laplacian(1.5), lambda A, B: np.exp(-_r(A, B) / 1.5)),
    (K.Matern(1.2, 0.5), lambda A, B: np.exp(-_r(A, B) / 1.2)),
    (K.Matern(ELL, 1.5), lambda A, B: (1 + np.sqrt(3) * _r(A, B, ELL))
     * np.exp(-np.sqrt(3) * _r(A, B, ELL))),
    (K.Matern(1.2, 2.5), lambda A, B: (1 + np.sqrt(5) * _r(A, B, 1.2) + 5 * _r(A, B, 1.2) ** 2 / 3)
     * np.exp(-np.sqrt(5) * _r(A, B, 1.2))),
    (K.Linear(), lambda A, B: A @ B.T),
    (K.Polynomial(3, c=0.5), lambda A, B: (A @ B.T + 0.5) ** 3),
    (K.Periodic(0.9, 2.5), lambda A, B: np.exp(-2 * np.sin(np.pi * _r(A, B) / 2.5) ** 2 / 0.81)),
    (K.RationalQuadratic(0.9, 1.7), lambda A, B: (1 + _r(A, B, 0.9) ** 2 / (2 * 1.7)) ** -1.7),
    (K.RationalQuadratic(ELL, 0.6), lambda A, B: (1 + _r(A, B, ELL) ** 2 / 1.2) ** -0.6),
    (K.DotProduct(0.7), lambda A, B: 0.49 + A @ B.T),
    (K.Constant(1.5), lambda A, B: np.full((len(A), len(B)), 1.5)),
]
G = LEAVES[0][1]
LIN = LEAVES[6][1]
COMPOSITES = [
    (2.5 * K.Gaussian(0.8), lambda A, B: 2.5 * G(A, B)),
    (K.Gaussian(0.8) + K.Linear(), lambda A, B: G(A, B) + LIN(A, B)),
    (K.Gaussian(0.8) * K.Linear(), lambda A, B: G(A, B) * LIN(A, B)),
    (K.Linear() ** 2, lambda A, B: LIN(A, B) ** 2),
    (K.exp(0.1 * K.Linear()), lambda A, B: np.exp(0.1 * LIN(A, B))),
    (K.Gaussian(0.8) + 2.0, lambda A, B: G(A, B) + 2.0),
    (K.warp(K.Gaussian(0.8), weight), lambda A, B: weight(A)[:, None] * G(A, B) * weight(B)[None]),
]
ALL = LEAVES + COMPOSITES
IDS = [repr(k)[:40] for k, _ in ALL]


@pytest.mark.parametrize(("kernel", "ref"), ALL, ids=IDS)
def test_dense_block_matches_reference(kernel, ref):
    want = ref(X, Z)
    np.testing.assert_allclose(kernel(X, Z), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    square = ref(X, X)
    np.testing.assert_allclose(kernel(X), square, rtol=1e-12, atol=1e-12 * np.abs(square).max())


@pytest.mark.parametrize(("kernel", "ref"), ALL, ids=IDS)
def test_diag_matches_reference(kernel, ref):
    np.testing.assert_allclose(kernel.diag(X), np.diag(ref(X, X)), rtol=1e-12)


@pytest.mark.parametrize(("kernel", "ref"), ALL, ids=IDS)
def test_numpy_backend_matvec(kernel, ref):
    V = RNG.normal(size=(len(Z), 3))
    want = ref(X, Z) @ V
    got = matvec_block_numpy(kernel, X, Z, V, tile_rows=16, tile_cols=10)  # many ragged tiles
    scale = np.abs(ref(X, Z)) @ np.abs(V)
    assert np.max(np.abs(got - want) / scale) < 1e-12


@pytest.mark.keops
def test_keops_backend_matvec_of_every_kernel_and_composition():
    """KeOps compiles each formula once (about 10 s on a CPU): every kernel and composition
    of ALL is checked in one formula, their sum with each term scaled to at most 1 on these
    points, so a wrong term still moves the sum by about its own size."""
    scales = [1.0 / np.abs(ref(X, Z)).max() for _, ref in ALL]
    kernel = sum((s * k for s, (k, _) in zip(scales[1:], ALL[1:], strict=True)),
                 scales[0] * ALL[0][0])
    V = RNG.normal(size=(len(Z), 1))
    terms = [s * ref(X, Z) for s, (_, ref) in zip(scales, ALL, strict=True)]
    want = sum(terms) @ V
    got = matvec_block_keops(kernel, X, Z, V)
    scale = sum(np.abs(t) for t in terms) @ np.abs(V)
    assert np.max(np.abs(got - want) / scale) < 1e-12


def test_rbf_alias_and_sklearn_agreement():
    from sklearn.gaussian_process.kernels import RBF as SkRBF
    from sklearn.gaussian_process.kernels import Matern as SkMatern
    from sklearn.metrics.pairwise import laplacian_kernel

    assert K.RBF is K.Gaussian
    np.testing.assert_allclose(K.Gaussian(ELL)(X, Z), SkRBF(ELL)(X, Z), rtol=1e-12)
    np.testing.assert_allclose(K.Matern(ELL, 2.5)(X, Z), SkMatern(ELL, nu=2.5)(X, Z), rtol=1e-11)
    # sklearn's laplacian kernel uses the L1 norm; on one feature it equals ours.
    np.testing.assert_allclose(K.Laplacian(2.0)(X[:, :1], Z[:, :1]),
                               laplacian_kernel(X[:, :1], Z[:, :1], gamma=0.5), rtol=1e-12)


def test_close_points_keep_full_accuracy():
    """Near-duplicate rows: the sqrt kernels must not lose digits to cancellation."""
    A = np.vstack([X, X + 1e-9])
    want = np.exp(-cdist(A, A) / 0.3)
    np.testing.assert_allclose(K.Laplacian(0.3)(A), want, rtol=0, atol=1e-13)


@pytest.mark.parametrize(("kernel", "_ref"), ALL[:-1], ids=IDS[:-1])
def test_repr_round_trips(kernel, _ref):
    again = K.from_repr(repr(kernel))
    assert again == kernel and again is not kernel
    np.testing.assert_array_equal(again(X, Z), kernel(X, Z))


# Kernels whose parameters do not print exactly in a short decimal (1/3, 0.1 + 0.2), ARD
# lengthscales, and nested algebra: repr must keep every digit and every bracket.
THIRD, ELL_ODD = 1 / 3, np.array([1 / 3, 0.1 + 0.2, 2.0, 7.0])
M25 = LEAVES[5][0]  # Matern(1.2, 2.5)
REPR_EXTRAS = [
    (K.Gaussian(ELL_ODD), lambda A, B: np.exp(-_r(A, B, ELL_ODD) ** 2 / 2)),
    (K.RBF(THIRD), lambda A, B: np.exp(-_r(A, B) ** 2 / (2 * THIRD**2))),
    (K.Laplacian(ELL), lambda A, B: np.exp(-_r(A, B, ELL))),
    (K.Matern(ELL_ODD, 0.5), lambda A, B: np.exp(-_r(A, B, ELL_ODD))),
    (K.Polynomial(2, c=THIRD), lambda A, B: (A @ B.T + THIRD) ** 2),
    (THIRD * (K.Gaussian(ELL) + K.Linear()) ** 2,
     lambda A, B: THIRD * (LEAVES[1][1](A, B) + LIN(A, B)) ** 2),
    (K.exp(0.1 * K.Linear()) * M25 + 0.5 * K.Laplacian(1.5),
     lambda A, B: np.exp(0.1 * LIN(A, B)) * LEAVES[5][1](A, B) + 0.5 * LEAVES[2][1](A, B)),
]
REPR_CASES = ALL[:-1] + REPR_EXTRAS  # warp with an arbitrary function is excepted


def _star_namespace():
    """What ``from dkern.kernels import *`` binds."""
    namespace = {}
    exec("from dkern.kernels import *", namespace)
    return namespace


@pytest.mark.parametrize("namespace", [_star_namespace(), dict(vars(K))],
                         ids=["import-star", "vars"])
@pytest.mark.parametrize(("kernel", "ref"), REPR_CASES,
                         ids=[repr(k)[:40] for k, _ in REPR_CASES])
def test_eval_of_repr_gives_an_equal_kernel(kernel, ref, namespace):
    """The issue's promise, literally: ``eval(repr(k))`` with dkern.kernels' names in scope."""
    again = eval(repr(kernel), dict(namespace))
    assert type(again) is type(kernel) and again is not kernel
    assert again == kernel and repr(again) == repr(kernel)
    mine, theirs = kernel.get_params(deep=True), again.get_params(deep=True)
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        if isinstance(value, K.Kernel):
            assert theirs[name] == value, name
        else:  # numbers and ARD lists: bit for bit, not merely close
            np.testing.assert_array_equal(np.asarray(theirs[name]), np.asarray(value), name)
    np.testing.assert_allclose(again(X, Z), kernel(X, Z), rtol=1e-15, atol=0)
    np.testing.assert_allclose(again.diag(X), kernel.diag(X), rtol=1e-15, atol=0)
    want = ref(X, Z)  # and against the independent formula
    np.testing.assert_allclose(again(X, Z), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def test_eval_of_warp_repr_with_its_function_in_scope():
    """A warp round-trips too when its function's name is in scope (a lambda cannot)."""
    k = K.warp(K.Gaussian(0.8) + K.Linear(), weight)
    again = eval(repr(k), {**_star_namespace(), "weight": weight})
    assert again == k and again is not k
    want = weight(X)[:, None] * (G(X, Z) + LIN(X, Z)) * weight(Z)[None]
    np.testing.assert_allclose(again(X, Z), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    assert "<lambda>" in repr(K.warp(K.Linear(), lambda rows: rows[:, 0] ** 2))


def test_warp_repr_names_function_and_from_repr_refuses_code():
    assert repr(K.warp(K.Linear(), weight)) == "warp(Linear(), weight)"
    with pytest.raises(ValueError, match="not part of a dkern kernel expression"):
        K.from_repr("__import__('os').system('true')")
    with pytest.raises(ValueError, match="not a kernel expression"):
        K.from_repr("Gaussian(")


@pytest.mark.parametrize("text, part", [
    ("Gaussian(lengthscale=9**9**9**9)", "9 ** 9"),  # unbounded work: refused, never run
    ("Gaussian(lengthscale=[1.0] * 10**10)", "10 ** 10"),
    ("Gaussian(1.0) + 2.0", "Gaussian(1.0) + 2.0"),
    ("Gaussian(1.0) ** Gaussian(1.0)", "Gaussian(1.0) ** Gaussian(1.0)"),
    ("Gaussian(**{'lengthscale': 1.0})", "Gaussian(**{'lengthscale': 1.0})"),
    ("Gaussian(lengthscale='1')", "'1'"),
    ("Gaussian.__class__", "Gaussian.__class__"),
])
def test_from_repr_parses_kernel_algebra_only(text, part):
    with pytest.raises(ValueError, match=re.escape(repr(part))):
        K.from_repr(text)


def test_from_repr_understands_signs_lists_and_the_algebra():
    text = "(0.5 * (Gaussian(lengthscale=[1.0, 2.0]) + Matern(1.5, nu=2.5)) ** 2) * Linear()"
    want = (0.5 * (K.Gaussian([1.0, 2.0]) + K.Matern(1.5, nu=2.5)) ** 2) * K.Linear()
    assert K.from_repr(text) == want
    with pytest.raises(ValueError, match="lengthscale"):  # the kernel's own check still runs
        K.from_repr("Gaussian(lengthscale=-1.0)")


def test_get_set_params_nested_like_sklearn():
    k = 2.0 * K.Gaussian(1.0) + K.Polynomial(2)
    params = k.get_params()
    assert params["k1__constant"] == 2.0 and params["k1__kernel__lengthscale"] == 1.0
    assert params["k2__degree"] == 2
    k.set_params(k1__kernel__lengthscale=0.8, k2__degree=3)
    np.testing.assert_allclose(k(X, Z), 2.0 * G(X, Z) + (LIN(X, Z) + 1.0) ** 3, rtol=1e-12)
    with pytest.raises(ValueError, match="lengthscale"):
        k.set_params(k1__kernel__lengthscale=-1.0)
    with pytest.raises(ValueError, match="no parameter 'gamma'"):
        K.Gaussian().set_params(gamma=1.0)


def test_sklearn_clone_keeps_params():
    from sklearn.base import clone

    k = K.Gaussian([1.0, 2.0])
    k2 = clone(k)
    assert k2 == k and k2 is not k


@pytest.mark.parametrize(("make", "match"), [
    (lambda: K.Gaussian(0.0), "lengthscale must be > 0"),
    (lambda: K.Gaussian(-1.0), "lengthscale must be > 0"),
    (lambda: K.Laplacian([1.0, np.nan]), "lengthscale must be > 0"),
    (lambda: K.Matern(1.0, nu=2.0), "nu must be one of"),
    (lambda: 0.0 * K.Gaussian(), "constant c in c \\* k must be a finite number > 0"),
    (lambda: -2.0 * K.Gaussian(), "constant c"),
    (lambda: K.Polynomial(2, c=-1.0), "c must be a finite number >= 0"),
    (lambda: K.Polynomial(0), "degree must be an integer >= 1"),
    (lambda: K.Gaussian() ** 0, "power must be an integer >= 1"),
    (lambda: K.Periodic(period=0.0), "Periodic: period must be > 0"),
    (lambda: K.Periodic(lengthscale=[1.0, 2.0]), "lengthscale must be one number"),
    (lambda: K.Periodic(period_bounds=(2.0, 1.0)), "period_bounds must be a pair"),
])
def test_bad_parameters_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(("make", "match"), [
    (lambda: K.Gaussian() ** 1.5, "power must be an integer"),
    (lambda: K.Polynomial(2.5), "degree must be an integer"),
    (lambda: K.Gaussian("wide"), "lengthscale must be a positive number"),
    (lambda: K.Periodic(period="year"), "period must be a positive number"),
    (lambda: K.warp(K.Gaussian(), 3.0), "f must be a function"),
    (lambda: K.exp("Gaussian"), "kernel must be a dkern kernel"),
])
def test_bad_types_raise_type_error(make, match):
    with pytest.raises(TypeError, match=match):
        make()


def test_ard_lengthscale_feature_mismatch():
    with pytest.raises(ValueError, match="lengthscale has 4 entries but the data has 2 features"):
        K.Gaussian(ELL)(X[:, :2], Z[:, :2])


def test_check_psd_accepts_valid_and_flags_invalid():
    k = 2.0 * K.Matern(1.0, 1.5) + K.Linear() * K.Polynomial(2)
    r, dot = np.sqrt(3) * _r(X, X), X @ X.T  # the Gram matrix from the closed forms
    full = np.linalg.eigvalsh(2.0 * (1 + r) * np.exp(-r) + dot * (dot + 1.0) ** 2)
    whole = K.check_psd(k, X, n=len(X))  # every row: the Gram matrix's own extremes
    assert whole.n_samples == 70 and whole.is_psd and whole.tolerance < 1e-6 * full[-1]
    assert whole.min_eigenvalue == pytest.approx(full[0], abs=whole.tolerance)
    assert whole.max_eigenvalue == pytest.approx(full[-1], rel=1e-10)
    # 60 of 70 rows give a principal submatrix: Cauchy interlacing bounds its extremes,
    # λ_1 <= μ_1 <= λ_11 and λ_60 <= μ_60 <= λ_70, whichever rows were drawn
    tol = whole.tolerance
    for seed in (0, 1):
        report = K.check_psd(k, X, n=60, random_state=seed)
        assert report.n_samples == 60 and report.is_psd
        assert full[0] - tol <= report.min_eigenvalue <= full[10] + tol
        assert full[59] - tol <= report.max_eigenvalue <= full[69] + tol

    class Sigmoid(K.Kernel):  # tanh(x·z - 1): a classic non-PSD "kernel"
        def __call__(self, A, B=None):
            return np.tanh(A @ (A if B is None else B).T - 1.0)

    bad = K.check_psd(Sigmoid(), X, n=60)
    assert not bad.is_psd and bad.min_eigenvalue < -1.0
    assert K.check_psd(k, X.tolist(), n=60, random_state=1) == report  # lists: array-likes
    with pytest.raises(ValueError, match=r"X must have shape \(n_samples, n_features\)"):
        K.check_psd(k, X[:, 0])
