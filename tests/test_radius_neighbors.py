"""Exact fixed-radius neighbours against scikit-learn's brute force, on real data
(scikit-learn's bundled diabetes study, standardised: continuous features, no ties)."""

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_diabetes
from sklearn.neighbors import NearestNeighbors
from sklearn.neighbors import RadiusNeighborsClassifier as SklearnRNC
from sklearn.neighbors import RadiusNeighborsRegressor as SklearnRNR
from sklearn.utils.estimator_checks import parametrize_with_checks

import dkern
from dkern import RadiusNeighborsClassifier, RadiusNeighborsRegressor


@pytest.fixture(autouse=True)
def _sync(sync_scheduler):
    """Dask's synchronous scheduler: no cluster needed."""


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), y


@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "cosine"])
def test_radius_neighbors_equal_sklearns_from_a_store(tmp_path, metric):
    """The same rows within the radius, with their distances (1e-12), by index or sorted by
    distance, from a Zarr store in several chunks, with queries and for the training rows
    themselves (each without itself); the graph as scikit-learn's."""
    X, y = _diabetes()
    url = str(tmp_path / "d.zarr")
    dkern.io.write_arrays(url, {"X": X[:350], "y": y[:350]}, chunk_rows=80)
    radius = {"euclidean": 2.5, "manhattan": 6.0, "cosine": 0.3}[metric]
    ours = RadiusNeighborsRegressor(radius, metric=metric).fit((url, "X"), (url, "y"))
    theirs = NearestNeighbors(radius=radius, metric=metric, algorithm="brute").fit(X[:350])
    for Q in (X[350:], None):
        for sort in (False, True):
            dist, ind = ours.radius_neighbors(Q, sort_results=sort)
            t_dist, t_ind = theirs.radius_neighbors(Q, sort_results=sort)
            assert len(ind) == len(t_ind) and sum(map(len, ind)) > 2 * len(ind)
            for d, i, td, ti in zip(dist, ind, t_dist, t_ind, strict=True):
                order = slice(None) if sort else np.argsort(ti)
                np.testing.assert_array_equal(i, ti[order])
                np.testing.assert_allclose(d, td[order], rtol=1e-12, atol=1e-14)
    got = ours.radius_neighbors_graph(X[350:], mode="distance")
    np.testing.assert_allclose(got.toarray(), theirs.radius_neighbors_graph(
        X[350:], mode="distance").toarray(), rtol=1e-12, atol=1e-14)


def test_regressor_and_classifier_equal_sklearns():
    """Predictions as scikit-learn's (uniform and distance weights, lazy queries too); a row
    with no neighbour: NaN and a warning (regression), refused or outlier_label (votes);
    a saved model predicts the same."""
    X, y = _diabetes()
    labels = np.where(y > np.median(y), "high", "low")
    Q = X[350:]
    for weights in ("uniform", "distance"):
        reg = RadiusNeighborsRegressor(3.0, weights=weights).fit(X[:350], y[:350])
        ref = SklearnRNR(radius=3.0, weights=weights, algorithm="brute").fit(X[:350], y[:350])
        np.testing.assert_allclose(reg.predict(Q), ref.predict(Q), rtol=1e-12)
        np.testing.assert_allclose(reg.predict(da.from_array(Q, chunks=30)), ref.predict(Q),
                                   rtol=1e-12)
        clf = RadiusNeighborsClassifier(3.0, weights=weights).fit(X[:350], labels[:350])
        ref = SklearnRNC(radius=3.0, weights=weights, algorithm="brute").fit(X[:350],
                                                                             labels[:350])
        np.testing.assert_allclose(clf.predict_proba(Q), ref.predict_proba(Q), rtol=1e-12)
        np.testing.assert_array_equal(clf.predict(Q), ref.predict(Q))
    far = Q[:3] + 100.0
    with pytest.warns(UserWarning, match="no neighbors within specified radius"):
        assert np.isnan(reg.predict(far)).all()
    with pytest.raises(ValueError, match=r"No neighbors found for test samples \[0 1 2\]"):
        RadiusNeighborsClassifier(1.0).fit(X[:350], labels[:350]).predict(far)
    for outlier in ("most_frequent", "none"):
        ours = RadiusNeighborsClassifier(1.0, outlier_label=outlier).fit(X[:350], labels[:350])
        ref = SklearnRNC(radius=1.0, outlier_label=outlier).fit(X[:350], labels[:350])
        np.testing.assert_array_equal(ours.predict(far), ref.predict(far))


def test_an_outlier_label_of_another_type_than_the_classes_is_refused():
    """Integer classes with outlier_label "unknown" (or -1.5): a batch with an outlier came
    back as strings (or floats), one without as ints (adversary H's repro_03). Refused at
    fit, as scikit-learn does; a label of the classes' type keeps their dtype."""
    X, y = _diabetes()
    codes = (y[:350] > 150).astype(np.int64)
    far = X[350:353] + 100.0
    for label in ("unknown", -1.5):
        with pytest.raises(TypeError, match=r"outlier_label=.* is not of the classes' type"):
            RadiusNeighborsClassifier(1.0, outlier_label=label).fit(X[:350], codes)
        with pytest.raises(TypeError):
            SklearnRNC(radius=1.0, outlier_label=label).fit(X[:350], codes)
    with pytest.raises(TypeError, match=r"outlier_label must be one label"):
        RadiusNeighborsClassifier(1.0, outlier_label=[0, 1]).fit(X[:350], codes)
    ours = RadiusNeighborsClassifier(1.0, outlier_label=-1).fit(X[:350], codes)
    ref = SklearnRNC(radius=1.0, outlier_label=-1).fit(X[:350], codes)
    got = ours.predict(np.vstack([X[350:360], far]))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref.predict(np.vstack([X[350:360], far])))


def test_save_load_and_refusals(tmp_path):
    X, y = _diabetes()
    fitted = RadiusNeighborsClassifier(8.0, metric="manhattan").fit(X[:300], y[:300] > 150)
    dkern.save(fitted, tmp_path / "m.zarr")
    loaded = dkern.load(tmp_path / "m.zarr")
    assert loaded.get_params() == fitted.get_params()
    np.testing.assert_array_equal(loaded.predict_proba(X[300:340]),
                                  fitted.predict_proba(X[300:340]))
    for radius in (-1.0, np.inf, "2"):
        with pytest.raises(ValueError, match="radius must be a finite number >= 0"):
            RadiusNeighborsRegressor(radius).fit(X, y)
    with pytest.raises(ValueError, match="metric must be one of"):
        RadiusNeighborsRegressor(metric="hamming").fit(X, y)
    duplicates = RadiusNeighborsRegressor(0.0).fit(np.vstack([X[:5], X[:5]]), np.ones(10))
    assert [list(i) for i in duplicates.radius_neighbors(X[:2])[1]] == [[0, 5], [1, 6]]
    with pytest.raises(ValueError, match="return_distance must be True if sort_results"):
        duplicates.radius_neighbors(X[:2], return_distance=False, sort_results=True)
    with pytest.raises(ValueError, match="mode must be one of"):
        RadiusNeighborsRegressor().fit(X, y).radius_neighbors_graph(mode="weights")


@parametrize_with_checks([RadiusNeighborsRegressor(), RadiusNeighborsClassifier()])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)
