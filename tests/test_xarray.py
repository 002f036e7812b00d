"""xarray in and out: DataArrays and Datasets are rows along a sample dimension, dask-backed
ones stay lazy, and results come back as DataArrays with the sample coordinates.

References: the same estimators fitted on the same values as numpy (which the rest of the
suite checks against scikit-learn and dense solves).
"""

import numpy as np
import pandas as pd
import pytest

xr = pytest.importorskip("xarray")

import dask.array as da  # noqa: E402

from dkern import load, save  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402
from dkern.models import (  # noqa: E402
    GaussianProcessRegressor,
    KernelDensity,
    KernelLogisticRegression,
    KernelRidge,
    KNeighborsClassifier,
    NadarayaWatson,
)

pytestmark = pytest.mark.usefixtures("sync_scheduler")

N, D = 300, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, D))
Y = np.sin(X[:, 0]) + 0.1 * RNG.normal(size=N)
LABELS = np.where(Y > 0, "up", "down")
TIME = pd.date_range("2000-01-01", periods=N, freq="D")
NAMES = ["a", "b", "c"]


def _dataset():
    """X's columns as variables a, b, c along "time", with y."""
    data = {name: ("time", X[:, i]) for i, name in enumerate(NAMES)}
    return xr.Dataset({**data, "y": ("time", Y)}, coords={"time": TIME})


@pytest.fixture
def opened(tmp_path):
    """The Dataset written with xarray and opened lazily, in 4 chunks along time."""
    _dataset().to_zarr(tmp_path / "ds.zarr", mode="w", consolidated=False)
    return xr.open_zarr(tmp_path / "ds.zarr", consolidated=False).chunk({"time": N // 4})


def _transposed():
    """X as a (feature, time) DataArray: the layout a plain reshape gets wrong."""
    return xr.DataArray(X.T, dims=("feature", "time"),
                        coords={"feature": NAMES, "time": TIME})


def _y():
    return xr.DataArray(Y, dims="time", coords={"time": TIME})


def test_a_dask_backed_dataset_stays_lazy_and_predicts_as_numpy(opened):
    """Nadaraya-Watson on the opened Dataset: the model holds dask rows (nothing loaded
    whole), the prediction is a lazy DataArray along time, equal to the numpy fit's."""
    model = NadarayaWatson(bandwidth=0.7).fit(opened[NAMES], opened["y"])
    assert isinstance(model.X_fit_, da.Array) and isinstance(model.y_fit_, da.Array)
    assert model.sample_dim_ == "time"
    assert list(model.feature_names_in_) == NAMES
    pred = model.predict(opened)  # y is not a feature: the fitted names are taken
    assert isinstance(pred, xr.DataArray) and isinstance(pred.data, da.Array)
    assert pred.dims == ("time",) and pred.name == "prediction"
    np.testing.assert_array_equal(pred["time"].values, TIME.values)
    want = NadarayaWatson(bandwidth=0.7).fit(X, Y).predict(X)
    np.testing.assert_allclose(pred.values, want, rtol=1e-12)


def test_a_transposed_data_array_is_read_along_the_dimension_of_y():
    """(feature, time) X with y along time: before, 'y has 300 rows but X has 3'."""
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(_transposed(), _y())
    assert model.sample_dim_ == "time"
    assert list(model.feature_names_in_) == NAMES
    pred = model.predict(_transposed())
    want = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y).predict(X)
    assert pred.dims == ("time",)
    np.testing.assert_allclose(pred.values, want, rtol=0, atol=1e-12)
    # the same rows as (time, feature): the fitted sample dimension, not the first
    np.testing.assert_allclose(model.predict(_transposed().T).values, want, rtol=0, atol=1e-12)


def test_gp_mean_and_std_are_data_arrays_and_the_covariance_an_array():
    gp = GaussianProcessRegressor(Gaussian(1.0), alpha=0.1, optimizer=None).fit(_transposed(),
                                                                                 _y())
    ref = GaussianProcessRegressor(Gaussian(1.0), alpha=0.1, optimizer=None).fit(X, Y)
    mean, std = gp.predict(_transposed(), return_std=True)
    want_mean, want_std = ref.predict(X, return_std=True)
    assert (mean.name, std.name, std.dims) == ("prediction", "std", ("time",))
    np.testing.assert_allclose(mean.values, want_mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(std.values, want_std, rtol=0, atol=1e-12)
    _, cov = gp.predict(_transposed()[:, :5], return_cov=True)  # (5, 5): two time axes
    np.testing.assert_allclose(cov, ref.predict(X[:5], return_cov=True)[1], rtol=0, atol=1e-12)


def test_class_probabilities_carry_the_classes():
    labels = xr.DataArray(LABELS, dims="time", coords={"time": TIME})
    model = KernelLogisticRegression(Gaussian(1.0)).fit(_transposed(), labels)
    proba = model.predict_proba(_transposed())
    assert proba.dims == ("time", "class")
    assert list(proba["class"].values) == ["down", "up"]
    want = KernelLogisticRegression(Gaussian(1.0)).fit(X, LABELS).predict_proba(X)
    np.testing.assert_allclose(proba.values, want, rtol=0, atol=1e-10)
    assert list(model.predict(_transposed()).values) == list(np.asarray(model.classes_)[
        want.argmax(axis=1)])


def test_density_and_neighbours_keep_the_sample_coordinate(opened):
    kde = KernelDensity(bandwidth=0.5).fit(opened[["a", "b"]])
    logp = kde.score_samples(opened)
    want = KernelDensity(bandwidth=0.5).fit(X[:, :2]).score_samples(X[:, :2])
    assert logp.dims == ("time",)
    np.testing.assert_allclose(logp.values, want, rtol=1e-12)
    knn = KNeighborsClassifier(n_neighbors=3).fit(_transposed(),
                                                  xr.DataArray(LABELS, dims="time"))
    dist, ind = knn.kneighbors(_transposed()[:, :4])
    assert dist.dims == ind.dims == ("time", "neighbor")
    np.testing.assert_array_equal(ind.values, KNeighborsClassifier(n_neighbors=3).fit(
        X, LABELS).kneighbors(X[:4])[1])
    # a sparse graph has no coordinates: the same matrix as of numpy rows (it raised
    # "'DataArray' object has no attribute 'ravel'")
    graph = knn.kneighbors_graph(_transposed()[:, :4], mode="distance")
    want = KNeighborsClassifier(n_neighbors=3).fit(X, LABELS).kneighbors_graph(
        X[:4], mode="distance")
    assert abs(graph - want).max() <= 1e-12


def test_radius_neighbours_answer_with_data_arrays_of_the_sample_coordinate(opened):
    """Radius regression, votes and neighbour lists of xarray rows (a lazy Dataset, 4
    chunks) are DataArrays along time with its coordinate, holding scikit-learn's
    numbers (the same estimators on numpy, which test_radius_neighbors checks)."""
    from sklearn.neighbors import RadiusNeighborsClassifier as SklearnRNC
    from sklearn.neighbors import RadiusNeighborsRegressor as SklearnRNR

    from dkern.models import RadiusNeighborsClassifier, RadiusNeighborsRegressor

    labels = xr.DataArray(LABELS, dims="time", coords={"time": TIME})
    reg = RadiusNeighborsRegressor(1.5, weights="distance").fit(opened[NAMES], opened["y"])
    clf = RadiusNeighborsClassifier(1.5, outlier_label="up").fit(opened[NAMES], labels)
    pred, proba, votes = reg.predict(opened), clf.predict_proba(opened), clf.predict(opened)
    assert pred.dims == votes.dims == ("time",) and proba.dims == ("time", "class")
    for result in (pred, proba, votes):
        np.testing.assert_array_equal(result["time"].values, TIME.values)
    assert list(proba["class"].values) == ["down", "up"]
    np.testing.assert_allclose(pred.values, SklearnRNR(1.5, weights="distance").fit(
        X, Y).predict(X), rtol=0, atol=1e-12)
    theirs = SklearnRNC(1.5, outlier_label="up").fit(X, LABELS)
    np.testing.assert_allclose(proba.values, theirs.predict_proba(X), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(votes.values, theirs.predict(X))
    dist, ind = reg.radius_neighbors(opened.isel(time=slice(0, 5)), sort_results=True)
    assert dist.dims == ind.dims == ("time",)
    np.testing.assert_array_equal(ind["time"].values, TIME.values[:5])
    want = theirs.radius_neighbors(X[:5], sort_results=True)[1]
    for ours, expected in zip(ind.values, want, strict=True):
        np.testing.assert_array_equal(ours, expected)


def test_saved_models_keep_the_sample_dimension_and_feature_names(tmp_path, opened):
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="nystrom", n_centers=40,
                        random_state=0).fit(opened[NAMES], opened["y"])
    save(model, tmp_path / "m.zarr")
    back = load(tmp_path / "m.zarr")
    assert back.sample_dim_ == "time" and list(back.feature_names_in_) == NAMES
    np.testing.assert_array_equal(back.predict(opened).values, model.predict(opened).values)


def test_score_takes_xarray_and_refuses_other_samples():
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(_transposed(), _y())
    want = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y).score(X, Y)
    assert model.score(_transposed(), _y()) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="label different samples"):
        model.score(_transposed(), _y().isel(time=slice(None, None, -1)))


def test_refusals_name_what_is_wrong(opened):
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(opened[NAMES],
                                                                       opened["y"])
    with pytest.raises(ValueError, match=r"without the variables \['c'\]"):
        model.predict(opened[["a", "b"]])
    shifted = _y().assign_coords(time=TIME + pd.Timedelta("1D"))
    with pytest.raises(ValueError, match="label different samples along 'time'"):
        KernelRidge().fit(_transposed(), shifted)
    with pytest.raises(ValueError, match="y is a Dataset"):
        KernelRidge().fit(_transposed(), _y().to_dataset(name="y"))
    cube = xr.DataArray(np.zeros((2, 3, 4)), dims=("t", "f", "g"))
    with pytest.raises(ValueError, match="takes one or two dimensions"):
        KernelRidge().fit(cube, np.zeros(2))
    mixed = xr.Dataset({"a": ("t", np.zeros(4)), "b": ("s", np.zeros(4))})
    with pytest.raises(ValueError, match="share no dimension"):
        KernelRidge().fit(mixed, np.zeros(4))
    # a variable of several columns has no order of its own among the others: refused
    wide = xr.Dataset({"a": ("t", np.zeros(4)), "m": (("t", "k"), np.zeros((4, 2)))})
    with pytest.raises(ValueError, match="each variable of a Dataset is one feature"):
        KernelRidge().fit(wide, np.zeros(4))
    renamed = _transposed().rename(time="day")
    fitted = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(_transposed(), _y())
    with pytest.raises(ValueError, match="features"):  # day read as the features: 300 of them
        fitted.predict(renamed)


# ------------------------------------------------------ what dkern writes, read by xarray
def test_predictions_written_to_an_xarray_store_open_in_xarray(tmp_path):
    """predict(out=) into the store xarray wrote (with consolidated metadata, xarray's
    default): xr.open_zarr lists the prediction along time with the store's coordinates,
    plain zarr reads it, and a rewrite is seen as a whole."""
    import zarr

    from dkern.io import check_store, open_array

    url = str(tmp_path / "ds.zarr")
    _dataset().to_zarr(url, mode="w")  # consolidated, as xarray writes by default
    opened = xr.open_zarr(url)
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(opened[NAMES],
                                                                       opened["y"])
    assert model.predict(opened, out=(url, "pred")) == (url, "pred")
    want = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y).predict(X)
    back = xr.open_zarr(url)
    assert back["pred"].dims == ("time",)
    np.testing.assert_array_equal(back["time"].values, TIME.values)
    np.testing.assert_allclose(back["pred"].values, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(zarr.open_group(url, mode="r")["pred"][...],
                                  back["pred"].values)
    np.testing.assert_array_equal(open_array(url, "pred").compute(), back["pred"].values)
    model.set_params(alpha=1.0).fit(opened[NAMES], opened["y"])
    model.predict(opened, out=(url, "pred"), overwrite=True)
    np.testing.assert_array_equal(xr.open_zarr(url)["pred"].values,
                                  model.predict(X.copy()))
    assert check_store(url).ok


def _labelled_back(url, name):
    """The stored prediction ``name`` as xr.open_zarr reads the whole store, along "time"
    by its own coordinate, whatever its dimension is called."""
    stored = xr.open_zarr(url)[name]
    (dim,) = stored.dims
    return stored.rename({dim: "time"})


def test_predictions_of_reordered_rows_are_stored_with_their_own_labels(tmp_path):
    """X in another order than the store's rows (newest first): each stored prediction
    carries its row's label, so selecting a day gives that day's prediction; the store's
    "time" is not reused for rows it does not label in that order."""
    url = str(tmp_path / "ds.zarr")
    _dataset().to_zarr(url, mode="w")
    opened = xr.open_zarr(url)
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(opened[NAMES],
                                                                       opened["y"])
    model.predict(opened.isel(time=np.arange(N)[::-1]), out=(url, "pred"))
    want = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y).predict(X)
    back = _labelled_back(url, "pred")
    np.testing.assert_array_equal(back["time"].values, TIME.values[::-1])
    np.testing.assert_allclose(back.sel(time=TIME).values, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(xr.open_zarr(url)["y"].values, Y)


def test_predictions_of_a_row_subset_leave_the_store_open_in_xarray(tmp_path):
    """A prediction of the last 100 days written into the store of all 300: xr.open_zarr
    still opens the whole store, and each of the 100 predictions carries its day."""
    url = str(tmp_path / "ds.zarr")
    _dataset().to_zarr(url, mode="w")
    opened = xr.open_zarr(url)
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(opened[NAMES],
                                                                       opened["y"])
    model.predict(opened.isel(time=slice(200, N)), out=(url, "pred"))
    want = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y).predict(X)
    back = _labelled_back(url, "pred")
    np.testing.assert_array_equal(back["time"].values, TIME.values[200:])
    np.testing.assert_allclose(back.sel(time=TIME[200:]).values, want[200:], rtol=0,
                               atol=1e-12)
    whole = xr.open_zarr(url)
    assert whole.sizes["time"] == N
    np.testing.assert_array_equal(whole["a"].values, X[:, 0])


def test_gp_predictions_of_other_rows_than_the_group_s_keep_their_labels(tmp_path, opened):
    """mean and std of 100 days written over the group of all 300 days: they share one
    dimension of their own, labelled by those days, beside the 300-day coordinate."""
    url = str(tmp_path / "out.zarr")
    gp = GaussianProcessRegressor(Gaussian(1.0), alpha=0.1, optimizer=None).fit(
        opened[NAMES], opened["y"])
    gp.predict(opened, return_std=True, out=(url, "gp"))
    gp.predict(opened.isel(time=slice(0, N, 3)), return_std=True, out=(url, "gp"),
               overwrite=True)
    written = xr.open_zarr(url, group="gp")
    want_mean, want_std = gp.predict(X, return_std=True)
    dim = written["mean"].dims[0]
    assert written["std"].dims == (dim,) and dim != "time"
    days = {"time": TIME[::3]}
    np.testing.assert_allclose(written["mean"].rename({dim: "time"}).sel(days).values,
                               want_mean[::3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(written["std"].rename({dim: "time"}).sel(days).values,
                               want_std[::3], rtol=0, atol=1e-12)


def test_gp_mean_and_std_written_as_a_group_open_in_xarray(tmp_path, opened):
    url = str(tmp_path / "out.zarr")
    gp = GaussianProcessRegressor(Gaussian(1.0), alpha=0.1, optimizer=None).fit(
        opened[NAMES], opened["y"])
    gp.predict(opened, return_std=True, out=(url, "gp"))
    written = xr.open_zarr(url, group="gp", consolidated=False)
    want_mean, want_std = gp.predict(X, return_std=True)
    assert written["mean"].dims == written["std"].dims == ("time",)
    np.testing.assert_array_equal(written["time"].values, TIME.values)  # labels written too
    np.testing.assert_allclose(written["mean"].values, want_mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(written["std"].values, want_std, rtol=0, atol=1e-12)


def test_non_index_coordinates_are_written_as_coordinates(tmp_path, caplog):
    """X with coordinates along time besides its index (a number, a time, strings): the
    written predictions carry the numbers and times as xarray coordinates under their own
    names, equal to X's; a row subset written beside them gets them under names of its own
    (nothing of the group replaced); strings are left out with a warning naming them. On
    the old code only the index was written."""
    url = str(tmp_path / "out.zarr")
    labelled = xr.DataArray(X, dims=("time", "feature"), coords={
        "time": TIME, "feature": NAMES, "temperature": ("time", Y * 10),
        "recorded": ("time", TIME + pd.Timedelta("6h")), "tag": ("time", LABELS)})
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(labelled, _y())
    with caplog.at_level("WARNING", logger="dkern"):
        model.predict(labelled, out=(url, "pred"))
        model.predict(labelled.isel(time=slice(0, N, 2)), out=(url, "half"))
    back = xr.open_zarr(url, consolidated=False)
    assert set(back["pred"].coords) == {"time", "temperature", "recorded"}
    np.testing.assert_array_equal(back["temperature"].values, Y * 10)
    np.testing.assert_array_equal(back["recorded"].values, (TIME + pd.Timedelta("6h")).values)
    half = back["half"]
    (dim,) = half.dims
    assert dim != "time" and set(half.coords) == {dim, "half_temperature", "half_recorded"}
    np.testing.assert_array_equal(half["half_temperature"].values, Y[::2] * 10)
    assert set(back.data_vars) == {"pred", "half"}
    np.testing.assert_allclose(half.values, model.predict(X[::2]), rtol=0, atol=1e-12)
    assert "'tag' coordinate" in caplog.text


def test_a_dkern_data_store_opens_in_xarray_with_its_rows_aligned(tmp_path):
    from dkern.io import make_regression_store, open_array

    url = str(tmp_path / "data.zarr")
    make_regression_store(url, n=500, d=3, n_test=50, seed=0)
    ds = xr.open_zarr(url, consolidated=False)
    assert ds["X"].dims == ("sample", "feature") and ds["y"].dims == ("sample",)
    assert ds["X_test"].dims == ("test_sample", "feature")
    np.testing.assert_array_equal(ds["X"].values, open_array(url, "X").compute())


def test_what_is_not_an_array_is_never_moved_or_deleted(tmp_path):
    """A folder of other files, or a Zarr v2 array (which dkern does not count as an
    array), at a name dkern writes: kept as it is, and not linked over."""
    import os

    import zarr

    from dkern.io import open_array, write_array

    url = str(tmp_path / "s.zarr")
    write_array(np.zeros(2), url, "first")
    os.makedirs(os.path.join(url, "X"))
    with open(os.path.join(url, "X", "notes.csv"), "w") as f:
        f.write("keep me")
    zarr.create_array(store=os.path.join(url, "W"), shape=(3,), dtype="f8", zarr_format=2)
    for name in ("X", "W"):
        write_array(np.ones(3), url, name)
        np.testing.assert_array_equal(open_array(url, name).compute(), np.ones(3))
        assert not os.path.islink(os.path.join(url, name))
    with open(os.path.join(url, "X", "notes.csv")) as f:
        assert f.read() == "keep me"
    assert os.path.exists(os.path.join(url, "W", ".zarray"))


def test_a_plain_read_across_a_rewrite_is_not_protected_and_dkern_raises(tmp_path):
    """What README states of plain readers: one that opened an array before a rewrite
    published reads the old version's chunks as NaN (deleted at the publish) or the new
    version's (the link is followed per chunk); dkern's reader of the old version raises."""
    import zarr

    from dkern.errors import StoreError
    from dkern.io import open_array, write_array

    url = str(tmp_path / "s.zarr")
    write_array(np.arange(8.0), url, "pred", chunk_rows=4)
    plain = zarr.open_group(url, mode="r")["pred"]
    ours = open_array(url, "pred")
    assert plain[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    write_array(np.full(8, 7.0), url, "pred", chunk_rows=4, overwrite=True)
    rest = plain[4:]
    assert np.isnan(rest).all() or (rest == 7.0).all(), rest  # neither is the old version
    with pytest.raises((StoreError, FileNotFoundError)):
        ours.compute()


def test_a_plain_write_through_a_link_is_reported_as_damage(tmp_path):
    """Plain tools should only read: a plain-zarr write changes dkern's checksummed
    version in place, and dkern's check reports it."""
    import zarr

    from dkern.io import check_store, write_array

    url = str(tmp_path / "s.zarr")
    write_array(np.arange(8.0), url, "pred", chunk_rows=4)
    zarr.open_group(url, mode="r+")["pred"][0] = 99.0
    report = check_store(url)
    assert not report.ok and any("pred" in message for message in report.damage), report


def test_consolidated_metadata_lists_no_hidden_version(tmp_path):
    import json

    from dkern.io import write_array

    url = str(tmp_path / "ds.zarr")
    _dataset().to_zarr(url, mode="w")
    write_array(np.zeros(N), url, "pred", dims=("time",))
    write_array(np.ones(N), url, "pred", dims=("time",), overwrite=True)
    with open(f"{url}/zarr.json") as f:
        listed = json.load(f)["consolidated_metadata"]["metadata"]
    assert "pred" in listed and not [k for k in listed if ".dkern" in k], sorted(listed)
    np.testing.assert_array_equal(xr.open_zarr(url)["pred"].values, np.ones(N))


def test_links_are_dkern_s_own_and_nothing_else_is_touched(tmp_path, monkeypatch):
    """A name shows the pointer's array through a link; a plain folder standing at a name
    this write does not replace (a store copied without its links) is left as it is, and
    clean_store puts back a link that went missing."""
    import os
    import shutil

    from dkern.errors import StoreError
    from dkern.io import clean_store, open_array, write_array, write_arrays

    url = str(tmp_path / "s.zarr")
    write_array(np.arange(4.0), url, "a")
    target = os.readlink(os.path.join(url, "a"))
    assert target.startswith(".dkern/") and target.endswith("/a")
    os.unlink(os.path.join(url, "a"))
    shutil.copytree(os.path.join(url, target), os.path.join(url, "a"))  # a dereferenced copy
    write_array(np.ones(2), url, "b")
    assert not os.path.islink(os.path.join(url, "a"))  # the user's folder: kept as it is
    np.testing.assert_array_equal(open_array(url, "a").compute(), np.arange(4.0))
    os.unlink(os.path.join(url, "b"))
    clean_store(url)
    np.testing.assert_array_equal(xr.open_zarr(url, consolidated=False)["b"].values,
                                  np.ones(2))
    # a link of dkern's to an array the pointer dropped (the process died between the
    # publish and the unlinking, before the old version was deleted) is not an array
    import dkern.io.write as writer

    monkeypatch.setattr(writer, "show_published", lambda *args: [])
    monkeypatch.setattr(writer, "_delete_superseded", lambda *args: None)
    write_arrays(url, {"c": np.ones(1)}, overwrite=True, replace_all=True)
    assert os.path.islink(os.path.join(url, "b"))
    with pytest.raises(StoreError, match="no array 'b'"):
        open_array(url, "b")


# -------------------------------------- the workflow, on data larger than a worker's memory
#: One worker of two threads limited to 350 MB holds X: 450,000 rows x 100 features,
#: 360 MB, in 2,500-row chunks (2 MB; a task needs about 15 MB of the 28-43 MB dkern lets it
#: take, depending on what the worker process already holds: 5,000 rows needed 29 MB and
#: were refused once, 20,000 need 77 MB); the rows lie on a 2-D plane, so 8 centres model a
#: smooth target of them (as in tests/test_memory_limits.py).
BIG_LIMIT, BIG_N, BIG_D, BIG_CHUNK = 350_000_000, 450_000, 100, 2_500


def _big_dataset():
    """The Dataset, generated chunk by chunk on the cluster (never whole anywhere)."""
    rng = da.random.default_rng(0)
    Z = rng.normal(size=(BIG_N, 2), chunks=(BIG_CHUNK, 2))
    plane = np.linalg.qr(np.random.default_rng(7).normal(size=(BIG_D, 2)))[0].T
    y = da.sin(2 * Z[:, 0]) + da.cos(1.5 * Z[:, 1]) + 0.1 * rng.normal(size=BIG_N,
                                                                      chunks=BIG_CHUNK)
    return xr.Dataset({"X": (("sample", "feature"), Z @ plane), "y": ("sample", y)},
                      coords={"sample": np.arange(BIG_N)})


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.filterwarnings("ignore::dkern.errors.ConvergenceWarning")  # 1 step, on purpose
def test_xarray_workflow_on_data_larger_than_a_worker(tmp_path, record_figures):
    """xr.open_zarr (360 MB, dask-backed) -> fit (Nystrom KRR, 8 centres) -> predict(out=) ->
    xr.open_zarr reads the prediction with the sample coordinate; the worker's sampled
    memory stays under its 350 MB limit and it is never restarted, so nothing was loaded
    whole; the predictions are the model's and beat the mean by half."""
    import os
    import threading
    import time

    import dask
    from _daskproc import sample_worker_memory
    from distributed import Client, LocalCluster

    url = str(tmp_path / "big.zarr")
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit=BIG_LIMIT,
                      processes=True, host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client, dask.config.set(scheduler=client):
        pids = client.run(os.getpid)
        samples, stop = [], threading.Event()
        sampler = threading.Thread(target=sample_worker_memory, args=(client, samples, stop))
        sampler.start()
        start = time.perf_counter()
        try:
            data = _big_dataset()
            # X uncompressed: random doubles hardly compress (zstd kept 96% of the bytes),
            # and decoding them again in every pass only cost time
            data.to_zarr(url, mode="w", encoding={"X": {"compressors": None}})
            written = time.perf_counter()
            ds = xr.open_zarr(url)
            assert ds["X"].nbytes > BIG_LIMIT
            model = KernelRidge(Gaussian(1.0), alpha=1e-3, solver="nystrom", n_centers=8,
                                tol=1e-2, max_iter=1, random_state=0)
            # one CG step still streams X in five passes (K_nmᵀy, the step, the residual
            # checks) and predicts at 0.30 of the mean's MSE; each further step cost one
            # more pass over the 360 MB for little (3 steps: 0.27)
            model.fit(ds["X"], ds["y"])
            model.predict(ds["X"], out=(url, "pred"))
            done = time.perf_counter()
        finally:
            stop.set()
            sampler.join()
        assert client.run(os.getpid) == pids, "the worker was restarted (killed by its nanny?)"
    back = xr.open_zarr(url)
    assert back["pred"].dims == ("sample",)
    rows = back.isel(sample=slice(0, BIG_N, 997)).compute()
    np.testing.assert_array_equal(rows["sample"].values, np.arange(0, BIG_N, 997))
    np.testing.assert_allclose(rows["pred"].values, model.predict(rows["X"].values),
                               rtol=1e-10, atol=1e-12)
    mse = float(((rows["pred"] - rows["y"]) ** 2).mean())
    figures = {"input_bytes": int(ds["X"].nbytes), "worker_memory_limit": BIG_LIMIT,
               "peak_worker_memory_sampled": int(max(samples, default=0)),
               "write_s": round(written - start, 1), "fit_predict_s": round(done - written, 1),
               "test_mse": mse, "mse_predicting_mean": float(rows["y"].var())}
    record_figures("xarray_workflow", **figures)
    assert mse < 0.5 * float(rows["y"].var()), figures  # 8 centres: the mean is far worse
    assert max(samples) < 0.95 * BIG_LIMIT, figures


def test_predictions_on_a_store_without_links_never_replace_its_hidden_arrays():
    """On an object store xarray sees none of dkern's arrays: a prediction of a row subset
    wrote X's coordinate as 'sample', replacing the store's 50 labels by 5 (with
    overwrite), or was refused as taken. It now lies along a dimension of its own."""
    from dkern.io import list_arrays, open_array, write_arrays
    from dkern.models import KernelRidge

    url = "memory://xr-hidden-arrays"
    rng = np.random.default_rng(0)
    Xn = rng.normal(size=(50, 3))
    labels = np.arange(1000, 1050)
    write_arrays(url, {"X": Xn, "y": Xn.sum(1), "sample": labels},
                 dims={"X": ("sample", "feature"), "y": ("sample",), "sample": ("sample",)})
    model = KernelRidge(alpha=1.0).fit(Xn, Xn.sum(1))
    X = xr.DataArray(Xn, dims=("sample", "feature"), coords={"sample": labels})
    model.predict(X[:5], out=(url, "pred"), overwrite=True)
    model.predict(X, out=(url, "p2"))  # was refused: "already has arrays ['sample']"
    np.testing.assert_array_equal(open_array(url, "sample").compute(), labels)
    np.testing.assert_allclose(open_array(url, "pred").compute(), model.predict(Xn[:5]),
                               rtol=1e-12)
    assert {"pred", "p2"} <= set(list_arrays(url))


def test_coordinates_stay_lazy_survive_a_rewrite_and_odd_names_are_left_out(
        tmp_path, caplog, monkeypatch):
    """A dask-backed coordinate is written chunk by chunk, none of it read before the write
    (it was loaded whole on the client); a second write over the same rows keeps it as
    the prediction's coordinate (it turned into a data variable); a coordinate named so a
    store cannot hold it ('station id') is left out with a warning, not a failed write."""
    import dkern.io.write as write

    read = []

    def block(b, block_info=None):
        read.append(block_info[None]["array-location"][0])
        return b

    lat = da.map_blocks(block, da.from_array(Y * 10, chunks=N // 3), dtype=float)
    labelled = xr.DataArray(da.from_array(X, chunks=(N // 3, D)), dims=("time", "feature"),
                            coords={"time": TIME, "lat": ("time", lat),
                                    "station id": ("time", np.arange(N))})
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y)
    url = str(tmp_path / "out.zarr")
    publish, before_write = write._write_and_publish, []
    monkeypatch.setattr(write, "_write_and_publish",
                        lambda *a, **k: before_write.append(len(read)) or publish(*a, **k))
    with caplog.at_level("WARNING", logger="dkern"):
        model.predict(labelled, out=(url, "pred"))
    assert before_write == [0]
    assert "'station id' coordinate" in caplog.text
    model.predict(labelled, out=(url, "pred"), overwrite=True)
    back = xr.open_zarr(url, consolidated=False)
    assert set(back["pred"].coords) == {"time", "lat"} and set(back.data_vars) == {"pred"}
    np.testing.assert_array_equal(back["lat"].values, Y * 10)


def test_a_group_string_variable_named_like_a_coordinate_is_not_taken_for_it(tmp_path):
    """The group (written by xarray) has a string variable 'tag' over X's rows, and X a
    numeric 'tag' coordinate: the prediction is written along the group's "time", 'tag'
    is not marked as its coordinate (the values differ) and stays as it was. The group's
    times read back in ns and X's pandas times are in µs: the same instants, the same rows
    (on the old code the prediction got a dimension of its own)."""
    url = str(tmp_path / "ds.zarr")
    tags = np.array([f"t{i}" for i in range(N)])
    xr.Dataset({"tag": ("time", tags)}, coords={"time": TIME}).to_zarr(url, mode="w")
    labelled = xr.DataArray(X, dims=("time", "feature"),
                            coords={"time": TIME, "tag": ("time", np.arange(N) * 1.0)})
    model = KernelRidge(Gaussian(1.0), alpha=0.1, solver="exact").fit(X, Y)
    model.predict(labelled, out=(url, "pred"))
    back = xr.open_zarr(url)
    assert set(back["pred"].coords) == {"time"}
    np.testing.assert_array_equal(back["tag"].values, tags)
    np.testing.assert_allclose(back["pred"].values, model.predict(X), rtol=0, atol=1e-12)
