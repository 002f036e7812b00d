"""A fitted model is a value (issue 27): fitted under ``dkern.connect()`` on Zarr rows, it
pickles and saves after that client has closed, and predicts the same in a fresh process.

Fits on dask or Zarr rows keep their n-sized coefficients persisted on the workers while
the client is open (CG vectors never cross to the client); the client connect() returns
gathers them into each model as it closes (``dkern._closing``). A plain
``distributed.Client`` has no such hook: there pickling says what was lost and how to
keep it, never dask's "Missing dependency".
"""

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import dask
import numpy as np
import pytest

import dkern
from dkern.errors import LostDataError
from dkern.kernels import Gaussian

pytestmark = [pytest.mark.distributed, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::dkern.errors.ConvergenceWarning")]

RNG = np.random.default_rng(7)
X = RNG.normal(size=(300, 3))
Y = np.sin(X[:, 0]) + 0.1 * RNG.normal(size=300)
LABELS = (Y > 0).astype(np.int64) + 2 * (X[:, 1] > 0.5)  # three classes
X_NEW = RNG.normal(size=(40, 3))

#: Every estimator (and each solver that keeps state on the cluster), with what it outputs.
MODELS = {
    "krr-cg": (lambda: dkern.KernelRidge(Gaussian(1.0), alpha=1e-2, solver="cg"), "y"),
    "krr-gd": (lambda: dkern.KernelRidge(Gaussian(1.0), alpha=1e-2, solver="gd",
                                         max_iter=20), "y"),
    "krr-nystrom": (lambda: dkern.KernelRidge(Gaussian(1.0), alpha=1e-2, solver="nystrom",
                                              n_centers=50, random_state=0), "y"),
    "gpr-cg": (lambda: dkern.GaussianProcessRegressor(Gaussian(1.0), alpha=1e-2, solver="cg",
                                                      optimizer=None, random_state=0), "y"),
    "gpr-nystrom": (lambda: dkern.GaussianProcessRegressor(
        Gaussian(1.0), alpha=1e-2, solver="nystrom", n_centers=50, optimizer=None,
        random_state=0), "y"),
    "klr": (lambda: dkern.KernelLogisticRegression(Gaussian(1.0), alpha=1e-2), "labels"),
    "gpc": (lambda: dkern.GaussianProcessClassifier(Gaussian(1.0), optimizer=None), "labels"),
    "kde": (lambda: dkern.KernelDensity(bandwidth=0.5), None),
    "nadaraya-watson": (lambda: dkern.NadarayaWatson(bandwidth=0.5), "y"),
    "knn-regressor": (lambda: dkern.KNeighborsRegressor(n_neighbors=5), "y"),
    "knn-classifier": (lambda: dkern.KNeighborsClassifier(n_neighbors=5), "labels"),
    "radius-regressor": (lambda: dkern.RadiusNeighborsRegressor(3.0), "y"),
    "radius-classifier": (lambda: dkern.RadiusNeighborsClassifier(
        3.0, outlier_label="most_frequent"), "labels"),
}


def outputs(name, model, X_new):
    """What the model answers at X_new, as numpy arrays (a GP's mean and std)."""
    if name == "kde":
        return [np.asarray(model.score_samples(X_new))]
    if name.startswith("gpr"):
        return [np.asarray(a) for a in model.predict(X_new, return_std=True)]
    if name in ("klr", "gpc", "knn-classifier", "radius-classifier"):
        return [np.asarray(model.predict_proba(X_new))]
    return [np.asarray(model.predict(X_new))]


FRESH = textwrap.dedent("""
    import pickle, sys
    import numpy as np
    import dkern
    sys.path.insert(0, sys.argv[1])
    from test_outlive_client import outputs
    folder = sys.argv[2]
    for name in sys.argv[3:]:
        with open(f"{folder}/{name}.pkl", "rb") as f:
            unpickled = pickle.load(f)
        loaded = dkern.load(f"{folder}/{name}.zarr")
        np.savez(f"{folder}/{name}.npz", *outputs(name, unpickled, np.load(f"{folder}/x.npy")),
                 *outputs(name, loaded, np.load(f"{folder}/x.npy")))
""")


def test_models_fitted_under_connect_outlive_it_in_a_fresh_process(tmp_path):
    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X, "y": Y, "labels": LABELS}, chunk_rows=100)
    models, want = {}, {}
    with dkern.connect(n_workers=2, threads_per_worker=1):
        for name, (make, target) in MODELS.items():
            model = make()
            models[name] = model.fit((url, "X"), (url, target)) if target else \
                model.fit((url, "X"))
            want[name] = outputs(name, model, X_NEW)
        held = {name for name, m in models.items() if m._cluster_held()}
    # the solvers that keep their coefficients on the cluster did, until the close
    assert {"krr-cg", "krr-gd", "gpr-cg", "klr"} <= held, held
    assert not any(m._cluster_held() for m in models.values())
    np.save(tmp_path / "x.npy", X_NEW)
    for name, model in models.items():
        (tmp_path / f"{name}.pkl").write_bytes(pickle.dumps(model))
        dkern.save(model, tmp_path / f"{name}.zarr")
    result = subprocess.run([sys.executable, "-c", FRESH, str(Path(__file__).parent),
                             str(tmp_path), *models], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in models:
        got = np.load(tmp_path / f"{name}.npz")
        arrays = [got[f"arr_{i}"] for i in range(len(got.files))]
        k = len(want[name])
        assert len(arrays) == 2 * k, name  # the unpickled and the loaded model
        for have, ref in zip(arrays, want[name] * 2, strict=True):
            np.testing.assert_allclose(have, ref, rtol=1e-12, atol=1e-12, err_msg=name)


def test_a_plain_client_s_model_says_what_was_lost(tmp_path):
    """Under a plain Client, closed: pickling and predicting raise LostDataError with the
    remedy; a model too large to gather refuses to pickle and names dkern.save."""
    from distributed import Client, LocalCluster

    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X, "y": Y}, chunk_rows=100)
    model = dkern.KernelRidge(Gaussian(1.0), alpha=1e-2, solver="cg")
    big = dkern.KernelRidge(Gaussian(1.0), alpha=1e-2, solver="cg")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        with dask.config.set(scheduler=client):
            model.fit((url, "X"), (url, "y"))
            want = big.fit((url, "X"), (url, "y")).predict(X_NEW)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr("dkern.models._model_file.GATHER_MAX_BYTES", 8 * 299)
                with pytest.raises(TypeError, match=r"dual_coef_ \(2.34 kiB\) are held .* "
                                   r"dkern.save\(model, 'model.zarr'\) while its client"):
                    pickle.dumps(big)
            kept = pickle.loads(pickle.dumps(big))  # under the limit, with the client open
            assert set(big._cluster_held()) == {"dual_coef_"}  # pickling left it as it was
    assert type(kept.dual_coef_) is np.ndarray
    np.testing.assert_allclose(kept.predict(X_NEW), want, rtol=1e-12)
    with pytest.raises(LostDataError, match="dkern.connect\\(\\) gathers them"):
        pickle.dumps(model)
    with pytest.raises(LostDataError, match="dkern.save the model there"):
        model.predict(X_NEW)


def test_a_refit_under_another_client_is_settled_by_that_client(tmp_path):
    """Fitted under client a, refitted under b: closing a leaves the model's arrays (b's)
    alone; pickling with no default client gathers through b into the pickle only, the
    GP keeping its posterior; closing b gathers them into the model; both predict alike."""
    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X, "y": Y}, chunk_rows=100)
    gp = dkern.GaussianProcessRegressor(Gaussian(1.0), alpha=1e-2, solver="cg",
                                        optimizer=None, random_state=0)
    # Each client restores dask's scheduler setting as it found it, so closing a before b
    # leaves "dask.distributed" behind with no client: the outer set puts it back after.
    with dask.config.set(scheduler=None), dkern.connect(n_workers=1) as a, \
            dkern.connect(n_workers=1) as b:
        with dask.config.set(scheduler=a):
            gp.fit((url, "X"), (url, "y"))
        with dask.config.set(scheduler=b):
            mean = gp.fit((url, "X"), (url, "y")).predict(X_NEW)
        posterior = gp._posterior
        a.close()
        assert set(gp._cluster_held(b.id)) == {"alpha_"}
        with dask.config.set(scheduler="sync"):
            twin = pickle.loads(pickle.dumps(gp))
        assert set(gp._cluster_held()) == {"alpha_"} and gp._posterior is posterior
    assert not gp._cluster_held() and type(gp.alpha_) is np.ndarray
    for model in (gp, twin):  # (the std after a close: the first test)
        with dask.config.set(scheduler="sync"):  # nested clients leave distributed's default
            np.testing.assert_allclose(model.predict(X_NEW), mean, rtol=1e-12, atol=1e-12)
