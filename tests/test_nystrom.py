"""Falkon, centre selection, the normal-matvec blocks and the exact solver vs dense references."""

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg as sla

from dkern.backends.normal import normal_matvec_block_keops, normal_matvec_block_numpy
from dkern.errors import ConvergenceWarning, NotPositiveDefiniteError
from dkern.kernels import Gaussian, Laplacian
from dkern.operators.nystrom import NystromOperator
from dkern.solvers import EXACT_MAX_N, exact_solve, falkon, select_centers

RNG = np.random.default_rng(11)
X = RNG.normal(size=(400, 2))
Y = np.sin(2 * X[:, 0]) + 0.1 * RNG.normal(size=400)

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def test_normal_block_numpy_matches_dense_with_tiles():
    C, v = X[:37], RNG.normal(size=(37, 3))
    K = Gaussian(0.7)(X, C)
    got = normal_matvec_block_numpy(Gaussian(0.7), X, C, v, tile_rows=64)
    np.testing.assert_allclose(got, K.T @ (K @ v), rtol=1e-12)


@pytest.mark.keops
def test_normal_block_keops_matches_dense():
    C, v = X[:37], RNG.normal(size=(37, 2))
    K = Gaussian(0.7)(X, C)
    got = normal_matvec_block_keops(Gaussian(0.7), X, C, v)
    np.testing.assert_allclose(got, K.T @ (K @ v), rtol=1e-10)


def test_nystrom_operator_products_match_dense():
    op = NystromOperator(Gaussian(0.7), X, X[:50], backend="numpy")
    K, v = Gaussian(0.7)(X, X[:50]), RNG.normal(size=(50, 2))
    np.testing.assert_allclose(op.normal_matvec(v).compute(), K.T @ (K @ v), rtol=1e-12)
    np.testing.assert_allclose(op.rmatvec(Y).compute()[:, 0], K.T @ Y, rtol=1e-12)
    np.testing.assert_allclose(op.matvec(v).compute(), K @ v, rtol=1e-12)
    assert op.normal_matvec(v).name.startswith("sum-") or "dkern-knm-normal" in str(
        dict(op.normal_matvec(v).__dask_graph__()).keys())


def test_falkon_with_all_points_as_centres_is_exact_krr():
    kernel, alpha = Laplacian(0.5), 1e-2
    res = falkon(kernel, X, Y, X, alpha, tol=1e-10, backend="numpy")
    want = sla.solve(kernel(X, X) + alpha * np.eye(len(X)), Y)
    assert res.beta.shape == (400, 1) and res.converged.all()
    assert np.linalg.norm(res.beta[:, 0] - want) / np.linalg.norm(want) < 1e-6
    assert res.n_iter <= 3  # the preconditioner is exact when M = n (measured: 1)


def blob_and_sparse(n, rng):
    """90% of points in a tight blob, 10% spread wide where the target varies."""
    dense = rng.normal(scale=0.3, size=(int(0.9 * n), 1))
    sparse = rng.uniform(-6, 6, size=(n - len(dense), 1))
    Xs = np.vstack([dense, sparse])
    return Xs, np.sin(2 * Xs[:, 0]) + 0.05 * rng.normal(size=n)


# Uniform picks from the tight blob are near-duplicates at this lengthscale: jitter is expected.
@pytest.mark.filterwarnings("ignore:K_mm is not numerically positive definite")
def test_leverage_centres_beat_uniform_on_uneven_density():
    kernel, alpha, M = Gaussian(0.4), 1e-3, 25
    errors = {"uniform": [], "leverage": []}
    for seed in range(4):
        rng = np.random.default_rng(seed)
        Xtr, ytr = blob_and_sparse(1500, rng)
        Xte, yte = blob_and_sparse(1000, rng)
        for method in errors:
            C = select_centers(Xtr, M, method=method, kernel=kernel, alpha=alpha,
                               random_state=seed)
            beta = falkon(kernel, Xtr, ytr, C, alpha, tol=1e-6, backend="numpy").beta
            errors[method].append(np.sqrt(np.mean((kernel(Xte, C) @ beta[:, 0] - yte) ** 2)))
    uniform, leverage = np.mean(errors["uniform"]), np.mean(errors["leverage"])
    assert leverage <= 0.8 * uniform, (leverage, uniform)


def test_select_centers_uniform_rows_are_distinct_rows_of_x():
    C = select_centers(X, random_state=0)
    assert C.shape == (20, 2)  # default round(sqrt(400))
    assert len({tuple(r) for r in C}) == 20 and all((X == r).all(1).any() for r in C)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_centers": 401}, r"n_centers must be an integer in \[1, n=400\]"),
    ({"n_centers": 0}, "n_centers"),
    ({"method": "kmeans"}, "method must be"),
    ({"method": "leverage", "alpha": 1e-3}, "needs kernel="),
    ({"method": "leverage", "kernel": Gaussian(1.0)}, "needs alpha > 0"),
])
def test_select_centers_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_centers(X, **{"n_centers": 10, **kwargs})


def test_exact_solve_matches_scipy_and_refuses_bad_cases():
    kernel = Gaussian(1.0)
    want = sla.solve(kernel(X, X) + 0.1 * np.eye(400), Y)
    np.testing.assert_allclose(exact_solve(kernel, X, Y, 0.1), want, rtol=1e-10)
    with pytest.raises(NotPositiveDefiniteError, match="Increase alpha"):
        exact_solve(kernel, X, Y, 0.0)
    big = np.zeros((EXACT_MAX_N + 1, 1))
    with pytest.raises(ValueError, match="solver='cg'.*solver='nystrom'"):
        exact_solve(kernel, big, big[:, 0], 1.0)


def test_falkon_and_cg_take_numpy_scalars():
    ref = falkon(Gaussian(1.0), X, Y, X[:10], 0.25, tol=0.5, backend="numpy", random_state=0)
    got = falkon(Gaussian(1.0), X, Y, X[:10], np.float32(0.25), tol=np.float32(0.5),
                 backend="numpy", random_state=0)
    np.testing.assert_array_equal(got.beta, ref.beta)


def test_falkon_bad_inputs():
    with pytest.raises(ValueError, match="alpha must be"):
        falkon(Gaussian(1.0), X, Y, X[:10], 0.0)
    with pytest.raises(ValueError, match="centers must have shape"):
        falkon(Gaussian(1.0), X, Y, X[:10, :1], 1.0)


@pytest.mark.parametrize("cache_bytes", [0, 2**30])
def test_falkon_with_and_without_cached_knm_agree(cache_bytes, monkeypatch):
    """Caching K_nm on the workers changes the cost of a pass, not the answer."""
    from dkern.operators import nystrom

    calls = []
    real = nystrom.NystromOperator.cache_blocks
    monkeypatch.setattr(nystrom.NystromOperator, "cache_blocks",
                        lambda self, max_bytes: calls.append(real(self, max_bytes)) or calls[-1])
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, size=(1200, 3))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=1200)
    C = X[rng.choice(1200, 80, replace=False)]
    kernel = Gaussian(0.7)
    with dask.config.set(scheduler="synchronous"):
        res = falkon(kernel, da.from_array(X, chunks=(300, -1)), y, C, 1e-2, tol=1e-10,
                     cache_bytes=cache_bytes)
    Knm = kernel(X, C)
    want = np.linalg.solve(Knm.T @ Knm + 1e-2 * kernel(C, C), Knm.T @ y)
    assert calls == [cache_bytes > 0]
    assert np.abs(res.beta[:, 0] - want).max() / np.abs(want).max() < 1e-6


def test_falkon_on_float32_data_factors_kmm_in_float64():
    """Wide lengthscale, 8 features: K_mm is too ill-conditioned for a float32 Cholesky."""
    rng = np.random.default_rng(6)
    X = rng.uniform(-1, 1, size=(3000, 8))
    y = np.sin(3 * X[:, 0])
    C = X[rng.choice(3000, 400, replace=False)]
    kernel = Gaussian(3.0)
    with dask.config.set(scheduler="synchronous"):
        r64 = falkon(kernel, X, y, C, 1e-3, tol=1e-3, max_iter=100)
        r32 = falkon(kernel, X.astype(np.float32), y, C.astype(np.float32), 1e-3, tol=1e-3,
                     max_iter=100)
    f64, f32 = kernel(X, C) @ r64.beta[:, 0], kernel(X, C) @ r32.beta[:, 0]
    assert np.sqrt(np.mean((f32 - f64) ** 2)) < 1e-2 * np.std(y)


def test_sketched_preconditioner_needs_far_fewer_iterations_for_the_same_fit():
    """Falkon's centres-only preconditioner vs the default sample of s = 10 M rows.

    Both solve the same system; the fitted values agree to the solve tolerance. Measured
    (n = 20,000, d = 8, M = 300, α = 1e-3): 86 iterations with the centres, 15 with the sample.
    """
    rng = np.random.default_rng(0)
    Xs = rng.uniform(-1, 1, (20_000, 8))
    ys = np.sin(3 * Xs[:, 0]) + 0.5 * np.cos(Xs.sum(axis=1)) + 0.1 * rng.normal(size=20_000)
    C = Xs[rng.choice(20_000, 300, replace=False)]
    kernel = Gaussian(3.0)
    runs = {s: falkon(kernel, Xs, ys, C, 1e-3, tol=1e-6, max_iter=300, sketch_rows=s,
                      random_state=0, backend="numpy") for s in (0, None)}
    assert all(r.converged.all() for r in runs.values())
    assert runs[None].n_iter * 3 <= runs[0].n_iter
    fits = {s: kernel(Xs[:2000], C) @ r.beta[:, 0] for s, r in runs.items()}
    assert np.linalg.norm(fits[None] - fits[0]) / np.linalg.norm(fits[0]) < 1e-5


def test_falkon_stops_at_its_rounding_floor_with_advice():
    """tol = 1e-12 is below what float64 reaches through an ill-conditioned K_mm (ℓ = 3 on
    [-1, 1]^8): the recursive residual reaches 1e-12 while the true one stays near 4e-10.
    Measured: stalled after 45 iterations (it used to run to max_iter), fitted values within
    3e-10 of a QR least-squares reference (the dense normal equations, whose condition number
    is squared, are off by 9e-5 here)."""
    rng = np.random.default_rng(0)
    Xs = rng.uniform(-1, 1, (20_000, 8))
    ys = np.sin(3 * Xs[:, 0]) + 0.1 * rng.normal(size=20_000)
    C = Xs[rng.choice(20_000, 500, replace=False)]
    kernel = Gaussian(3.0)
    with pytest.warns(ConvergenceWarning, match=r"stopped decreasing near .*use tol >= "):
        run = falkon(kernel, Xs, ys, C, 1e-3, tol=1e-12, max_iter=300, random_state=0,
                     backend="numpy")
    assert run.n_iter < 100 and not run.converged.any()
    assert 1e-12 < run.residuals[-1, 0] < 1e-7
    # min ||K_nm β − y||² + α ||T β||² with K_mm = TᵀT, as one least-squares problem
    Knm, T = kernel(Xs, C), sla.cholesky(kernel(C, C), lower=False)
    beta = np.linalg.lstsq(np.vstack([Knm, np.sqrt(1e-3) * T]),
                           np.concatenate([ys, np.zeros(len(C))]), rcond=None)[0]
    fit, want = Knm[:2000] @ run.beta[:, 0], Knm[:2000] @ beta
    assert np.linalg.norm(fit - want) / np.linalg.norm(want) < 1e-6


def test_sketch_size_default_and_cap():
    from dkern.solvers.falkon import sketch_size

    assert sketch_size(20_000, 300) == 3_000  # 10 rows per centre
    assert sketch_size(1_000_000, 2_000) == 20_000
    assert sketch_size(1_000_000, 20_000) == 2_500  # capped near one iteration's cost
    assert sketch_size(500, 100) == 250  # capped at 50 n / M


def test_duplicate_centres_get_jitter_with_a_warning_then_a_clear_error():
    from dkern.solvers.falkon import _cholesky_with_jitter

    C = np.repeat(X[:20], 2, axis=0)  # every centre twice: K_mm is exactly singular
    with pytest.warns(UserWarning, match="jitter"):
        res = falkon(Gaussian(1.0), X, Y, C, 1e-2, tol=1e-8, backend="numpy")
    assert res.converged.all()
    # the fit equals the one on the 20 distinct centres (the duplicates split their weight)
    ref = falkon(Gaussian(1.0), X, Y, X[:20], 1e-2, tol=1e-10, backend="numpy")
    fit, want = Gaussian(1.0)(X, C) @ res.beta[:, 0], Gaussian(1.0)(X, X[:20]) @ ref.beta[:, 0]
    assert np.linalg.norm(fit - want) / np.linalg.norm(want) < 1e-4
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite even with jitter"):
        _cholesky_with_jitter(-np.eye(5))
