"""GaussianProcessRegressor(solver="nystrom"): the SGPR (Titsias) sparse GP against the exact
GP on real data, its bound and gradient, the optimizer, a synthetic store at scale, files."""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from test_gp_regression import NOISE, X_TEST, X_TRAIN, Y_ALL, Y_TRAIN, our_gp

import dkern
from dkern import GaussianProcessRegressor
from dkern.kernels import Gaussian, Scaled

N = 300  # all rows as centres: n = M = 300


def relative_max(got, want):
    return np.abs(np.asarray(got) - want).max() / np.abs(want).max()


@pytest.mark.parametrize("two_targets", [False, True], ids=["one-target", "two-targets"])
def test_all_rows_as_centres_give_the_exact_gp(two_targets):
    """Z = X: the SGPR posterior and bound are the exact GP's (up to the K_uu jitter, 1e-10
    relative here: measured offsets 1e-7 (mean), 1e-9 (std), 5e-9 (LML) relative)."""
    X, y, Xt = X_TRAIN[:N], (Y_ALL[:N] * [3.0, 0.5] if two_targets else Y_TRAIN[:N]), X_TEST
    params = {"optimizer": None, "normalize_y": two_targets}
    exact = our_gp(**params).fit(X, y)
    sparse = our_gp(solver="nystrom", n_centers=N, random_state=0, **params).fit(X, y)
    assert sparse.solver_ == sparse.variance_ == "nystrom" and sparse.centers_.shape == (N, 6)
    mean, std = sparse.predict(Xt, return_std=True)
    want_mean, want_std = exact.predict(Xt, return_std=True)
    assert relative_max(mean, want_mean) <= 1e-6
    np.testing.assert_allclose(std, want_std, rtol=1e-6)
    assert sparse.log_marginal_likelihood_value_ == pytest.approx(
        exact.log_marginal_likelihood_value_, rel=1e-6)
    _, cov = sparse.predict(Xt[:40], return_cov=True)
    assert relative_max(cov, exact.predict(Xt[:40], return_cov=True)[1]) <= 1e-6
    theta = sparse.kernel_.theta + [0.2, -0.3]  # the bound's gradient is the exact LML's too
    value, grad = sparse.log_marginal_likelihood(theta, eval_gradient=True)
    want, want_grad = exact.log_marginal_likelihood(theta, eval_gradient=True)
    assert value == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-6 * np.abs(want_grad).max())


def test_a_jitter_not_small_next_to_the_noise_warns():
    """diabetes (real data), every row a centre, scikit-learn's default alpha = 1e-10: K_uu's
    jitter (1e-10 · k(z, z)) equals the noise, and the sparse bound misses the exact LML by
    hundreds of nats (-269 against -213 at n = 150, measured): the fit warns, naming the
    ratio and the ways out. At alpha = 0.05 (ratio 2e-9) it does not."""
    from sklearn.datasets import load_diabetes

    from dkern.errors import ConvergenceWarning

    X, y = load_diabetes(return_X_y=True)
    X, y = (X[:60, :3] - X[:60, :3].mean(0)) / X[:60, :3].std(0), y[:60] / y[:60].std()
    with pytest.warns(ConvergenceWarning, match=r"jitter of 1e-10 times k\(z, z\).* times "
                      r"the noise variance 1e-10.*solver='exact'"):
        our_gp(solver="nystrom", n_centers=60, alpha=1e-10, optimizer=None,
               random_state=0).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        our_gp(solver="nystrom", n_centers=60, alpha=0.05, optimizer=None,
               random_state=0).fit(X, y)


def fitted_sparse(M=60, **kw):
    return our_gp(solver="nystrom", n_centers=M, random_state=0, **kw).fit(X_TRAIN[:N],
                                                                            Y_TRAIN[:N])


def test_fewer_centres_bound_the_exact_likelihood_and_the_gradient_is_its_derivative():
    sparse = fitted_sparse(optimizer=None)
    exact = our_gp(optimizer=None).fit(X_TRAIN[:N], Y_TRAIN[:N])
    assert sparse.log_marginal_likelihood_value_ < exact.log_marginal_likelihood_value_
    h = 1e-5
    for theta in (sparse.kernel_.theta, sparse.kernel_.theta + [0.3, -0.2]):
        value, grad = sparse.log_marginal_likelihood(theta, eval_gradient=True)
        assert value <= exact.log_marginal_likelihood(theta)
        fd = [(sparse.log_marginal_likelihood(theta + h * e)
               - sparse.log_marginal_likelihood(theta - h * e)) / (2 * h) for e in np.eye(2)]
        np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_optimizer_raises_the_bound_in_at_most_two_passes_per_evaluation():
    kernel = Scaled(1.0, Gaussian(1.0, lengthscale_bounds=(0.05, 20.0)),
                    constant_bounds=(0.01, 100.0))
    start = GaussianProcessRegressor(kernel, alpha=NOISE, solver="nystrom", n_centers=60,
                                     optimizer=None, random_state=0).fit(X_TRAIN[:N], Y_TRAIN[:N])
    reads, evaluations = [], []

    def count(block):
        reads.append(len(block))
        return block

    def counting_lbfgs(obj_func, theta, bounds):
        import scipy.optimize

        def f(t):
            evaluations.append(t)
            return obj_func(t, eval_gradient=True)

        result = scipy.optimize.minimize(f, theta, jac=True, bounds=bounds, method="L-BFGS-B")
        return result.x, result.fun

    X = da.from_array(X_TRAIN[:N], chunks=(100, -1)).map_blocks(count, dtype=np.float64)
    with dask.config.set(scheduler="synchronous"):
        gp = GaussianProcessRegressor(kernel, alpha=NOISE, solver="nystrom", n_centers=60,
                                      optimizer=counting_lbfgs, random_state=0).fit(X, Y_TRAIN[:N])
    np.testing.assert_array_equal(gp.centers_, start.centers_)  # the same centres
    assert gp.log_marginal_likelihood_value_ >= start.log_marginal_likelihood_value_ + 1.0
    assert gp.log_marginal_likelihood(gp.kernel_.theta) == pytest.approx(
        gp.log_marginal_likelihood_value_, rel=1e-12)
    # every evaluation: <= 2 passes of 3 chunks; centre selection and the end: <= 2 passes
    assert sum(reads) <= N * (2 * len(evaluations) + 2)


def test_auto_picks_nystrom_only_when_n_centers_is_given_and_says_so(caplog):
    with caplog.at_level("INFO", logger="dkern.models.gaussian_process"):
        gp = our_gp(optimizer=None, n_centers=30, random_state=0).fit(X_TRAIN[:200],
                                                                      Y_TRAIN[:200])
        plain = our_gp(optimizer=None).fit(X_TRAIN[:200], Y_TRAIN[:200])
    assert gp.solver_ == gp.variance_ == "nystrom" and plain.solver_ == "exact"
    assert "solver='auto' chose 'nystrom' (n_centers=30 was given)" in caplog.text


def test_numpy_dask_zarr_and_store_inputs_give_the_same_model(tmp_path):
    X, y, Xt = X_TRAIN[:200], Y_TRAIN[:200], X_TEST[:30]
    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X, "y": y, "Xt": Xt}, chunk_rows=64)
    want = fitted_sparse(optimizer=None).fit(X, y).predict(Xt, return_std=True)
    inputs = [(da.from_array(X, chunks=(50, -1)), da.from_array(y, chunks=50), Xt),
              tuple(dkern.io.open_array(url, name) for name in ("X", "y", "Xt")),
              ((url, "X"), (url, "y"), (url, "Xt"))]
    with dask.config.set(scheduler="synchronous"):
        for Xin, yin, Xtin in inputs:
            mean, std = dask.compute(*fitted_sparse(optimizer=None).fit(Xin, yin).predict(
                Xtin, return_std=True))
            np.testing.assert_allclose(mean, want[0], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(std, want[1], rtol=1e-9)


def test_save_and_load_keep_only_m_sized_arrays_and_predict_identically(tmp_path):
    Y2 = Y_ALL[:N] * [3.0, 0.5] + [1.0, -2.0]
    gp = our_gp(solver="nystrom", n_centers=50, normalize_y=True, random_state=0).fit(
        X_TRAIN[:N], Y2)
    dkern.save(gp, tmp_path / "gp.zarr")
    back = dkern.load(tmp_path / "gp.zarr")
    assert sorted(dkern.io.list_arrays(str(tmp_path / "gp.zarr"))) == [
        "L", "P", "alpha", "b", "centers", "yty"]
    assert back.kernel_ == gp.kernel_ and back.get_params() == gp.get_params()
    for got, want in zip(back.predict(X_TEST, return_std=True), gp.predict(X_TEST, return_std=True),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    assert back.log_marginal_likelihood() == gp.log_marginal_likelihood_value_
    with pytest.raises(ValueError, match="loaded from a file.*refit it"):
        back.log_marginal_likelihood(gp.kernel_.theta)


@pytest.mark.parametrize(("params", "match"), [
    ({"solver": "exact", "n_centers": 10}, "n_centers=10 sets the centres of the sparse GP"),
    ({"solver": "cg", "variance": "nystrom"}, "variance='nystrom' is the sparse GP's own"),
    ({"solver": "nystrom", "variance": "exact"}, "variance='nystrom' is the sparse GP's own"),
    ({"solver": "nystrom", "n_centers": 51}, "n_centers=51 is more centres than the 50"),
    ({"solver": "nystrom", "n_centers": 0}, "n_centers must be None or an integer >= 1"),
    ({"solver": "nystrom", "alpha": 0.0}, "alpha must be a finite number > 0"),
])
def test_bad_parameters_are_named(params, match):
    with pytest.raises(ValueError, match=match):
        our_gp(optimizer=None, **params).fit(X_TRAIN[:50], Y_TRAIN[:50])


def test_a_white_only_kernel_is_refused_naming_the_cause():
    """It has no signal for the centres: the message said to raise a jitter the estimator
    does not take, or (learning) that every factorisation failed."""
    from dkern.kernels import White

    for optimizer in (None, "fmin_l_bfgs_b"):
        with pytest.raises(ValueError, match="White noise only: solver='nystrom' has no"):
            GaussianProcessRegressor(White(0.5), alpha=0.05, solver="nystrom", n_centers=20,
                                     optimizer=optimizer).fit(X_TRAIN[:50], Y_TRAIN[:50])


# --------------------------------------------------- acceptance point 5 on a small store
SIGMA = 0.1  # the store's noise standard deviation


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("sgpr") / "data.zarr")
    dkern.io.make_regression_store(url, 20_000, 4, chunk_rows=5_000, noise=SIGMA, n_test=2_000)
    return url


@pytest.mark.parametrize("optimizer", [None, pytest.param("lbfgs", marks=pytest.mark.slow)])
def test_sparse_gp_at_scale_beats_an_exact_subsample_and_covers(store, tmp_path, optimizer):
    """n = 20,000 from Zarr, M = 200 vs an exact GP on 200 rows; intervals on noisy targets.
    (With lengthscale 0.5, too short for 200 centres in 4-d, SGPR's honest variances are
    wide: coverage 0.9995.)"""
    kernel, s = 1.0 * Gaussian(1.0), SIGMA**2
    sparse = GaussianProcessRegressor(kernel, alpha=s, optimizer=optimizer, solver="nystrom",
                                      variance="nystrom", n_centers=200, random_state=0)
    sparse.fit((store, "X"), (store, "y"))
    X_test = dkern.io.open_array(store, "X_test").compute()
    f_test = dkern.io.open_array(store, "y_test").compute()  # noise-free
    mean, std = sparse.predict(X_test, return_std=True)
    subsample = np.random.default_rng(0).choice(20_000, 200, replace=False)
    X_sub = dkern.io.open_array(store, "X")[np.sort(subsample)].compute()
    y_sub = dkern.io.open_array(store, "y")[np.sort(subsample)].compute()
    exact = GaussianProcessRegressor(kernel, alpha=s, optimizer=None).fit(X_sub, y_sub)
    rmse, rmse_exact = (np.sqrt(np.mean((m - f_test) ** 2))
                        for m in (mean, exact.predict(X_test)))
    assert rmse < rmse_exact
    y_noisy = f_test + SIGMA * np.random.default_rng(1).standard_normal(len(f_test))
    half = 1.96 * np.sqrt(std**2 + s)
    coverage = np.mean(np.abs(y_noisy - mean) <= half)
    assert 0.9 <= coverage <= 0.99
    prior = np.sqrt(sparse.kernel_.diag(X_test))
    assert np.all(np.isfinite(std)) and np.all(std >= 0) and np.all(std <= prior)
    out = (str(tmp_path / "pred.zarr"), "gp")
    assert sparse.predict(da.from_array(X_test, chunks=(512, -1)), return_std=True,
                          out=out) == out
    np.testing.assert_allclose(dkern.io.open_array(out[0], "gp/mean").compute(), mean,
                               rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dkern.io.open_array(out[0], "gp/std").compute(), std, rtol=1e-12)
