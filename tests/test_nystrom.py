"""Falkon, centre selection, the normal-matvec blocks and the exact solver vs dense references."""

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg as sla

from dkern.backends.nystrom_normal import normal_matvec_block_keops, normal_matvec_block_numpy
from dkern.errors import ConvergenceWarning, NotPositiveDefiniteError
from dkern.kernels import Gaussian, Laplacian
from dkern.operators.nystrom import NystromOperator
from dkern.solvers import EXACT_MAX_N, exact_solve, falkon, select_centers

RNG = np.random.default_rng(11)
X = RNG.normal(size=(400, 2))
Y = np.sin(2 * X[:, 0]) + 0.1 * RNG.normal(size=400)

pytestmark = pytest.mark.usefixtures("sync_scheduler")
READS = []


def counted_read(block, block_info=None):
    """A dask block function that records which chunk of its source it was called for."""
    READS.append(block_info[0]["chunk-location"][0])
    return block.copy()


def test_normal_block_numpy_matches_dense_with_tiles():
    C, v = X[:37], RNG.normal(size=(37, 3))
    K = Gaussian(0.7)(X, C)
    got = normal_matvec_block_numpy(Gaussian(0.7), X, C, v, tile_rows=64)
    np.testing.assert_allclose(got, K.T @ (K @ v), rtol=1e-12)


@pytest.mark.keops
def test_normal_block_keops_matches_dense():
    # d = 3 and 16 columns: the KeOps formula other tests compile (Gaussian, d = 3, V 16
    # wide); X's d = 2 with 2 columns compiled one of its own (~15-35 s)
    x = np.column_stack([X, Y])
    C, v = x[:37], RNG.normal(size=(37, 16))
    K = Gaussian(0.7)(x, C)
    got = normal_matvec_block_keops(Gaussian(0.7), x, C, v)
    np.testing.assert_allclose(got, K.T @ (K @ v), rtol=1e-10)


def test_nystrom_operator_products_match_dense():
    """Over four row chunks; each product reads every chunk of X exactly once."""
    Xd = da.map_blocks(counted_read, da.from_array(X, chunks=(100, -1)), dtype=float)
    op = NystromOperator(Gaussian(0.7), Xd, X[:50], backend="numpy")
    K, v = Gaussian(0.7)(X, X[:50]), RNG.normal(size=(50, 2))
    for product, want in [(op.normal_matvec(v), K.T @ (K @ v)), (op.rmatvec(Y), K.T @ Y[:, None]),
                          (op.matvec(v), K @ v)]:
        READS.clear()
        np.testing.assert_allclose(product.compute(), want, rtol=1e-12)
        assert sorted(READS) == [0, 1, 2, 3]


def test_cached_nystrom_operator_reads_x_once_then_only_its_blocks():
    """After cache_blocks, every product equals the dense one and none reads X again."""
    Xd = da.map_blocks(counted_read, da.from_array(X, chunks=(100, -1)), dtype=float)
    op = NystromOperator(Gaussian(0.7), Xd, X[:50], backend="numpy")
    READS.clear()
    assert op.cache_blocks(2**20)
    assert sorted(READS) == [0, 1, 2, 3]
    K, v = Gaussian(0.7)(X, X[:50]), RNG.normal(size=(50, 2))
    READS.clear()
    for product, want in [(op.normal_matvec(v), K.T @ (K @ v)), (op.rmatvec(Y), K.T @ Y[:, None]),
                          (op.matvec(v), K @ v), (op.X[::7], X[::7])]:
        np.testing.assert_allclose(product.compute(), want, rtol=1e-12)
    assert READS == []


def test_products_on_cached_blocks_do_not_copy_them():
    """Each cached K(X_i, C) block (here 16 MB) is read in place by every product: the
    peak of new allocations stays at the size of the results (a copy per task cost 3x the
    product's time at n = 200,000, M = 1,000)."""
    import tracemalloc

    rng = np.random.default_rng(2)
    Xb, v = rng.uniform(size=(40_000, 3)), rng.normal(size=(200, 1))
    op = NystromOperator(Gaussian(0.5), da.from_array(Xb, chunks=(10_000, -1)), Xb[:200],
                         backend="numpy")
    assert op.cache_blocks(2**30)
    products = [op.normal_matvec(v), op.rmatvec(Xb[:, 0])]
    tracemalloc.start()
    try:
        dask.compute(*products)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB: a 16 MiB cached block was copied"


def test_falkon_with_all_points_as_centres_is_exact_krr():
    kernel, alpha = Laplacian(0.5), 1e-2
    res = falkon(kernel, X, Y, X, alpha, tol=1e-10, backend="numpy")
    want = sla.solve(kernel(X, X) + alpha * np.eye(len(X)), Y)
    assert res.beta.shape == (400, 1) and res.converged.all()
    assert np.linalg.norm(res.beta[:, 0] - want) / np.linalg.norm(want) < 1e-6
    assert res.n_iter <= 3  # M = n: (BBᵀ)⁻¹ = K² + αK is the system, one step in exact arithmetic


def blob_and_sparse(n, rng):
    """90% of points in a tight blob, 10% spread wide where the target varies."""
    dense = rng.normal(scale=0.3, size=(int(0.9 * n), 1))
    sparse = rng.uniform(-6, 6, size=(n - len(dense), 1))
    Xs = np.vstack([dense, sparse])
    return Xs, np.sin(2 * Xs[:, 0]) + 0.05 * rng.normal(size=n)


# Uniform picks from the tight blob are near-duplicates at this lengthscale: jitter is expected.
@pytest.mark.filterwarnings("ignore:K_mm is singular to working precision")
def test_leverage_centres_beat_uniform_on_uneven_density():
    """Medians over 8 draws: leverage sampling has a heavy tail (a rare draw leaves a gap in
    the sparse region), so a mean over few draws tests the random stream, not the method."""
    kernel, alpha, M = Gaussian(0.4), 1e-3, 25
    errors = {"uniform": [], "leverage": []}
    for seed in range(8):
        rng = np.random.default_rng(seed)
        Xtr, ytr = blob_and_sparse(1500, rng)
        Xte, yte = blob_and_sparse(1000, rng)
        for method in errors:
            C = select_centers(Xtr, M, method=method, kernel=kernel, alpha=alpha,
                               random_state=seed)
            beta = falkon(kernel, Xtr, ytr, C, alpha, tol=1e-6, backend="numpy").beta
            errors[method].append(np.sqrt(np.mean((kernel(Xte, C) @ beta[:, 0] - yte) ** 2)))
    uniform, leverage = np.median(errors["uniform"]), np.median(errors["leverage"])
    assert leverage <= 0.8 * uniform, (leverage, uniform)


def test_select_centers_uniform_rows_are_distinct_rows_of_x():
    C = select_centers(X, random_state=0)
    assert C.shape == (20, 2)  # default round(sqrt(400))
    assert len({tuple(r) for r in C}) == 20 and all((X == r).all(1).any() for r in C)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_centers": 401}, r"n_centers must be an integer in \[1, 400\].*n_centers <= n = 400"),
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


def test_falkon_on_float32_data_computes_in_float64():
    """Wide lengthscale, 8 features: K_mm's condition number is far beyond float32's. The fit
    on float32 data equals a float64 least-squares reference on the same (float32-rounded)
    values to 1e-6; any float32 step (kernel, factors, products) would miss by ~1e-3."""
    rng = np.random.default_rng(6)
    X32 = rng.uniform(-1, 1, size=(3000, 8)).astype(np.float32)
    y = np.sin(3 * X32[:, 0].astype(np.float64))
    C32 = X32[rng.choice(3000, 200, replace=False)]
    kernel = Gaussian(3.0)
    res = falkon(kernel, X32, y, C32, 1e-3, tol=1e-8, max_iter=300, backend="numpy")
    X64, C64 = X32.astype(np.float64), C32.astype(np.float64)
    Knm, T = kernel(X64, C64), sla.cholesky(kernel(C64, C64), lower=False)
    beta = np.linalg.lstsq(np.vstack([Knm, np.sqrt(1e-3) * T]),
                           np.concatenate([y, np.zeros(len(C64))]), rcond=None)[0]
    fit, want = Knm @ res.beta[:, 0], Knm @ beta
    assert np.linalg.norm(fit - want) / np.linalg.norm(want) < 1e-6


def test_sketched_preconditioner_needs_far_fewer_iterations_for_the_same_fit():
    """Falkon's centres-only preconditioner vs the default sample of s = 10 M rows.

    Both solve the same system; the fitted values agree to the solve tolerance
    (iteration counts: benchmarks/RESULTS.md, "Solver notes").
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
    [-1, 1]^8): the solve must stop at the floor before max_iter, unconverged, with fitted
    values matching a QR least-squares reference (the dense normal equations, whose
    condition number is squared, are too inaccurate to serve here)."""
    rng = np.random.default_rng(0)
    Xs = rng.uniform(-1, 1, (20_000, 8))
    ys = np.sin(3 * Xs[:, 0]) + 0.1 * rng.normal(size=20_000)
    C = Xs[rng.choice(20_000, 500, replace=False)]
    kernel = Gaussian(3.0)
    with pytest.warns(ConvergenceWarning, match=r"stopped decreasing near .*use tol >= "):
        run = falkon(kernel, Xs, ys, C, 1e-3, tol=1e-12, max_iter=300, random_state=0,
                     backend="numpy")
    assert run.n_iter < 300 and not run.converged.any() and run.residuals[-1, 0] > 1e-12
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
    assert sketch_size(300_000, 2_000) == 20_000
    assert sketch_size(1_000_000, 20_000) == 7_500  # capped near a few iterations' cost
    assert sketch_size(10_000, 1_000) == 1_500  # capped at 150 n / M
    assert sketch_size(500, 100) == 500  # all of X


def normal_equations_residual(kernel, X, y, C, alpha, beta):
    """``‖K_nmᵀ y − (K_nmᵀ K_nm + α K_mm) β‖ / ‖K_nmᵀ y‖`` with dense numpy."""
    Knm = kernel(X, C)
    rhs = Knm.T @ y
    return np.linalg.norm(rhs - Knm.T @ (Knm @ beta) - alpha * kernel(C, C) @ beta) / (
        np.linalg.norm(rhs))


def test_duplicate_centres_warn_then_fit_the_distinct_ones_or_raise_if_not_psd():
    from dkern.solvers.falkon import _kmm_factor

    C = np.repeat(X[:20], 2, axis=0)  # every centre twice: K_mm is exactly singular
    with pytest.warns(UserWarning, match="40 centres span only 20 directions"):
        res = falkon(Gaussian(1.0), X, Y, C, 1e-2, tol=1e-8, backend="numpy")
    assert res.converged.all()
    assert normal_equations_residual(Gaussian(1.0), X, Y, C, 1e-2, res.beta[:, 0]) < 1e-7
    # the fit equals the one on the 20 distinct centres (the duplicates split their weight)
    ref = falkon(Gaussian(1.0), X, Y, X[:20], 1e-2, tol=1e-10, backend="numpy")
    fit, want = Gaussian(1.0)(X, C) @ res.beta[:, 0], Gaussian(1.0)(X, X[:20]) @ ref.beta[:, 0]
    assert np.linalg.norm(fit - want) / np.linalg.norm(want) < 1e-6
    with pytest.raises(NotPositiveDefiniteError, match="not positive semi-definite"):
        _kmm_factor(-np.eye(5))


class Float32Gaussian(Gaussian):
    """A Gaussian kernel whose values are rounded to float32 (a user kernel of limited
    precision): K_mm of duplicated centres has eigenvalues near -1e-7, not just rounding."""

    def __call__(self, A, B=None):
        return super().__call__(A, B).astype(np.float32).astype(np.float64)


def test_a_singular_kmm_changes_the_preconditioner_not_the_problem():
    """Old main factored K_mm + 1e-6 · I and used that factor in the system too, so β solved
    (K_nmᵀK_nm + α(K_mm + 1e-6 I)) β = K_nmᵀ y: its residual in the stated normal
    equations was 2.3e-8 here. β must solve the stated equations (dense numpy reference),
    to 1e-8: the float32 kernel values leave a floor near 3e-9."""
    rng = np.random.default_rng(0)
    Xs = rng.uniform(-1, 1, size=(1000, 1))
    ys = np.sin(3 * Xs[:, 0]) + 0.1 * rng.normal(size=1000)
    C, kernel = np.repeat(Xs[:20], 2, axis=0), Float32Gaussian(1.0)
    with pytest.warns(UserWarning, match="K_mm"):
        res = falkon(kernel, Xs, ys, C, 1.0, tol=1e-10, backend="numpy", random_state=0)
    true = normal_equations_residual(kernel, Xs, ys, C, 1.0, res.beta[:, 0])
    assert true < 1e-8
    assert res.normal_residuals[0] == pytest.approx(true, rel=0.1)  # it reports the truth


def test_leverage_selection_reads_x_a_fixed_number_of_times():
    """α = 1e-4 from α_0 ≈ n gives 13 BLESS levels; X must not be read once per level, only:
    one chunk (first row), one pass (all levels' candidates), one pass (final scores) and
    the chunks holding the chosen centres."""
    rng = np.random.default_rng(1)
    Xs, _ = blob_and_sparse(6000, rng)
    READS.clear()
    Xd = da.map_blocks(counted_read, da.from_array(Xs, chunks=(500, -1)), dtype=float)
    C = select_centers(Xd, 30, method="leverage", kernel=Gaussian(0.4), alpha=1e-4,
                       random_state=0)
    assert C.shape == (30, 1) and len(np.unique(C)) == 30 and np.isin(C, Xs).all()
    assert len(READS) <= 1 + 3 * 12 and max(np.bincount(READS)) <= 4


class _FakeClient:
    """What persist_budget reads of a distributed client: its workers' memory limits."""

    def __init__(self, limits):
        self.limits = limits

    def scheduler_info(self, n_workers=5):
        return {"workers": {f"w{i}": {"memory_limit": m} for i, m in enumerate(self.limits)}}

    def get(self, *args, **kwargs):
        raise AssertionError("nothing is computed here")


def test_persist_budget_follows_the_workers_memory_limits():
    from dkern.operators import persist_budget
    from dkern.operators.memory import PERSIST_FRACTION

    limits = [400e6, 500e6, 450e6, 400e6, 400e6, 400e6]  # more workers than a default listing
    with dask.config.set(scheduler=_FakeClient(limits).get):
        assert persist_budget() == int(PERSIST_FRACTION * 400e6 * 6)


def test_falkon_does_not_cache_knm_beyond_the_workers_memory(monkeypatch):
    """Two 400 MB workers cannot hold a 1.6 GB K_nm: it was cached anyway (the 2 GiB
    default alone decided) and the workers were killed. Now the pass recomputes it."""
    import importlib

    falkon_module = importlib.import_module("dkern.solvers.falkon")
    calls = []
    real = NystromOperator.cache_blocks
    monkeypatch.setattr(NystromOperator, "cache_blocks",
                        lambda self, budget: calls.append(budget) or real(self, budget))
    monkeypatch.setattr(falkon_module, "persist_budget", lambda: 240_000_000)
    falkon_module.falkon(Gaussian(1.0), X, Y, X[:20], 1e-2, tol=1e-3, backend="numpy")
    assert calls == [240_000_000]


def test_falkon_passes_are_its_iterations_and_two_checks(monkeypatch):
    """Each CG step is one ``K_nmᵀ K_nm v`` pass, plus the last (judged) step's and the
    true-residual check at the result; the normal equations' residual reuses that check's
    product, so it costs no pass, and still equals the dense one."""
    calls = []
    real = NystromOperator.normal_matvec
    monkeypatch.setattr(NystromOperator, "normal_matvec",
                        lambda self, v: calls.append(1) or real(self, v))
    C, kernel = X[np.random.default_rng(3).choice(400, 40, replace=False)], Gaussian(0.8)
    # a sample of half of X: the default (all of X here) is exact, done in one step
    res = falkon(kernel, X, Y, C, 1e-2, tol=1e-8, backend="numpy", sketch_rows=200,
                 random_state=0)
    assert res.converged.all() and 2 <= res.n_iter < 50  # no residual replacement on the way
    assert len(calls) == res.n_iter + 2
    true = normal_equations_residual(kernel, X, Y, C, 1e-2, res.beta[:, 0])
    assert res.normal_residuals[0] == pytest.approx(true, rel=1e-6, abs=1e-15)
