"""Model files: round trips give identical predictions; refusals leave stores intact."""

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError

import dkern
from dkern import KernelRidge
from dkern.errors import DkernError, StoreError
from dkern.kernels import Gaussian, Laplacian, Matern, warp

pytestmark = pytest.mark.usefixtures("sync_scheduler")

RNG = np.random.default_rng(7)
X = RNG.normal(size=(300, 3))
Y = np.column_stack([np.sin(X[:, 0]) + X[:, 1] ** 2, np.cos(X[:, 2])])
X_NEW = RNG.normal(size=(120, 3))
KERNEL = 2.0 * Gaussian([1.0, 2.0, 0.5]) + Matern(1.5, nu=2.5)


def roundtrip(model, tmp_path, name="model.zarr"):
    url = str(tmp_path / name)
    dkern.save(model, url)
    return url, dkern.load(url)


def test_exact_round_trip_is_bitwise_equal(tmp_path):
    model = KernelRidge(KERNEL, alpha=0.3, solver="exact").fit(X, Y)
    url, loaded = roundtrip(model, tmp_path)
    assert np.array_equal(loaded.predict(X_NEW), model.predict(X_NEW))
    assert loaded.kernel == KERNEL and loaded.get_params()["alpha"] == 0.3
    assert isinstance(loaded.X_fit_, np.ndarray) and loaded.residuals_ is None
    attrs = dkern.io.read_attrs(url)
    assert attrs["dkern_model"] == "KernelRidge" and attrs["format"] == 2
    assert attrs["kernel"] == repr(KERNEL) and "kernel" not in attrs["params"]
    assert sorted(dkern.io.list_arrays(url)) == ["X_fit", "dual_coef"]


def test_cg_with_dask_x_round_trip_stays_lazy(tmp_path):
    Xd = da.from_array(X, chunks=100)
    model = KernelRidge(Laplacian(1.5), alpha=0.2, solver="cg", tol=1e-9,
                        random_state=1).fit(Xd, Y[:, 0])
    assert isinstance(model.dual_coef_, da.Array)
    url, loaded = roundtrip(model, tmp_path)
    assert isinstance(loaded.X_fit_, da.Array) and isinstance(loaded.dual_coef_, da.Array)
    assert loaded.X_fit_.chunks == Xd.chunks  # written chunk by chunk, never gathered
    assert np.array_equal(loaded.predict(X_NEW), model.predict(X_NEW))
    assert loaded.n_iter_ == model.n_iter_ and loaded.converged_
    np.testing.assert_array_equal(loaded.residuals_, model.residuals_)
    assert loaded.random_state == 1 and loaded.solver == "cg"


def test_nystrom_round_trip_default_kernel_and_feature_names(tmp_path):
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    model = KernelRidge(alpha=0.1, solver="nystrom", n_centers=40, random_state=0).fit(frame, Y)
    url, loaded = roundtrip(model, tmp_path)
    assert loaded.kernel is None and loaded.kernel_ == Gaussian(1.0)
    np.testing.assert_array_equal(loaded.centers_, model.centers_)
    assert list(loaded.feature_names_in_) == ["a", "b", "c"]
    new = pd.DataFrame(X_NEW, columns=["a", "b", "c"])
    assert np.array_equal(loaded.predict(new), model.predict(new))
    assert "X_fit" not in dkern.io.list_arrays(url)


def test_numpy_scalar_hyperparameters_are_stored_as_numbers(tmp_path):
    """As a GridSearchCV grid from np.arange / np.logspace hands them over."""
    model = KernelRidge(alpha=np.float32(0.5), solver="nystrom", n_centers=np.int64(30),
                        random_state=np.int64(3)).fit(X, Y)
    url, loaded = roundtrip(model, tmp_path)
    assert dkern.io.read_attrs(url)["params"]["n_centers"] == 30
    assert loaded.get_params()["alpha"] == 0.5 and loaded.random_state == 3
    assert np.array_equal(loaded.predict(X_NEW), model.predict(X_NEW))


def test_save_refuses_to_replace_a_model_and_keeps_the_old_one(tmp_path):
    old = KernelRidge(KERNEL, alpha=0.3, solver="exact").fit(X, Y)
    url, _ = roundtrip(old, tmp_path)
    new = KernelRidge(alpha=1.0, solver="nystrom", n_centers=30, random_state=0).fit(X, Y)
    with pytest.raises(StoreError, match="already holds a saved KernelRidge model; pass "
                                         "overwrite=True"):
        dkern.save(new, url)
    assert np.array_equal(dkern.load(url).predict(X_NEW), old.predict(X_NEW))
    dkern.save(new, url, overwrite=True)
    replaced = dkern.load(url)
    assert replaced.solver_ == "nystrom"
    assert np.array_equal(replaced.predict(X_NEW), new.predict(X_NEW))


def test_load_rejects_stores_that_are_not_models(tmp_path):
    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X}, attrs={"source": "synthetic"})
    with pytest.raises(StoreError, match=r"is not a dkern model store.*found None, attributes "
                                         r"\['source'\] and arrays \['X'\]"):
        dkern.load(url)
    with pytest.raises(StoreError, match="no Zarr group"):
        dkern.load(str(tmp_path / "missing.zarr"))


@pytest.mark.parametrize("attrs, message", [
    ({"format": 3}, "file of format 3 .*; this dkern .* reads model format 2 only"),
    ({"dkern_version": "1.0.0"}, "saved by dkern 1.0.0; this is dkern .* different major"),
])
def test_load_rejects_incompatible_models(tmp_path, attrs, message):
    url, _ = roundtrip(KernelRidge(solver="exact").fit(X, Y), tmp_path)
    dkern.io.write_arrays(url, {"note": np.zeros(1)}, attrs=attrs)
    with pytest.raises(StoreError, match=message):
        dkern.load(url)


def test_a_file_of_the_unreleased_format_1_is_refused_with_the_fix(tmp_path):
    """Format 1 was never released: no conversion, a message naming both formats and the fix."""
    url, _ = roundtrip(KernelRidge(solver="exact").fit(X, Y), tmp_path)
    dkern.io.write_arrays(url, {"note": np.zeros(1)}, attrs={"format": 1})
    with pytest.raises(StoreError) as err:
        dkern.load(url)
    assert (f"holds a KernelRidge model file of format 1 (written by dkern "
            f"{dkern.__version__}); this dkern {dkern.__version__} reads model format 2 only "
            "(no earlier format was released, so none is converted). Refit the model and "
            "save it again with this dkern.") in str(err.value)


def test_save_refuses_unfitted_and_unrestorable_models(tmp_path):
    with pytest.raises(NotFittedError):
        dkern.save(KernelRidge(), str(tmp_path / "a.zarr"))
    model = KernelRidge(warp(Gaussian(1.0), np.linalg.norm), solver="exact")
    model.set_params(kernel=warp(Gaussian(1.0), _row_norm)).fit(X, Y)
    with pytest.raises(DkernError, match="does not round-trip .* dkern never pickles"):
        dkern.save(model, str(tmp_path / "b.zarr"))
    assert not (tmp_path / "b.zarr").exists()


def _row_norm(rows):
    return 1.0 + np.linalg.norm(rows, axis=1)


def stored_folders(url):
    """Every version folder in the store, and those the pointer uses."""
    import os

    import zarr
    on_disk = set(os.listdir(os.path.join(url, ".dkern"))) - {"zarr.json", "zarr.pointer.json"}
    entries = zarr.open_group(url, mode="r").attrs["dkern"]["arrays"].values()
    return on_disk, {e["path"].split("/")[1] for e in entries}


def test_saving_over_a_model_leaves_exactly_the_new_model(tmp_path):
    old = KernelRidge(KERNEL, alpha=0.3, solver="exact").fit(X, Y)
    url, _ = roundtrip(old, tmp_path)
    new = KernelRidge(alpha=1.0, solver="nystrom", n_centers=30, random_state=0).fit(X, Y)
    dkern.save(new, url, overwrite=True)
    assert dkern.io.list_arrays(url) == ["centers", "dual_coef", "residuals"]  # no X_fit
    on_disk, used = stored_folders(url)
    assert on_disk == used  # the old n x d X_fit is gone from the disk too
    attrs = dkern.io.read_attrs(url)
    assert set(attrs) == {"dkern_model", "format", "dkern_version", "arrays", "kernel",
                          "kernel_is_default", "params", "fitted"}
    assert attrs["arrays"] == ["centers", "dual_coef", "residuals"]
    assert np.array_equal(dkern.load(url).predict(X_NEW), new.predict(X_NEW))


def _save_during_load(monkeypatch, model, url):
    """Make the next ``dkern.load`` publish ``model`` to ``url`` (save, overwrite=True)
    between reading the file's attributes and reading its arrays, as a writer in another
    process can."""
    from dkern.models import persist
    checked = persist.checked_model_file

    def then_save(*args, **kwargs):
        found = checked(*args, **kwargs)
        monkeypatch.setattr(persist, "checked_model_file", checked)
        dkern.save(model, url, overwrite=True)
        return found
    monkeypatch.setattr(persist, "checked_model_file", then_save)


def _two_models():
    first = KernelRidge(Gaussian(0.5), alpha=1e-3, solver="exact").fit(X, Y)
    second = KernelRidge(Gaussian(3.0), alpha=1e-3, solver="exact").fit(X, Y)  # same shapes
    return first, second


def test_a_save_during_load_is_reported_and_never_mixes_the_two_models(tmp_path, monkeypatch):
    """Issue: load took the kernel from one read of the pointer and each array from a new
    read, so a save(overwrite=True) in between gave A's kernel with B's coefficients
    (predictions of neither); now that load says the model was replaced, and loading
    again gives B."""
    first, second = _two_models()
    url, _ = roundtrip(first, tmp_path)
    _save_during_load(monkeypatch, second, url)
    with pytest.raises(StoreError, match=r"the model was replaced while loading it .*call "
                                         "dkern.load again"):
        dkern.load(url)
    np.testing.assert_array_equal(dkern.load(url).predict(X_NEW), second.predict(X_NEW))


def test_a_load_reads_every_array_from_the_version_it_started_with(tmp_path, monkeypatch):
    """While the replaced model's arrays are still on disk (its deletion not yet done, as a
    reader on a shared file system may see it), load gives exactly that model."""
    first, second = _two_models()
    url, _ = roundtrip(first, tmp_path)
    monkeypatch.setattr(dkern.io.write, "_delete_superseded", lambda *args: None)
    _save_during_load(monkeypatch, second, url)
    loaded = dkern.load(url)
    assert loaded.kernel == first.kernel
    np.testing.assert_array_equal(loaded.predict(X_NEW), first.predict(X_NEW))
    np.testing.assert_array_equal(dkern.load(url).predict(X_NEW), second.predict(X_NEW))


def test_resaving_a_lazily_loaded_model_to_its_own_url_keeps_it_working(tmp_path):
    Xd = da.from_array(X, chunks=100)
    model = KernelRidge(Laplacian(1.5), alpha=0.2, solver="cg", tol=1e-9,
                        random_state=1).fit(Xd, Y[:, 0])
    url, loaded = roundtrip(model, tmp_path)
    assert isinstance(loaded.X_fit_, da.Array) and isinstance(loaded.dual_coef_, da.Array)
    before = loaded.predict(X_NEW)
    dkern.save(loaded, url, overwrite=True)  # its X_fit_ and dual_coef_ read this very store
    np.testing.assert_array_equal(loaded.predict(X_NEW), before)
    np.testing.assert_array_equal(dkern.load(url).predict(X_NEW), model.predict(X_NEW))
    report = dkern.io.check_store(url)
    assert report.ok and report.orphans == []


@pytest.mark.parametrize("name", ["predict", "__class__", "kernel"])
def test_load_sets_only_known_fitted_attributes(tmp_path, name):
    url, _ = roundtrip(KernelRidge(solver="exact").fit(X, Y), tmp_path)
    fitted = {**dkern.io.read_attrs(url)["fitted"], name: 1}
    dkern.io.write_arrays(url, {"note": np.zeros(1)}, attrs={"fitted": fitted})  # checksummed
    with pytest.raises(StoreError, match=rf"'fitted' attributes name \['{name}'\] \(unknown "
                                         "to dkern.load"):
        dkern.load(url)


def _reseal_fitted(url, **changed):
    """Change the model's "fitted" attributes as a forger would: the pointer's checksum is
    recomputed (it detects damage, it is no signature)."""
    fitted = {**dkern.io.read_attrs(url)["fitted"], **changed}
    dkern.io.write_arrays(url, {"note": np.zeros(1)}, attrs={"fitted": fitted})


def test_a_huge_n_features_in_is_refused_before_anything_is_sized_by_it(tmp_path):
    """Issue: a forged n_features_in_ = 1e9 made load build a list of that many feature
    names (8 GB) before comparing it with the arrays' shapes."""
    import tracemalloc
    url, _ = roundtrip(KernelRidge(solver="exact").fit(X, Y), tmp_path)
    _reseal_fitted(url, n_features_in_=10**8)
    tracemalloc.start()
    try:
        with pytest.raises(StoreError, match=r"array 'X_fit' claims shape \(300, 3\).* d = "
                                             r"100000000 \(n_features_in_ = 100000000 in "
                                             r"'fitted'\); found d = 3"):
            dkern.load(url)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**26, peak  # the list alone took 800 MB


def test_feature_names_that_do_not_match_n_features_in_are_refused(tmp_path):
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    url, _ = roundtrip(KernelRidge(solver="exact").fit(frame, Y), tmp_path)
    _reseal_fitted(url, feature_names_in_=["a", "b"])
    with pytest.raises(StoreError, match=r"has n_features_in_ = 3 but 2 feature_names_in_"):
        dkern.load(url)


def _model_json(url):
    import os
    return os.path.join(url, "zarr.json")


def test_an_edited_lengthscale_is_refused_naming_the_file(tmp_path):
    model = KernelRidge(Gaussian(0.5), alpha=0.1, solver="exact").fit(X, Y)
    url, _ = roundtrip(model, tmp_path)
    path = _model_json(url)
    text = open(path).read()
    assert text.count("lengthscale=0.5") == 1
    with open(path, "w") as f:
        f.write(text.replace("lengthscale=0.5", "lengthscale=0.9"))
    with pytest.raises(StoreError, match=rf"the dkern pointer in '{path}' fails its checksum: "
                                         "the file was edited or damaged.*dkern.save the model"):
        dkern.load(url)


def test_bit_flips_in_the_model_metadata_load_identically_or_raise_a_store_error(tmp_path):
    model = KernelRidge(Gaussian([1.0, 2.0, 0.5]), alpha=0.1, solver="exact").fit(X, Y)
    url, _ = roundtrip(model, tmp_path)
    expected = model.predict(X_NEW)
    path = _model_json(url)
    original = open(path, "rb").read()
    rng = np.random.default_rng(17)
    outcomes = {"identical": 0, "StoreError": 0}
    for _ in range(150):
        raw = bytearray(original)
        raw[rng.integers(len(raw))] ^= 1 << int(rng.integers(8))
        with open(path, "wb") as f:
            f.write(bytes(raw))
        try:
            got = dkern.load(url).predict(X_NEW)
        except StoreError:
            outcomes["StoreError"] += 1
        else:
            assert np.array_equal(got, expected)  # e.g. a flip in insignificant whitespace
            outcomes["identical"] += 1
    with open(path, "wb") as f:
        f.write(original)
    assert outcomes["StoreError"] >= 100, outcomes  # nearly every flip changes what is read
    np.testing.assert_array_equal(dkern.load(url).predict(X_NEW), expected)


@pytest.mark.parametrize("overwrite", [False, True])
def test_saving_into_a_data_store_is_refused_even_with_overwrite(tmp_path, overwrite):
    """A model file replaces its whole store: following an 'overwrite' hint would have
    deleted the training data (it used to say "pass overwrite=True", and then did)."""
    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X})
    with pytest.raises(StoreError, match=r"holds data arrays \['X'\], not part of a saved"):
        dkern.save(KernelRidge(solver="exact").fit(X, Y), url, overwrite=overwrite)
    np.testing.assert_array_equal(dkern.io.open_array(url, "X").compute(), X)


def test_saving_over_a_model_keeps_arrays_written_beside_it(tmp_path):
    """Predictions written into a model's store (predict(out=(url, "mean"))) were deleted by
    the next save with overwrite=True; now that save is refused and both stay."""
    model = KernelRidge(solver="exact").fit(X, Y)
    url, _ = roundtrip(model, tmp_path)
    model.predict(X_NEW, out=(url, "mean"))
    with pytest.raises(StoreError, match=r"holds a saved KernelRidge model and data arrays "
                                         r"\['mean'\], not part of a saved model") as err:
        dkern.save(model, url, overwrite=True)
    assert "overwrite" not in str(err.value)
    np.testing.assert_array_equal(dkern.io.open_array(url, "mean").compute(),
                                  model.predict(X_NEW))
    np.testing.assert_array_equal(dkern.load(url).predict(X_NEW), model.predict(X_NEW))


# ------------------------------------------------------------- GaussianProcessClassifier
def _labelled(n_classes):
    """Rows of X labelled by which of n_classes angular sectors they fall in (numbers 0..k-1)."""
    angle = np.arctan2(X[:, 1], X[:, 0]) + np.pi
    return np.minimum((angle / (2 * np.pi) * n_classes).astype(int), n_classes - 1)


def test_classifier_round_trip_with_string_classes(tmp_path):
    """Binary, learned kernel, string labels: the file holds X, the label indices and pi
    (no n x n factor); the loaded model rebuilds its factors and predicts the same."""
    labels = np.array(["no", "yes"])[_labelled(2)]
    model = dkern.GaussianProcessClassifier(2.0 * Gaussian(1.5)).fit(X[:150], labels[:150])
    url, loaded = roundtrip(model, tmp_path)
    assert dkern.io.list_arrays(url) == ["X_fit", "pi", "y_train"]
    np.testing.assert_allclose(loaded.predict_proba(X_NEW), model.predict_proba(X_NEW),
                               rtol=0, atol=1e-12)
    assert loaded.classes_.dtype == model.classes_.dtype and loaded.classes_.tolist() == ["no",
                                                                                          "yes"]
    np.testing.assert_array_equal(loaded.predict(X_NEW), model.predict(X_NEW))
    assert loaded.kernel_ == model.kernel_ and loaded.kernel == 2.0 * Gaussian(1.5)
    assert loaded.kernel_ != loaded.kernel  # the learned hyperparameters were stored
    assert loaded.log_marginal_likelihood_value_ == model.log_marginal_likelihood_value_
    np.testing.assert_array_equal(loaded.n_iter_, model.n_iter_)
    assert loaded.optimizer == "lbfgs" and loaded.solver_ == "exact"


@pytest.mark.parametrize("labels", [
    lambda v: pd.Series(v),  # pandas' default str dtype
    lambda v: pd.Series(v, dtype=object),
    lambda v: pd.Categorical(v),
], ids=["str", "object", "categorical"])
def test_string_labels_held_as_objects_round_trip(tmp_path, labels):
    """String labels from pandas give classes_ of dtype object: the file was written, then
    refused by dkern.load as 'not written by dkern.save' (adversary H's repro_02)."""
    y = labels(np.array(["no", "yes"])[_labelled(2)][:150])
    model = dkern.KNeighborsClassifier(n_neighbors=3).fit(X[:150], y)
    assert model.classes_.dtype == object
    url, loaded = roundtrip(model, tmp_path)
    assert loaded.classes_.dtype == object and loaded.classes_.tolist() == ["no", "yes"]
    np.testing.assert_array_equal(loaded.predict(X_NEW), model.predict(X_NEW))


def test_classifier_round_trip_three_classes_learned_per_class(tmp_path):
    """One-vs-rest learns one kernel per class: all three are stored; int labels keep
    their dtype."""
    y = (_labelled(3) * 10).astype(np.int32)
    model = dkern.GaussianProcessClassifier(Gaussian(1.0)).fit(X[:150], y[:150])
    url, loaded = roundtrip(model, tmp_path)
    assert isinstance(loaded.kernel_, list) and loaded.kernel_ == model.kernel_
    assert dkern.io.read_attrs(url)["fitted_kernel"] == [repr(k) for k in model.kernel_]
    assert loaded.classes_.dtype == np.int32 and loaded.classes_.tolist() == [0, 10, 20]
    P = loaded.predict_proba(X_NEW)
    np.testing.assert_allclose(P, model.predict_proba(X_NEW), rtol=0, atol=1e-12)
    theta = np.concatenate([k.theta for k in model.kernel_])
    assert loaded.log_marginal_likelihood(theta) == pytest.approx(
        model.log_marginal_likelihood(theta), rel=1e-12)


def test_classifier_cg_round_trip_stays_lazy(tmp_path):
    Xd = da.from_array(X[:80], chunks=40)
    model = dkern.GaussianProcessClassifier(Gaussian(1.5), optimizer=None,
                                            solver="cg").fit(Xd, _labelled(2)[:80])
    url, loaded = roundtrip(model, tmp_path)
    assert isinstance(loaded.X_fit_, da.Array) and isinstance(loaded.pi_, da.Array)
    np.testing.assert_allclose(loaded.predict_proba(X_NEW[:20]), model.predict_proba(X_NEW[:20]),
                               rtol=0, atol=1e-12)
    assert loaded.log_marginal_likelihood_value_ == model.log_marginal_likelihood_value_


def test_classifier_with_labels_json_cannot_keep_is_refused(tmp_path):
    labels = np.array(["2026-01-01", "2026-06-01"], dtype="datetime64[D]")[_labelled(2)[:60]]
    model = dkern.GaussianProcessClassifier(optimizer=None).fit(X[:60], labels)
    with pytest.raises(DkernError, match=r"classes_ have dtype datetime64\[D\] .* Encode the "
                                         "labels as strings or integers"):
        dkern.save(model, str(tmp_path / "c.zarr"))
    assert not (tmp_path / "c.zarr").exists()


def test_model_on_dask_rows_across_clients_says_to_save_it(tmp_path):
    """CG's coefficients of dask rows stay persisted on the fitting cluster: under the next
    Client predict raises LostDataError with the remedy (it was distributed's bare
    "lost dependencies"), and the remedy works: saved there, loaded here, same numbers."""
    import dask
    from distributed import Client, LocalCluster

    from dkern.errors import LostDataError

    rng = np.random.default_rng(0)
    X, Xt = rng.normal(size=(150, 3)), rng.normal(size=(20, 3))
    y = np.sin(X[:, 0])
    model = KernelRidge(kernel=Gaussian(1.5), alpha=1e-2, solver="cg")
    url = str(tmp_path / "krr.zarr")
    for first in (True, False):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster) as client, \
                dask.config.set(scheduler=client):
            if first:
                want = model.fit(da.from_array(X, chunks=50), y).predict(Xt)
                dkern.save(model, url)
                continue
            with pytest.raises(LostDataError, match="dkern.save the model there") as info:
                model.predict(Xt)
            assert "lost dependencies" in str(info.value.__cause__)
            np.testing.assert_allclose(dkern.load(url).predict(Xt), want, rtol=1e-12)


DECLARED = [
    lambda: KernelRidge(solver="cg", tol=1e-6, random_state=0).fit(X[:60], Y[:60]),
    lambda: dkern.GaussianProcessRegressor(Gaussian(1.0), alpha=0.1, optimizer=None,
                                           n_centers=10, random_state=0).fit(X[:60], Y[:60]),
    lambda: dkern.GaussianProcessClassifier(Gaussian(1.0), optimizer=None).fit(
        X[:60], X[:60, 0] > 0),
    lambda: dkern.KernelLogisticRegression(alpha=0.1).fit(X[:60], np.arange(60) % 3),
    lambda: dkern.KernelDensity(bandwidth=0.5).fit(X[:60]),
    lambda: dkern.KernelDensity(bandwidth=0.5).fit(X[:60], sample_weight=np.arange(60) % 3 + 1.0),
    lambda: dkern.NadarayaWatson(bandwidth=0.5).fit(X[:60], Y[:60]),
    lambda: dkern.KNeighborsRegressor(n_neighbors=3).fit(X[:60], Y[:60, 0]),
    lambda: dkern.KNeighborsClassifier(n_neighbors=3).fit(X[:60], np.arange(60) % 2),
    lambda: dkern.RadiusNeighborsRegressor(2.0).fit(X[:60], Y[:60, 0]),
    lambda: dkern.RadiusNeighborsClassifier(2.0).fit(X[:60], np.arange(60) % 2),
]


@pytest.mark.parametrize("fitted_model", DECLARED)
def test_a_file_holds_what_its_class_declares(tmp_path, fitted_model):
    """save and load walk the class's declaration: the file holds its declared arrays and
    "fitted" names (with their kinds), and load gives back every declared attribute."""
    model = fitted_model()
    layout = model._file_layout()
    url, loaded = roundtrip(model, tmp_path)
    attrs = dkern.io.read_attrs(url)
    assert attrs["format"] == dkern.models.persist.MODEL_FORMAT
    assert attrs["arrays"] == sorted(dkern.io.list_arrays(url)) == sorted(
        name for name in layout.arrays if getattr(model, f"{name}_", None) is not None
        or name not in layout.optional)  # an optional array is stored when it is set
    optional = {"feature_names_in_", "sample_dim_"}  # set only by named (pandas, xarray) input
    assert set(layout.kinds()) - optional == set(attrs["fitted"])
    public = [f"{name}_" for name in layout.arrays if name not in layout.private] + [
        name for name in layout.scalars if name not in layout.private]
    for name in public:
        want, got = getattr(model, name), getattr(loaded, name)
        if isinstance(want, da.Array | np.ndarray):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        else:
            assert got == want or (want != want and got != got), name  # NaN == NaN


def _rewritten_with(url, name, index, value):
    """The model file at ``url`` written again by dkern's own writer (so every checksum
    holds) with ``array[index] = value``: an edit the checksums cannot see."""
    from dkern.io import list_arrays, open_array, read_attrs, write_arrays

    attrs = read_attrs(url)
    arrays = {n: np.asarray(open_array(url, n)) for n in list_arrays(url)}
    arrays[name] = arrays[name].copy()
    arrays[name][index] = value
    write_arrays(url, arrays, attrs=attrs, overwrite=True)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_model_file_holding_nan_or_inf_is_refused(tmp_path, value):
    """fit never stores NaN or infinity; a file holding them (here with valid checksums)
    gave NaN standard deviations without a word. An in-memory array (the exact GP's factor)
    is now refused at load; a lazy one (training rows that were a dask array) was already
    refused as it is read, like any lazy operand."""
    gp = dkern.GaussianProcessRegressor(Gaussian(1.0), alpha=0.1, solver="exact",
                                        optimizer=None).fit(X[:60], Y[:60, 0])
    url, _ = roundtrip(gp, tmp_path, "gp.zarr")
    _rewritten_with(url, "L", (3, 1), value)
    with pytest.raises(StoreError, match=r"the model's array 'L' holds NaN or infinity \(1 of "
                                         r"its values\).*edited or damaged"):
        dkern.load(url)
    kde = dkern.KernelDensity(bandwidth=0.5).fit(da.from_array(X, chunks=100))
    url, loaded = roundtrip(kde, tmp_path, "kde.zarr")
    np.testing.assert_allclose(loaded.score_samples(X_NEW), kde.score_samples(X_NEW),
                               rtol=1e-12)
    _rewritten_with(url, "X_fit", (250, 2), value)
    loaded = dkern.load(url)  # lazy: read, and checked, by the pass
    with pytest.raises(ValueError, match=r"X_fit contains NaN or infinity in rows \[0, 300\) "
                                         r"\(first at row 250\)"):
        np.asarray(loaded.score_samples(X_NEW))
