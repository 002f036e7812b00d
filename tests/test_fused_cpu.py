"""The fused C Gaussian loop against dense numpy/scipy references, its fallbacks, and
that the operators really run it."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from scipy.special import logsumexp

import dkern
from dkern.backends import fused_cpu
from dkern.backends.blocks import NumpyBlocks
from dkern.backends.numpy_backend import matvec_block_numpy
from dkern.backends.smoothing import weighted_log_sums_block
from dkern.kernels import Gaussian, Laplacian, White

RNG = np.random.default_rng(28)
#: Relative to Σ|k||v| per entry (the scale of its rounding), against float64 references.
RTOL = 1e-12


@pytest.fixture(scope="module")
def compiled():
    if fused_cpu._load()[0] is None:
        pytest.skip(f"no fused C loop here: {fused_cpu.status()}")


def dense(ell, x, z):
    """``exp(-‖(x - z) / l‖² / 2)`` from the differences, float64."""
    x, z = np.asarray(x, np.float64), np.asarray(z, np.float64)
    return np.exp(-0.5 * (((x[:, None, :] - z[None, :, :]) / ell) ** 2).sum(-1))


def assert_close(got, K, v):
    want, scale = K @ v, np.abs(K) @ np.abs(v)
    assert got.shape == want.shape and got.dtype == np.float64
    assert np.max(np.abs(got - want) / scale) < RTOL


CASES = [  # (n, m, d, t, lengthscale): ragged n and m, t = 1 and t > 1, d = 1 and 64
    (37, 301, 3, 1, 1.3),
    (5, 4099, 8, 1, np.sqrt(8.0)),  # m over two column panels of the loop
    (64, 1, 5, 2, 0.9),  # m = 1
    (1, 50, 2, 3, 0.5),
    (41, 77, 1, 2, 0.7),  # d = 1
    (9, 130, 64, 1, 6.0),  # d = 64, the largest fused
    (23, 91, 4, 4, np.array([0.6, 1.7, 1.0, 2.5])),  # ARD
]


@pytest.mark.parametrize("n, m, d, t, ell", CASES)
def test_matvec_matches_the_dense_product(compiled, n, m, d, t, ell):
    x, z, v = RNG.normal(size=(n, d)), RNG.normal(size=(m, d)), RNG.normal(size=(m, t))
    got = fused_cpu.matvec_block_fused(Gaussian(ell), x, z, v)
    assert got is not None
    assert_close(got, dense(ell, x, z), v)


def test_each_kernel_value_within_two_ulp_of_numpy_exp(compiled):
    """The fused loop's exp (reduced by ln 2 / 2) value by value: one training row at 0 and
    query rows at distance t give k = exp(-t²/2) exactly as numpy computes its argument,
    within 2 ulp relative (eps = 2.2e-16) over its range (odd and even multiples of
    ln 2 / 2, both ends of each reduction interval, down to v = -708.38), and 0 past -708.39."""
    t = np.concatenate([np.sqrt(2 * np.linspace(0.0, 708.38, 40_001)),
                        np.sqrt(2 * np.log(2) / 2 * np.arange(0, 2044)),  # k ln 2 / 2
                        np.sqrt(2 * (np.log(2) / 2 * np.arange(0, 2043) + np.log(2) / 4)),
                        [np.sqrt(2 * 708.395), np.sqrt(2 * 708.4), 40.0, 1e3]])
    x = np.column_stack([t, np.zeros_like(t)])  # d = 2: the second difference adds 0
    got = fused_cpu.matvec_block_fused(Gaussian(1.0), x, np.zeros((1, 2)), np.ones((1, 1)))
    v = -0.5 * (t * t)
    want, kept = np.exp(v), v >= -708.39
    relative = np.abs(got[kept, 0] - want[kept]) / want[kept] / np.finfo(np.float64).eps
    assert relative.max() <= 2.0, f"{relative.max():.2f} ulp at v = {v[kept][relative.argmax()]}"
    assert kept.sum() > 40_000 and (~kept).sum() == 4
    assert np.all(got[~kept, 0] == 0.0)


def test_scaled_and_white_terms_and_float32(compiled):
    x, z = RNG.normal(size=(19, 6)), RNG.normal(size=(203, 6))
    v = RNG.normal(size=(203, 2))
    kernel = 2.5 * Gaussian(1.2) + White(0.3)  # White adds 0 to a cross block
    assert_close(fused_cpu.matvec_block_fused(kernel, x, z, v), 2.5 * dense(1.2, x, z), v)
    x32, z32, v32 = x.astype(np.float32), z.astype(np.float32), v.astype(np.float32)
    got = matvec_block_numpy(Gaussian(1.2), x32, z32, v32)  # widened: float64 results
    assert_close(got, dense(1.2, x32, z32), v32.astype(np.float64))


def test_far_rows_keep_their_small_differences(compiled):
    """Differences first, then the lengthscale: two rows near 1e12 still see their
    distance of ~0.3 (an expanded ‖x‖² + ‖z‖² − 2x·z would lose every digit)."""
    x, z = RNG.normal(size=(6, 3)), RNG.normal(size=(9, 3))
    x[2] += 1e12
    z[4] = x[2] + [0.1, -0.2, 0.2]
    v = RNG.normal(size=(9, 1))
    for ell in (0.8, np.array([0.8, 1.5, 0.6])):
        assert_close(fused_cpu.matvec_block_fused(Gaussian(ell), x, z, v), dense(ell, x, z), v)


def test_a_lengthscale_whose_inverse_square_overflows(compiled):
    """l = 1e-160: 1/l² is inf, so the scalar fold (c = -1/2l²) would give inf · 0 = NaN
    for coincident rows; the loop divides the differences instead, as the tiles do."""
    x = np.array([[0.0, 0.0], [1e-160, 0.0], [3e-160, 1e-160]])
    z, v = np.array([[0.0, 0.0], [2e-160, -1e-160]]), np.array([[1.0], [2.0]])
    for ell in (1e-160, np.array([1e-160, 1e-160]), np.array([1e-160, 2e-160])):
        got = fused_cpu.matvec_block_fused(Gaussian(ell), x, z, v)
        assert_close(got, np.asarray(Gaussian(ell)(x, z)), v)


def test_only_c_gaussian_on_few_features_is_fused(compiled):
    x, z, v = RNG.normal(size=(4, 3)), RNG.normal(size=(5, 3)), RNG.normal(size=(5, 1))
    for kernel in (Laplacian(1.0), Gaussian(1.0) + Gaussian(2.0), Gaussian(1.0) * Laplacian(1.0)):
        assert fused_cpu.matvec_block_fused(kernel, x, z, v) is None
    wide = RNG.normal(size=(4, fused_cpu.MAX_FEATURES + 1))
    assert fused_cpu.matvec_block_fused(Gaussian(1.0), wide, wide, v[:4]) is None


def test_a_non_fusable_kernel_takes_the_tiles(compiled, monkeypatch):
    calls = count_calls(monkeypatch)
    x, z, v = RNG.normal(size=(30, 3)), RNG.normal(size=(40, 3)), RNG.normal(size=(40, 2))
    got = matvec_block_numpy(Laplacian(1.3), x, z, v, tile_rows=7, tile_cols=9)
    D = np.sqrt(((x[:, None] - z[None]) ** 2).sum(-1)) / 1.3
    assert_close(got, np.exp(-D), v)
    assert calls == []


def test_turned_off_gives_the_same_products_by_the_tiles(compiled, monkeypatch):
    x, z, v = RNG.normal(size=(50, 4)), RNG.normal(size=(70, 4)), RNG.normal(size=(70, 2))
    fused = matvec_block_numpy(Gaussian(1.1), x, z, v)
    monkeypatch.setenv("DKERN_FUSED_CPU", "0")
    fused_cpu._load.cache_clear()
    try:
        assert fused_cpu.matvec_block_fused(Gaussian(1.1), x, z, v) is None
        assert "DKERN_FUSED_CPU=0" in fused_cpu.status()
        tiles = matvec_block_numpy(Gaussian(1.1), x, z, v)
    finally:
        fused_cpu._load.cache_clear()
    np.testing.assert_allclose(fused, tiles, rtol=0, atol=RTOL * np.abs(v).sum(0).max())


def test_a_broken_compiler_falls_back_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("DKERN_CACHE_DIR", str(tmp_path))
    fused_cpu._load.cache_clear()
    try:
        assert fused_cpu._load()[0] is None
        assert "failed" in fused_cpu.status() and "BLAS tiles" in fused_cpu.status()
        x, v = RNG.normal(size=(8, 2)), RNG.normal(size=(8, 1))
        assert_close(matvec_block_numpy(Gaussian(0.9), x, x, v), dense(0.9, x, x), v)
    finally:
        fused_cpu._load.cache_clear()


def test_a_build_failing_its_check_is_not_used(monkeypatch):
    fused_cpu._load.cache_clear()
    monkeypatch.setattr(fused_cpu, "CHECK_RTOL", -1.0)  # no build can pass
    try:
        assert fused_cpu._load()[0] is None
        assert "differs from the dense numpy products" in fused_cpu.status()
    finally:
        monkeypatch.undo()
        fused_cpu._load.cache_clear()


def reference_log_sums(ell, x, z, t):
    """``[m, s₀, s…]`` from scipy's logsumexp of the dense log weights."""
    L = -0.5 * (((x[:, None, :] - z[None, :, :]) / ell) ** 2).sum(-1)
    m = L.max(axis=1)
    values = np.hstack([np.ones((len(z), 1)), t])
    return m, np.exp(L - m[:, None]) @ values, logsumexp(L, axis=1)


@pytest.mark.parametrize("ell, scale", [(1.0, 0.3), (np.array([0.5, 2.0, 1.0]), 1.7)])
def test_log_sums_match_scipy_logsumexp(compiled, ell, scale):
    """Queries far from the data too: their weights underflow, the log-scaled sums not."""
    x, z, t = RNG.normal(size=(13, 3)), RNG.normal(size=(2300, 3)), RNG.normal(size=(2300, 2))
    x[0] += 40.0
    got = fused_cpu.log_sums_block_fused(x, z, t, kernel=Gaussian(ell), scale=scale)
    m, sums, lse = reference_log_sums(ell * scale, x, z, t)
    # the far row's weights all underflow: it is summed around its largest log weight; the
    # others unshifted (m = 0), their weights' sum far above SHIFT_ZERO_MIN_SUM
    np.testing.assert_allclose(got[0, 0], m[0], rtol=1e-13)
    assert got[0, 0] < -500 and np.all(got[1:, 0] == 0.0)
    np.testing.assert_allclose(got[:, 0] + np.log(got[:, 1]), lse, rtol=1e-13)
    np.testing.assert_allclose(got[:, 2:] / got[:, 1:2], sums[:, 1:] / sums[:, :1], rtol=1e-11,
                               atol=1e-12)
    np.testing.assert_allclose(weighted_log_sums_block(x, z, t, kernel=Gaussian(ell),
                                                       scale=scale), got, rtol=0, atol=0)
    empty = fused_cpu.log_sums_block_fused(x, z[:0], None, kernel=Gaussian(ell))
    np.testing.assert_array_equal(empty, np.tile([-np.inf, 0.0], (13, 1)))


def test_log_sums_either_side_of_the_unshifted_sums_floor(compiled):
    """A row whose weights sum to about e^-240 keeps the unshifted product (m = 0); one at
    about e^-690, under SHIFT_ZERO_MIN_SUM (e^-416) though not yet underflowing, is summed
    around its largest log weight. Both equal scipy's logsumexp."""
    z, t = RNG.normal(size=(500, 3)), RNG.normal(size=(500, 1))
    x = np.array([[3.0 + np.sqrt(480.0), 0.0, 0.0], [3.0 + np.sqrt(1380.0), 0.0, 0.0]])
    z[:, 0] = np.minimum(z[:, 0], 3.0)  # the nearest rows at most 3 along the first axis
    got = fused_cpu.log_sums_block_fused(x, z, t, kernel=Gaussian(1.0))
    m, sums, lse = reference_log_sums(1.0, x, z, t)
    assert -300 < lse[0] < -200 and -708 < m[1] and lse[1] < -600
    assert got[0, 0] == 0.0 and got[1, 0] == m[1]
    np.testing.assert_allclose(got[:, 0] + np.log(got[:, 1]), lse, rtol=1e-13)
    np.testing.assert_allclose(got[:, 2] / got[:, 1], sums[:, 1] / sums[:, 0], rtol=1e-12)


def test_log_sums_of_other_kernels_take_the_tiles(compiled):
    x, z = RNG.normal(size=(4, 2)), RNG.normal(size=(6, 2))
    assert fused_cpu.log_sums_block_fused(x, z, None, kernel=Laplacian(1.0)) is None
    got = weighted_log_sums_block(x, z, None, kernel=Laplacian(1.0))
    L = -np.sqrt(((x[:, None] - z[None]) ** 2).sum(-1))
    np.testing.assert_allclose(got[:, 0] + np.log(got[:, 1]), logsumexp(L, axis=1), rtol=1e-12)


def count_calls(monkeypatch) -> list[tuple[int, int]]:
    """The (n, m) of every fused product from now on (any thread)."""
    calls: list[tuple[int, int]] = []
    inner = fused_cpu._matvec

    def spy(run, c, ell, x, z, v):
        calls.append((len(x), len(z)))
        return inner(run, c, ell, x, z, v)

    monkeypatch.setattr(fused_cpu, "_matvec", spy)
    return calls


def test_the_gram_operator_runs_the_fused_loop(compiled, monkeypatch):
    calls = count_calls(monkeypatch)
    x, v = RNG.normal(size=(300, 5)), RNG.normal(size=(300, 1))
    X = da.from_array(x, chunks=(100, -1))  # 3 × 3 block pairs
    got = np.asarray((dkern.gram(3.0 * Gaussian(1.4), X, backend="numpy") @ v).compute())
    assert_close(got, 3.0 * dense(1.4, x, x), v)
    assert len(calls) >= 1 and sum(n * m for n, m in calls) == 300 * 300
    assert NumpyBlocks().kernel_matvec(x[:7], x, v, kernel=Gaussian(1.4)).shape == (7, 1)
    assert len(calls) >= 2


def test_two_threads_at_once_get_their_own_results(compiled):
    """ctypes releases the GIL and dask runs tasks side by side: the C loop is reentrant."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [(RNG.normal(size=(60, 4)), RNG.normal(size=(900, 4)), RNG.normal(size=(900, 2)))
             for _ in range(4)]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: fused_cpu.matvec_block_fused(Gaussian(0.8), *p), pairs))
    for (x, z, v), out in zip(pairs, got, strict=True):
        assert_close(out, dense(0.8, x, z), v)
