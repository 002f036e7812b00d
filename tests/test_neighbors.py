"""Exact k-nearest neighbours against scikit-learn's brute force and dense numpy.

Real data: scikit-learn's bundled handwritten digits (1,797 rows of 64 integer pixel
intensities 0–16): squared distances are integers, so many neighbours tie exactly,
which tests the tie rule (lower index first) rather than avoiding it.
"""

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.metrics import pairwise_distances
from sklearn.neighbors import KNeighborsClassifier as SklearnKNC
from sklearn.neighbors import KNeighborsRegressor as SklearnKNR
from sklearn.neighbors import NearestNeighbors
from sklearn.utils.estimator_checks import parametrize_with_checks

import dkern
from dkern import KNeighborsClassifier, KNeighborsRegressor
from dkern.io import write_array


@pytest.fixture(autouse=True)
def _sync(sync_scheduler):
    """Every test here runs on dask's synchronous scheduler (no cluster needed)."""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Digits split 1,500 / 297, the training rows in a Zarr store of 10 chunks."""
    data = load_digits()
    X, y = data.data.astype(np.float64), data.target
    url = str(tmp_path_factory.mktemp("digits") / "digits.zarr")
    write_array(X[:1500], url, "X", chunk_rows=150)
    write_array(y[:1500].astype(np.float64), url, "y", chunk_rows=150)
    return X[:1500], y[:1500], X[1500:], y[1500:], url


def _exact_order(X, Q, k):
    """Indices of the k nearest rows by (exact squared distance, index), and the distances."""
    D = ((Q[:, None, :] - X[None]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(np.arange(len(X)), D.shape), D), axis=1)[:, :k]
    return np.sqrt(np.take_along_axis(D, order, 1)), order


def test_kneighbors_from_zarr_equal_sklearn_brute_force_up_to_ties(digits):
    X, _, Q, _, url = digits
    k = 10
    dist, ind = KNeighborsRegressor(n_neighbors=k).fit((url, "X"), (url, "y")).kneighbors(Q)
    assert isinstance(dist, np.ndarray) and ind.dtype == np.int64
    ref_dist, ref_ind = _exact_order(X, Q, k)
    np.testing.assert_array_equal(ind, ref_ind)  # exactly, ties to the lower index
    np.testing.assert_array_equal(dist, ref_dist)  # the true distances of those indices
    s_dist, s_ind = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(X).kneighbors(Q)
    np.testing.assert_allclose(dist, s_dist, rtol=1e-12)
    # scikit-learn orders rows at equal distance arbitrarily: its indices equal ours as sets
    # of rows strictly nearer than the k-th distance, and at the k-th distance are tied rows
    strict = dist < dist[:, -1:]
    for row in range(len(Q)):
        assert set(ind[row][strict[row]]) == set(s_ind[row][strict[row]])
        tied = s_ind[row][~strict[row]]
        kth = ((X[ind[row, -1]] - Q[row]) ** 2).sum()
        np.testing.assert_array_equal(((X[tied] - Q[row]) ** 2).sum(1), kth)
    assert (~strict).sum() > len(Q), "the digits should have ties at the k-th distance"


def test_near_neighbours_are_ordered_by_their_exact_distances():
    """Rows 1e-7 apart around a point far from the origin: ‖x‖² + ‖z‖² − 2xᵀz cancels to
    noise there (scikit-learn's brute force, which uses it, orders all 20 rows' neighbours
    wrongly); the refined candidates are ordered by their exact distances."""
    rng = np.random.default_rng(0)
    centre = np.full(5, 1e4)
    X = centre + 1e-7 * rng.normal(size=(400, 5))
    Q = centre + 1e-7 * rng.normal(size=(20, 5))
    dist, ind = KNeighborsRegressor(n_neighbors=4).fit(
        da.from_array(X, chunks=50), np.zeros(400)).kneighbors(Q)
    ref_dist, ref_ind = _exact_order(X, Q, 4)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_array_equal(dist, ref_dist)


def test_chunks_of_several_tiles_give_the_exact_neighbours():
    """Training chunks of 2,500 rows: two full 1,024-column tiles (searched in runs of 64
    columns) and a partial one, with a running bound carried across them."""
    rng = np.random.default_rng(1)
    X, Q = rng.normal(size=(5000, 3)), rng.normal(size=(1500, 3))
    dist, ind = KNeighborsRegressor(n_neighbors=6).fit(
        da.from_array(X, chunks=2500), np.zeros(5000)).kneighbors(Q)
    ref_dist, ref_ind = _exact_order(X, Q, 6)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_array_equal(dist, ref_dist)


def test_sparse_mask_search_equals_nonzero():
    from dkern.backends.neighbors import _true_entries

    rng = np.random.default_rng(2)
    for shape in [(300, 1024), (7, 960), (5, 100)]:
        mask = rng.random(shape) < 0.003
        np.testing.assert_array_equal(np.vstack(_true_entries(mask)), np.vstack(np.nonzero(mask)))


def test_classifier_and_regressor_equal_sklearn_on_real_data(digits):
    X, y, Q, yq, url = digits
    for weights in ("uniform", "distance"):
        ours = KNeighborsClassifier(n_neighbors=7, weights=weights).fit((url, "X"), y)
        theirs = SklearnKNC(n_neighbors=7, weights=weights, algorithm="brute").fit(X, y)
        np.testing.assert_allclose(ours.predict_proba(Q), theirs.predict_proba(Q), atol=1e-12)
        np.testing.assert_array_equal(ours.predict(Q), theirs.predict(Q))
        assert ours.score(Q, yq) == theirs.score(Q, yq) > 0.9
        reg = KNeighborsRegressor(n_neighbors=7, weights=weights).fit((url, "X"), (url, "y"))
        ref = SklearnKNR(n_neighbors=7, weights=weights, algorithm="brute").fit(X, y)
        np.testing.assert_allclose(reg.predict(Q), ref.predict(Q), rtol=1e-12)


def test_without_queries_each_training_row_is_not_its_own_neighbour(digits):
    X, y, _, _, _ = digits
    dist, ind = KNeighborsRegressor(n_neighbors=3).fit(X[:300], y[:300]).kneighbors()
    s_dist, s_ind = NearestNeighbors(n_neighbors=3, algorithm="brute").fit(X[:300]).kneighbors()
    np.testing.assert_allclose(dist, s_dist, rtol=1e-12)
    assert not (ind == np.arange(300)[:, None]).any()


def test_lazy_queries_give_lazy_results_equal_to_in_memory(digits):
    X, y, Q, _, url = digits
    model = KNeighborsClassifier(n_neighbors=5).fit((url, "X"), y)
    lazy = model.predict_proba(da.from_array(Q, chunks=100))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), model.predict_proba(Q))
    np.testing.assert_array_equal(model.predict(da.from_array(Q, chunks=100)).compute(),
                                  model.predict(Q))


@pytest.mark.parametrize("model", [KNeighborsClassifier(n_neighbors=4, weights="distance"),
                                   KNeighborsRegressor(n_neighbors=3)])
def test_save_and_load_round_trip(tmp_path, digits, model):
    X, y, Q, _, url = digits
    labels = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                       "nine"])[y] if isinstance(model, KNeighborsClassifier) else y
    fitted = model.fit((url, "X"), labels)
    dkern.save(fitted, tmp_path / "m.zarr")
    loaded = dkern.load(tmp_path / "m.zarr")
    assert type(loaded) is type(model) and loaded.get_params() == model.get_params()
    assert isinstance(loaded.X_fit_, da.Array)  # lazy rows stay lazy
    np.testing.assert_array_equal(loaded.predict(Q), fitted.predict(Q))


def test_bad_input_names_the_argument(digits):
    X, y, Q, _, _ = digits
    with pytest.raises(ValueError, match="n_neighbors must be an integer >= 1; got 0"):
        KNeighborsClassifier(n_neighbors=0).fit(X, y)
    with pytest.raises(ValueError, match="n_neighbors <= n_samples_fit, but n_neighbors = 11"):
        KNeighborsRegressor(n_neighbors=11).fit(X[:10], y[:10]).predict(Q)
    with pytest.raises(ValueError, match="weights must be one of"):
        KNeighborsRegressor(weights="gaussian").fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but KNeighborsClassifier is "
                                         "expecting 64"):
        KNeighborsClassifier().fit(X, y).predict(Q[:, :3])
    with pytest.raises(ValueError, match="0 sample"):
        KNeighborsClassifier().fit(X[:0], y[:0])
    with pytest.raises(ValueError, match="Unknown label type"):
        KNeighborsClassifier().fit(X, y + 0.5)


@pytest.mark.parametrize("metric, p", [("manhattan", 2), ("minkowski", 3), ("chebyshev", 2),
                                       ("minkowski", np.inf), ("cosine", 2), ("euclidean", 1)])
def test_metrics_equal_sklearns_distances_with_ties_to_the_lower_index(digits, metric, p):
    """scikit-learn's metric names and p, from the Zarr store: the distances of scikit-learn's
    brute force (1e-12), and the indices of the dense (distance, index) order of
    scikit-learn's pairwise_distances exactly (the digits tie often; scikit-learn orders ties
    arbitrarily). metric="euclidean" ignores p, as scikit-learn does."""
    X, _, Q, _, url = digits
    k = 7
    model = KNeighborsRegressor(n_neighbors=k, metric=metric, p=p).fit((url, "X"), (url, "y"))
    dist, ind = model.kneighbors(Q)
    theirs, _ = NearestNeighbors(n_neighbors=k, algorithm="brute", metric=metric,
                                 p=p).fit(X).kneighbors(Q)
    np.testing.assert_allclose(dist, theirs, rtol=1e-12, atol=1e-15)
    D = pairwise_distances(Q, X, metric=metric, **({"p": p} if metric == "minkowski" else {}))
    order = np.lexsort((np.broadcast_to(np.arange(len(X)), D.shape), D), axis=1)[:, :k]
    np.testing.assert_array_equal(ind, order)


def test_metric_predictions_equal_sklearns_on_real_data():
    """Manhattan and cosine neighbours' regression and votes equal scikit-learn's (diabetes:
    continuous features, no ties), in memory and on lazy rows; a saved model keeps them."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    labels = (y > np.median(y)).astype(int)
    for metric in ("manhattan", "cosine"):
        reg = KNeighborsRegressor(7, weights="distance", metric=metric).fit(X[:350], y[:350])
        ref = SklearnKNR(7, weights="distance", metric=metric, algorithm="brute")
        np.testing.assert_allclose(reg.predict(X[350:]),
                                   ref.fit(X[:350], y[:350]).predict(X[350:]), rtol=1e-12)
        lazy = da.from_array(X[350:], chunks=40)
        np.testing.assert_allclose(reg.predict(lazy).compute(), reg.predict(X[350:]),
                                   rtol=1e-14)
        clf = KNeighborsClassifier(9, metric=metric).fit(X[:350], labels[:350])
        ref = SklearnKNC(9, metric=metric, algorithm="brute").fit(X[:350], labels[:350])
        np.testing.assert_allclose(clf.predict_proba(X[350:]), ref.predict_proba(X[350:]))


def test_kneighbors_graph_equals_sklearns():
    """kneighbors_graph as scikit-learn's (diabetes: no ties), both modes, with queries and
    for the training rows themselves (each without itself), from lazy queries too."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    ours = KNeighborsRegressor(6).fit(X[:350], y[:350])
    theirs = SklearnKNR(6, algorithm="brute").fit(X[:350], y[:350])
    for Q in (X[350:], None):
        for mode in ("connectivity", "distance"):
            got, expected = ours.kneighbors_graph(Q, mode=mode), theirs.kneighbors_graph(Q,
                                                                                      mode=mode)
            assert got.shape == expected.shape and got.format == "csr"
            np.testing.assert_allclose(got.toarray(), expected.toarray(), rtol=1e-12)
    lazy = ours.kneighbors_graph(da.from_array(X[350:], chunks=30), n_neighbors=3)
    np.testing.assert_array_equal(lazy.toarray(),
                                  theirs.kneighbors_graph(X[350:], n_neighbors=3).toarray())
    with pytest.raises(ValueError, match=r"mode must be one of \['connectivity', 'distance'\]"):
        ours.kneighbors_graph(X[350:], mode="weights")


def test_metric_and_p_are_checked_and_saved(tmp_path, digits):
    X, y, Q, _, _ = digits
    with pytest.raises(ValueError, match=r"metric must be one of \['minkowski', 'euclidean'"):
        KNeighborsRegressor(metric="hamming").fit(X, y)
    for p in (0.5, "two", True, np.nan):
        with pytest.raises(ValueError, match="p must be a number >= 1 .*got"):
            KNeighborsRegressor(p=p).fit(X, y)
    fitted = KNeighborsClassifier(metric="minkowski", p=np.inf).fit(X, y)
    dkern.save(fitted, tmp_path / "m.zarr")
    loaded = dkern.load(tmp_path / "m.zarr")
    assert loaded.get_params() == fitted.get_params()
    np.testing.assert_array_equal(loaded.kneighbors(Q[:20])[1], fitted.kneighbors(Q[:20])[1])


@parametrize_with_checks([KNeighborsRegressor(), KNeighborsClassifier()])
def test_sklearn_estimator_checks(estimator, check):
    with dask.config.set(scheduler="synchronous"):
        check(estimator)


@pytest.mark.parametrize("scale", [1e-158, 1e-162])
def test_features_whose_squared_distances_are_subnormal_keep_every_neighbour(scale):
    """Features near 1e-157 make squared distances subnormal, where rounding is absolute:
    the relative error bounds dropped neighbours (distance inf, index 2^63 - 1, then an
    IndexError in predict). Now exact against scipy's cdist, as at ordinary scales."""
    from scipy.spatial.distance import cdist

    rng = np.random.default_rng(0)
    X, Q = rng.normal(size=(300, 4)) * scale, rng.normal(size=(30, 4)) * scale
    model = KNeighborsRegressor(7, backend="numpy").fit(X, np.arange(300.0))
    dist, idx = model.kneighbors(Q)
    D = cdist(Q, X)
    np.testing.assert_array_equal(dist, np.sort(D, axis=1)[:, :7])
    np.testing.assert_array_equal(np.take_along_axis(D, idx, axis=1), dist)
    np.testing.assert_allclose(model.predict(Q), np.arange(300.0)[idx].mean(axis=1))


def test_the_neighbour_reduction_takes_an_empty_query_chunk():
    """``nearest_neighbors`` called directly (the estimators drop empty chunks first) with
    query chunks (5, 0, 4): the same neighbours as scipy. On the old code the numpy block
    failed on the empty chunk ("zero-size array to reduction operation maximum"), then the
    records' reshape and merge did."""
    from scipy.spatial.distance import cdist

    from dkern.operators.reductions import nearest_neighbors

    rng = np.random.default_rng(0)
    Q, Z = rng.normal(size=(9, 2)), rng.normal(size=(40, 2))
    Qd = da.from_array(Q, chunks=((5, 0, 4), 2))
    with dask.config.set(scheduler="synchronous"):
        dist, idx = dask.compute(*nearest_neighbors(Qd, da.from_array(Z, chunks=20), 3,
                                                    backend="numpy"))
    D = cdist(Q, Z)
    np.testing.assert_array_equal(idx, np.argsort(D, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(dist, np.sort(D, axis=1)[:, :3], rtol=1e-14)


def test_dask_rows_with_an_empty_chunk_give_the_same_answers():
    """Queries chunked (10, 0, 20), training rows (100, 0, 200): kNN, radius neighbours and
    kernel logistic regression as without the empty chunk. On the old code the block
    reductions failed on it ("zero-size array to reduction operation maximum", "index 0 is
    out of bounds", dask's own max over an empty chunk in the Newton step)."""
    from dkern import KernelLogisticRegression, RadiusNeighborsRegressor

    rng = np.random.default_rng(0)
    X, Q = rng.normal(size=(300, 4)), rng.normal(size=(30, 4))
    Xd, Qd = (da.from_array(X, chunks=((100, 0, 200), 4)),
              da.from_array(Q, chunks=((10, 0, 20), 4)))
    knn = KNeighborsRegressor(3, backend="numpy").fit(X, X[:, 0])
    for got, want in zip(dask.compute(*knn.kneighbors(Qd)), knn.kneighbors(Q), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(knn.predict(Qd).compute(), knn.predict(Q))
    own = KNeighborsRegressor(3, backend="numpy").fit(Xd, X[:, 0])
    for got, want in zip(dask.compute(*own.kneighbors()), knn.kneighbors(), strict=True):
        np.testing.assert_array_equal(got, want)
    radius = RadiusNeighborsRegressor(1.5, backend="numpy").fit(X, X[:, 0])
    np.testing.assert_array_equal(radius.predict(Qd), radius.predict(Q))
    labels = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)
    np.testing.assert_allclose(
        KernelLogisticRegression(backend="numpy").fit(Xd, labels).predict_proba(Q),
        KernelLogisticRegression(backend="numpy").fit(X, labels).predict_proba(Q),
        rtol=0, atol=1e-12)
