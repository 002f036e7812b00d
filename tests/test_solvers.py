"""Block CG and its preconditioners against dense scipy solves."""

import logging
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg as sla
from dask.sizeof import sizeof

import dkern
from dkern.errors import ConvergenceWarning, DkernError, NotPositiveDefiniteError
from dkern.kernels import Gaussian
from dkern.solvers import JacobiPreconditioner, NystromPreconditioner, cg

RNG = np.random.default_rng(3)
N = 200
X = RNG.normal(size=(N, 2))
KERNEL = Gaussian(1.0)
# K + alpha I with alpha = 1: kappa ~ 40, so a CG solve to 1e-10 is ~30 steps. Every step
# is dask graph overhead (~0.1 s here, whatever n), so the condition number sets the
# tests' time (alpha = 0.1 took twice the steps and proved nothing more).
ALPHA = 1.0
B8 = RNG.normal(size=(N, 8))
DENSE = KERNEL(X, X) + ALPHA * np.eye(N)

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def rel_err(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def operator(alpha=ALPHA, dtype=None):
    return dkern.gram(KERNEL, X, backend="numpy", dtype=dtype) + alpha


def test_cg_single_and_block_match_dense_solve():
    """A block of 3 right-hand sides: each column is the single-column solve (each CG solve
    here is ~30 steps of graph overhead, so 4 solves, not 10)."""
    B = B8[:, :3]
    single = cg(operator(), B[:, 0], tol=1e-10)
    block = cg(operator(), B, tol=1e-10)
    assert single.x.shape == (N,) and block.x.shape == (N, 3)
    assert rel_err(single.x.compute(), sla.solve(DENSE, B[:, 0])) < 1e-8
    assert rel_err(block.x.compute(), sla.solve(DENSE, B)) < 1e-8
    assert block.converged.all() and block.residuals.shape == (block.n_iter + 1, 3)
    assert block.residuals[-1].max() <= 1e-10
    for j in range(3):
        alone = (single if j == 0 else cg(operator(), B[:, j], tol=1e-10)).x.compute()
        assert rel_err(block.x[:, j].compute(), alone) < 1e-8


class GraphSpy:
    """Records the task count of every vector block CG hands to the operator."""

    def __init__(self, A):
        self.A, self.sizes = A, []
        self.shape, self.dtype, self.col_chunks = A.shape, A.dtype, A.col_chunks

    def matvec(self, V):
        self.sizes.append(len(dict(V.__dask_graph__())))
        return self.A.matvec(V)


def test_graph_does_not_grow_with_iterations():
    """The direction handed to the matvec at iteration 50 has as small a graph as at the
    first: iterate, residual and direction are persisted, not chained lazily."""
    spy = GraphSpy(dkern.gram(KERNEL, da.from_array(X, chunks=50), backend="numpy") + 1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        res = cg(spy, B8[:, :2], tol=1e-14, max_iter=50)
    assert res.n_iter == 50 and len(spy.sizes) >= 50
    assert set(spy.sizes) == {4}  # every call: a persisted (200, 2) array, one task per chunk
    assert len(dict(res.x.__dask_graph__())) == 4


def test_not_positive_definite_raises():
    with pytest.raises(NotPositiveDefiniteError, match=r"iteration \d+.*alpha"):
        cg(operator(alpha=-0.5), B8[:, 0], tol=1e-10)


class NaNAfter:
    """A Gram operator whose matvec starts returning NaN at its ``calls``-th call."""

    def __init__(self, A, calls):
        self.A, self.calls = A, calls
        self.shape, self.dtype, self.col_chunks = A.shape, A.dtype, A.col_chunks

    def matvec(self, V):
        self.calls -= 1
        out = self.A.matvec(V)
        return out * np.nan if self.calls <= 0 else out


def test_nan_mid_solve_raises_naming_iteration():
    with pytest.raises(DkernError, match=r"CG iteration 3: .* is nan"):
        cg(NaNAfter(operator(), calls=4), B8[:, 0], tol=1e-12)


def test_max_iter_too_small_warns_and_reports_not_converged():
    with pytest.warns(ConvergenceWarning, match="max_iter.*alpha.*preconditioner"):
        res = cg(operator(), B8[:, :3], tol=1e-12, max_iter=2)
    assert res.n_iter == 2 and res.residuals.shape == (3, 3)
    assert not res.converged.any()


class Float32Products(NaNAfter):
    """A Gram operator whose products are rounded to float32: its rounding floor is ~1e-7."""

    def __init__(self, A):
        super().__init__(A, calls=np.inf)

    def matvec(self, V):
        return self.A.matvec(V).astype(np.float32).astype(np.float64)


def test_tol_below_the_rounding_floor_stalls_early_with_advice():
    """The recursive residual sticks at the floor too, so the replacements every 50
    iterations find no gain: the solve stops before max_iter, unconverged, with x as good
    as float32 products allow (dense numpy: residual within 20 float32 ulps)."""
    with pytest.warns(ConvergenceWarning, match=r"stopped decreasing near \d.*use tol >="):
        res = cg(Float32Products(operator()), B8, tol=1e-13, max_iter=500)
    assert res.n_iter < 500 and not res.converged.any() and (res.residuals[-1] > 1e-13).all()
    x = res.x.compute()
    true = np.linalg.norm(B8 - DENSE @ x, axis=0) / np.linalg.norm(B8, axis=0)
    assert (true < 20 * np.finfo(np.float32).eps).all()
    assert rel_err(x, sla.solve(DENSE, B8)) < 1e-6
    # a reachable tol on the same operator converges as before, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        ok = cg(Float32Products(operator()), B8, tol=1e-5)
    assert ok.converged.all() and ok.residuals[-1].max() <= 1e-5


def test_numpy_scalar_tol_is_a_number():
    want = cg(operator(), B8[:, 0], tol=1e-6)
    got = cg(operator(), B8[:, 0], tol=np.float32(1e-6))
    np.testing.assert_array_equal(got.x.compute(), want.x.compute())


@pytest.mark.parametrize("kwargs, match", [
    ({"B": np.ones(N + 1)}, r"B must have shape \(200,\)"),
    ({"B": np.full(N, np.nan)}, "NaN"),
    ({"tol": 0.0}, "tol must be"),
    ({"max_iter": 0}, "max_iter must be"),
])
def test_bad_inputs(kwargs, match):
    args = {"B": B8[:, 0], **kwargs}
    with pytest.raises(ValueError, match=match):
        cg(operator(), args.pop("B"), **args)


def test_non_numeric_right_hand_side_is_a_type_error():
    with pytest.raises(TypeError, match="B must hold numbers .* got dtype <U1"):
        cg(operator(), np.array(["a"] * N))


class Scaled:
    """``S A S`` for a diagonal S: badly scaled, which Jacobi undoes."""

    def __init__(self, A, s):
        self.A, self.s = A, s
        self.shape, self.dtype, self.col_chunks = A.shape, A.dtype, A.col_chunks

    def matvec(self, V):
        s = da.from_array(self.s, chunks=(self.col_chunks,))[:, None]
        return s * self.A.matvec(s * V)

    def diag(self):
        return self.A.diag() * self.s**2


def test_jacobi_same_solution_fewer_iterations():
    """Jacobi undoes the scaling S: alpha = 10 makes K + alpha I itself well conditioned,
    so the plain solve's extra steps are the scaling's alone (measured: 73 plain, 13 Jacobi;
    at alpha = 0.1, 186 and 54 steps of graph overhead)."""
    s = np.exp(RNG.uniform(-1.0, 1.0, size=N))
    alpha = 10.0
    A = Scaled(operator(alpha), s)
    dense = s[:, None] * (KERNEL(X, X) + alpha * np.eye(N)) * s[None, :]
    plain = cg(A, B8[:, 0], tol=1e-8)
    jacobi = cg(A, B8[:, 0], tol=1e-8, preconditioner=JacobiPreconditioner(A))
    want = sla.solve(dense, B8[:, 0])
    assert rel_err(jacobi.x.compute(), want) < 1e-6 and rel_err(plain.x.compute(), want) < 1e-6
    assert jacobi.n_iter * 2 <= plain.n_iter  # a no-op preconditioner would tie


def chebyshev_iterations(kappa_pre, kappa, tol):
    """Steps after which PCG's relative residual is surely <= tol: the A-norm error falls by
    2 ((√κ' − 1) / (√κ' + 1))^k (κ' of the preconditioned matrix), and ‖r‖ / ‖r_0‖ <= √κ(A)
    times the A-norm ratio."""
    rate = (np.sqrt(kappa_pre) - 1) / (np.sqrt(kappa_pre) + 1)
    return int(np.ceil(np.log(2 * np.sqrt(kappa) / tol) / -np.log(rate)))


@pytest.mark.parametrize("pivots", ["uniform", "rpcholesky"])
def test_nystrom_preconditioner_cuts_iterations(pivots):
    """Against the dense condition numbers: P⁻¹ (formed densely from the factor) shrinks
    κ(A) by over 100×, and PCG stays within the Chebyshev bound of κ(P^{-1/2} A P^{-1/2}),
    which is under a tenth of the bound without it."""
    alpha, b = 1e-3, B8[:, 0]
    pre = NystromPreconditioner(KERNEL, X, alpha, rank=40, pivots=pivots, random_state=0)
    fast = cg(operator(alpha), b, tol=1e-8, preconditioner=pre)
    A = KERNEL(X, X) + alpha * np.eye(N)
    assert rel_err(fast.x.compute(), sla.solve(A, b)) < 1e-5
    G = pre.factor.compute()
    w, V = np.linalg.eigh(np.eye(N) + G @ pre.core @ G.T)
    assert w.min() > 0  # P⁻¹ is SPD
    root = (V * np.sqrt(w)) @ V.T
    lam, lam_pre = np.linalg.eigvalsh(A), np.linalg.eigvalsh(root @ A @ root)
    kappa, kappa_pre = lam[-1] / lam[0], lam_pre[-1] / lam_pre[0]
    assert kappa_pre * 100 < kappa
    bound = chebyshev_iterations(kappa_pre, kappa, 1e-8)
    assert fast.n_iter <= bound < chebyshev_iterations(kappa, kappa, 1e-8) / 10


@pytest.mark.parametrize("pivots", ["uniform", "rpcholesky"])
def test_a_rank_n_preconditioner_is_k_itself(pivots, caplog):
    """At rank = n (small n) every row is a pivot, and the factor is K's eigenbasis from one
    dense eigendecomposition instead of n / 16 RPCholesky steps: it is orthonormal, spans
    K's eigenvalues above the cutoff, P⁻¹ (K + αI) is the scale on it, and PCG needs a few
    steps."""
    alpha, b = 1e-3, B8[:, 0]
    with caplog.at_level(logging.INFO, logger="dkern.solvers.preconditioners"):
        pre = NystromPreconditioner(KERNEL, X, alpha, rank=N, pivots=pivots, random_state=0)
    assert "all rows (K itself) pivots" in caplog.text
    K = KERNEL(X, X)
    lam = np.linalg.eigvalsh(K)
    assert pre.rank == (lam > 1e-10 * lam[-1]).sum()
    Q = pre.factor.compute()
    np.testing.assert_allclose(Q.T @ Q, np.eye(pre.rank), atol=1e-12)
    A = K + alpha * np.eye(N)
    Pinv = np.eye(N) + Q @ pre.core @ Q.T
    np.testing.assert_allclose(Q.T @ Pinv @ A @ Q / pre.scale, np.eye(pre.rank), atol=1e-8)
    assert np.linalg.eigvalsh(Pinv).min() > 0  # P⁻¹ is SPD
    fast = cg(operator(alpha), b, tol=1e-8, preconditioner=pre)
    assert rel_err(fast.x.compute(), sla.solve(A, b)) < 1e-5
    assert fast.n_iter <= 3  # measured 2: P⁻¹ A has two eigenvalue clusters, alpha and scale


def test_rows_drawn_with_their_data_are_the_rows_sample_rows_draws():
    """RPCholesky's one-round-trip draw: from the same generator state, the distinct
    sorted rows of ``sample_rows`` and X's and F's rows there, over several chunks."""
    from dkern.solvers.sampling import sample_distinct_rows_of, sample_rows

    w = da.from_array(RNG.uniform(size=N) ** 4, chunks=50)
    Xd, F = da.from_array(X, chunks=(50, 2)), da.from_array(B8, chunks=(50, 8))
    want = np.unique(sample_rows(w, 30, np.random.default_rng(5)))
    S, (Z, FS) = sample_distinct_rows_of(w, 30, np.random.default_rng(5), [Xd, F])
    np.testing.assert_array_equal(S, want)
    np.testing.assert_array_equal(Z, X[want])
    np.testing.assert_array_equal(FS, B8[want])


def test_float32_reports_true_residual():
    res = cg(operator(dtype=np.float32), B8[:, :2], tol=1e-4, max_iter=200)
    x = res.x.compute().astype(np.float64)
    assert res.x.dtype == np.float32
    true = np.linalg.norm(B8[:, :2] - DENSE @ x, axis=0)
    true /= np.linalg.norm(B8[:, :2], axis=0)
    assert np.allclose(res.residuals[-1], true, rtol=0.1, atol=1e-7)  # reported == true one
    assert true.max() <= 1e-4 and res.converged.all()


def test_callback_gets_scalars_each_iteration():
    seen = []
    res = cg(operator(), B8[:, :2], tol=1e-8, callback=lambda k, r: seen.append((k, r.shape)))
    assert seen[0] == (0, (2,)) and seen[-1][0] == res.n_iter


@pytest.mark.distributed
def test_client_receives_only_scalars(cluster_client, monkeypatch):
    """n = 20 000: a leaked float64 n-vector would be 160 kB; every gather stays tiny."""
    n = 20_000
    # kappa = 2: 11 CG steps (kappa = 10 took 29, each a few cluster round trips of ~0.7 s)
    d = np.linspace(1.0, 2.0, n)
    received = []
    gather = cluster_client.gather

    def spy(*args, **kwargs):
        out = gather(*args, **kwargs)
        received.append(sizeof(out))
        return out

    monkeypatch.setattr(cluster_client, "gather", spy)
    with dask.config.set(scheduler=cluster_client):
        res = cg(Diagonal(d, chunks=5_000), np.ones((n, 2)), tol=1e-8)
        assert res.converged.all() and isinstance(res.x, da.Array)
        assert len(received) > res.n_iter and max(received) < 4_000  # bytes
        np.testing.assert_allclose(res.x[:5, 0].compute(), 1.0 / d[:5], rtol=1e-7)


class Diagonal:
    """``diag(d)`` as a matvec operator (cheap, so the test measures traffic, not kernels)."""

    def __init__(self, d, chunks):
        self.d = da.from_array(d, chunks=chunks)
        self.shape, self.dtype, self.col_chunks = (len(d), len(d)), d.dtype, self.d.chunks[0]

    def matvec(self, V):
        return self.d[:, None] * V


@pytest.mark.parametrize("pivots", ["uniform", "rpcholesky"])
def test_nystrom_preconditioner_stays_positive_definite_when_k_is_ill_conditioned(pivots):
    """Wide lengthscale in 8-D: K's eigenvalues span ~n/alpha = 3e6. Forming the Woodbury
    basis without re-orthonormalising made P⁻¹ indefinite and CG diverge (uniform)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (3000, 8))
    y = np.sin(3 * X[:, 0])
    Xd = da.from_array(X, chunks=(1000, -1))
    kernel = Gaussian(3.0)
    with dask.config.set(scheduler="threads"):
        P = NystromPreconditioner(kernel, Xd, 1e-3, 300, pivots=pivots, random_state=0)
        G = P.factor.compute()
        Pinv = np.eye(3000) + G @ P.core @ G.T
        # P⁻¹ is positive definite iff its Cholesky factorisation exists: the same check as
        # eigvalsh(...).min() > 0 (both to rounding, ~n·eps = 1e-12, here min eig ~7e-7;
        # an indefinite P⁻¹ raises LinAlgError), in 1 s instead of 10-15 s at n = 3000
        np.linalg.cholesky((Pinv + Pinv.T) / 2)
        res = cg(dkern.gram(kernel, Xd) + 1e-3, y, preconditioner=P, tol=1e-6, max_iter=60)
        x = res.x.compute()
    assert res.converged.all()
    true = np.linalg.norm(y - (kernel(X, X) @ x + 1e-3 * x)) / np.linalg.norm(y)
    assert true <= 1e-6 * 1.01


class Signs:
    """``apply(R) = R * signs``: an indefinite "preconditioner" when any sign is negative."""

    def __init__(self, signs):
        self.signs = signs

    def apply(self, R):
        return R * self.signs


@pytest.mark.parametrize("signs", [-1.0, np.where(np.arange(N) % 2, 1.0, -1.0)[:, None]])
def test_indefinite_preconditioner_raises_naming_it(signs):
    """apply = -R and a diagonal of mixed signs: rᵀMr <= 0 must stop CG, not be trusted."""
    with pytest.raises(NotPositiveDefiniteError, match=r"rᵀMr = .* the preconditioner Signs "
                       r"is not positive definite"):
        cg(operator(), B8[:, :2], tol=1e-10, preconditioner=Signs(signs))


READS = []


def counted_read(block, block_info=None):
    """A dask block function that records which chunk of its source it was called for."""
    READS.append(block_info[0]["chunk-location"])
    return block.copy()


def test_right_hand_side_is_read_once():
    """A B that is expensive to read (a Zarr array: read and checksummed) is read once per
    chunk, not again at every residual refresh (here every 5 steps)."""
    READS.clear()
    B = da.map_blocks(counted_read, da.from_array(B8[:, :2], chunks=(50, 2)), dtype=float)
    res = cg(operator(), B, tol=1e-10, refresh_every=5)
    assert res.n_iter > 10 and res.converged.all()  # several refreshes happened
    assert sorted(READS) == [(i, 0) for i in range(4)]
    assert rel_err(res.x.compute(), sla.solve(DENSE, B8[:, :2])) < 1e-8
