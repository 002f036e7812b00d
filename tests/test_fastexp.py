"""The compiled float64 exp against numpy.exp, and its fallback."""

from __future__ import annotations

import numpy as np
import pytest

from dkern.kernels import Gaussian, fastexp


@pytest.fixture(scope="module")
def compiled():
    if fastexp._load()[0] is None:
        pytest.skip(f"no compiled exp here: {fastexp.status()}")


@pytest.mark.parametrize("low, high", [(-30.0, 0.0), (-708.0, 709.0), (-1e-8, 1e-8)])
def test_within_two_ulp_of_numpy(compiled, low, high):
    # Measured: at most 1.43 relative ulp (2.0 in units of the result's spacing) over [-708, 709].
    x = np.random.default_rng(0).uniform(low, high, 200_003)
    got, want = fastexp.exp(x), np.exp(x)
    assert np.max(np.abs(got - want) / np.spacing(want)) <= 2.0


def test_special_values_and_subnormals_as_numpy(compiled):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 709.78, 709.79, 720.0, -745.1, -745.2,
                  -1e300, 1e300, -720.0, -740.0])
    with np.errstate(over="ignore"):
        want = np.exp(x)
    got = fastexp.exp(x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    # subnormal results (x < -708.4) carry fewer bits: compare them absolutely
    np.testing.assert_allclose(got[finite], want[finite], rtol=4.5e-16, atol=1e-320)


def test_in_place_and_layouts(compiled):
    x = np.random.default_rng(1).uniform(-5, 0, (37, 41))
    want = np.exp(x)
    y = x.copy()
    assert fastexp.exp(y, out=y) is y
    np.testing.assert_allclose(y, want, rtol=4.5e-16)
    # non-contiguous and float32 inputs go through numpy.exp
    np.testing.assert_array_equal(fastexp.exp(x[:, ::2]), np.exp(x[:, ::2]))
    np.testing.assert_array_equal(fastexp.exp(x.astype(np.float32)), np.exp(x.astype(np.float32)))


def test_turned_off_falls_back_to_numpy(monkeypatch):
    monkeypatch.setenv("DKERN_FASTEXP", "0")
    fastexp._load.cache_clear()
    try:
        assert fastexp._load()[0] is None
        assert "DKERN_FASTEXP=0" in fastexp.status()
        x = np.linspace(-3, 0, 101)
        np.testing.assert_array_equal(fastexp.exp(x), np.exp(x))
        # the kernels still match their dense formula on the numpy path
        X = np.random.default_rng(2).standard_normal((20, 3))
        D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
        np.testing.assert_allclose(Gaussian(1.5)(X), np.exp(-D / (2 * 1.5**2)), rtol=1e-12)
    finally:
        fastexp._load.cache_clear()


def test_a_broken_compiler_falls_back_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("DKERN_CACHE_DIR", str(tmp_path))
    fastexp._load.cache_clear()
    try:
        assert fastexp._load()[0] is None
        assert "failed" in fastexp.status()
        assert list(tmp_path.iterdir()) == []  # no half-built library left behind
    finally:
        fastexp._load.cache_clear()
