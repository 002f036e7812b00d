"""Kernel density estimation and Nadaraya–Watson against scikit-learn and dense numpy.

Real data: the diabetes study's standardised body-mass index, blood pressure and blood
serum measurement s5 (scikit-learn's bundled copy, 442 rows).
"""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.datasets import load_diabetes, load_iris
from sklearn.model_selection import GridSearchCV
from sklearn.neighbors import KernelDensity as SklearnKernelDensity
from sklearn.utils.estimator_checks import parametrize_with_checks

import dkern
from dkern import KernelDensity, NadarayaWatson
from dkern.io import write_array
from dkern.kernels import Gaussian, Laplacian, Linear
from dkern.kernels.profiles import RadialProfile


@pytest.fixture(autouse=True)
def _sync(sync_scheduler):
    """Every test here runs on dask's synchronous scheduler (no cluster needed)."""


def _diabetes():
    data = load_diabetes()
    X = data.data[:, [2, 3, 8]]  # bmi, bp, s5
    return (X - X.mean(0)) / X.std(0), data.target


def _dense_log_density(X, Q, ell, h):
    """log of the Parzen estimate with a normal kernel of std h·ℓ per feature, densely."""
    s = h * np.broadcast_to(ell, (X.shape[1],))
    L = -0.5 * (((Q[:, None, :] - X[None]) / s) ** 2).sum(-1)
    return logsumexp(L, axis=1) - np.log(len(X)) - 0.5 * X.shape[1] * np.log(2 * np.pi) \
        - np.log(s).sum()


def test_gaussian_kde_equals_sklearn_on_real_data():
    X, _ = _diabetes()
    train, test = X[:300], X[300:]
    ours = KernelDensity("gaussian", bandwidth=0.35).fit(train).score_samples(test)
    theirs = SklearnKernelDensity(kernel="gaussian", bandwidth=0.35).fit(train).score_samples(test)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-8)
    assert KernelDensity(bandwidth=0.35).fit(train).score(test) == pytest.approx(theirs.sum(),
                                                                                 rel=1e-12)


@pytest.mark.parametrize("rule", ["scott", "silverman"])
def test_bandwidth_rules_equal_sklearns(rule, tmp_path):
    """scikit-learn's rules of thumb, by name: the same bandwidth_ and densities (1e-12),
    kept by a saved model; an unknown rule is refused by name."""
    X, _ = _diabetes()
    train, test = X[:300], X[300:]
    ours = KernelDensity(bandwidth=rule).fit(train)
    theirs = SklearnKernelDensity(bandwidth=rule).fit(train)
    assert ours.bandwidth_ == pytest.approx(theirs.bandwidth_, rel=1e-15)
    np.testing.assert_allclose(ours.score_samples(test), theirs.score_samples(test),
                               rtol=1e-12)
    dkern.save(ours, tmp_path / "kde.zarr")
    back = dkern.load(tmp_path / "kde.zarr")
    assert back.bandwidth == rule and back.bandwidth_ == ours.bandwidth_
    with pytest.raises(ValueError, match=r"bandwidth must be a number > 0 or one of "
                                         r"\['scott', 'silverman'\]; got 'scot'"):
        KernelDensity(bandwidth="scot").fit(train)


def test_box_kde_of_bandwidth_2h_equals_sklearn_tophat_of_h_in_one_dimension():
    """The seeds' hypercube of side 2h is scikit-learn's ball of radius h in 1-D only."""
    X, _ = _diabetes()
    x = X[:, :1]
    grid = np.linspace(-3, 3, 241)[:, None] + 1e-7  # off the sample's 1/100 grid: no boundary
    ours = KernelDensity("box", bandwidth=0.5).fit(x).score_samples(grid)
    theirs = SklearnKernelDensity(kernel="tophat", bandwidth=0.25).fit(x).score_samples(grid)
    assert np.array_equal(np.isinf(ours), np.isinf(theirs)) and np.isinf(ours).any()
    np.testing.assert_allclose(ours[np.isfinite(ours)], theirs[np.isfinite(theirs)], atol=1e-8)


@pytest.mark.parametrize("name", ["tophat", "epanechnikov", "exponential", "linear", "cosine"])
def test_sklearns_other_kernels_by_name_equal_sklearns_densities(name, tmp_path):
    """scikit-learn's five other density kernels, by its names: the same log-densities
    (1e-10, -inf where a compact kernel reaches no row) on real data in 3 and 1 dimensions,
    kept by a saved model; sampling as scikit-learn allows (tophat: within h of a row)."""
    X, _ = _diabetes()
    for train, test, h in ((X[:300], X[300:], 0.6), (X[:300, :1], X[300:, :1] + 1e-7, 0.3)):
        ours = KernelDensity(name, bandwidth=h).fit(train)
        theirs = SklearnKernelDensity(kernel=name, bandwidth=h).fit(train).score_samples(test)
        got = ours.score_samples(test)
        assert np.array_equal(np.isinf(got), np.isinf(theirs))
        np.testing.assert_allclose(got[np.isfinite(got)], theirs[np.isfinite(theirs)],
                                   rtol=0, atol=1e-10)
    dkern.save(ours, tmp_path / "kde.zarr")
    np.testing.assert_array_equal(dkern.load(tmp_path / "kde.zarr").score_samples(test), got)
    if name == "tophat":
        draws = ours.sample(200, random_state=0)
        nearest = np.abs(draws[:, None, 0] - train[None, :, 0]).min(axis=1)
        assert (nearest < h).all() and draws.std() > 0.5 * train.std()
    else:
        with pytest.raises(NotImplementedError, match="'gaussian', 'box' and 'tophat'"):
            ours.sample(1)


def test_cosine_density_integrates_to_one_in_even_dimensions_too():
    """The cosine kernel's normalising constant in every dimension, not only the odd ones
    where scikit-learn's series is right (it gives NaN on 4-D iris): equal to the closed
    forms by parts, sphere area × ∫₀¹ cos(πr/2) r^(d-1) dr with J₀ = 2/π, J₁ = 2/π − 4/π²,
    J_n = 2/π − n(n−1)(4/π²) J_(n−2), to 1e-11 in the log (the recursion
    itself loses digits by d = 8); a 2-D density sums to 1 on a grid (1e-3);
    4-D iris fits, with finite densities at its rows."""
    j = {0: 2 / np.pi, 1: 2 / np.pi - 4 / np.pi**2}
    for n in range(2, 8):
        j[n] = 2 / np.pi - n * (n - 1) * (4 / np.pi**2) * j[n - 2]
    area = {1: 2.0, 2: 2 * np.pi, 3: 4 * np.pi, 4: 2 * np.pi**2, 8: np.pi**4 / 3}
    for d, sphere in area.items():
        ours = RadialProfile("cosine").log_integral(d)
        np.testing.assert_allclose(ours, np.log(sphere * j[d - 1]), rtol=0, atol=1e-11)
    grid = np.linspace(-1, 1, 401)
    points = np.stack(np.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
    kde = KernelDensity("cosine", bandwidth=1.0).fit(np.zeros((1, 2)))
    mass = np.exp(kde.score_samples(points)).sum() * (grid[1] - grid[0]) ** 2
    assert abs(mass - 1) < 1e-3, mass
    iris = load_iris().data
    assert np.isfinite(KernelDensity("cosine", bandwidth=0.5).fit(iris).score_samples(iris)).all()

@pytest.mark.parametrize("name", ["gaussian", "tophat"])
def test_sample_weight_equals_sklearns_and_repeated_rows(name, tmp_path):
    """fit(sample_weight=) as scikit-learn's KernelDensity (1e-10, zero weights included);
    integer weights equal repeated rows; lazy weights stay lazy with the same densities;
    a save keeps them (and an unweighted model's file has no weights array); sampling
    never draws a row of weight 0."""
    X, _ = _diabetes()
    train, test = X[:300], X[300:]
    w = np.random.default_rng(0).integers(0, 4, size=300).astype(float)
    ours = KernelDensity(name, bandwidth=0.7).fit(train, sample_weight=w)
    theirs = SklearnKernelDensity(kernel=name, bandwidth=0.7).fit(train, sample_weight=w)
    got = ours.score_samples(test)
    expected = theirs.score_samples(test)
    assert np.array_equal(np.isinf(got), np.isinf(expected))
    np.testing.assert_allclose(got[np.isfinite(got)], expected[np.isfinite(expected)],
                               rtol=0, atol=1e-10)
    repeated = KernelDensity(name, bandwidth=0.7).fit(np.repeat(train, w.astype(int), axis=0))
    np.testing.assert_allclose(repeated.score_samples(test), got, rtol=0, atol=1e-10)
    lazy = KernelDensity(name, bandwidth=0.7).fit(da.from_array(train, chunks=100),
                                                  sample_weight=da.from_array(w, chunks=100))
    assert isinstance(lazy.sample_weight_, da.Array)
    np.testing.assert_allclose(lazy.score_samples(test), got, rtol=0, atol=1e-12)
    dkern.save(ours, tmp_path / "w.zarr")
    np.testing.assert_array_equal(dkern.load(tmp_path / "w.zarr").score_samples(test), got)
    dkern.save(KernelDensity(name).fit(train), tmp_path / "u.zarr")
    assert sorted(dkern.io.list_arrays(str(tmp_path / "u.zarr"))) == ["X_fit"]
    assert dkern.load(tmp_path / "u.zarr").sample_weight_ is None
    if name == "tophat":  # a narrow ball: each draw names its row
        draws = KernelDensity(name, bandwidth=1e-6).fit(train, sample_weight=w).sample(
            3000, random_state=1)
        nearest = np.linalg.norm(draws[:, None] - train[None], axis=2).argmin(axis=1)
        counts = np.bincount(w[nearest].astype(int), minlength=4)
        assert counts[0] == 0  # never a row of weight 0; weight 3 drawn ~3x as often as 1
        assert 2.5 < (counts[3] / (w == 3).sum()) / (counts[1] / (w == 1).sum()) < 3.5


def test_sample_draws_from_every_kernel_object_scikit_learn_samples():
    """A dkern Gaussian kernel object samples (a membership test on the kernel names once
    raised "unhashable type" for it): the draws spread as N(row, h²ℓ²) around the rows."""
    X, _ = _diabetes()
    draws = KernelDensity(Gaussian(2.0), bandwidth=0.1).fit(X[:1, :2]).sample(4000,
                                                                           random_state=0)
    np.testing.assert_allclose(draws.std(axis=0), [0.2, 0.2], rtol=0.05)


@pytest.mark.parametrize("weights, match", [
    (-np.ones(300), "must be finite and >= 0 with a positive sum; got a weight -1"),
    (np.full(300, np.nan), "must be finite .* got NaN or infinity"),
    (np.zeros(300), "must be finite .* got all weights zero"),
    (np.ones(299), r"must have shape \(300,\), one weight per row of X; got shape \(299,\)"),
])
def test_bad_sample_weight_is_refused_by_name(weights, match):
    X, _ = _diabetes()
    with pytest.raises(ValueError, match="sample_weight " + match):
        KernelDensity().fit(X[:300], sample_weight=weights)


def test_ard_gaussian_kernel_is_the_normal_density_of_covariance_h2_ell2():
    X, _ = _diabetes()
    ell = np.array([0.5, 1.0, 2.0])
    ours = KernelDensity(Gaussian(ell), bandwidth=0.4).fit(X[:300]).score_samples(X[300:])
    np.testing.assert_allclose(ours, _dense_log_density(X[:300], X[300:], ell, 0.4), atol=1e-12)


@pytest.mark.parametrize("kernel, h", [("gaussian", 0.3), ("box", 0.4)])
def test_density_integrates_to_one_in_one_and_two_dimensions(kernel, h):
    X, _ = _diabetes()
    x1 = np.linspace(-6, 6, 24001)
    p1 = np.exp(KernelDensity(kernel, bandwidth=h).fit(X[:, :1]).score_samples(x1[:, None]))
    assert np.trapezoid(p1, x1) == pytest.approx(1.0, abs=2e-4)
    g = np.linspace(-6, 6, 601)
    grid = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    p2 = np.exp(KernelDensity(kernel, bandwidth=h).fit(X[:60, :2]).score_samples(grid))
    total = np.trapezoid(np.trapezoid(p2.reshape(601, 601), g, axis=1), g)
    assert total == pytest.approx(1.0, abs=1e-2 if kernel == "box" else 1e-4)


def test_log_density_far_from_the_data_is_finite_and_exact():
    """scikit-learn's tree sums kernel values and loses them far away; the log-sum-exp
    over row chunks keeps the exact log-density at any distance."""
    X, _ = _diabetes()
    far = X[:5] + 40.0
    ours = KernelDensity(bandwidth=0.3).fit(X).score_samples(far)
    assert np.all(np.isfinite(ours)) and ours.max() < -1e3
    np.testing.assert_allclose(ours, _dense_log_density(X, far, 1.0, 0.3), rtol=1e-13)


def test_bandwidth_is_chosen_by_grid_search():
    X, _ = _diabetes()
    grid = {"bandwidth": [0.05, 0.3, 3.0]}
    ours = GridSearchCV(KernelDensity(), grid, cv=3).fit(X)
    theirs = GridSearchCV(SklearnKernelDensity(), grid, cv=3).fit(X)
    assert ours.best_params_ == theirs.best_params_ == {"bandwidth": 0.3}
    folds = np.array_split(np.arange(len(X)), 3)  # KFold(3), unshuffled
    dense = [np.mean([_dense_log_density(np.delete(X, f, 0), X[f], 1.0, h).sum() for f in folds])
             for h in grid["bandwidth"]]
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], dense, rtol=1e-12)
    # scikit-learn agrees except at h = 0.05, where held-out rows lie far (in bandwidths)
    # from the others and its tree's sums of kernel values lose them
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"][1:],
                               theirs.cv_results_["mean_test_score"][1:], rtol=1e-10)


def test_samples_follow_the_kernel_around_training_rows():
    X, _ = _diabetes()
    box = KernelDensity("box", bandwidth=0.2).fit(X)
    draws = box.sample(500, random_state=0)
    nearest = np.abs(draws[:, None, :] - X[None]).max(-1).min(1)
    assert draws.shape == (500, 3) and nearest.max() <= 0.1 + 1e-12
    np.testing.assert_array_equal(draws, box.sample(500, random_state=0))
    gauss = KernelDensity(bandwidth=0.5).fit(X).sample(20000, random_state=1)
    # the mixture's covariance is the data's plus h²I; standard errors about 1e-2
    np.testing.assert_allclose(np.cov(gauss.T), np.cov(X.T, bias=True) + 0.25 * np.eye(3),
                               atol=0.06)


def test_nadaraya_watson_equals_the_dense_formula_with_several_outputs():
    X, t = _diabetes()
    T = np.column_stack([t, np.log(t)])
    W = np.exp(-0.5 * ((X[300:, None] - X[None, :300]) ** 2).sum(-1) / 0.6**2)
    ref = W @ T[:300] / W.sum(1, keepdims=True)
    pred = NadarayaWatson(bandwidth=0.6).fit(X[:300], T[:300]).predict(X[300:])
    np.testing.assert_allclose(pred, ref, rtol=1e-12)
    one = NadarayaWatson(bandwidth=0.6).fit(X[:300], t[:300]).predict(X[300:])
    assert one.shape == (142,)
    np.testing.assert_allclose(one, ref[:, 0], rtol=1e-12)
    L = np.exp(-np.sqrt(((X[300:, None] - X[None, :300]) ** 2).sum(-1)) / 0.6)
    lap = NadarayaWatson(Laplacian(1.0), bandwidth=0.6).fit(X[:300], t[:300]).predict(X[300:])
    np.testing.assert_allclose(lap, L @ t[:300] / L.sum(1), rtol=1e-12)


def test_nadaraya_watson_stays_finite_100_lengthscales_from_the_data():
    X, t = _diabetes()
    far = X[:3] + 100 * 0.5
    pred = NadarayaWatson(bandwidth=0.5).fit(X, t).predict(far)
    L = -0.5 * ((far[:, None] - X[None]) ** 2).sum(-1) / 0.5**2  # softmax of the log weights
    ref = np.exp(L - logsumexp(L, axis=1, keepdims=True)) @ t
    assert np.all(np.isfinite(pred))
    np.testing.assert_allclose(pred, ref, rtol=1e-12)


def test_box_kernel_without_a_training_row_in_reach_predicts_nan_and_warns():
    X, t = _diabetes()
    queries = np.vstack([X[:4], X[:2] + 10.0])
    with pytest.warns(RuntimeWarning, match="2 of 6 rows of X have no training row"):
        pred = NadarayaWatson("box", bandwidth=0.5).fit(X, t).predict(queries)
    assert np.isnan(pred[4:]).all() and np.isfinite(pred[:4]).all()
    inside = (np.abs(X[:4, None] - X[None]) <= 0.25).all(-1)
    np.testing.assert_allclose(pred[:4], inside @ t / inside.sum(1), rtol=1e-12)


@pytest.mark.slow
def test_a_million_rows_from_zarr_equal_a_chunked_float64_evaluation(tmp_path):
    rng = np.random.default_rng(0)
    n, h = 1_000_000, 0.05
    X = rng.uniform(-1, 1, size=(n, 2))
    t = np.sin(3 * X[:, 0]) + X[:, 1] ** 2
    url = str(tmp_path / "big.zarr")
    write_array(X, url, "X", chunk_rows=125_000)
    write_array(t, url, "t", chunk_rows=125_000)
    # 20 queries (and one far away): the million training rows are the point, and the cost
    # of each evaluation is queries × rows (100 queries: 3.4 s per estimator here, 20: 1.1 s)
    Q = np.vstack([rng.uniform(-1.2, 1.2, size=(20, 2)), [[30.0, 30.0]]])
    logp = KernelDensity(bandwidth=h).fit((url, "X")).score_samples(Q)
    pred = NadarayaWatson(bandwidth=h).fit((url, "X"), (url, "t")).predict(Q)
    # the formulas in float64 from coordinate differences, 100,000 training rows at a time,
    # each chunk's sums scaled by its own maximum log weight and merged by a log-add
    top, weight, weighted = np.full(len(Q), -np.inf), np.zeros(len(Q)), np.zeros(len(Q))
    for i in range(0, n, 100_000):
        Xi = X[i:i + 100_000]
        L = -0.5 * sum((Q[:, j, None] - Xi[None, :, j]) ** 2 for j in range(2)) / h**2
        m = np.maximum(top, L.max(axis=1))
        E = np.exp(L - m[:, None])
        weight = weight * np.exp(top - m) + E.sum(axis=1)
        weighted = weighted * np.exp(top - m) + E @ t[i:i + 100_000]
        top = m
    ref_logp = top + np.log(weight) - np.log(n) - np.log(2 * np.pi) - 2 * np.log(h)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-9)
    np.testing.assert_allclose(pred, weighted / weight, rtol=1e-9, atol=1e-12)


def test_dask_zarr_and_store_references_give_the_in_memory_results(tmp_path):
    X, t = _diabetes()
    url = str(tmp_path / "d.zarr")
    write_array(X[:300], url, "X", chunk_rows=70)
    write_array(t[:300], url, "t", chunk_rows=70)
    kde = KernelDensity(bandwidth=0.4).fit(X[:300]).score_samples(X[300:])
    nw = NadarayaWatson(bandwidth=0.4).fit(X[:300], t[:300]).predict(X[300:])
    for train, target in [((url, "X"), (url, "t")), (da.from_array(X[:300], chunks=90),
                                                      da.from_array(t[:300], chunks=90))]:
        lazy_q = da.from_array(X[300:], chunks=50)
        got = KernelDensity(bandwidth=0.4).fit(train).score_samples(lazy_q)
        assert isinstance(got, da.Array)
        np.testing.assert_allclose(got.compute(), kde, rtol=1e-13)
        np.testing.assert_allclose(
            NadarayaWatson(bandwidth=0.4).fit(train, target).predict(X[300:]), nw, rtol=1e-13)


@pytest.mark.parametrize("model", [KernelDensity("box", bandwidth=0.7),
                                   KernelDensity(Gaussian([0.5, 1.0, 2.0]), bandwidth=0.3),
                                   NadarayaWatson(Laplacian(2.0), bandwidth=0.5)])
def test_save_and_load_round_trip(tmp_path, model):
    X, t = _diabetes()
    fitted = model.fit(X[:300], t[:300]) if isinstance(model, NadarayaWatson) \
        else model.fit(X[:300])
    dkern.save(fitted, tmp_path / "m.zarr")
    loaded = dkern.load(tmp_path / "m.zarr")
    assert type(loaded) is type(model) and loaded.get_params() == model.get_params()
    method = "predict" if isinstance(model, NadarayaWatson) else "score_samples"
    np.testing.assert_array_equal(getattr(loaded, method)(X[300:]),
                                  getattr(fitted, method)(X[300:]))


@pytest.mark.parametrize("make, match", [
    (lambda: KernelDensity(bandwidth=0.0), "bandwidth must be a finite number > 0"),
    (lambda: KernelDensity(bandwidth=np.nan), "bandwidth must be a finite number > 0"),
    (lambda: KernelDensity("biweight"), "kernel must be one of 'gaussian', 'box', 'tophat', "
                                        "'epanechnikov', 'exponential', 'linear', 'cosine' or "
                                        "a dkern Gaussian"),
    (lambda: KernelDensity(Laplacian(1.0)), "kernel must be one of .* or a dkern Gaussian"),
    (lambda: NadarayaWatson("biweight"), "kernel must be one of .* or a dkern kernel"),
])
def test_bad_parameters_are_refused_at_fit(make, match):
    X, t = _diabetes()
    with pytest.raises(ValueError, match=match):
        model = make()
        model.fit(X, t) if isinstance(model, NadarayaWatson) else model.fit(X)


def test_bad_data_is_refused():
    X, t = _diabetes()
    with pytest.raises(ValueError, match="X has 2 features, but KernelDensity is expecting 3"):
        KernelDensity().fit(X).score_samples(X[:, :2])
    with pytest.raises(ValueError, match="0 sample"):
        KernelDensity().fit(X[:0])
    with pytest.raises(ValueError, match="y has 10 rows but X has 442"):
        NadarayaWatson().fit(X, t[:10])
    with pytest.raises(ValueError, match="weights k.x, z. >= 0"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        NadarayaWatson(Linear()).fit(X, t).predict(X[:5])


@parametrize_with_checks([KernelDensity(), NadarayaWatson()])
def test_sklearn_estimator_checks(estimator, check):
    with dask.config.set(scheduler="synchronous"):
        check(estimator)
