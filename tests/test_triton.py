"""The Triton backend's fused kernels, run on the CPU by Triton's interpreter
(``TRITON_INTERPRET=1``, set in conftest): equal to the numpy backend's blocks for every
kernel and composition, in float64 (1e-12) and float32 (1e-5), relative to ``|K| |v|``
(the size of the terms summed), and through the models with a spy proving the fused
kernels ran. Sizes stay small: the interpreter evaluates each tile with numpy.

On a CUDA GPU the same kernels compile to GPU code; their speed is measured by
``benchmarks/gram.py --gpu`` (benchmarks/RESULTS.md).
"""

import ast
import logging
import os

import numpy as np
import pytest

try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError:
    if os.environ.get("CI"):  # the test extra installs them: CI must not skip silently
        raise
    pytest.skip('needs torch and triton (pip install -e ".[test]")', allow_module_level=True)

import dkern
from dkern.backends import (
    BackendUnavailableError,
    block_backend,
    keops_backend,
    resolve_backend,
    select,
)
from dkern.backends import blocks as blocks_module
from dkern.backends.triton_backend import matvec_source
from dkern.backends.triton_source import NoTritonSource, tile_source
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
    White,
    exp,
    warp,
)

RNG = np.random.default_rng(11)
X = RNG.normal(size=(150, 3))
Z = RNG.normal(size=(130, 3))
TOL = {np.float64: 1e-12, np.float32: 1e-5}

KERNELS = [
    Gaussian(1.3), Gaussian([0.5, 1.0, 2.0]), Laplacian(2.0), Matern(0.7, nu=0.5),
    Matern(0.7, nu=1.5), Matern([0.7, 1.0, 1.4], nu=2.5), RationalQuadratic(1.1, alpha=0.7),
    Periodic(1.0, 2.0), Linear(), DotProduct(0.5), Polynomial(3, c=1.0),
    2.0 * Gaussian(1.0) + Constant(0.3), Gaussian(1.0) * Periodic(1.0, 3.0),
    Gaussian(1.0) ** 3, exp(0.1 * Linear()), Gaussian(1.0) + 0.5 * White(0.1),
]

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def assert_matches_numpy(got, kernel, x, z, v, tol):
    """``got`` equals numpy's ``k(x, z) @ v`` to ``tol`` relative to ``|k(x, z)| |v|``."""
    dense = (kernel.without_white() or kernel)(x, z)
    want = block_backend("numpy").kernel_matvec(x, z, v, kernel=kernel)
    scale = np.abs(dense) @ np.abs(v)
    assert got.dtype == np.float64 and got.shape == want.shape
    err = np.max(np.abs(got - want) / scale)
    assert err <= tol, f"{kernel!r}: relative error {err:.1e} > {tol:.0e}"


def test_the_interpreter_is_what_runs_here():
    if os.environ["TRITON_INTERPRET"] == "0" and select.gpu_visible():
        pytest.skip("TRITON_INTERPRET=0 on a GPU: these tests run compiled for it")
    status = select.triton_status()
    assert status.available and "interpreter" in status.detail, status
    assert resolve_backend("triton") == "triton"
    assert resolve_backend("auto") != "triton"  # the interpreter is for checking, not speed


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
def test_kernel_matvec_equals_numpy(kernel, dtype):
    x, z = X.astype(dtype), Z.astype(dtype)
    blocks = block_backend("triton")
    for width in (1, 3):
        v = RNG.normal(size=(len(z), width))
        assert_matches_numpy(blocks.kernel_matvec(x, z, v, kernel=kernel), kernel, x, z, v,
                             TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_normal_matvec_equals_numpy(dtype):
    """``k(x, c)ᵀ (k(x, c) v)`` of Falkon's normal equations, as two fused products."""
    kernel, c = Matern(0.8, nu=2.5), Z[:40].astype(dtype)
    v = RNG.normal(size=(40, 2))
    got = block_backend("triton").normal_matvec(X.astype(dtype), c, v, kernel=kernel)
    want = block_backend("numpy").normal_matvec(X.astype(dtype), c, v, kernel=kernel)
    K = np.abs(kernel(X, c))
    np.testing.assert_array_less(np.abs(got - want), TOL[dtype] * (K.T @ (K @ np.abs(v))))


@pytest.mark.parametrize("kernel", [Gaussian(0.7), Gaussian([0.5, 1.0, 2.0])], ids=repr)
def test_gaussian_log_sums_equal_numpy_also_far_from_the_data(kernel):
    """KDE / Nadaraya–Watson sums as ``[m, s₀, s…]``: a query 40 lengthscales away keeps
    its sums (weights of e^-800 would underflow outside the log form). Compared as what
    they stand for, ``log Σk = m + log s₀`` and the weighted means ``s / s₀``: any shift m
    is valid, and numpy's fused loop sums near rows unshifted (m = 0) where Triton's online
    log-sum-exp shifts by the row's maximum."""
    x, t = X.copy(), RNG.normal(size=(len(Z), 2))
    x[0] += 40.0
    for values in (None, t):
        got = block_backend("triton").weighted_log_sums(x, Z, values, kernel=kernel, scale=1.3)
        want = block_backend("numpy").weighted_log_sums(x, Z, values, kernel=kernel, scale=1.3)
        assert np.isfinite(got).all() and got[0, 0] < -300
        np.testing.assert_allclose(got[:, 0] + np.log(got[:, 1]),
                                   want[:, 0] + np.log(want[:, 1]), rtol=1e-12)
        np.testing.assert_allclose(got[:, 2:] / got[:, 1:2], want[:, 2:] / want[:, 1:2],
                                   rtol=0, atol=1e-12 * max(1.0, np.abs(t).max()))


def test_log_sums_of_a_row_whose_every_distance_overflows_are_empty_not_nan():
    """A query at 3e153 scaled by 0.1: every squared distance overflows to ∞, every log
    weight is -inf. Its sums are the empty ones, [-inf, 0, 0], as numpy's (the online
    shift by the maximum -inf gave e^(-inf + inf) = NaN); the other row is unchanged."""
    x = np.vstack([[3e153, -1e153, 2e153], X[:1]])
    values = Z[:, :1].copy()
    got = block_backend("triton").weighted_log_sums(x, Z, values, kernel=Gaussian(1.0),
                                                    scale=0.1)
    want = block_backend("numpy").weighted_log_sums(x, Z, values, kernel=Gaussian(1.0),
                                                    scale=0.1)
    np.testing.assert_array_equal(got[0], [-np.inf, 0.0, 0.0])
    np.testing.assert_array_equal(want[0], [-np.inf, 0.0, 0.0])
    np.testing.assert_allclose(got[1, 0] + np.log(got[1, 1]), want[1, 0] + np.log(want[1, 1]),
                               rtol=1e-12)


@pytest.mark.parametrize("ell", [1e-300, [1e-300, 1.0, 2.0]])
def test_tiny_lengthscales_give_the_identity_and_a_match_weight_1_not_nan(ell):
    """Lengthscales whose 1 / l² overflows (below ~1e-154): the kernels and the log-sums
    multiplied squared differences by it, 0 · inf = NaN where x = z. Differences are now
    scaled before they are squared: the kernel is the identity, as numpy's, and a query
    equal to a training row has that row's weight 1 beside zeros."""
    rng = np.random.default_rng(6)
    x, v = rng.normal(size=(9, 3)), rng.normal(size=(9, 2))
    for kernel in (Gaussian(ell), Matern(ell, 1.5)):
        np.testing.assert_array_equal(
            block_backend("triton").kernel_matvec(x, x, v, kernel=kernel), v)
    q = np.vstack([rng.normal(size=(2, 3)), x[:2]])
    got = block_backend("triton").weighted_log_sums(q, x, None, kernel=Gaussian(1.0),
                                                    scale=1e-300)
    np.testing.assert_array_equal(got, [[-np.inf, 0.0], [-np.inf, 0.0], [0.0, 1.0], [0.0, 1.0]])


def test_box_smoothing_falls_back_to_numpy_logged(caplog, monkeypatch):
    monkeypatch.setattr(keops_backend, "_logged", set())
    with caplog.at_level(logging.INFO, logger="dkern.backends.keops_backend"):
        got = block_backend("triton").weighted_log_sums(X, Z, box_width=1.0)
    assert "backend='triton': kernel smoothing sums (KernelDensity, NadarayaWatson) run " \
        "with numpy: the box kernel's log weights are 0 or -inf (no fused log form)" in caplog.text
    np.testing.assert_array_equal(got, block_backend("numpy").weighted_log_sums(
        X, Z, box_width=1.0))


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
def test_generated_sources_name_only_what_triton_knows(kernel):
    """The interpreter runs the source as Python, where a stray name (numpy 2's
    ``np.float64(…)`` repr, seen on an H100) still resolves; Triton's compiler does not.
    Every name the kernel reads is a parameter, a local, or ``tl``/``range``/``float``."""
    tree = ast.parse(matvec_source(kernel, 3)[0])
    fn = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))
    given = {a.arg for a in fn.args.args} | {"tl", "range", "float"}
    names = [n for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    bound = {n.id for n in names if isinstance(n.ctx, ast.Store)}
    read = {n.id for n in names if isinstance(n.ctx, ast.Load)}
    assert read - given - bound == set()


def test_wide_v_goes_in_groups_of_columns():
    """More right-hand sides than one launch takes (block CG, variance solves)."""
    v = RNG.normal(size=(len(Z), 70))
    kernel = Gaussian(0.9)
    got = block_backend("triton").kernel_matvec(X, Z, v, kernel=kernel)
    assert_matches_numpy(got, kernel, X, Z, v, TOL[np.float64])


def test_tiles_too_big_for_the_gpu_are_halved_logged(monkeypatch, caplog):
    """Triton's OutOfResources (seen: a derivative kernel's tiles needed 282 KB of an
    H200's 227 KB of shared memory) makes the launch retry with smaller tiles, once
    logged; a launch that fits nowhere raises."""
    from triton.runtime.errors import OutOfResources

    from dkern.backends import triton_backend

    tried = []

    class Kernel:
        __name__ = "fake_kernel"

        def __getitem__(self, grid):
            def launch(*args, BN, BM, num_warps, **meta):
                tried.append((grid, BN, BM))
                if BN * BM > limit:
                    raise OutOfResources(BN * BM * 8, limit * 8, "shared memory")
            return launch

    limit, kernel = 32 * 32, Kernel()
    with caplog.at_level(logging.INFO, logger="dkern.backends.triton_backend"):
        triton_backend._launch(kernel, 300, (128, 64, 4), "arg", min_bm=16)
    assert [t[1:] for t in tried] == [(128, 64), (64, 64), (32, 64), (16, 64)]
    assert tried[-1][0] == (19, 1)  # ⌈300 / 16⌉ programs
    assert sum("fake_kernel" in r.message for r in caplog.records) == 3
    tried[:] = []  # the next launch of that kernel starts from the tiles that fitted
    triton_backend._launch(kernel, 300, (128, 64, 4), "arg", min_bm=16)
    assert [t[1:] for t in tried] == [(16, 64)]
    limit, tried[:] = 16, []
    with pytest.raises(OutOfResources):
        triton_backend._launch(Kernel(), 300, (32, 32, 4), min_bm=16)
    assert [t[1:] for t in tried] == [(32, 32), (16, 32), (16, 16)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("d", [3, 20], ids=["x-in-registers", "x-loaded-per-tile"])
def test_chunks_of_tiles_and_column_splits_equal_numpy(d, dtype, monkeypatch):
    """Small tiles on many columns: each program sums chunks of two tiles entry by entry,
    over several chunks, in several column splits ending in a part tile; one and three
    right-hand sides; with x's columns kept in registers (d ≤ HOIST_MAX) and not."""
    from dkern.backends import triton_backend
    from dkern.backends.triton_backend import _splits, matvec_block_triton
    from dkern.backends.triton_source import HOIST_MAX

    assert (d <= HOIST_MAX) == (d == 3)
    rng = np.random.default_rng(d)
    x, z = rng.normal(size=(20, d)).astype(dtype), rng.normal(size=(301, d)).astype(dtype)
    # two "multiprocessors" (as under the interpreter; a GPU has more) with four programs
    # each, over 2 row blocks: four splits of 80 columns (five tiles: chunks of 2, 2 and
    # 1), the last of 61
    monkeypatch.setattr(triton_backend, "_multiprocessors", lambda: 2)
    monkeypatch.setattr(triton_backend, "PROGRAMS_PER_MULTIPROCESSOR", 4)
    assert _splits(len(x), 16, len(z), 16) == 4
    kernel = Matern(2.0 * np.sqrt(d), nu=1.5)
    for width in (1, 3):
        v = rng.normal(size=(len(z), width))
        got = matvec_block_triton(kernel, x, z, v, tiles=(16, 16, 1), chunk=2)
        assert_matches_numpy(got, kernel, x, z, v, TOL[dtype])


def test_empty_blocks():
    got = block_backend("triton").kernel_matvec(X[:0], Z, np.ones((len(Z), 1)),
                                                kernel=Gaussian(1.0))
    assert got.shape == (0, 1)
    got = block_backend("triton").kernel_matvec(X, Z[:0], np.ones((0, 2)), kernel=Gaussian(1.0))
    np.testing.assert_array_equal(got, np.zeros((len(X), 2)))


def test_a_far_row_keeps_the_digits_of_a_small_difference():
    """Differences first, then the lengthscale: rows near 1e9 as accurate as near 0."""
    x = np.array([[1e9 + 0.3, 0.0, 0.0]])
    z = np.array([[1e9 + 0.1, 0.0, 0.0], [0.0, 0.0, 0.0]])
    got = block_backend("triton").kernel_matvec(x, z, np.ones((2, 1)), kernel=Gaussian(0.1))
    gap = x[0, 0] - z[0, 0]  # exact in float64 (Sterbenz): 0.2 as the stored rows differ
    np.testing.assert_allclose(got, [[np.exp(-0.5 * (gap / 0.1) ** 2)]], rtol=1e-12)


def _row_norm(rows):
    return np.sqrt(1.0 + np.square(rows).sum(axis=1))


def test_a_kernel_without_triton_form_falls_back_to_numpy_logged(caplog, monkeypatch):
    monkeypatch.setattr(keops_backend, "_logged", set())
    kernel = warp(Gaussian(1.0), _row_norm)
    with pytest.raises(NoTritonSource, match="Warp"):
        tile_source(kernel, 3)
    v = RNG.normal(size=(len(Z), 1))
    with caplog.at_level(logging.INFO, logger="dkern.backends.keops_backend"):
        got = block_backend("triton").kernel_matvec(X, Z, v, kernel=kernel)
    assert "backend='triton': kernel products run with numpy: Warp has no Triton form" \
        in caplog.text
    assert_matches_numpy(got, kernel, X, Z, v, 1e-15)
    z, y = Z[:10], RNG.normal(size=(len(X), 1))  # the sparse GP's device blocks, too
    L = np.linalg.cholesky(kernel(z, z) + 1e-6 * np.eye(10))
    LB, c = np.linalg.cholesky(np.eye(10) + np.eye(10)), RNG.normal(size=(10, 1))
    with caplog.at_level(logging.INFO, logger="dkern.backends.keops_backend"):
        for name, args in (("sgpr_statistics", (y, L)), ("sgpr_predict", (L, LB, c))):
            got = getattr(block_backend("triton"), name)(X, z, *args, kernel=kernel, tile=40)
            want = getattr(block_backend("numpy"), name)(X, z, *args, kernel=kernel, tile=40)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert "sparse GP statistics run with numpy: Warp" in caplog.text
    assert "sparse GP predictions run with numpy: Warp" in caplog.text


@pytest.mark.parametrize("kernel", [Gaussian([0.5, 1.0, 2.0]), 1.5 * Matern(0.8) + White(0.1)],
                         ids=repr)
def test_sgpr_gradient_equals_numpy(kernel):
    """``Σᵢ G[i, m] ∂k(xᵢ, z_m)/∂θ`` per centre, ``G = k(x, z) knu + y kyᵀ``."""
    z, y = Z[:20], np.column_stack([np.sin(X[:, 0]), X[:, 1]])
    args = (X, z, y, RNG.normal(size=(20, 20)), RNG.normal(size=(20, 2)))
    kwargs = dict(kernel=kernel, gradient=kernel.gradient, p=len(kernel.theta), tile=64)
    got = block_backend("triton").sgpr_gradient(*args, **kwargs)
    want = block_backend("numpy").sgpr_gradient(*args, **kwargs)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_the_sgpr_bound_gradient_runs_through_triton(triton_calls):
    from dkern.solvers.sgpr import sgpr_bound_gradient, sgpr_statistics

    kernel, y = 1.2 * Gaussian(0.9), np.sin(2 * X[:, 0])
    stats = sgpr_statistics(kernel, X, y, Z[:20], backend="numpy")
    value, grad = sgpr_bound_gradient(stats, X, y, 0.05, backend="triton")
    assert triton_calls
    want_value, want_grad = sgpr_bound_gradient(stats, X, y, 0.05, backend="numpy")
    assert value == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-9)


def test_projections_equal_numpy(triton_calls):
    """Dense columns (identity tiles of width 16), the whitened cross block (20 centres,
    L⁻ᵀ padded to 32 columns) and the passes on it, as fused products: numpy's to 1e-9."""
    triton_, numpy_ = block_backend("triton"), block_backend("numpy")
    kernel, z, y = Matern(0.8, nu=2.5), Z[:20], np.column_stack([np.sin(X[:, 0]), X[:, 1]])
    L = np.linalg.cholesky(kernel(z, z) + 1e-8 * np.eye(20))
    Linv = np.linalg.inv(L)

    def close(got, want):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())

    close(triton_.kernel_columns(X, z, kernel=kernel), kernel(X, z))
    assert triton_calls == [(16, 16), (4, 16)]  # two identity tiles, the last one padded
    for factor, W in (("cholesky", L), ("inverse", Linv)):
        close(triton_.whitened_cross(X, z, W, kernel=kernel, factor=factor),
              numpy_.whitened_cross(X, z, W, kernel=kernel, factor=factor))
    assert triton_calls[-1] == (20, 32)
    close(triton_.whitened_residual_diag(X, z, L, kernel=kernel),
          numpy_.whitened_residual_diag(X, z, L, kernel=kernel))
    close(triton_.leverage(X, z, kernel=kernel, Linv=Linv, alpha=0.1),
          numpy_.leverage(X, z, kernel=kernel, Linv=Linv, alpha=0.1))
    close(triton_.sgpr_statistics(X, z, y, L, kernel=kernel, tile=64),
          numpy_.sgpr_statistics(X, z, y, L, kernel=kernel, tile=64))
    LB, c = np.linalg.cholesky(np.eye(20) + Linv @ Linv.T), RNG.normal(size=(20, 2))
    close(triton_.sgpr_predict(X, z, L, LB, c, kernel=kernel, tile=64),
          numpy_.sgpr_predict(X, z, L, LB, c, kernel=kernel, tile=64))


def test_sgpr_device_blocks_in_row_tiles_equal_numpy():
    """The sparse GP's sums and predictions kept on the device, over several row tiles of
    A (37 rows, the last one short) and two target columns: numpy's host blocks to 1e-10,
    the variance within [0, k(x, x)]."""
    from dkern.backends.triton_backend import sgpr_predict_triton, sgpr_statistics_triton

    kernel, z = Gaussian([0.7, 1.0, 1.3]), Z[:24]
    y = np.column_stack([np.sin(X[:, 0]), X[:, 1] * X[:, 2]])
    L = np.linalg.cholesky(kernel(z, z) + 1e-6 * np.eye(len(z)))
    numpy_ = block_backend("numpy")
    got = sgpr_statistics_triton(kernel, X, z, y, L, rows=37)
    want = numpy_.sgpr_statistics(X, z, y, L, kernel=kernel, tile=50)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * np.abs(want).max())
    P = np.tril(want[:, :24]) + np.tril(want[:, :24], -1).T
    LB = np.linalg.cholesky(np.eye(24) + P / 0.05)
    c = np.linalg.solve(LB, want[:, 24:]) / 0.05
    got = sgpr_predict_triton(kernel, X, z, L, LB, c, kernel.diag(X), rows=37)
    want = numpy_.sgpr_predict(X, z, L, LB, c, kernel=kernel, tile=50)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * np.abs(want).max())
    assert np.all(got[:, -1] >= 0) and np.all(got[:, -1] <= kernel.diag(X))


def test_sgpr_blocks_of_an_empty_chunk_are_zeros_and_empty():
    """A chunk of 0 rows (dask arrays can have them) sums to nothing in the statistics and
    predicts nothing, as numpy's blocks do (Triton's failed to reshape y and v)."""
    kernel, z = Gaussian(1.0), Z[:6]
    L = np.linalg.cholesky(kernel(z, z) + 1e-6 * np.eye(6))
    triton_, numpy_ = block_backend("triton"), block_backend("numpy")
    for y in (np.zeros((0, 1)), np.zeros(0)):
        got = triton_.sgpr_statistics(X[:0], z, y, L, kernel=kernel, tile=16)
        assert got.shape == (6, 7) and not got.any()
    got = triton_.sgpr_predict(X[:0], z, L, np.eye(6), np.ones((6, 1)), kernel=kernel, tile=16)
    want = numpy_.sgpr_predict(X[:0], z, L, np.eye(6), np.ones((6, 1)), kernel=kernel, tile=16)
    assert got.shape == want.shape == (0, 2)
    assert triton_.kernel_matvec(X[:4], Z[:0], np.zeros(0), kernel=kernel).shape == (4, 1)


def test_sparse_gp_fit_and_predict_run_through_triton(triton_calls):
    """SGPR statistics (fit), mean and std (predict) from fused products: numpy's."""
    from dkern.models import GaussianProcessRegressor

    y = np.sin(2 * X[:, 0])
    params = dict(alpha=0.05, solver="nystrom", n_centers=20, optimizer=None, random_state=0)
    want = GaussianProcessRegressor(Gaussian(0.9), backend="numpy", **params).fit(X, y)
    gp = GaussianProcessRegressor(Gaussian(0.9), backend="triton", **params).fit(X, y)
    fitted = len(triton_calls)
    assert fitted > 0
    assert gp.log_marginal_likelihood_value_ == pytest.approx(
        want.log_marginal_likelihood_value_, rel=1e-9)
    mean, std = gp.predict(Z, return_std=True)
    assert len(triton_calls) > fitted
    want_mean, want_std = want.predict(Z, return_std=True)
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=1e-9 * np.abs(want_mean).max())
    np.testing.assert_allclose(std, want_std, rtol=0, atol=1e-9 * want_std.max())


GRAD_KERNELS = [
    Gaussian(1.3), Gaussian([0.5, 1.0, 2.0]), Laplacian(2.0), Matern(0.7, nu=1.5),
    Matern([0.7, 1.0, 1.4], nu=2.5), RationalQuadratic(1.1, alpha=0.7), Periodic(1.0, 2.0),
    DotProduct(0.5), 2.0 * Gaussian(1.0) + Constant(0.3), Gaussian(1.0) * Periodic(1.0, 3.0),
    Gaussian(1.0) ** 3, exp(0.1 * Gaussian(1.0)), Gaussian(1.0) + White(0.1),
    Linear() + Gaussian(0.5), Gaussian(1.0, lengthscale_bounds="fixed") + Matern(1.0),
]


@pytest.mark.parametrize("kernel", GRAD_KERNELS, ids=repr)
def test_kernel_grad_matvec_equals_numpy(kernel):
    """``∂K/∂θ_j V`` for every log-hyperparameter (White's: zero in cross blocks), to 1e-12
    relative to ``|∂K| |V|``."""
    x, z = X[:70], Z[:60]
    for width in (1, 3):
        v = RNG.normal(size=(len(z), width))
        got = block_backend("triton").kernel_grad_matvec(x, z, v, kernel=kernel)
        want = block_backend("numpy").kernel_grad_matvec(x, z, v, kernel=kernel)
        assert got.shape == want.shape == (len(x), width, len(kernel.theta))
        scale = np.einsum("nmp,mt->ntp", np.abs(kernel.gradient(x, z)), np.abs(v))
        assert np.all(np.abs(got - want) <= 1e-12 * scale)


def test_gram_gradient_products_run_through_triton(monkeypatch):
    """The GP-learning pass (dkern.operators.gram_gradient_products) on chunked rows."""
    import dask.array as da

    from dkern.operators.gradients import gram_gradient_products

    calls = []
    real = blocks_module.grad_matvec_block_triton
    monkeypatch.setattr(blocks_module, "grad_matvec_block_triton",
                        lambda *a: calls.append(1) or real(*a))
    kernel = 1.5 * Matern([0.7, 1.0, 1.4], nu=2.5) + White(0.2)
    Xd, V = da.from_array(X, chunks=50), da.from_array(RNG.normal(size=(len(X), 2)), chunks=50)
    got = gram_gradient_products(kernel, Xd, V, backend="triton").compute()
    assert len(calls) == 9  # 3 × 3 chunk pairs
    want = gram_gradient_products(kernel, Xd, V, backend="numpy").compute()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("k", [1, 5, 12])
def test_nearest_equals_numpy_with_ties_and_a_limit(k):
    """Exact indices, distances to an ulp (compiled for a GPU, a squared difference and
    its sum fuse into one rounding); of rows at equal distance the lower index first;
    slots no row within the limit fills stay (inf, PAD_INDEX)."""
    x, z = X[:100].copy(), Z.copy()
    z[7] = z[3]  # a tie: the same row twice, and a query exactly on it
    x[5] = z[3]
    index = (np.arange(len(z)) + 1000)[:, None]
    for limit in (np.inf, 0.5):
        bound = np.full((len(x), 1), limit)
        got = block_backend("triton").nearest(x, z, bound, index, k=k)
        want = block_backend("numpy").nearest(x, z, bound, index, k=k)
        np.testing.assert_array_equal(got[1], want[1])
        if os.environ["TRITON_INTERPRET"] == "1":
            np.testing.assert_array_equal(got[0], want[0])
        else:
            np.testing.assert_allclose(got[0], want[0], rtol=5e-16, atol=0)
    assert list(got[1][5][:2]) == [1003, 1007][:k]


def test_k_neighbors_runs_through_triton(monkeypatch):
    calls = []
    real = blocks_module.nearest_block_triton
    monkeypatch.setattr(blocks_module, "nearest_block_triton",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    y = np.sin(X[:, 0])
    got = dkern.KNeighborsRegressor(n_neighbors=4, backend="triton").fit(X, y).predict(Z)
    assert calls
    want = dkern.KNeighborsRegressor(n_neighbors=4, backend="numpy").fit(X, y).predict(Z)
    np.testing.assert_array_equal(got, want)


def test_white_noise_alone_has_no_blocks():
    with pytest.raises(NoTritonSource, match="white noise only"):
        tile_source(White(0.1), 3)


@pytest.fixture
def triton_calls(monkeypatch):
    """The calls of the fused product from the block backend (a spy around the real one):
    v's shape, and ("sgpr", M) for the sparse GP's device blocks, which run it inside."""
    calls = []
    real = blocks_module.matvec_block_triton

    def spy(kernel, x, z, v):
        calls.append(v.shape)
        return real(kernel, x, z, v)

    def spy_sgpr(real_block):
        def sgpr_spy(kernel, x, z, *args, **kwargs):
            calls.append(("sgpr", len(z)))
            return real_block(kernel, x, z, *args, **kwargs)
        return sgpr_spy

    monkeypatch.setattr(blocks_module, "matvec_block_triton", spy)
    for name in ("sgpr_statistics_triton", "sgpr_predict_triton"):
        monkeypatch.setattr(blocks_module, name, spy_sgpr(getattr(blocks_module, name)))
    return calls


def test_kernel_ridge_cg_runs_through_triton(triton_calls):
    """CG's matvecs and the prediction through the fused kernels: numpy's answer."""
    x, y = X[:120], np.sin(2 * X[:120, 0])
    params = dict(alpha=0.5, solver="cg", tol=1e-12, random_state=0)
    model = dkern.KernelRidge(Gaussian(0.9), backend="triton", **params).fit(x, y)
    assert len(triton_calls) > 0
    want = dkern.KernelRidge(Gaussian(0.9), backend="numpy", **params).fit(x, y)
    scale = np.abs(want.dual_coef_).max()
    np.testing.assert_allclose(model.dual_coef_, want.dual_coef_, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(model.predict(Z), want.predict(Z), rtol=0, atol=1e-9)


def test_kernel_density_runs_through_triton(monkeypatch):
    calls = []
    real = blocks_module.log_sums_block_triton
    monkeypatch.setattr(blocks_module, "log_sums_block_triton",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    got = dkern.KernelDensity(bandwidth=0.6, backend="triton").fit(X).score_samples(Z)
    assert calls
    want = dkern.KernelDensity(bandwidth=0.6, backend="numpy").fit(X).score_samples(Z)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_falkon_runs_through_triton(triton_calls):
    """Falkon's normal-equation products as fused products: numpy's answer."""
    x, y = X, np.cos(X[:, 1])
    params = dict(alpha=0.1, solver="nystrom", n_centers=20, tol=1e-10, random_state=0)
    model = dkern.KernelRidge(Gaussian(0.9), backend="triton", **params).fit(x, y)
    assert len(triton_calls) > 0
    want = dkern.KernelRidge(Gaussian(0.9), backend="numpy", **params).fit(x, y)
    np.testing.assert_allclose(model.predict(Z), want.predict(Z), rtol=0, atol=1e-8)


@pytest.fixture
def triton_recheck(monkeypatch):
    """A fresh triton_status for this test, and again for the tests after it."""
    select.triton_status.cache_clear()
    yield monkeypatch
    select.triton_status.cache_clear()


def test_missing_packages_make_triton_unavailable_with_the_fix(triton_recheck):
    real = select.importlib.util.find_spec
    triton_recheck.setattr(select.importlib.util, "find_spec",
                           lambda name: None if name == "triton" else real(name))
    status = select.triton_status()
    assert not status.available
    assert status.detail == 'triton not installed: pip install "dkern[gpu]"'
    assert [s.name for s in select.backend_statuses()] == ["numpy", "keops", "triton"]
    with pytest.raises(BackendUnavailableError, match="backend='triton' was requested but "
                       "Triton cannot run here .triton not installed"):
        resolve_backend("triton")


def test_without_a_gpu_or_the_interpreter_triton_says_so(triton_recheck):
    triton_recheck.setenv("TRITON_INTERPRET", "0")
    triton_recheck.setattr(select.ctypes.util, "find_library", lambda name: None)
    status = select.triton_status()
    assert not status.available
    assert status.detail.startswith("no CUDA driver (libcuda) on this machine")
    triton_recheck.setattr(select, "gpu_visible", lambda: False)  # KeOps' GPU too
    assert resolve_backend("auto") == "numpy"
