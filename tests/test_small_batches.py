"""Small passes over in-memory arrays run in this process (dkern.operators.in_process), with
the same results as on the cluster; the kNN block's k-d tiles (dkern.backends.spatial).

Each in-process result is compared with a dense reference and with the same call on the
cluster (the in-process cap set to 0); the scheduler's transition counter shows whether
the cluster was used at all.
"""

import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import futures_of
from scipy.special import logsumexp
from sklearn.datasets import load_diabetes
from sklearn.neighbors import NearestNeighbors

import dkern
from dkern.backends import neighbors, spatial
from dkern.io import write_array
from dkern.operators import in_process as in_process_module
from dkern.operators.in_process import in_process, pass_scheduler


def _transitions(client):
    """Task transitions the scheduler has made so far (unchanged: nothing was submitted)."""
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


def _settled_transitions(client, deadline_s=10.0):
    """The transition count once it holds still for 0.3 s: the session cluster releases
    an earlier call's results asynchronously (CI saw 2 transitions arrive late)."""
    count, end = _transitions(client), time.monotonic() + deadline_s
    while time.monotonic() < end:
        time.sleep(0.3)
        if (now := _transitions(client)) == count:
            return count
        count = now
    return count


def _on_both_paths(client, monkeypatch, call):
    """``call()`` in process and on the cluster: (in-process result, cluster result), after
    checking that only the second used the scheduler."""
    before = _settled_transitions(client)
    local = call()
    assert _transitions(client) == before, "the small pass went to the cluster"
    with monkeypatch.context() as patch:
        patch.setattr(in_process_module, "IN_PROCESS_PAIRS", 0)
        remote = call()
    assert _transitions(client) > before, "the large pass did not use the cluster"
    return local, remote


def _exact_order(X, Q, k):
    """The k nearest rows by (exact squared distance, index), and their distances."""
    D = ((Q[:, None, :] - X[None]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(np.arange(len(X)), D.shape), D), axis=1)[:, :k]
    return np.sqrt(np.take_along_axis(D, order, 1)), order


def _diabetes():
    data = load_diabetes()
    X = data.data[:, [2, 3, 8]]
    return (X - X.mean(0)) / X.std(0), data.target


def test_knn_in_process_equals_the_cluster_and_brute_force_with_ties(cluster_client,
                                                                     monkeypatch):
    """Rows on an integer grid (many rows at equal distance): the k nearest by (distance,
    index) on both paths, identical, and scikit-learn's brute force distances."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 6, size=(3000, 3)).astype(np.float64)
    Q = rng.integers(0, 6, size=(300, 3)).astype(np.float64) + 0.5 * (np.arange(300) % 2)[:, None]
    model = dkern.KNeighborsRegressor(n_neighbors=7, backend="numpy").fit(X, X[:, 0])
    (dist, ind), (dist_c, ind_c) = _on_both_paths(cluster_client, monkeypatch,
                                                  lambda: model.kneighbors(Q))
    ref_dist, ref_ind = _exact_order(X, Q, 7)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_array_equal(dist, ref_dist)
    np.testing.assert_array_equal(ind_c, ind)
    np.testing.assert_array_equal(dist_c, dist)
    sk_dist, _ = NearestNeighbors(n_neighbors=7, algorithm="brute").fit(X).kneighbors(Q)
    np.testing.assert_allclose(dist, sk_dist, rtol=1e-12, atol=1e-12)
    pred, pred_c = _on_both_paths(cluster_client, monkeypatch, lambda: model.predict(Q))
    np.testing.assert_array_equal(pred, pred_c)
    np.testing.assert_allclose(pred, X[ref_ind, 0].mean(axis=1), rtol=1e-14)


def test_kde_and_nadaraya_watson_in_process_equal_the_cluster_and_dense(cluster_client,
                                                                        monkeypatch):
    X, y = _diabetes()
    train, test, h = X[:300], X[300:], 0.4
    kde = dkern.KernelDensity(bandwidth=h, backend="numpy").fit(train)
    logp, logp_c = _on_both_paths(cluster_client, monkeypatch,
                                  lambda: kde.score_samples(test))
    L = -0.5 * (((test[:, None, :] - train[None]) / h) ** 2).sum(-1)
    dense = logsumexp(L, axis=1) - np.log(len(train)) - 1.5 * np.log(2 * np.pi * h * h)
    np.testing.assert_allclose(logp, dense, rtol=1e-12)
    np.testing.assert_array_equal(logp_c, logp)
    nw = dkern.NadarayaWatson(bandwidth=h, backend="numpy").fit(train, y[:300])
    pred, pred_c = _on_both_paths(cluster_client, monkeypatch, lambda: nw.predict(test))
    W = np.exp(L - L.max(axis=1, keepdims=True))
    np.testing.assert_allclose(pred, W @ y[:300] / W.sum(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(pred_c, pred)


def test_kernel_ridge_predict_in_process_equals_the_cluster(cluster_client, monkeypatch):
    X, y = _diabetes()
    model = dkern.KernelRidge(alpha=1.0, kernel=dkern.kernels.Gaussian(1.0), solver="exact",
                              backend="numpy").fit(X[:300], y[:300])
    pred, pred_c = _on_both_paths(cluster_client, monkeypatch, lambda: model.predict(X[300:]))
    K = np.exp(-0.5 * ((X[300:, None, :] - X[None, :300]) ** 2).sum(-1))
    np.testing.assert_allclose(pred, K @ model.dual_coef_, rtol=1e-10)
    np.testing.assert_array_equal(pred_c, pred)


def test_zarr_training_rows_stay_on_the_cluster(cluster_client, tmp_path):
    """Lazy rows are never gathered into this process: the pass runs on the workers, and
    lazy queries give lazy results."""
    X, y = _diabetes()
    url = str(tmp_path / "rows.zarr")
    write_array(X[:300], url, "X", chunk_rows=100)
    model = dkern.KNeighborsRegressor(n_neighbors=5, backend="numpy").fit((url, "X"), y[:300])
    before = _transitions(cluster_client)
    dist, ind = model.kneighbors(X[300:])
    assert _transitions(cluster_client) > before
    np.testing.assert_array_equal(ind, _exact_order(X[:300], X[300:], 5)[1])
    lazy = dkern.KernelDensity(bandwidth=0.5, backend="numpy").fit(X[:300]).score_samples(
        da.from_array(X[300:], chunks=50))
    assert isinstance(lazy, da.Array)


def test_in_process_only_for_in_memory_inputs_under_a_remote_scheduler(cluster_client):
    small, lazy = np.zeros((3, 2)), da.zeros((3, 2), chunks=1)
    with in_process(100, small, None, name="t") as local:
        assert local and pass_scheduler() == "threads"
    assert pass_scheduler() is None
    for args in [(100, small, lazy), (2**40, small), (100, small, ("file.zarr", "X"))]:
        with in_process(*args, name="t") as local:
            assert not local and pass_scheduler() is None
    with dask.config.set(scheduler="synchronous"), in_process(100, small, name="t") as local:
        assert not local and dask.config.get("scheduler") == "synchronous"


def test_in_process_leaves_other_threads_on_the_cluster(cluster_client):
    """The block is per call: dask's configuration is untouched, and another thread that
    computes and persists meanwhile still uses the cluster (its persisted array is held
    there, as futures), while this thread's pass scheduler is the threads."""
    entered, done, seen = threading.Event(), threading.Event(), {}

    def other():
        assert entered.wait(30)
        seen["scheduler"], before = pass_scheduler(), _transitions(cluster_client)
        seen["sum"] = int(da.arange(10, chunks=5).sum().compute())
        seen["futures"] = len(futures_of(dask.persist(da.ones(4, chunks=2))[0]))
        seen["transitions"] = _transitions(cluster_client) - before
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with in_process(100, np.zeros((3, 2)), name="t") as local:
        entered.set()
        finished = done.wait(60)
        assert local and pass_scheduler() == "threads"
        configured = dask.config.get("scheduler")
    thread.join(60)
    assert finished, "the other thread did not finish"
    assert seen == {"scheduler": None, "sum": 45, "futures": 2, "transitions": seen["transitions"]}
    assert seen["transitions"] > 0, "the other thread's work did not reach the cluster"
    assert configured is cluster_client


def test_nearest_block_given_any_row_order_equals_the_sorted_search(monkeypatch):
    """The order a fit keeps (tile_order), or any other permutation of the block's rows,
    gives the search's result: (distance, index) order, exact distances; an order of
    another block's length is refused."""
    monkeypatch.setattr(neighbors, "TILE", (64, 128))
    rng = np.random.default_rng(7)
    Z = rng.integers(-4, 5, size=(1000, 3)).astype(np.float64)
    Z[::89] *= 1e3
    X = rng.integers(-4, 5, size=(150, 3)).astype(np.float64)
    limit = neighbors.sample_bound(X, Z[:64], k=6)
    index = np.arange(40, 1040)[:, None]
    order = neighbors.tile_order(Z)
    assert order.shape == (1000, 1) and order.dtype == np.int32
    np.testing.assert_array_equal(order[:, 0], spatial.spatial_order(Z, 128)[1])
    ref_dist, ref_ind = _exact_order(Z, X, 6)
    for given in (None, order, np.arange(1000, dtype=np.int32)[::-1, None]):
        sq, ind = neighbors.nearest_block(X, Z, limit, index, given, k=6)
        np.testing.assert_array_equal(ind, ref_ind + 40)
        np.testing.assert_array_equal(np.sqrt(sq), ref_dist)
    with pytest.raises(ValueError, match="order must give the tile order of z's 1000 rows"):
        neighbors.nearest_block(X, Z, limit, index, order[:-1], k=6)


def test_knn_fit_orders_the_tiles_once_and_a_loaded_model_reuses_them(monkeypatch, tmp_path):
    """In-memory training rows are ordered into tiles at fit (and when a saved model is
    loaded): searches gather by that order and never sort, with the exact k nearest.
    Dask rows keep no order (each block sorts where it runs)."""
    monkeypatch.setattr(neighbors, "TILE", (64, 128))
    rng = np.random.default_rng(8)
    X = rng.integers(-3, 4, size=(5000, 3)).astype(np.float64)  # ties
    Q = rng.integers(-3, 4, size=(200, 3)) + 0.5 * (np.arange(200) % 2)[:, None]
    model = dkern.KNeighborsRegressor(n_neighbors=6, backend="numpy").fit(X, X[:, 1])
    assert model._tiles.chunks == (2500, 2500) and model._tiles.order.shape == (5000, 1)
    lazy = dkern.KNeighborsRegressor(n_neighbors=6, backend="numpy").fit(
        da.from_array(X, chunks=1000), X[:, 1])
    assert lazy._tiles is None
    ref_dist, ref_ind = _exact_order(X, Q, 6)
    np.testing.assert_array_equal(lazy.kneighbors(Q)[1], ref_ind)
    dkern.save(model, str(tmp_path / "knn.zarr"))
    loaded = dkern.load(str(tmp_path / "knn.zarr"))
    np.testing.assert_array_equal(loaded._tiles.order, model._tiles.order)

    def sorted_again(*args, **kwargs):
        raise AssertionError("a search sorted the training rows again")

    monkeypatch.setattr(neighbors, "spatial_order", sorted_again)
    for fitted in (model, loaded):
        dist, ind = fitted.kneighbors(Q)
        np.testing.assert_array_equal(ind, ref_ind)
        np.testing.assert_array_equal(dist, ref_dist)
        np.testing.assert_allclose(fitted.predict(Q), X[ref_ind, 1].mean(axis=1), rtol=1e-14)


@pytest.mark.parametrize("tile, product_rows", [((64, 128), 16), ((8192, 1024), 1024)])
def test_nearest_block_over_many_tiles_equals_the_exact_order(tile, product_rows, monkeypatch):
    """Several query and training tiles, products of a few rows, a partial last tile, rows
    on a grid (ties), and rows far from the rest: the k nearest by (distance, index) and
    their exact distances."""
    monkeypatch.setattr(neighbors, "TILE", tile)
    monkeypatch.setattr(neighbors, "PRODUCT_ROWS", product_rows)
    rng = np.random.default_rng(3)
    Z = rng.integers(-4, 5, size=(1500, 4)).astype(np.float64)
    Z[::97] *= 1e3
    X = np.vstack([rng.integers(-4, 5, size=(180, 4)), rng.normal(size=(20, 4)) * 50])
    limit = neighbors.sample_bound(X, Z[:64], k=5)
    index = np.arange(10, 1510)[:, None]  # global indices of a later block
    sq, ind = neighbors.nearest_block(X, Z, limit, index, k=5)
    ref_dist, ref_ind = _exact_order(Z, X, 5)
    np.testing.assert_array_equal(ind, ref_ind + 10)
    np.testing.assert_array_equal(np.sqrt(sq), ref_dist)
    # a tighter limit than any row's k-th: the slots past it stay (inf, PAD_INDEX)
    sq, ind = neighbors.nearest_block(X, Z, np.full((len(X), 1), 2.5), index, k=5)
    within = ref_dist <= np.sqrt(2.5)
    assert 0 < within.mean() < 1
    np.testing.assert_array_equal(ind, np.where(within, ref_ind + 10, neighbors.PAD_INDEX))
    np.testing.assert_array_equal(np.sqrt(sq), np.where(within, ref_dist, np.inf))


def test_sample_bound_bounds_the_exact_kth_distance():
    rng = np.random.default_rng(4)
    S, X = rng.normal(size=(300, 6)) + 1e4, rng.normal(size=(50, 6)) + 1e4
    exact = np.sort(((X[:, None] - S[None]) ** 2).sum(-1), axis=1)[:, 2]
    bound = neighbors.sample_bound(X, S, k=3)[:, 0]
    assert (bound >= exact).all() and (bound <= exact * (1 + 1e-6) + 1e-6).all()


def test_spatial_tiles_are_a_permutation_and_box_bounds_are_lower_bounds():
    rng = np.random.default_rng(5)
    A = rng.normal(size=(5120, 3))
    rows, order = spatial.spatial_order(A, 256)
    np.testing.assert_array_equal(np.sort(order), np.arange(5120))
    np.testing.assert_array_equal(rows, A[order])
    low, high = spatial.tile_boxes(rows, 256)
    assert low.shape == (20, 3)
    # compact: each tile's box is far smaller than the whole cloud's
    assert np.prod(high - low, axis=1).mean() < 0.1 * np.prod(A.max(0) - A.min(0))
    Q = rng.normal(size=(40, 3)) * 2
    bound = spatial.box_bounds(Q, low, high)
    D = ((Q[:, None] - rows[None]) ** 2).sum(-1).reshape(40, 20, 256).min(axis=2)
    assert (bound <= D).all() and (bound > 0.5 * D).mean() > 0.5


def test_gp_predict_in_process_equals_the_cluster_and_scikit_learn(cluster_client, monkeypatch):
    """The mean (every solver) and the std of the exact and Nyström posteriors run in this
    process, with the cluster's numbers and scikit-learn's; the std of "cg" stays on the
    cluster (its CG iterations are the client's)."""
    from sklearn.gaussian_process import GaussianProcessRegressor as SkGPR
    from sklearn.gaussian_process.kernels import RBF

    X, y = _diabetes()
    train, test, t = X[:300], X[300:], (y[:300] - y.mean()) / y.std()
    exact = dkern.GaussianProcessRegressor(dkern.kernels.Gaussian(1.3), alpha=0.3,
                                           optimizer=None, solver="exact",
                                           backend="numpy").fit(train, t)
    (mean, std), (mean_c, std_c) = _on_both_paths(
        cluster_client, monkeypatch, lambda: exact.predict(test, return_std=True))
    sk_mean, sk_std = SkGPR(RBF(1.3), alpha=0.3, optimizer=None).fit(train, t).predict(
        test, return_std=True)
    np.testing.assert_allclose(mean, sk_mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(std, sk_std, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(mean_c, mean)
    np.testing.assert_array_equal(std_c, std)
    sparse = dkern.GaussianProcessRegressor(dkern.kernels.Gaussian(1.3), alpha=0.3,
                                            optimizer=None, n_centers=40, random_state=0,
                                            backend="numpy").fit(train, t)
    (mean, std), (mean_c, std_c) = _on_both_paths(
        cluster_client, monkeypatch, lambda: sparse.predict(test, return_std=True))
    np.testing.assert_allclose(mean_c, mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(std_c, std, rtol=1e-12, atol=1e-14)
    cg = dkern.GaussianProcessRegressor(dkern.kernels.Gaussian(1.3), alpha=0.3, optimizer=None,
                                        solver="cg", tol=1e-10, backend="numpy").fit(train, t)
    mean, mean_c = _on_both_paths(cluster_client, monkeypatch, lambda: cg.predict(test))
    np.testing.assert_allclose(mean, sk_mean, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(mean_c, mean)
    before = _settled_transitions(cluster_client)
    np.testing.assert_allclose(cg.predict(test, return_std=True)[1], sk_std, rtol=1e-5)
    assert _transitions(cluster_client) > before, "the CG std did not run on the cluster"
