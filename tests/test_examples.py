"""The README's python snippets and the scripts in examples/ run as written, as scripts.

Each runs as ``python SCRIPT`` runs it, as ``__main__`` from its file (``run_scripts``: the
README's snippets one after the other in a fresh interpreter, the examples in another): the
embedded LocalCluster's worker processes re-import the script, which fails without an
``if __name__ == "__main__":`` guard.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dkern import load
from dkern.io import list_arrays, open_array

ROOT = Path(__file__).resolve().parents[1]

#: The README's sizes, scaled down for the test. Each must occur in the README, so a
#: snippet that changes fails here instead of silently running at full size.
SCALED = {"n=1_000_000": "n=20_000", "X[:2000]": "X[:200]", "np.ones(2000)": "np.ones(200)",
          "n_centers=2000": "n_centers=100", "n_centers=500": "n_centers=100",
          '")[:2000]': '")[:500]'}  # the toolbox snippet's queries


def _gaussian(A, B, ell):
    """Independent dense Gaussian kernel (scipy's cdist)."""
    from scipy.spatial.distance import cdist

    return np.exp(-cdist(A, B, "sqeuclidean") / (2 * ell**2))


def run_script(path, cwd, *args, extra_env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's dkern, in every worker too
    env.update(extra_env or {})
    return subprocess.run([sys.executable, str(path), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


#: Runs the scripts named in its argument (JSON: script, args, output prefix) one after the
#: other in this interpreter, each as ``python SCRIPT ARGS`` would run it: as ``__main__``
#: from its file, with its argv and its folder first on sys.path, so that the workers of its
#: embedded cluster re-import it from that file as they would. Its stdout goes to
#: PREFIX.stdout, its exit status to PREFIX.status; the clusters it leaves running are
#: closed after it, as the interpreter's exit would. With "stop", the first failure ends
#: the run (the README's snippets build on each other). Later scripts find dkern imported
#: and the embedded clusters' fork server running: each saves ~7 s of imports (its own and
#: its fork server's), the most of what a short script costs.
DRIVER = """
import contextlib, json, os, runpy, sys, traceback
from distributed.deploy.spec import SpecCluster

stop = sys.argv[2] == "stop"
for script, args, prefix in json.loads(sys.argv[1]):
    sys.argv, path = [script, *args], list(sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status = 0
    try:
        with open(prefix + ".stdout", "w") as out, contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:  # sys.exit(code) as the interpreter reads it
        code = exit_.code
        status = code if isinstance(code, int) else int(code is not None)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        for cluster in list(SpecCluster._instances):
            cluster.close()
        sys.path[:] = path
    with open(prefix + ".status", "w") as f:
        f.write(str(status))
    if status and stop:
        break
"""


def run_scripts(scripts, cwd, stop=False):
    """Run ``scripts`` ((path, args, output prefix), ...) with ``DRIVER`` in one fresh
    interpreter in ``cwd`` (``stop``: stop at the first failure); return its
    CompletedProcess and each script's (status, stdout), status None where it did not run
    (an earlier one failed, with ``stop``, or the interpreter died)."""
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's dkern, in every worker too
    done = subprocess.run([sys.executable, "-c", DRIVER,
                           json.dumps([[str(p), list(a), str(o)] for p, a, o in scripts]),
                           "stop" if stop else "all"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    results = []
    for _, _, prefix in scripts:
        status = Path(f"{prefix}.status")
        results.append((int(status.read_text()), Path(f"{prefix}.stdout").read_text())
                       if status.exists() else (None, ""))
    return done, results


def readme_snippets():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.slow
@pytest.mark.distributed
def test_readme_snippets_run_as_scripts(tmp_path):
    snippets = readme_snippets()
    assert len(snippets) == 5, "update this test with the README's snippets"
    for old in SCALED:
        assert any(old in code for code in snippets), f"{old!r} is no longer in the README"
    scripts = []
    for i, code in enumerate(snippets):  # in order, in one folder: the second uses data.zarr
        for old, new in SCALED.items():
            code = code.replace(old, new)
        script = tmp_path / f"readme_{i}.py"
        script.write_text(code, encoding="utf-8")
        scripts.append((script, (), script))
    done, results = run_scripts(scripts, tmp_path, stop=True)
    for i, (status, _) in enumerate(results):
        assert status == 0, (i, status, done.stderr[-4000:])
    assert done.returncode == 0, done.stderr[-4000:]
    outputs = [stdout for _, stdout in results]
    store = str(tmp_path / "data.zarr")
    assert {"Kv", "pred"} <= set(list_arrays(store))
    # first snippet: Kv = K(X, X[:200]) @ 1 with k = 2 Gaussian(0.5) + Linear, checked densely
    X, Kv = open_array(store, "X").compute(), open_array(store, "Kv").compute()
    rows, Z = X[::997], X[:200]
    want = (2.0 * _gaussian(rows, Z, 0.5) + rows @ Z.T).sum(1)
    np.testing.assert_allclose(Kv[::997], want, rtol=1e-10)
    # second snippet: the stored predictions are those of the dense normal equations
    # (K_nmᵀ K_nm + α K_mm) β = K_nmᵀ y on the saved model's centres (Falkon ran to tol 1e-3),
    # and the RMSE it prints is theirs
    C, y = load(str(tmp_path / "model.zarr")).centers_, open_array(store, "y").compute()
    Knm = _gaussian(X, C, 3.0)
    beta = np.linalg.solve(Knm.T @ Knm + 1e-3 * _gaussian(C, C, 3.0), Knm.T @ y)
    X_test, truth = open_array(store, "X_test").compute(), open_array(store, "y_test").compute()
    pred = open_array(store, "pred").compute()
    want = _gaussian(X_test, C, 3.0) @ beta
    assert np.linalg.norm(pred - want) / np.linalg.norm(want) <= 1e-2
    assert f"test RMSE {np.sqrt(np.mean((pred - truth) ** 2)):.4f}" in outputs[1]
    # third snippet: the sparse GP's mean and std, stored chunk by chunk: std finite and
    # within [0, prior std = 1]; with 100 centres in 8-d the mean is rough, but it beats the
    # zero predictor (tests/test_gp_sparse.py checks the sparse GP's numbers densely)
    mean, std = (open_array(store, f"gp/{a}").compute() for a in ("mean", "std"))
    assert mean.shape == std.shape == truth.shape
    assert np.all(np.isfinite(std)) and np.all((std >= 0) & (std <= 1 + 1e-12))
    rmse = np.sqrt(np.mean((mean - truth) ** 2))
    assert rmse < 0.8 * np.sqrt(np.mean(truth**2)) and f"GP test RMSE {rmse:.4f}" in outputs[2]
    # fourth snippet: the toolbox's figures, recomputed densely from the store's arrays
    from scipy.spatial.distance import cdist

    Q, t, y = X_test[:500], truth[:500], open_array(store, "y").compute()
    D = cdist(Q, X, "sqeuclidean")  # (500, n), from the differences
    L = -D / (2 * 0.5**2)
    top = L.max(1, keepdims=True)
    logp = (top[:, 0] + np.log(np.exp(L - top).sum(1)) - np.log(len(X))
            - X.shape[1] * np.log(np.sqrt(2 * np.pi) * 0.5))
    W = np.exp(L - top)
    nw_rmse = np.sqrt(np.mean((W @ y / W.sum(1) - t) ** 2))
    assert (f"mean log-density {logp.mean():.3f}, Nadaraya-Watson RMSE {nw_rmse:.4f}, "
            f"mean nearest distance {np.sqrt(D.min(1)).mean():.4f}") in outputs[3]
    # fifth snippet: through xarray, the prediction it published and read back without dkern
    # is the model's, along the test rows' dimension
    import xarray as xr

    stored = xr.open_zarr(store, consolidated=False)["pred_xr"]
    assert stored.dims == ("test_sample",)
    assert f"test_sample: xarray RMSE {np.sqrt(np.mean((stored.values - truth) ** 2)):.4f}" \
        in outputs[4]
    assert np.sqrt(np.mean((stored.values - truth) ** 2)) < np.sqrt(np.mean(truth**2))


#: Examples with a test of their own below, which also checks what they write.
OWN_TEST = {"mauna_loa_co2.py"}
#: Options scaling an example down for the test (as SCALED does for the README): the
#: same code path and check, on fewer rows (gram_matvec: 5 row chunks at any n;
#: krr_from_zarr: 4).
EXAMPLE_ARGS = {"gram_matvec.py": ["--n", "5000"], "krr_from_zarr.py": ["--n", "20000"]}


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py") if p.name not in OWN_TEST)


@pytest.fixture(scope="module")
def examples_run(request, tmp_path_factory):
    """The examples this session selected, run as scripts by ``run_scripts`` in one fresh
    interpreter: {example: (status, stdout, the interpreter's stderr)} of those that ran."""
    chosen = {item.callspec.params["example"] for item in request.session.items
              if item.originalname == "test_example_runs_as_written"}
    folder = tmp_path_factory.mktemp("examples")
    todo = [e for e in EXAMPLES if e in chosen]
    done, results = run_scripts([(ROOT / "examples" / e, EXAMPLE_ARGS.get(e, []), folder / e)
                                 for e in todo], folder)
    outcome = {e: (*r, done.stderr) for e, r in zip(todo, results, strict=True)
               if r[0] is not None}
    return outcome


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs_as_written(example, examples_run):
    """Each example checks its own answer and exits 1 when it is wrong."""
    assert example in examples_run, "the examples' interpreter died before it ran"
    status, stdout, stderr = examples_run[example]
    assert status == 0, stdout[-2000:] + stderr[-4000:]
    if example == "gram_matvec.py":  # it ran at the size asked for
        assert "K is (5000, 5000)" in stdout, stdout
    if example == "krr_from_zarr.py":
        assert "on 20,000 rows" in stdout, stdout


def _example_module(name):
    """An example script imported as a module (its ``main`` is not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mauna_loa_kernel_is_sklearns_twin():
    """The example's dkern kernel and its scikit-learn oracle are one kernel: the same
    theta, bounds and Gram matrix (White's noise on its diagonal) at the start."""
    example = _example_module("mauna_loa_co2")
    ours, theirs = example.co2_kernel(), example.sklearn_co2_kernel()
    t = np.linspace(1958.0, 2001.0, 60)[:, None]
    np.testing.assert_array_equal(ours.theta, theirs.theta)
    np.testing.assert_array_equal(ours.bounds, theirs.bounds)
    np.testing.assert_allclose(ours(t), theirs(t), rtol=1e-12, atol=0)
    np.testing.assert_allclose(ours.diag(t), theirs.diag(t), rtol=1e-12, atol=0)


@pytest.mark.slow
def test_mauna_loa_example_fits_the_record_and_saves_its_plot(tmp_path):
    """The CO₂ GP as scikit-learn's example learns it: the script checks its LML against
    scikit-learn's, its held-out coverage and that no bound was hit; here its printed
    figures are recomputed by scikit-learn at the kernel it learned, and its plot is a
    real PNG."""
    import matplotlib.image
    from sklearn.gaussian_process import GaussianProcessRegressor

    from dkern.kernels import from_repr

    png = tmp_path / "plot.png"
    # One BLAS thread: its matrices are 324 x 324, and when the cores are oversubscribed (CI
    # runs two pytest processes on two cores) a BLAS pool's LAPACK calls, many small
    # synchronised steps, stall: at load 7.5 on the 2-core host one 324 x 324 dpotri took
    # 1.5 s with two threads against 4 ms with one, and this test 84 s against 23 s
    single = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    result = run_script(ROOT / "examples" / "mauna_loa_co2.py", tmp_path, "--out", str(png),
                        extra_env=single)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    image = matplotlib.image.imread(png)  # decodes the whole file: a valid PNG
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape == (450, 900, 4)
    assert len(np.unique(image.reshape(-1, 4), axis=0)) > 50  # a plot, not a blank canvas
    found = re.search(r"learned kernel: (.*)\nlog marginal likelihood: (\S+) \(scikit-learn: "
                      r"(\S+), .*\nin-sample RMSE: (\S+) ppm on 485 months; held-out RMSE: "
                      r"(\S+) ppm on the last 36 months\nheld-out months inside mean ± 2σ: "
                      r"(\d+) of 36 .*\nconvergence warnings: 0\n", result.stdout)
    assert found, result.stdout
    text, *figures = found.groups()
    lml, lml_sklearn, rmse_in, rmse_held, inside = map(float, figures)
    assert lml >= lml_sklearn - 1e-3 and rmse_in < 0.5 and rmse_held < 1.0
    assert inside >= 33  # at least 90% of the 36 held-out months (35 measured)
    # scikit-learn at the learned kernel: the same LML, and the same months inside the band
    example = _example_module("mauna_loa_co2")
    t, y = example.monthly_co2()
    learned = example.sklearn_co2_kernel().clone_with_theta(from_repr(text).theta)
    y_mean = y[:-36].mean()
    theirs = GaussianProcessRegressor(learned, optimizer=None).fit(t[:-36], y[:-36] - y_mean)
    assert theirs.log_marginal_likelihood_value_ == pytest.approx(lml, abs=1e-3)
    mean, std = theirs.predict(t[-36:], return_std=True)
    assert np.sum(np.abs(y[-36:] - y_mean - mean) <= 2 * std) == inside


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def script_cluster(tmp_path_factory):
    """A scheduler and two workers started by cluster/start-scheduler.sh and
    start-workers.sh, each in a process group of its own; yields the scheduler address.
    One for the module's tests: starting and stopping it takes most of a minute."""
    from _daskproc import stop_groups

    tmp_path = tmp_path_factory.mktemp("script-cluster")

    port = _free_port()
    env = {**os.environ, "DKERN_PYTHON": sys.executable, "DKERN_PORT": str(port),
           "DKERN_DASHBOARD": f"127.0.0.1:{_free_port()}", "DKERN_NWORKERS": "2",
           "DKERN_MEMORY_LIMIT": "2GB", "PYTHONPATH": str(ROOT)}
    env.pop("DASK_CONFIG", None)
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([str(ROOT / "cluster" / script), "--local", *args], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              cwd=tmp_path, start_new_session=True)
             for script, args in (("start-scheduler.sh", []), ("start-workers.sh", [address]))]
    try:
        yield address
    finally:
        stop_groups(procs)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_script_started_scheduler_ends_a_wait_with_no_running_worker(script_cluster):
    """Workers all paused for memory on a cluster of cluster/ scripts kept a job waiting for
    ever: distributed's schedulers wait without end by default, and only the embedded
    cluster's was given a timeout. start-scheduler.sh's scheduler now reads the same
    no-workers-timeout from dkern's settings (the embedded one fails such a wait with a
    WorkerFailureError naming the paused workers: tests/test_poison.py)."""
    from dkern.runtime import NO_WORKERS_TIMEOUT, connect

    with connect(script_cluster) as client:
        got = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.no_workers_timeout)
    assert NO_WORKERS_TIMEOUT == "300s" and got == 300


@pytest.mark.slow
@pytest.mark.distributed
def test_remote_client_notebook_runs_in_a_kernel_against_script_started_workers(
        tmp_path, script_cluster, monkeypatch):
    """examples/remote_client.ipynb, executed by nbclient in a Jupyter kernel, attaches to
    a scheduler and workers that cluster/ scripts started in processes of their own, fits,
    and writes predictions whose RMSE against the noise-free target is below 0.1; its
    progress shows as widgets (ipywidgets is in the examples extra)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(ROOT / "examples" / "remote_client.ipynb", as_version=4)
    nbformat.validate(notebook)
    assert all(c.outputs == [] for c in notebook.cells if c.cell_type == "code")
    # the kernel inherits this environment: the scheduler, the checkout, where the store goes
    monkeypatch.setenv("DKERN_SCHEDULER_ADDRESS", script_cluster)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "examples")]))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for out in cell.outputs)
    assert f"scheduler: {script_cluster}\ndashboard: http" in text, text[-2000:]
    widgets = [out for cell in notebook.cells if cell.cell_type == "code"
               for out in cell.outputs
               if "application/vnd.jupyter.widget-view+json" in out.get("data", {})]
    assert widgets, "no progress widget was displayed"
    store = str(tmp_path / "dkern-remote-demo.zarr")
    pred, truth = (open_array(store, a).compute() for a in ("pred", "y_test"))
    assert pred.shape == truth.shape == (4_000,)
    assert np.sqrt(np.mean((pred - truth) ** 2)) < 0.1
