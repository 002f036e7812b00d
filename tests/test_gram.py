"""The lazy Gram operator against dense numpy products, for every input kind and chunking."""

import pickle
import tracemalloc
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import dkern
from dkern.io import open_array, write_array
from dkern.kernels import Gaussian, Laplacian, Linear
from dkern.operators import data_rows
from dkern.operators.base import LARGE_GRAPH_KEY, client_data_in_graph

RNG = np.random.default_rng(7)
N, M, D = 503, 311, 4
X = RNG.uniform(-2, 2, size=(N, D))
Z = RNG.uniform(-2, 2, size=(M, D))
KERNEL = Gaussian(1.3)
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def rel_err(got, want):
    return np.max(np.abs(got - want)) / np.max(np.abs(want))


def as_input(kind, A, chunks, tmp_path, name):
    """A as the operand a user would pass: numpy as is, dask in ``chunks``-row chunks, Zarr as
    ``(url, path)`` of a store written in ``chunks``-row chunks."""
    if kind == "numpy":
        return A
    if kind == "dask":
        return da.from_array(A, chunks=(chunks, -1))
    url = str(tmp_path / f"{name}.zarr")
    write_array(A, url, name, chunk_rows=chunks)
    return (url, name)


def stored_as_dask(A, chunks, tmp_path, name):
    """A written to a Zarr store in ``chunks``-row chunks and opened as a dask array with one
    task per Zarr chunk (``dkern.io.open_array``), so the operator sees the Zarr chunks."""
    url = str(tmp_path / f"{name}.zarr")
    write_array(A, url, name, chunk_rows=chunks)
    return open_array(url, name)


def reference(kernel, A, B, V):
    """The dense product in float64 on the operands as stored (float32 inputs are rounded
    first, so the float32 error bound measures the computation, not the input rounding)."""
    return kernel(A.astype(np.float64), B.astype(np.float64)) @ V


def regular(rows, n):
    return (rows,) * (n // rows) + ((n % rows,) if n % rows else ())


CHUNKINGS = {  # rows per chunk: uneven, one-row, single chunk
    "uneven": 97, "one_row": 1, "single": N,
}
#: Rows per chunk of Z. numpy X is always one operator chunk (dkern.gram chunks numpy input
#: itself, ~16 MiB), and a Zarr ``(url, path)`` X is read as whole Zarr chunks merged into
#: one operator chunk at this size, so for those two kinds Z carries the one-row chunks; with
#: dask X in one-row chunks, 16-row Z chunks give 61 x 3 tasks instead of 61 x 37.
Z_ROWS = {
    "numpy": {"uneven": 50, "one_row": 1, "single": M},
    "dask": {"uneven": 50, "one_row": 16, "single": M},
    "zarr": {"uneven": 50, "one_row": 1, "single": M},
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["numpy", "dask", "zarr"])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("t", [1, 3])
def test_matvec_matches_dense(kind, chunking, t, dtype, tmp_path, sync_scheduler):
    """N=503 != M=311 (one-row chunks: the first 61 and 37 rows, still unequal and
    unaligned: the claim is the chunk grid, and 503 one-row Zarr chunks cost 10 s a case).
    X from numpy, dask or a Zarr store (a genuine one-row-chunk store: one chunk file per
    row); Z a dask array (numpy for numpy X in a single chunk), or for Zarr a store opened
    with open_array.
    Measured relative errors: float64 <= 1.1e-15, float32 <= 8.1e-7."""
    n, m = (61, 37) if chunking == "one_row" else (N, M)
    rows, zrows = CHUNKINGS[chunking], Z_ROWS[kind][chunking]
    Xs, Zs = X[:n].astype(dtype), Z[:m].astype(dtype)
    Xin = as_input(kind, Xs, rows, tmp_path, "X")
    if kind == "zarr":
        Zin = stored_as_dask(Zs, zrows, tmp_path, "Z")
    elif kind == "numpy" and chunking == "single":
        Zin = Zs  # numpy on both sides
    else:
        Zin = da.from_array(Zs, chunks=(zrows, -1))
    V = RNG.normal(size=(m, t))
    op = dkern.gram(KERNEL, Xin, Zin, backend="numpy")
    # the chunk grid this case claims to test is the one the operator multiplies by
    assert op.Z.chunks[0] == regular(zrows, m)
    if kind == "dask":
        assert op.X.chunks[0] == regular(rows, n)
    elif kind == "numpy":
        assert op.X.chunks[0] == (n,)
    else:  # whole Zarr chunks per operator chunk
        assert sum(op.X.chunks[0]) == n and all(c % rows == 0 for c in op.X.chunks[0][:-1])
    assert op.dtype == dtype
    got = (op @ V[:, 0] if t == 1 else op @ V).compute()
    assert got.shape == ((n,) if t == 1 else (n, t)) and got.dtype == dtype
    assert rel_err(got.reshape(n, t), reference(KERNEL, Xs, Zs, V)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [1, 3])
def test_zarr_one_row_chunks_on_both_sides(dtype, t, tmp_path, sync_scheduler):
    """13 x 9, both operands stored one row per Zarr chunk: X read as (url, path), and as
    open_array's dask array so every operator block is 1 x 1 (13 x 9 tasks)."""
    Xs, Zs, V = X[:13].astype(dtype), Z[:9].astype(dtype), RNG.normal(size=(9, t))
    Zin = stored_as_dask(Zs, 1, tmp_path, "Z")
    want = reference(KERNEL, Xs, Zs, V)
    for Xin in (as_input("zarr", Xs, 1, tmp_path, "X"), open_array(str(tmp_path / "X.zarr"), "X")):
        op = dkern.gram(KERNEL, Xin, Zin, backend="numpy")
        assert op.Z.chunks[0] == (1,) * 9 and op.dtype == dtype
        got = (op @ V[:, 0] if t == 1 else op @ V).compute()
        assert rel_err(got.reshape(13, t), want) < TOL[dtype]
    assert op.X.chunks[0] == (1,) * 13  # the open_array case: 1 x 1 blocks


@pytest.mark.keops
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_keops_backend_through_dask(dtype, sync_scheduler):
    # d = 3 (X's first three columns): float64's is then the KeOps formula the other KeOps
    # tests compile (Gaussian, d = 3, V one column wide), not one more compile for d = 4
    X3, Z3 = X[:, :3], Z[:, :3]
    V = RNG.normal(size=(M, 1))
    op = dkern.gram(KERNEL, da.from_array(X3.astype(dtype), chunks=(97, -1)), Z3.astype(dtype),
                    backend="keops")
    assert rel_err((op @ V).compute(), KERNEL(X3, Z3) @ V) < TOL[dtype]


def _gram_tasks_by_worker(task_stream):
    """{worker address: number of dk-gram-mv block tasks it ran} from a task-stream
    record (a block task is named ``dk-gram-mv-…``, fused or not with its partial sum;
    the tree sum's tasks are ``dk-gram-mv-sum-…``)."""
    ran = {}
    for record in task_stream:
        key = record["key"]
        name = key[0] if isinstance(key, tuple) else str(key)
        if (name.startswith("dk-gram-mv-")
                and not name.startswith("dk-gram-mv-sum-")):
            ran[record["worker"]] = ran.get(record["worker"], 0) + 1
    return ran


@pytest.mark.distributed
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["numpy", "dask", "zarr"])
@pytest.mark.parametrize("t", [1, 3])
def test_matvec_on_local_cluster(cluster_client, kind, t, dtype, tmp_path):
    """On the shared LocalCluster (2 worker processes, 1 thread each): every block task ran
    on a worker (counted in the task stream), and with X in several row chunks both workers
    ran some. (With X in one chunk the scheduler may rightly keep all six blocks beside it.)"""
    from distributed import get_task_stream

    kernel = Laplacian(0.9) + 0.5 * Linear()
    Xs, Zs = X.astype(dtype), Z.astype(dtype)
    Xin = as_input(kind, Xs, 97, tmp_path, "X")
    Zin = (stored_as_dask(Zs, 60, tmp_path, "Z") if kind == "zarr"
           else da.from_array(Zs, chunks=(60, -1)))
    V = RNG.normal(size=(M, t))
    op = dkern.gram(kernel, Xin, Zin, backend="numpy")
    blocks = len(op.X.chunks[0]) * len(op.Z.chunks[0])  # numpy and Zarr X: 1 x 6; dask: 6 x 6
    with get_task_stream(cluster_client) as stream:
        got = cluster_client.compute(op @ V[:, 0] if t == 1 else op @ V).result()
    assert got.shape == ((N,) if t == 1 else (N, t)) and got.dtype == dtype
    assert rel_err(got.reshape(N, t), reference(kernel, Xs, Zs, V)) < TOL[dtype]
    workers = set(cluster_client.nthreads())
    ran = _gram_tasks_by_worker(stream.data)
    assert len(workers) == 2
    assert sum(ran.values()) == blocks, ran
    if len(op.X.chunks[0]) > 1:
        assert set(ran) == workers, f"block tasks ran only on {sorted(ran)} of {sorted(workers)}"


@pytest.mark.distributed
def test_in_memory_rows_reach_the_cluster_without_the_large_graph_warning(cluster_client):
    """In-memory rows are persisted into the graph on purpose (recomputable after a lost
    worker): 12.8 MB of them, past distributed's 10 MB warning, which advises the user to
    load the data with dask, raise no warning and equal the input on the cluster; the same
    persist without dkern's setting does warn."""
    X = np.random.default_rng(0).standard_normal((200_000, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Xd = data_rows(X)
    assert not [w for w in caught if "large graph" in str(w.message)]
    np.testing.assert_array_equal(Xd.compute(), X)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dask.persist(da.from_array(X + 1.0, chunks=(50_000, 8)))
    assert [w for w in caught if "large graph" in str(w.message)]



@pytest.mark.distributed
def test_a_large_broadcast_factor_reaches_the_cluster_without_the_large_graph_warning(
        cluster_client):
    """An exact GP's predictions broadcast its n x n factor to every test chunk: at
    n = 1,200 that is 11.5 MB, past distributed's 10 MB warning, which advised the user to
    load the data with dask (the factor is dkern's, not theirs). Sent before the graph, it
    raises no warning, and the mean and std on lazy test points equal scikit-learn's."""
    from sklearn.gaussian_process import GaussianProcessRegressor as SkGPR
    from sklearn.gaussian_process.kernels import RBF

    from dkern.models import GaussianProcessRegressor

    rng = np.random.default_rng(3)
    Xf, Xt = rng.normal(size=(1_200, 3)), rng.normal(size=(3_000, 3))
    yf = np.sin(Xf[:, 0]) + 0.1 * rng.normal(size=1_200)
    gp = GaussianProcessRegressor(kernel=Gaussian(1.3), alpha=0.05, optimizer=None).fit(Xf, yf)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean, std = dask.compute(*gp.predict(da.from_array(Xt, chunks=1_000), return_std=True))
    assert not [w for w in caught if "large graph" in str(w.message)]
    sk = SkGPR(RBF(1.3), alpha=0.05, optimizer=None).fit(Xf, yf)
    sk_mean, sk_std = sk.predict(Xt, return_std=True)
    np.testing.assert_allclose(mean, sk_mean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(std, sk_std, rtol=0, atol=1e-9)

def test_threads_persisting_rows_at_once_restore_the_warning_threshold():
    """dask's config is one dict per process: two threads persisting rows at once, the first
    leaving while the second still persists, keep the second's raise until it leaves, and
    the threshold is the user's again after both; a setting that is not a size is left as
    it is."""
    key = LARGE_GRAPH_KEY
    with dask.config.set({key: "10MB"}):
        first, second = client_data_in_graph(100_000_000), client_data_in_graph(50_000_000)
        first.__enter__()
        assert dask.config.get(key) == 110_000_000
        second.__enter__()
        assert dask.config.get(key) == 160_000_000
        first.__exit__(None, None, None)
        assert dask.config.get(key) == 60_000_000  # still covers the second's rows
        second.__exit__(None, None, None)
        assert dask.config.get(key) == "10MB"
    with dask.config.set({key: None}), client_data_in_graph(100):
        assert dask.config.get(key) is None


@pytest.mark.filterwarnings("ignore:Increasing number of chunks")  # 40 x 30 blocks, on purpose
def test_one_row_chunks_on_both_sides(sync_scheduler):
    Xs, Zs, V = X[:40], Z[:30], RNG.normal(size=(30, 2))
    op = dkern.gram(KERNEL, da.from_array(Xs, chunks=(1, -1)), da.from_array(Zs, chunks=(1, -1)),
                    backend="numpy")
    assert rel_err((op @ V).compute(), KERNEL(Xs, Zs) @ V) < 1e-12


def test_square_operator_shift_transpose_and_diag(sync_scheduler):
    op = dkern.gram(KERNEL, da.from_array(X, chunks=(128, -1)), backend="numpy")
    v = RNG.normal(size=N)
    dense = KERNEL(X, X)
    assert rel_err(((op + 0.25) @ v).compute(), (dense + 0.25 * np.eye(N)) @ v) < 1e-12
    assert rel_err(((0.25 + op) @ v).compute(), (dense + 0.25 * np.eye(N)) @ v) < 1e-12
    np.testing.assert_allclose((op + 0.25).diag().compute(), np.diag(dense) + 0.25, rtol=1e-15)
    rect = dkern.gram(KERNEL, X, Z, backend="numpy")
    w = RNG.normal(size=N)
    assert rect.T.shape == (M, N)
    assert rel_err((rect.T @ w).compute(), KERNEL(X, Z).T @ w) < 1e-12


def test_task_keys_read_well_in_dashboard(sync_scheduler):
    op = dkern.gram(KERNEL, da.from_array(X, chunks=(128, -1)), Z, backend="numpy")
    names = {k[0] if isinstance(k, tuple) else k for k in dict((op @ Z[:, 0]).dask)}
    assert any(n.startswith("dk-gram-mv-") for n in names)
    assert (op @ Z[:, :2]).name.startswith("dk-gram-mv-sum-")


def test_no_task_builds_the_dense_matrix(sync_scheduler):
    """n=40,000 × m=5,000: the dense Gram matrix would be 1.6 GB; the matvec must stay < 100 MB."""
    n, m = 40_000, 5_000
    Xb = RNG.uniform(size=(n, 3))
    Zb = RNG.uniform(size=(m, 3))
    V = RNG.normal(size=m)
    op = dkern.gram(Gaussian(0.5), da.from_array(Xb, chunks=(10_000, -1)),
                    da.from_array(Zb, chunks=(m, -1)), backend="numpy")
    product = op @ V
    tracemalloc.start()
    try:
        got = product.compute()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"peak traced memory {peak / 2**20:.0f} MiB"
    rows = RNG.choice(n, 200, replace=False)  # check a sample of rows densely
    np.testing.assert_allclose(got[rows], Gaussian(0.5)(Xb[rows], Zb) @ V, rtol=1e-11)


# ---------------------------------------------------------------- bad input
def test_nan_in_numpy_x_is_reported_with_name():
    bad = X.copy()
    bad[5, 1] = np.nan
    with pytest.raises(ValueError, match="X"):
        dkern.gram(KERNEL, bad, Z)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the unchecked run meets inf
def test_inf_in_dask_z_is_reported_lazily(sync_scheduler):
    bad = Z.copy()
    bad[200, 0] = np.inf
    op = dkern.gram(KERNEL, X, da.from_array(bad, chunks=(100, -1)), backend="numpy")
    with pytest.raises(ValueError, match="Z.*(NaN|Inf|finite)"):
        (op @ np.ones(M)).compute()
    unchecked = dkern.gram(KERNEL, X, da.from_array(bad, chunks=(100, -1)), backend="numpy",
                           check_finite=False)
    got = (unchecked @ np.ones(M)).compute()  # unchecked: no error, whatever the blocks make
    # of inf: the tiled path's expansion |x|² + |z|² − 2x·z gives inf − inf = NaN; the fused
    # C loop (dkern.backends.fused_cpu) takes exact differences, so k(x, z_200) = exp(−inf) = 0
    finite = np.delete(Z, 200, axis=0)
    assert np.isnan(got).any() or np.allclose(got, KERNEL(X, finite) @ np.ones(M - 1),
                                              rtol=1e-12)


def test_feature_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(503, 4\).*\(311, 3\)"):
        dkern.gram(KERNEL, X, Z[:, :3])


@pytest.mark.parametrize("make", [
    lambda k: dkern.gram(k, da.from_array(X, chunks=100)),
    lambda k: dkern.KernelRidge(k, solver="cg").fit(X, X[:, 0]),
    lambda k: dkern.KernelRidge(k, solver="nystrom", n_centers=20).fit(X, X[:, 0]),
])
def test_ard_lengthscale_of_the_wrong_length_is_refused_before_any_task(make):
    kernel = 2.0 * Gaussian([1.0, 2.0, 3.0]) + Linear()  # X has 4 features
    with pytest.raises(ValueError, match="lengthscale has 3 entries but the data has 4 features"):
        make(kernel)


def test_vector_length_mismatch_names_both_shapes():
    op = dkern.gram(KERNEL, X, Z, backend="numpy")
    with pytest.raises(ValueError, match=r"\(311,\).*\(503, 311\).*\(310,\)"):
        op @ np.ones(310)


def test_non_numeric_dtypes_are_type_errors():
    with pytest.raises(TypeError, match="X"):
        dkern.gram(KERNEL, X.astype(str), Z)
    op = dkern.gram(KERNEL, X, Z, backend="numpy")
    with pytest.raises(TypeError, match="V must be a real numeric array"):
        op @ np.array(["a"] * M)


def test_chunked_feature_axis_gives_the_fix():
    with pytest.raises(ValueError, match=r"X\.rechunk\(\{1: -1\}\)"):
        dkern.gram(KERNEL, da.from_array(X, chunks=(100, 2)), Z)


def test_unknown_backend_and_bad_kernel():
    with pytest.raises(ValueError, match="backend must be one of"):
        dkern.gram(KERNEL, X, backend="cuda")
    with pytest.raises(TypeError, match="kernel must be a dkern kernel"):
        dkern.gram("rbf", X)


def test_shift_and_diag_need_a_square_operator():
    op = dkern.gram(KERNEL, X, Z, backend="numpy")
    with pytest.raises(ValueError, match="square operator"):
        op + 1.0
    with pytest.raises(ValueError, match="square operator"):
        op.diag()
    square = dkern.gram(KERNEL, X, backend="numpy")
    for operand in (square, square + 1.0):
        with pytest.raises(TypeError, match="unsupported operand"):
            operand + "1.0"


def test_threaded_scheduler_gives_same_result():
    op = dkern.gram(KERNEL, da.from_array(X, chunks=(50, -1)), Z, backend="numpy")
    v = RNG.normal(size=M)
    with dask.config.set(scheduler="threads"):
        got = (op @ v).compute()
    assert rel_err(got, KERNEL(X, Z) @ v) < 1e-12


def _use_build_folder(folder):
    """pykeops.set_build_folder(folder) in a worker, without its side effect of writing the
    folder into the user's KeOps cache (~/.cache/keops2.3/build_folder_location.txt,
    naming a temporary folder after the test)."""
    import functools

    import keopscore
    import pykeops

    set_folder = keopscore.set_build_folder  # what pykeops.set_build_folder calls
    keopscore.set_build_folder = functools.partial(set_folder, write_save_file=False)
    try:
        pykeops.set_build_folder(folder)
    finally:
        keopscore.set_build_folder = set_folder


@pytest.mark.keops
@pytest.mark.distributed
def test_two_workers_compiling_one_new_formula_at_once(tmp_path):
    """KeOps corrupts its cache when two processes compile one formula together; dkern locks."""
    from distributed import Client, LocalCluster

    folder = str(tmp_path / "keops-build")  # empty: both workers must compile
    V = RNG.normal(size=(M, 1))
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.run(_use_build_folder, folder)
        op = dkern.gram(KERNEL, da.from_array(X, chunks=(130, -1)), Z, backend="keops")
        got = client.compute(op @ V).result()
        assert len(client.nthreads()) == 2
    assert rel_err(got, KERNEL(X, Z) @ V) < 1e-12


# ------------------------------------------------ pairwise_reduce: types, broadcast, rows
# Partial results keep their dtype (a structured one carries float64 and int64 fields side
# by side); small client arrays reach every task through one key; pairwise_rows maps row
# chunks alone (the Gram diagonal above runs on it).

def _far_index_block(x, z, index, *, offset):
    """Per row of x: the sum of z's entries (float64) and the largest index (int64)."""
    return (np.full((len(x), 1), z.sum()), np.full((len(x), 1), index.max() + offset))


def _take_larger(parts, axis, keepdims):
    """Combine of _far_index_block's records: the sums add, the larger index wins."""
    out = np.empty((len(parts), 1), parts.dtype)  # records (n, r, 1) merged along axis 1
    out["sum"] = parts["sum"].sum(axis=1)
    out["index"] = parts["index"].max(axis=1)
    return out[:, None] if keepdims else out


def test_structured_partials_keep_int64_indices_exact(sync_scheduler):
    """Indices above 2⁵³ survive the block, the tree merge and the field access: through
    float64 they would round to even."""
    from dkern.operators.pairwise import pairwise_reduce

    dtype = np.dtype([("sum", np.float64, (1,)), ("index", np.int64, (1,))])
    index = da.arange(M, chunks=53, dtype=np.int64)[:, None]
    out = pairwise_reduce(_far_index_block, da.from_array(X, chunks=(97, -1)),
                          da.from_array(Z, chunks=(53, -1)), [(index, "cols")], over="cols",
                          width=1, dtype=dtype, combine=_take_larger, name="test-typed",
                          offset=2**53)
    assert out.dtype == dtype and out["index"].dtype == np.int64
    got = out.compute()
    assert (got["index"][:, 0, 0] == 2**53 + M - 1).all()  # odd: float64 cannot hold it
    np.testing.assert_allclose(got["sum"][:, 0, 0], Z.sum(), rtol=1e-12)


def _project_block(x, z, *, C, w):
    """``(x C) w`` summed over z's rows; C and w broadcast to every task."""
    return (x @ C @ w)[:, None] * len(z)


def test_broadcast_arrays_reach_every_task_through_one_key(sync_scheduler):
    from dask.core import get_dependencies

    from dkern.operators.pairwise import pairwise_reduce

    C, w = RNG.normal(size=(D, 300)), RNG.normal(size=300)
    out = pairwise_reduce(_project_block, da.from_array(X, chunks=(97, -1)),
                          da.from_array(Z, chunks=(53, -1)), over="cols", width=1,
                          name="test-broadcast", broadcast={"C": C, "w": w})
    np.testing.assert_allclose(out.compute()[:, 0], X @ C @ w * M, rtol=1e-12)
    graph = dict(out.__dask_graph__())
    shared = [key for key in graph if str(key[0]).startswith("dk-bc-")]
    blocks = [key for key in graph if key[0].startswith("test-broadcast-")
              and not key[0].startswith("test-broadcast-sum-")]
    assert len(shared) == 2 and len(blocks) == 6 * 6  # one key per array, 6 × 6 chunk pairs
    for key in blocks:  # each task names the keys, and carries no copy of C (19 kB)
        assert set(shared) <= get_dependencies(graph, key)
        assert len(pickle.dumps(graph[key])) < C.nbytes / 4


def test_broadcast_of_a_chunked_dask_array_gives_the_fix():
    from dkern.operators.pairwise import pairwise_reduce

    with pytest.raises(ValueError, match=r"one chunk .* in 2 chunks.*x\.rechunk\(-1\)"):
        pairwise_reduce(_project_block, da.from_array(X, chunks=(97, -1)),
                        da.from_array(Z, chunks=(53, -1)), over="cols", width=1, name="t",
                        broadcast={"C": da.ones((D, 4), chunks=(2, 4)), "w": np.ones(4)})


def test_structured_block_returning_too_few_fields_says_so(sync_scheduler):
    from dkern.operators.pairwise import pairwise_reduce

    dtype = np.dtype([("a", np.float64), ("b", np.int64)])
    out = pairwise_reduce(lambda x, z: (np.zeros(len(x)),), da.from_array(X, chunks=(97, -1)),
                          da.from_array(Z, chunks=(53, -1)), over="cols", width=1,
                          dtype=dtype, name="t")
    with pytest.raises(ValueError, match=r"must return its 2 fields \('a', 'b'\); got 1"):
        out.compute()


def _whiten_block(x, scale, *, C):
    return (x @ C) * scale


def test_pairwise_rows_maps_row_chunks_with_operands_and_broadcast(sync_scheduler):
    from dkern.operators.pairwise import pairwise_rows

    C, scale = RNG.normal(size=(D, 3)), RNG.uniform(size=(N, 1))
    Xd = da.from_array(X, chunks=(97, -1))
    out = pairwise_rows(_whiten_block, Xd, [da.from_array(scale, chunks=(97, -1))], width=3,
                        dtype=np.float64, name="test-rows", broadcast={"C": C})
    assert out.chunks == (Xd.chunks[0], (3,))
    np.testing.assert_allclose(out.compute(), X @ C * scale, rtol=1e-14)
    diag = dkern.gram(KERNEL, Xd, backend="numpy").diag()
    assert diag.name.startswith("dk-diag-") and diag.chunks == (Xd.chunks[0],)
