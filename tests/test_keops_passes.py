"""The projection passes (dkern.backends.projections) against dense references, and every
pass of the sparse GP, leverage scores, the Nyström preconditioner and GP variances run
through KeOps: equal to numpy's to 1e-9 in float64, with a spy proving KeOps ran (as
linear_operator's tests do).

KeOps compiles one formula per (kernel, d, width of V): these tests use one kernel in
d = 3 and widths 1, 16 and 32 (with 20 centres, padded to 32) where they can.
"""

import logging

import dask
import numpy as np
import pytest
import scipy.linalg as sla

import dkern
from dkern.backends import block_backend, projections
from dkern.backends import blocks as blocks_module
from dkern.backends.projections import residual_diag
from dkern.kernels import Gaussian, Scaled
from dkern.models import GaussianProcessRegressor
from dkern.solvers import NystromPreconditioner, select_centers
from dkern.solvers.sgpr import sgpr_bound_gradient, sgpr_statistics

RNG = np.random.default_rng(5)
X = RNG.normal(size=(300, 3))
Y = np.sin(2 * X[:, 0]) + 0.1 * RNG.normal(size=300)
X_TEST = RNG.normal(size=(32, 3))  # 32 test points: the width of the variance solves
KERNEL = Gaussian(0.9)
RTOL = 1e-9

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def count_calls(monkeypatch, name):
    """Replace the block backend's KeOps function ``name`` by a spy; the list it fills
    holds the width of V (the last argument) of every call."""
    calls = []
    real = getattr(blocks_module, name)

    def spy(kernel, x, z, v):
        calls.append(v.shape[1])
        return real(kernel, x, z, v)

    monkeypatch.setattr(blocks_module, name, spy)
    return calls


@pytest.fixture
def keops_calls(monkeypatch):
    """Counts the KeOps Sum reductions of the block backend (one entry per call)."""
    return count_calls(monkeypatch, "matvec_block_keops")


@pytest.fixture
def fresh_fallback_log(monkeypatch, caplog):
    """Forget which fallbacks were logged, and capture this test's log."""
    monkeypatch.setattr(projections, "_logged", set())
    caplog.set_level(logging.INFO, logger="dkern.backends.projections")
    return caplog


def assert_close(got, want, rtol=RTOL):
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * np.abs(want).max())


# -------------------------------------------------------------- numpy, dense references
def test_residual_diag_is_prior_minus_the_nystrom_diagonal():
    Z = X[:20]
    L = np.linalg.cholesky(KERNEL(Z, Z) + 1e-8 * np.eye(20))
    want = 1.0 - np.diag(KERNEL(X, Z) @ np.linalg.solve(L @ L.T, KERNEL(Z, X)))
    assert_close(residual_diag(np.ones(300), KERNEL(X, Z), L), want, 1e-10)
    A = sla.solve_triangular(L, KERNEL(Z, X), lower=True).T  # already whitened
    assert_close(residual_diag(np.ones(300), A), want, 1e-10)


@pytest.mark.parametrize("factor", ["cholesky", "inverse"])
def test_whitened_cross_numpy_equals_dense(factor):
    Z = X[:20]
    L = np.linalg.cholesky(KERNEL(Z, Z) + 1e-8 * np.eye(20))
    W = L if factor == "cholesky" else sla.solve_triangular(L, np.eye(20), lower=True)
    got = block_backend("numpy").whitened_cross(X, Z, W, kernel=KERNEL, factor=factor)
    assert_close(got, sla.solve_triangular(L, KERNEL(Z, X), lower=True).T, 1e-12)


def test_kernel_grad_matvec_numpy_equals_dense_over_tiles():
    kernel = Scaled(1.5, Gaussian([0.8, 1.1, 0.7]))  # p = 4: constant and three lengthscales
    Z, V = X[:25], RNG.normal(size=(25, 2))
    got = block_backend("numpy").kernel_grad_matvec(X, Z, V, kernel=kernel, tile=64)
    assert got.shape == (300, 2, 4)
    assert_close(got, np.einsum("nmp,mt->ntp", kernel.gradient(X, Z), V), 1e-13)


# ---------------------------------------------------------------- KeOps against numpy
@pytest.mark.keops
def test_keops_blocks_equal_numpy(keops_calls):
    """Dense columns (identity tiles of width 16) and the whitened cross block (20 centres,
    V padded to 32 columns) from KeOps reductions."""
    keops, numpy = block_backend("keops"), block_backend("numpy")
    Z = X[:20]
    assert_close(keops.kernel_columns(X, Z, kernel=KERNEL), KERNEL(X, Z))
    assert keops_calls == [16, 16]  # two tiles of the identity, the last one padded
    L = np.linalg.cholesky(KERNEL(Z, Z) + 1e-8 * np.eye(20))
    assert_close(keops.whitened_cross(X, Z, L, kernel=KERNEL),
                 numpy.whitened_cross(X, Z, L, kernel=KERNEL))
    assert keops_calls[-1] == 32


@pytest.mark.keops
def test_keops_gradient_passes_fall_back_to_numpy_and_say_so_once(fresh_fallback_log):
    """No kernel gives a KeOps form of ∂k/∂θ: the gradient passes run numpy's blocks,
    logged once per process and pass."""
    keops = block_backend("keops")
    Z, V = X[:20], RNG.normal(size=(20, 1))
    for _ in range(2):
        got = keops.kernel_grad_matvec(X, Z, V, kernel=KERNEL)
    assert_close(got, block_backend("numpy").kernel_grad_matvec(X, Z, V, kernel=KERNEL), 0)
    stats = sgpr_statistics(KERNEL, X, Y, Z, backend="numpy")
    for _ in range(2):
        value, grad = sgpr_bound_gradient(stats, X, Y, 0.05, backend="keops")
    assert_close(grad, sgpr_bound_gradient(stats, X, Y, 0.05, backend="numpy")[1], 0)
    messages = [r.getMessage() for r in fresh_fallback_log.records]
    assert len(messages) == 2, messages
    assert all("runs numpy's blocks" in m and "∂k/∂θ" in m for m in messages)


@pytest.mark.keops
def test_sparse_gp_fit_and_predict_run_through_keops(keops_calls):
    """SGPR statistics (fit), mean and std (predict): KeOps equals numpy."""
    want = GaussianProcessRegressor(KERNEL, alpha=0.05, solver="nystrom", n_centers=20,
                                    optimizer=None, random_state=0, backend="numpy").fit(X, Y)
    gp = GaussianProcessRegressor(KERNEL, alpha=0.05, solver="nystrom", n_centers=20,
                                  optimizer=None, random_state=0, backend="keops").fit(X, Y)
    assert len(keops_calls) > 0  # the statistics pass
    fitted = len(keops_calls)
    assert gp.log_marginal_likelihood_value_ == pytest.approx(
        want.log_marginal_likelihood_value_, rel=RTOL)
    mean, std = gp.predict(X_TEST, return_std=True)
    assert len(keops_calls) > fitted  # the prediction pass
    want_mean, want_std = want.predict(X_TEST, return_std=True)
    assert_close(mean, want_mean)
    assert_close(std, want_std)


@pytest.mark.keops
def test_leverage_scores_run_through_keops(keops_calls):
    """The scores of one dictionary, and the centres chosen from them."""
    Z = X[:20]
    L = np.linalg.cholesky(KERNEL(Z, Z) + 1e-3 * np.eye(20))
    Linv = sla.solve_triangular(L, np.eye(20), lower=True)
    got = block_backend("keops").leverage(X, Z, kernel=KERNEL, Linv=Linv, alpha=1e-3)
    assert len(keops_calls) > 0
    assert_close(got, block_backend("numpy").leverage(X, Z, kernel=KERNEL, Linv=Linv,
                                                      alpha=1e-3))
    keops_calls.clear()
    # BLESS draws each dictionary from a pool of min(n, 4000) rows: on 32 rows every
    # dictionary (eight levels down to alpha here) has at most 32, so its V stays 16 or 32
    # wide (on all 300 rows they reach 158 rows: widths 64, 128 and 256, three more
    # KeOps compiles of ~15-50 s each, which test nothing more)
    chosen = select_centers(X[:32], 16, method="leverage", kernel=KERNEL, alpha=1e-3,
                            random_state=1, backend="keops")
    assert len(keops_calls) > 0 and max(keops_calls) <= 32
    want = select_centers(X[:32], 16, method="leverage", kernel=KERNEL, alpha=1e-3,
                          random_state=1, backend="numpy")
    np.testing.assert_array_equal(chosen, want)


@pytest.mark.keops
def test_a_loaded_sparse_gp_predicts_with_its_backend(tmp_path, keops_calls):
    """The backend is the estimator's parameter, not part of the file: a loaded
    backend="keops" model predicts through KeOps."""
    gp = GaussianProcessRegressor(KERNEL, alpha=0.05, solver="nystrom", n_centers=20,
                                  optimizer=None, random_state=0, backend="keops").fit(X, Y)
    dkern.save(gp, tmp_path / "gp.zarr")
    back = dkern.load(tmp_path / "gp.zarr")
    keops_calls.clear()
    assert_close(back.predict(X_TEST, return_std=True)[1], gp.predict(X_TEST,
                                                                       return_std=True)[1], 0)
    assert len(keops_calls) == 2  # one prediction pass each


@pytest.mark.keops
@pytest.mark.parametrize("pivots", ["uniform", "rpcholesky"])
def test_nystrom_preconditioner_columns_run_through_keops(pivots, keops_calls):
    R = dask.array.from_array(RNG.normal(size=(300, 2)), chunks=(100, -1))
    got = NystromPreconditioner(KERNEL, X, 1e-2, 32, pivots=pivots, random_state=2,
                                backend="keops")
    assert len(keops_calls) > 0 and set(keops_calls) == {16}  # identity tiles
    want = NystromPreconditioner(KERNEL, X, 1e-2, 32, pivots=pivots, random_state=2,
                                 backend="numpy")
    assert_close(got.apply(R).compute(), want.apply(R).compute())


@pytest.mark.keops
@pytest.mark.parametrize("variance", ["cg", "lanczos"])
def test_gp_variance_runs_through_keops(variance, keops_calls):
    """CG variances (right-hand sides K(X, X*) and the solves) and LOVE's at tol 1e-12."""
    # alpha = 2: K + alpha I is better conditioned, 23 CG steps to 1e-12 instead of 40 at
    # 0.5, each a few dask graphs (the most of this test's time), for both backends
    params = dict(alpha=2.0, solver="cg", variance=variance, preconditioner_rank=16,
                  lanczos_rank=16, optimizer=None, tol=1e-12, random_state=0)
    gp = GaussianProcessRegressor(KERNEL, backend="keops", **params).fit(X, Y)
    fitted = len(keops_calls)
    assert fitted > 0
    mean, std = gp.predict(X_TEST, return_std=True)
    assert len(keops_calls) > fitted
    want = GaussianProcessRegressor(KERNEL, backend="numpy", **params).fit(X, Y)
    want_mean, want_std = want.predict(X_TEST, return_std=True)
    assert_close(mean, want_mean)
    assert_close(std, want_std)


@pytest.mark.keops
def test_kernel_ridge_cg_runs_through_keops(keops_calls):
    """CG's matvecs and the prediction: KeOps Sum reductions, numpy's answer at tol 1e-12."""
    params = dict(alpha=0.5, solver="cg", tol=1e-12, random_state=0)
    model = dkern.KernelRidge(KERNEL, backend="keops", **params).fit(X, Y)
    assert len(keops_calls) > 0
    want = dkern.KernelRidge(KERNEL, backend="numpy", **params).fit(X, Y)
    assert_close(model.dual_coef_, want.dual_coef_)
    assert_close(model.predict(X_TEST), want.predict(X_TEST))


@pytest.mark.keops
def test_falkon_runs_through_keops(monkeypatch):
    """Falkon's normal-equation products K(x, C)ᵀ K(x, C) v: KeOps, numpy's answer."""
    calls = count_calls(monkeypatch, "normal_matvec_block_keops")
    params = dict(alpha=0.5, solver="nystrom", n_centers=20, tol=1e-12, random_state=0)
    model = dkern.KernelRidge(KERNEL, backend="keops", **params).fit(X, Y)
    assert len(calls) > 0
    want = dkern.KernelRidge(KERNEL, backend="numpy", **params).fit(X, Y)
    assert_close(model.predict(X_TEST), want.predict(X_TEST))
