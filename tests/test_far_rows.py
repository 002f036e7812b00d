"""One row far from the others: every kernel value accurate to its own pair's scale.

The stationary kernels' expanded distance ``h_x + h_z - s_x·s_z`` rounds with an error
of about ``ε (h_x + h_z)``; centred on the mean of Z, one far row moved every pair off
the origin and lost every digit of the bulk's distances (``Gaussian(1)`` gave ``inf``).
Here one row at 1e3 … 1e15 sits among 20 ordinary ones, in Z, in X, or on both sides
near the same far place, and every kernel, backend and model is checked against
direct differences ``x - z`` (numpy, scipy's cdist, scikit-learn's GP, which uses cdist).
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from scipy.special import logsumexp

import dkern
from dkern import kernels as K
from dkern.backends import matvec_block_keops, matvec_block_numpy

FAR = [1e3, 1e6, 1e9, 1e12, 1e15]
RNG = np.random.default_rng(11)
BULK_X = RNG.normal(size=(20, 3))
BULK_Z = RNG.normal(size=(21, 3)) + 0.5
DIRECTION = np.array([1.0, -0.5, 0.25])
ELL = np.array([0.8, 1.5, 0.6])


def layout(far, where):
    """(X, Z): the bulk with one far row in Z, in X, or near the same far place in both."""
    X, Z = BULK_X.copy(), BULK_Z.copy()
    if where in ("z", "both"):
        Z[7] = far * DIRECTION + np.array([0.1, 0.0, 0.1])
    if where in ("x", "both"):
        X[3] = far * DIRECTION + np.array([0.3, 0.1, -0.2])
    return X, Z


def r_direct(A, B, ell=1.0):
    """``||a - b|| / l`` from the differences, then the lengthscale."""
    return np.sqrt((((A[:, None, :] - B[None, :, :]) / ell) ** 2).sum(-1))


def matern(nu, ell):
    a = np.sqrt(2 * nu)
    poly = {0.5: lambda r: 1, 1.5: lambda r: 1 + a * r,
            2.5: lambda r: 1 + a * r + a * a * r * r / 3}
    return lambda A, B: poly[nu](r_direct(A, B, ell)) * np.exp(-a * r_direct(A, B, ell))


def gauss(ell):
    return lambda A, B: np.exp(-0.5 * r_direct(A, B, ell) ** 2)


P_ELL, PERIOD = 0.9, 2.5
# (kernel, dense reference of k(A, B) from direct differences)
CASES = [
    (K.Gaussian(0.8), gauss(0.8)),
    (K.Gaussian(ELL), gauss(ELL)),
    (K.Laplacian(1.5), lambda A, B: np.exp(-r_direct(A, B, 1.5))),
    (K.Matern(1.2, 0.5), matern(0.5, 1.2)),
    (K.Matern(ELL, 1.5), matern(1.5, ELL)),
    (K.Matern(0.8, 2.5), matern(2.5, 0.8)),
    (2.0 * K.Gaussian(0.8) + K.Linear(), lambda A, B: 2 * gauss(0.8)(A, B) + A @ B.T),
    (K.Gaussian(ELL) * K.Matern(0.7, 2.5), lambda A, B: gauss(ELL)(A, B) * matern(2.5, 0.7)(A, B)),
    (K.Periodic(P_ELL, PERIOD),
     lambda A, B: np.exp(-2 * np.sin(np.pi * r_direct(A, B) / PERIOD) ** 2 / P_ELL**2)),
]
IDS = [repr(k)[:40] for k, _ in CASES]


def tolerance(kernel, A, B):
    """1e-12 on a kernel value; plus what the data's own rounding allows: ``ε |a||b|`` for
    a Linear term, and for the periodic kernel ``ε r`` times its largest slope in r (its
    phase at r ~ 1e15 is known to a few units only, whatever the arithmetic)."""
    eps, tol = np.finfo(float).eps, 1e-12
    if "Linear" in repr(kernel):
        tol = tol + 8 * eps * np.abs(A) @ np.abs(B).T
    if "Periodic" in repr(kernel):
        tol = tol + 8 * eps * cdist(A, B) * 4 * np.pi / (PERIOD * P_ELL**2)
    return tol


def test_the_reported_repro():
    got = K.Gaussian(lengthscale=1.0)(np.array([[0.3]]), np.array([[0.1], [1e10]]))
    np.testing.assert_allclose(got, [[np.exp(-0.02), 0.0]], rtol=1e-14, atol=0)


@pytest.mark.parametrize("far", FAR)
@pytest.mark.parametrize(("kernel", "ref"), CASES, ids=IDS)
def test_dense_block_is_exact_with_one_far_row(kernel, ref, far):
    for where in ("z", "x", "both"):
        X, Z = layout(far, where)
        want = ref(X, Z)
        err = np.abs(kernel(X, Z) - want)
        assert np.all(err <= tolerance(kernel, X, Z)), (where, err.max())
        A = np.vstack([X, Z])  # a square block holding the far rows, as a Gram tile does
        assert np.all(np.abs(kernel(A) - ref(A, A)) <= tolerance(kernel, A, A)), where


@pytest.mark.parametrize("far", [1e9, 1e12])
def test_two_rows_near_the_same_far_place_keep_their_kernel_value(far):
    """x = far + 0.3, z = far + 0.1 (one feature): k = exp(-0.02) = 0.980 up to the rounding
    of the inputs themselves (an ulp of 1e12 is 1.2e-4)."""
    X, Z = np.array([[far + 0.3], [0.0]]), np.array([[far + 0.1], [1.0]])
    got = K.Gaussian(1.0)(X, Z)
    d = X[0, 0] - Z[0, 0]  # the difference of the stored values
    np.testing.assert_allclose(got, [[np.exp(-d * d / 2), 0.0], [0.0, np.exp(-0.5)]],
                               rtol=1e-14, atol=0)
    assert abs(got[0, 0] - 0.980) < 1e-3


@pytest.mark.parametrize("far", FAR)
@pytest.mark.parametrize("exact_near", [False, True])
def test_half_neg_sqdist_is_relatively_exact(far, exact_near):
    """``-r²/2`` within 1e-11 of its own size (the exponential kernels' criterion: of
    ``max(|G|, 1)``), for isotropic and ARD lengthscales."""
    for ell in (0.8, ELL):
        for where in ("z", "x", "both"):
            X, Z = layout(far, where)
            want = -0.5 * r_direct(X, Z, ell) ** 2
            got = K.Gaussian(ell).half_neg_sqdist(X, Z, exact_near=exact_near)
            scale = np.abs(want) if exact_near else np.maximum(np.abs(want), 1.0)
            assert np.all(np.abs(got - want) <= 1e-11 * scale), (ell, where)


@pytest.mark.parametrize("far", FAR)
def test_gradient_is_exact_with_one_far_row(far):
    """The gradients take differences before the lengthscale too."""
    X, Z = layout(far, "both")
    for ell in (0.8, ELL):
        r = r_direct(X, Z, ell)
        _, grad = K.Gaussian(ell)._value_and_gradient(X, Z, diag=False)
        want = np.exp(-0.5 * r**2) * r**2 if np.ndim(ell) == 0 else \
            np.exp(-0.5 * r**2)[:, :, None] * ((X[:, None] - Z[None]) / ell) ** 2
        np.testing.assert_allclose(grad.reshape(want.shape), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("far", FAR)
def test_numpy_backend_matvec_with_one_far_row(far):
    kernel, ref = CASES[4]  # Matern(ELL, 1.5): a root-taking kernel
    X, Z = layout(far, "both")
    V = RNG.normal(size=(len(Z), 2))
    got = matvec_block_numpy(kernel, X, Z, V, tile_rows=6, tile_cols=8)  # far rows in some tiles
    np.testing.assert_allclose(got, ref(X, Z) @ V, rtol=0, atol=1e-12)
    got = matvec_block_numpy(CASES[0][0], X, Z, V, tile_rows=6, tile_cols=8)
    np.testing.assert_allclose(got, CASES[0][1](X, Z) @ V, rtol=0, atol=1e-12)


@pytest.mark.keops
def test_keops_backend_with_one_far_row():
    """One formula (KeOps compiles each once): a Gaussian plus an ARD Laplacian, whose
    distances KeOps takes from the differences, then the lengthscale."""
    kernel = K.Gaussian(0.8) + K.Laplacian(ELL)
    for far in FAR:
        X, Z = layout(far, "both")
        V = RNG.normal(size=(len(Z), 1))
        want = (gauss(0.8)(X, Z) + np.exp(-r_direct(X, Z, ELL))) @ V
        np.testing.assert_allclose(matvec_block_keops(kernel, X, Z, V), want, rtol=0,
                                   atol=1e-12, err_msg=str(far))


# ---------------------------------------------------------------- end to end, small n
@pytest.fixture(autouse=True)
def _sync(sync_scheduler):
    """dask's synchronous scheduler: no cluster needed."""


@pytest.mark.parametrize("far", [1e9, 1e12])
def test_gram_matvec_with_one_far_row(far):
    X, Z = layout(far, "both")
    v = RNG.normal(size=len(Z))
    kernel = K.Gaussian(0.8)
    got = np.asarray(dkern.gram(kernel, X, Z, backend="numpy") @ v)
    np.testing.assert_allclose(got, gauss(0.8)(X, Z) @ v, rtol=0, atol=1e-12)


@pytest.mark.parametrize("far", [1e9, 1e12])
def test_exact_gp_std_at_a_far_test_point_equals_sklearn(far):
    """sklearn's RBF takes cdist distances: its prior std 1 far from the data, small near it."""
    from sklearn.gaussian_process import GaussianProcessRegressor as SklearnGPR
    from sklearn.gaussian_process.kernels import RBF

    X = BULK_X
    y = np.sin(X[:, 0]) + X[:, 1]
    test = np.vstack([X[:2] + 0.01, far * DIRECTION])
    sk = SklearnGPR(RBF(0.8), alpha=1e-2, optimizer=None).fit(X, y)
    mean, std = sk.predict(test, return_std=True)
    gp = dkern.GaussianProcessRegressor(K.Gaussian(0.8), alpha=1e-2, optimizer=None,
                                        solver="exact").fit(X, y)
    got_mean, got_std = gp.predict(test, return_std=True)
    np.testing.assert_allclose(got_mean, mean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got_std, std, rtol=1e-9)


@pytest.mark.parametrize("far", [1e9, 1e12])
def test_exact_kernel_ridge_with_one_far_training_row(far):
    X, Z = layout(far, "x")
    y = np.cos(X[:, 0])
    alpha = 0.1
    Kd = gauss(0.8)(X, X)
    coef = np.linalg.solve(Kd + alpha * np.eye(len(X)), y)
    want = gauss(0.8)(Z, X) @ coef
    model = dkern.KernelRidge(K.Gaussian(0.8), alpha=alpha, solver="exact").fit(X, y)
    np.testing.assert_allclose(model.predict(Z), want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("where", ["x", "both"])
@pytest.mark.parametrize("far", [1e9, 1e12])
def test_kde_and_nadaraya_watson_with_one_far_training_row(far, where):
    """Bandwidth 0.35: dividing the rows by it first would round a far row to its own
    magnitude (2.9e-8 off at 1e9, 1.7e-4 at 1e12, with a query row near it)."""
    X, Q = layout(far, where)
    h = 0.35
    L = -0.5 * r_direct(Q, X, h) ** 2
    log_density = logsumexp(L, axis=1) - np.log(len(X)) - 1.5 * np.log(2 * np.pi) - 3 * np.log(h)
    got = dkern.KernelDensity(bandwidth=h).fit(X).score_samples(Q)
    np.testing.assert_allclose(got, log_density, rtol=1e-12, atol=1e-12)
    t = np.sin(X[:, 0]) + 2.0
    want = np.exp(L - logsumexp(L, axis=1, keepdims=True)) @ t
    got = dkern.NadarayaWatson(bandwidth=h).fit(X, t).predict(Q)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


# ---------------------------------------------------------------- k nearest neighbours
# nearest_block selects candidates by the expanded form on centred rows and recomputes them
# from differences. A far row must neither change the result (exact, ties to the lower
# index) nor widen every pair's error bound: centred on Z's mean with one bound per row
# from Z's largest norm, one row at 1e3 … 1e15 made every pair of the block a candidate.

def knn_brute(Q, X, k):
    """(distances, indices) of the k nearest rows of X: a stable argsort of the exact
    squared differences, so rows at equal distance come in index order."""
    D = ((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    return np.sqrt(np.take_along_axis(D, order, 1)), order


@pytest.mark.parametrize("where", ["z", "x", "both"])
@pytest.mark.parametrize("far", [1e3, 1e9, 1e15])
def test_kneighbors_with_one_far_row_equal_brute_force(far, where):
    import dask.array as da

    X, Z = layout(far, where)
    k = 4
    dist, ind = dkern.KNeighborsRegressor(n_neighbors=k).fit(
        da.from_array(Z, chunks=8), np.zeros(len(Z))).kneighbors(X)
    ref_dist, ref_ind = knn_brute(X, Z, k)
    np.testing.assert_array_equal(ind, ref_ind)
    # the distances of those indices, from the same differences: equal to rounding
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-14, atol=0)


def _block_knn(X, Z, k, monkeypatch):
    """nearest_block on one (X, Z) block, and the number of pairs it recomputed exactly
    (the candidates every tile's mask search returns)."""
    from dkern.backends import neighbors

    search, count = neighbors._true_entries, [0]

    def counting(mask):
        rows, cols = search(mask)
        count[0] += len(rows)
        return rows, cols

    monkeypatch.setattr(neighbors, "_true_entries", counting)
    limit = neighbors.sample_bound(X, Z[:256], k=k)
    index = np.arange(len(Z), dtype=np.int64)[:, None]
    sq, ind = neighbors.nearest_block(X, Z, limit, index, k=k)
    return np.sqrt(sq), ind, count[0]


@pytest.mark.parametrize("where", ["z", "x", "both"])
@pytest.mark.parametrize("far", [1e3, 1e9, 1e15])
def test_knn_block_recomputes_few_pairs_with_one_far_row(far, where, monkeypatch):
    """A 300 × 2,500 block (three tiles of columns) recomputes about as many pairs as
    without the far row: the far row's own pairs at most (one far query row may admit
    all its columns), never the whole block."""
    rng = np.random.default_rng(5)
    X, Z, k = rng.normal(size=(300, 4)), rng.normal(size=(2500, 4)), 5
    *_, ordinary = _block_knn(X, Z, k, monkeypatch)
    direction = np.array([1.0, -0.5, 0.25, 2.0])
    if where in ("z", "both"):
        Z[1500] = far * direction + 0.1
    if where in ("x", "both"):
        X[17] = far * direction + 0.3
    dist, ind, count = _block_knn(X, Z, k, monkeypatch)
    ref_dist, ref_ind = knn_brute(X, Z, k)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-14, atol=0)
    far_query_row = len(Z) if where in ("x", "both") else 0
    assert count <= 1.2 * ordinary + far_query_row, (count, ordinary)


def test_rows_just_inside_the_magnitude_limit_give_zeros_not_nan():
    """Rows under the inputs' limit (3.87e153 at d = 3) whose scaled squared distances
    still overflow. A Matérn 5/2 kernel is 0 there (∞ · 0 gave NaN: the exact fit failed
    with 'V contains NaN', predict called the kernel overflowing; scikit-learn's gives
    NaN); a Gaussian KDE scores -inf, as scikit-learn's (the fused log-sum-exp gave NaN);
    Nadaraya–Watson's prediction there is NaN with its warning. Other rows unchanged."""
    from sklearn.gaussian_process.kernels import Matern as SkMatern
    from sklearn.kernel_ridge import KernelRidge as SkKRR
    from sklearn.neighbors import KernelDensity as SkKDE

    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = np.sin(X).sum(axis=1)
    far = np.array([[3.8e153, -3.8e153, 3.8e153]])
    Q = np.vstack([X[:4] + 0.1, far])
    ref = SkKRR(kernel=SkMatern(1.0, nu=2.5), alpha=0.1).fit(X, y).predict(Q[:4])
    got = dkern.KernelRidge(K.Matern(1.0, 2.5), alpha=0.1, solver="exact").fit(X, y).predict(Q)
    np.testing.assert_allclose(got[:4], ref, rtol=1e-12)
    assert got[4] == 0.0
    model = dkern.KernelRidge(K.Matern(1.0, 2.5), alpha=0.1, solver="exact").fit(
        np.vstack([X, far]), np.append(y, 1.0))
    np.testing.assert_allclose(model.predict(Q[:4]), ref, rtol=1e-12)  # a row far from all

    Xs, Qs = X * 0.1, np.vstack([X[:3] * 0.1, [[3e153, -1e153, 2e153]]])
    scores = dkern.KernelDensity(bandwidth=0.1).fit(Xs).score_samples(Qs)
    np.testing.assert_allclose(scores, SkKDE(bandwidth=0.1).fit(Xs).score_samples(Qs),
                               rtol=1e-12)
    assert scores[-1] == -np.inf
    with pytest.warns(RuntimeWarning, match="1 of 4 .* NaN: their squared distances"):
        nw = dkern.NadarayaWatson(K.Gaussian(0.1)).fit(Xs, y).predict(Qs)
    assert np.isnan(nw[-1]) and np.isfinite(nw[:3]).all()

    # KeOps, which backend="auto" takes first on a GPU: the same values (it gave NaN for
    # the score and refused the Matérn product as overflowing)
    from dkern.backends import block_backend

    keops, numpy_ = block_backend("keops"), block_backend("numpy")
    v = np.ones((len(X), 1))
    np.testing.assert_allclose(keops.kernel_matvec(Q, X, v, kernel=K.Matern(1.0, 2.5)),
                               numpy_.kernel_matvec(Q, X, v, kernel=K.Matern(1.0, 2.5)),
                               rtol=1e-12)
    sums = keops.weighted_log_sums(Qs, Xs, kernel=K.Gaussian(1.0), scale=0.1)
    np.testing.assert_array_equal(sums[-1], [-np.inf, 0.0])


@pytest.mark.parametrize("ell", [1e-300, 1e-160, [1e-300, 1.0, 2.0]])
def test_lengthscales_tiny_next_to_the_rows_give_the_identity_not_nan(ell):
    """A lengthscale so small that the scaled rows' squared norms overflow (ℓ below ~1e-154
    for values of order 1): the expanded distance gave inf - inf = NaN, and the fits ended
    "successfully" with NaN coefficients (predict then said 'V contains NaN or Inf'). The
    tile is now computed from differences: the kernel matrix is the identity, as
    scikit-learn's, and the exact GP's mean and std equal its own."""
    from sklearn.gaussian_process import GaussianProcessRegressor as SkGPR
    from sklearn.gaussian_process.kernels import RBF
    from sklearn.gaussian_process.kernels import Matern as SkMatern

    rng = np.random.default_rng(5)
    X, Q = rng.normal(size=(25, 3)), rng.normal(size=(6, 3))
    y = np.sin(X).sum(axis=1)
    np.testing.assert_array_equal(K.Gaussian(ell)(X, Q), RBF(ell)(X, Q))  # zeros
    for ours in (K.Gaussian(ell), K.Matern(ell, 1.5), K.Matern(ell, 2.5)):
        np.testing.assert_array_equal(ours(X, X), np.eye(len(X)))
        np.testing.assert_array_equal(ours(X, Q), np.zeros((len(X), len(Q))))
    assert np.isnan(SkMatern(ell, nu=1.5)(X, Q)).all()  # scikit-learn's: inf * 0
    gp = dkern.GaussianProcessRegressor(K.Gaussian(ell), alpha=0.1, solver="exact",
                                        optimizer=None).fit(X, y)
    mean, std = gp.predict(np.vstack([Q, X[:2]]), return_std=True)
    sk_mean, sk_std = SkGPR(RBF(ell), alpha=0.1, optimizer=None).fit(X, y).predict(
        np.vstack([Q, X[:2]]), return_std=True)
    np.testing.assert_allclose(mean, sk_mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(std, sk_std, rtol=1e-12)
    krr = dkern.KernelRidge(K.Gaussian(ell), alpha=0.1, solver="cg", tol=1e-10,
                            backend="numpy").fit(X, y)
    np.testing.assert_allclose(krr.predict(X), y / 1.1, rtol=1e-9)  # (I + 0.1 I) c = y


@pytest.mark.parametrize("ell", [1e-300, [1e-300, 1.0, 2.0]])
def test_keops_with_tiny_lengthscales_equals_numpy(ell):
    """KeOps scaled a scalar lengthscale's squared distances by 1 / l², inf here: 0 · inf
    gave NaN where x = z (the kernel's diagonal). Its log-sum-exp (KDE, Nadaraya–Watson)
    shifted from -inf and gave NaN sums for rows with some zero weights. Both now equal
    numpy's: the identity, and a match's weight 1 beside zeros."""
    from dkern.backends import block_backend

    keops, numpy_ = block_backend("keops"), block_backend("numpy")
    rng = np.random.default_rng(6)
    X, V = rng.normal(size=(25, 3)), rng.normal(size=(25, 2))
    Q = np.vstack([rng.normal(size=(2, 3)), X[:2]])
    # (one kernel: each KeOps formula costs a compile; Matérn takes the same _keops_sqdist)
    np.testing.assert_array_equal(keops.kernel_matvec(X, X, V, kernel=K.Gaussian(ell)), V)
    got = keops.weighted_log_sums(Q, X, None, kernel=K.Gaussian(1.0), scale=1e-300)
    want = numpy_.weighted_log_sums(Q, X, None, kernel=K.Gaussian(1.0), scale=1e-300)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, [[-np.inf, 0.0], [-np.inf, 0.0], [0.0, 1.0], [0.0, 1.0]])


def test_float32_tiles_warn_of_nothing_and_stay_within_float32_of_float64():
    """The far-tile check compared float32 norms with a float64 bound: 'overflow
    encountered in cast' on every float32 tile (seen compiled on a GPU host's test run).
    The bound is now the dtype's own; a float32 row far enough to overflow its squares
    takes the differences, as in float64."""
    import warnings

    X = RNG.normal(size=(40, 3)).astype(np.float32)
    far = X.copy()
    far[0] = 1e19  # (1e19 / 1e-3)² overflows float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kernel in (K.Gaussian(1.0), K.Matern(0.7, 2.5), K.Gaussian(ELL)):
            got = kernel(X, X[:9])
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, kernel(X.astype(np.float64), X[:9].astype(np.float64)),
                                       atol=2e-6)
        values = K.Gaussian(1e-3)(far, far)
        # a lengthscale that is 0 in float32 (below ~1.4e-45) gave 0 / 0 on the diagonal
        tiny = K.Matern(1e-50, 1.5)(X, X)
    np.testing.assert_array_equal(np.diag(values), 1.0)
    assert np.isfinite(values).all()
    np.testing.assert_array_equal(tiny, np.eye(len(X)))


def test_keops_with_huge_lengthscales_equals_numpy():
    """A lengthscale from 1e155 makes 1 / l² underflow to 0, and pykeops turns a LazyTensor
    times 0.0 into a plain number: the products and KDE failed with "'float' object has no
    attribute 'exp'" (adversary G). The kernel is all ones there, as numpy's."""
    from dkern.backends import block_backend

    keops, numpy_ = block_backend("keops"), block_backend("numpy")
    rng = np.random.default_rng(7)
    X, V = rng.normal(size=(25, 3)), rng.normal(size=(25, 2))
    np.testing.assert_allclose(keops.kernel_matvec(X, X, V, kernel=K.Gaussian(1e200)),
                               np.tile(V.sum(axis=0), (25, 1)), rtol=1e-14)
    got = keops.weighted_log_sums(X[:4], X, None, kernel=K.Gaussian(1.0), scale=1e200)
    want = numpy_.weighted_log_sums(X[:4], X, None, kernel=K.Gaussian(1.0), scale=1e200)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_array_equal(want, [[0.0, 25.0]] * 4)
