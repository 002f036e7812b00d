"""Checkpoint / resume of CG and Falkon, the lineage a checkpoint cuts, and watching a solve.

Resumed solves are compared bit for bit with uninterrupted ones (CPU float64, the same
chunking): the checkpoint stores every vector and scalar exactly.
"""

import json
import os
import threading
import time
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

from dkern.errors import DkernError
from dkern.kernels import Gaussian
from dkern.operators import gram
from dkern.solvers import SolveMonitor, cg, falkon, remove_checkpoint
from dkern.solvers.checkpoint import decode, encode


class Stop(Exception):
    """Raised by a callback to interrupt a solve, as a crash would."""


def stop_at(k_stop, seen=None):
    def callback(k, rel):
        if seen is not None:
            seen.append(k)
        if k == k_stop:
            raise Stop
    return callback


def _problem(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(n, 2)), rng.normal(size=n)


@pytest.fixture
def problem(sync_scheduler):
    X, y = _problem()
    # Gaussian(0.5) with alpha = 1e-2 takes 51 unpreconditioned CG steps to 1e-8
    return gram(Gaussian(0.5), da.from_array(X, chunks=200)) + 1e-2, X, y


def test_cg_resumes_where_it_stopped_and_ends_bitwise_equal(problem, tmp_path):
    A, _, y = problem
    ref = cg(A, y, tol=1e-8)
    assert ref.n_iter > 40 and ref.converged.all()
    ck = tmp_path / "ck"
    with pytest.raises(Stop):
        cg(A, y, tol=1e-8, checkpoint=ck, checkpoint_every=10, callback=stop_at(27))
    seen = []
    out = cg(A, y, tol=1e-8, checkpoint=ck, checkpoint_every=10, callback=stop_at(-1, seen))
    assert seen[0] == 20  # the last checkpoint: 7 (<= k = 10) iterations redone
    assert out.n_iter == ref.n_iter
    np.testing.assert_array_equal(out.x.compute(), ref.x.compute())
    np.testing.assert_array_equal(out.residuals, ref.residuals)
    seen.clear()  # a completed checkpoint is not resumed: the next solve starts afresh
    with pytest.raises(Stop):
        cg(A, y, tol=1e-8, checkpoint=ck, checkpoint_every=10, callback=stop_at(0, seen))
    assert seen == [0]


def test_falkon_resumes_where_it_stopped_and_ends_bitwise_equal(sync_scheduler, tmp_path):
    X, y = _problem()
    Xd, C = da.from_array(X, chunks=100), X[:40]
    kw = dict(tol=1e-10, max_iter=500, sketch_rows=0)  # 87 iterations
    ref = falkon(Gaussian(0.2), Xd, y, C, 1e-3, **kw)
    assert ref.n_iter > 60 and ref.converged.all()
    ck = tmp_path / "ck"
    with pytest.raises(Stop):
        falkon(Gaussian(0.2), Xd, y, C, 1e-3, checkpoint=ck, checkpoint_every=20,
               callback=stop_at(55), **kw)
    seen = []
    out = falkon(Gaussian(0.2), Xd, y, C, 1e-3, checkpoint=ck, checkpoint_every=20,
                 callback=stop_at(-1, seen), **kw)
    assert seen[0] == 40 and out.n_iter == ref.n_iter
    np.testing.assert_array_equal(out.beta, ref.beta)
    np.testing.assert_array_equal(out.residuals, ref.residuals)


def test_a_checkpoint_whose_residual_is_not_its_iterate_s_is_not_called_converged(
        problem, tmp_path):
    """A finished solve's checkpoint, its iterate doubled and marked unfinished (written
    with dkern's own writer, so every checksum holds): the resumed solve used to stop at
    once on the saved residual, "converged", 1.8 from the solution. A saved residual is no
    longer taken as true: the first true residual shows the jump, and the solve ends
    unconverged with a ConvergenceWarning, not a silent wrong answer."""
    from dkern.errors import ConvergenceWarning
    from dkern.io import open_array, read_attrs, read_manifest, write_arrays

    A, _, y = problem
    ck = str(tmp_path / "ck")
    cg(A, y, tol=1e-8, checkpoint=ck, checkpoint_every=10)
    attrs = read_attrs(ck)
    meta = attrs["dkern_checkpoint"]
    assert meta["complete"]
    vectors = {name: open_array(ck, name).compute() for name in read_manifest(ck)[1]}
    vectors["X"] = 2 * vectors["X"]
    forged = {**meta, "complete": False, "arrays": sorted(set(vectors) - {"history"})}
    write_arrays(ck, vectors, attrs={**attrs, "dkern_checkpoint": forged}, overwrite=True,
                 replace_all=True)
    with pytest.warns(ConvergenceWarning, match="above tol"):
        out = cg(A, y, tol=1e-8, checkpoint=ck, checkpoint_every=10)
    assert not out.converged.any() and out.residuals[-1].max() > 1e-3


def test_checkpoint_of_another_problem_is_refused(problem, tmp_path):
    A, X, y = problem
    ck = tmp_path / "ck"
    with pytest.raises(Stop):
        cg(A, y, tol=1e-8, checkpoint=ck, checkpoint_every=5, callback=stop_at(12))
    other = gram(Gaussian(0.5), da.from_array(X, chunks=200)) + 2e-3  # another alpha
    with pytest.raises(DkernError, match=r"another problem \(its operator differ"):
        cg(other, y, tol=1e-8, checkpoint=ck, checkpoint_every=5)
    with pytest.raises(DkernError, match=r"its data, operator"):
        cg(A, y + 1.0, tol=1e-8, checkpoint=ck, checkpoint_every=5)
    with pytest.raises(DkernError, match=r"its settings differ"):
        cg(A, y, tol=1e-7, checkpoint=ck, checkpoint_every=5)
    remove_checkpoint(ck)
    assert not ck.exists()


def test_a_folder_that_is_not_a_checkpoint_is_refused_and_kept(problem, tmp_path):
    A, _, y = problem
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DkernError, match="is not a dkern checkpoint"):
        cg(A, y, checkpoint=tmp_path)
    with pytest.raises(DkernError, match="is not a dkern checkpoint"):
        remove_checkpoint(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 1; got 0"):
        cg(A, y, checkpoint=tmp_path / "ck", checkpoint_every=0)


def test_state_encoding_is_exact():
    state = {"a": np.array([0.1, np.inf, -0.0, 5e-324]), "b": np.array([True, False]),
             "r": [(3, np.array([1 / 3]))], "k": 7}
    back = decode(json.loads(json.dumps(encode(state))), list(state))
    assert back["a"].tobytes() == state["a"].tobytes()
    np.testing.assert_array_equal(back["b"], state["b"])
    assert back["r"][0][0] == 3 and back["r"][0][1][0] == 1 / 3 and back["k"] == 7


def test_monitor_is_readable_from_another_thread_while_the_solve_runs(problem):
    A, _, y = problem
    monitor, seen_live = SolveMonitor(), []
    release = threading.Event()

    def slow(k, rel):  # the solve's callback: hold iteration 20 until the watcher has looked
        monitor(k, rel)
        if k == 20:
            release.wait(30)

    solve = threading.Thread(
        target=lambda: seen_live.append(cg(A, y, tol=1e-8, max_iter=25, callback=slow)))
    solve.start()
    deadline = time.monotonic() + 30
    while len(monitor.iterations) < 21 and time.monotonic() < deadline:
        time.sleep(0.01)
    live, running = monitor.residuals(), not seen_live
    release.set()
    solve.join(60)
    assert running and live.shape == (21, 1)
    (result,) = seen_live
    assert monitor.iterations == list(range(result.n_iter + 1))
    np.testing.assert_array_equal(live, result.residuals[:21])


@pytest.mark.distributed
def test_iteration_numbers_reach_the_scheduler_as_annotations(cluster_client):
    X, y = _problem(200)
    A = gram(Gaussian(0.5), da.from_array(X, chunks=100)) + 1e-3
    found = {}

    def look(k, rel):
        if k == 3:
            found[k] = cluster_client.run_on_scheduler(_annotations)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter is the point
        cg(A, y, tol=1e-8, max_iter=4, callback=look)
    assert 3 in found[3] and 4 not in found[3], found  # iteration 3's vectors carry its number


def _annotations(dask_scheduler):
    return sorted({ts.annotations["dkern_iteration"] for ts in dask_scheduler.tasks.values()
                   if "dkern_iteration" in (ts.annotations or {})})


class Diagonal:
    """A cheap ill-conditioned SPD operator: CG's own graph is all the scheduler sees."""

    def __init__(self, d):
        self.d, self.shape, self.dtype = d, (len(d), len(d)), np.float64
        self.col_chunks = d.chunks[0]

    def matvec(self, V):
        return V * self.d[:, None]


def _task_count(dask_scheduler):
    return len(dask_scheduler.tasks)


@pytest.fixture
def threaded_client():
    """An in-process cluster: the lineage lives on its scheduler like on any other, and
    an iteration's round trips cost less than across processes."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


@pytest.mark.slow
@pytest.mark.distributed
def test_checkpoints_keep_the_scheduler_task_count_flat(threaded_client, tmp_path,
                                                       record_figures):
    """Without a checkpoint the scheduler keeps every iteration's tasks (the lineage of the
    persisted vectors); with one every ``every`` iterations, the count stays flat over 200
    iterations (it ran 500 with checkpoints every 25, which took 147 s of a CI run)."""
    n, every, iterations = 20_000, 10, 200  # 15 checkpoint cycles past the first five
    # a spread spectrum of condition 1e4: CG's residual still falls at iteration 500 (to
    # about 2e-6), so the solve neither converges nor stalls before max_iter
    A = Diagonal(da.from_array(np.linspace(1.0, 1e4, n), chunks=n // 2))
    y = np.random.default_rng(0).normal(size=n)
    marks = (5, 10, 50, 83, 117, 144, 171, 200)  # at several points of the cycle
    counts = {}

    def count(k, rel):
        if k in marks:
            counts[k] = threaded_client.run_on_scheduler(_task_count)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter is the point
        start = time.perf_counter()
        cg(A, y, tol=1e-30, max_iter=10, callback=count)
        per_iteration = (time.perf_counter() - start) / 10
        grown = dict(counts)
        counts.clear()
        start = time.perf_counter()
        out = cg(A, y, tol=1e-30, max_iter=iterations, callback=count,
                 checkpoint=tmp_path / "ck", checkpoint_every=every)
        seconds = time.perf_counter() - start
    assert out.n_iter == iterations
    growth = (grown[10] - grown[5]) / 5  # tasks kept per iteration without checkpoints
    assert growth > 5, grown
    # with checkpoints: from iteration 50 to 200 (150 iterations, 15 cycles), less growth
    # than two checkpoint cycles' worth without (each count falls at its own point of the
    # cycle); without them the count would grow by 150 * growth
    assert max(counts[k] for k in marks[3:]) - counts[50] < 2 * growth * every, counts
    assert counts[200] < grown[10], (counts, grown)
    record_figures("checkpoint", lineage={
        "n": n, "chunks": 2, "checkpoint_every": every, "iterations": iterations,
        "tasks_per_iteration_kept_without_checkpoint": round(growth, 1),
        "tasks_without_checkpoint": grown, "tasks_with_checkpoint": counts,
        "seconds_per_iteration_without": round(per_iteration, 3),
        "seconds_per_iteration_with": round(seconds / iterations, 3)})


@pytest.mark.distributed
def test_checkpoint_vectors_read_back_bitwise_and_the_write_time(cluster_client, tmp_path,
                                                                record_figures):
    from dkern.solvers.checkpoint import Checkpoint

    rng = np.random.default_rng(1)
    vectors = {name: da.from_array(rng.normal(size=(2000, 2)), chunks=(500, 2)).persist()
               for name in ("X", "R", "P", "S")}
    ck, seconds = Checkpoint(tmp_path / "ck", 50, {"data": "d"}, "cg"), []
    for k in (50, 100, 150):
        start = time.perf_counter()
        ck.save(vectors, np.ones((k, 2)), {"iteration": k})
        seconds.append(time.perf_counter() - start)
    back = ck.vectors(list(vectors), vectors["X"])
    for name, v in vectors.items():
        assert back[name].chunks == v.chunks
        np.testing.assert_array_equal(back[name].compute(), v.compute())
    assert ck.load()["iteration"] == 150 and ck.history().shape == (150, 2)
    record_figures("checkpoint", write={"n": 2000, "t": 2, "vectors": 4,
                     "seconds_per_checkpoint_median": round(float(np.median(seconds)), 3)})


@pytest.mark.slow
def test_kernel_ridge_fit_resumes_from_its_checkpoint(sync_scheduler, tmp_path, monkeypatch):
    import dkern.models.kernel_ridge
    from dkern import KernelRidge, load, save
    from dkern.kernels import Matern

    # a rank-60 preconditioner (the default 300 is most of three fits' time on 400 rows)
    monkeypatch.setattr(dkern.models.kernel_ridge, "CG_PRECONDITIONER_RANK", 60)
    rng = np.random.default_rng(0)
    X, y = rng.uniform(size=(400, 1)), rng.normal(size=400)
    # a slowly decaying spectrum: CG still iterates after the preconditioner
    kw = dict(alpha=1e-3, solver="cg", tol=1e-3, random_state=0)
    ref = KernelRidge(Matern(1.0, nu=0.5), **kw).fit(X, y)
    model = KernelRidge(Matern(1.0, nu=0.5), checkpoint=tmp_path / "ck", checkpoint_every=3,
                        **kw)
    with pytest.raises(Stop):
        model.fit(X, y, callback=stop_at(4))
    monitor = SolveMonitor()
    model.fit(X, y, callback=monitor)
    assert monitor.iterations[0] == 3 and model.n_iter_ == ref.n_iter_ > 4
    np.testing.assert_array_equal(model.dual_coef_, ref.dual_coef_)
    save(model, tmp_path / "model")  # a path-like checkpoint is stored as its str
    assert load(tmp_path / "model").checkpoint == str(tmp_path / "ck")


DRIVER = """
import json, sys, warnings
import numpy as np
import dkern
from dkern.io import open_array, write_array
from dkern.kernels import Gaussian
from dkern.solvers import SolveMonitor, cg

store, scheduler, ck = sys.argv[1:4]
client = dkern.connect(scheduler)
monitor = SolveMonitor()
A = dkern.gram(Gaussian(0.5), (store, "X")) + 1e-2
out = cg(A, open_array(store, "y"), tol=1e-8, checkpoint=ck, checkpoint_every=10, callback=monitor)
write_array(out.x, store, "x", overwrite=True)
print(json.dumps({"first": monitor.iterations[0], "n_iter": out.n_iter}))
client.close()
"""


class _Cluster:
    """A scheduler and two workers as subprocesses; every process is killed at the end."""

    def __init__(self, folder):
        self.folder, self.procs = folder, []

    def start(self, name):
        import subprocess
        import sys

        file = self.folder / f"{name}.json"
        base = [sys.executable, "-m", "dask"]
        self.scheduler = self._spawn(base + ["scheduler", "--port", "0", "--no-dashboard",
                                             "--host", "127.0.0.1", "--scheduler-file",
                                             str(file)], subprocess)
        deadline = time.monotonic() + 120
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.address = json.loads(file.read_text())["address"]
        self._spawn(base + ["worker", self.address, "--nworkers", "2", "--nthreads", "1",
                            "--no-dashboard"], subprocess)
        return self.address

    def _spawn(self, cmd, subprocess, stdout=None):
        proc = subprocess.Popen(cmd, stdout=stdout or subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, *args):
        import subprocess
        import sys

        return self._spawn([sys.executable, "-c", DRIVER, *args], subprocess, subprocess.PIPE)

    def close(self):
        import signal

        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _wait_for_checkpoint(ck, past, proc, timeout=300):
    """Poll until a checkpoint past iteration ``past`` is published; its iteration."""
    from dkern.io import read_attrs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the solve ended before it was to be killed"
        try:
            k = read_attrs(ck)["dkern_checkpoint"]["iteration"]
        except (DkernError, KeyError, OSError):
            k = -1
        if k > past:
            return k
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint past iteration {past} within {timeout} s")


@pytest.mark.slow
@pytest.mark.distributed
def test_solve_survives_sigkill_of_client_then_of_scheduler(tmp_path, record_figures):
    import signal

    from dkern.io import open_array, write_arrays

    X, y = _problem()
    store, ck = str(tmp_path / "data.zarr"), str(tmp_path / "ck")
    write_arrays(store, {"X": X, "y": y}, chunk_rows=200)
    with dask.config.set(scheduler="synchronous"):  # the uninterrupted run, in process
        A = gram(Gaussian(0.5), (store, "X")) + 1e-2
        ref = cg(A, open_array(store, "y"), tol=1e-8)
        expected = ref.x.compute()
    cluster = _Cluster(tmp_path)
    try:
        address = cluster.start("first")
        client = cluster.run(store, address, ck)  # 1. SIGKILL the client
        first = _wait_for_checkpoint(ck, 0, client)
        os.killpg(client.pid, signal.SIGKILL)
        client = cluster.run(store, address, ck)  # 2. rerun; SIGKILL the scheduler
        second = _wait_for_checkpoint(ck, first, client)
        os.killpg(cluster.scheduler.pid, signal.SIGKILL)
        cluster.close()
        address = cluster.start("second")  # 3. a new cluster; the same command
        client = cluster.run(store, address, ck)
        stdout, _ = client.communicate(timeout=300)
    finally:
        cluster.close()
    report = json.loads(stdout.decode().strip().splitlines()[-1])
    assert first >= 10 and report["first"] >= second > first  # resumed, not restarted
    assert report["n_iter"] == ref.n_iter
    np.testing.assert_array_equal(open_array(store, "x").compute(), expected)
    record_figures("checkpoint", sigkill={"client_killed_after_checkpoint_of_iteration": first,
                       "scheduler_killed_after_checkpoint_of_iteration": second,
                       "last_run_resumed_from": report["first"], "n_iter": report["n_iter"],
                       "bitwise_equal": True})
