"""make_regression_store: deterministic, lazily written, and the documented formula."""

import dask
import numpy as np
import pytest

from dkern.io import make_regression_store, open_array, read_attrs


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def load(url, name):
    return open_array(url, name).compute()


def target(X):
    """The formula in make_regression_store's docstring, written out independently."""
    d = X.shape[1]
    return np.sin(3 * X[:, 0]) + 0.5 * np.cos(2 * X.sum(axis=1) / np.sqrt(d))


def test_same_values_for_any_chunk_rows(tmp_path):
    for rows in (700, 4096, 10_000):
        make_regression_store(tmp_path / f"s{rows}", 9000, 3, chunk_rows=rows, n_test=50)
    assert open_array(tmp_path / "s700", "X").chunks[0][:2] == (700, 700)
    for name in ("X", "y", "X_test", "y_test"):
        ref = load(tmp_path / "s4096", name)
        np.testing.assert_array_equal(load(tmp_path / "s700", name), ref)
        np.testing.assert_array_equal(load(tmp_path / "s10000", name), ref)


def test_values_depend_on_row_and_seed_only(tmp_path):
    make_regression_store(tmp_path / "small", 10, 2, seed=3)
    make_regression_store(tmp_path / "big", 5000, 2, seed=3, chunk_rows=999)
    make_regression_store(tmp_path / "other", 10, 2, seed=4)
    np.testing.assert_array_equal(load(tmp_path / "small", "X"), load(tmp_path / "big", "X")[:10])
    assert not np.allclose(load(tmp_path / "small", "X"), load(tmp_path / "other", "X"))


def test_formula_noise_and_ranges(tmp_path):
    url = tmp_path / "s"
    make_regression_store(url, 20_000, 4, chunk_rows=3000, noise=0.1, n_test=500)
    X, y = load(url, "X"), load(url, "y")
    assert X.shape == (20_000, 4) and y.shape == (20_000,)
    assert -1.0 <= X.min() < -0.999 and 0.999 < X.max() <= 1.0
    residual = y - target(X)
    assert abs(residual.mean()) < 0.003  # 3 standard errors of 0.1 / sqrt(20000)
    assert residual.std() == pytest.approx(0.1, rel=0.02)
    # the test set is noise-free and drawn independently of X
    X_test = load(url, "X_test")
    np.testing.assert_allclose(load(url, "y_test"), target(X_test), rtol=0, atol=1e-15)
    assert not np.isin(X_test[:, 0], X[:, 0]).any()


def test_noise_free_rows_match_formula_by_hand(tmp_path):
    url = tmp_path / "s"
    make_regression_store(url, 5, 2, noise=0.0)
    X, y = load(url, "X"), load(url, "y")
    for i in range(3):
        x0, x1 = X[i]
        by_hand = np.sin(3 * x0) + 0.5 * np.cos(2 * (x0 + x1) / np.sqrt(2))
        assert y[i] == pytest.approx(by_hand, abs=1e-15)


def test_float32_target_uses_stored_x(tmp_path):
    url = tmp_path / "s"
    make_regression_store(url, 1000, 3, noise=0.0, dtype=np.float32)
    X, y = load(url, "X"), load(url, "y")
    assert X.dtype == np.float32 and y.dtype == np.float32
    np.testing.assert_array_equal(y, target(X.astype(np.float64)).astype(np.float32))


def test_attrs_and_refusal(tmp_path):
    url = tmp_path / "s"
    make_regression_store(url, 100, 2, seed=7, noise=0.5)
    attrs = read_attrs(url)
    assert {k: attrs[k] for k in ("n", "d", "seed", "noise", "n_test", "dtype")} == {
        "n": 100,
        "d": 2,
        "seed": 7,
        "noise": 0.5,
        "n_test": 0,
        "dtype": "float64",
    }
    assert attrs["target"].startswith("y = sin(3*x0) + 0.5*cos(2*sum_j(x_j)/sqrt(d))")
    with pytest.raises(ValueError, match="pass overwrite=True"):
        make_regression_store(url, 100, 2)
    make_regression_store(url, 50, 2, overwrite=True)
    assert open_array(url, "X").shape == (50, 2)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0, 2), {}, "need n >= 1"),
        ((10, 2), {"dtype": np.int64}, "dtype must be numpy.float32 or numpy.float64"),
        ((10, 2), {"chunk_rows": 0}, "chunk_rows must be a positive int"),
    ],
)
def test_bad_arguments(tmp_path, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_regression_store(tmp_path / "s", *args, **kwargs)
    assert not (tmp_path / "s").exists()
