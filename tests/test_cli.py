"""The dkern command and connect(): real runs, real stores."""

import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import dkern
from dkern import cli, connect
from dkern.io import list_arrays, open_array, read_attrs, write_arrays
from dkern.kernels import Gaussian


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def keops_recheck():
    """Forget the per-process cached KeOps check before and after the test, so `dkern info`
    really runs it (and later tests re-check under their own settings)."""
    from dkern.backends.select import keops_status

    keops_status.cache_clear()
    yield
    keops_status.cache_clear()


@pytest.fixture(scope="module")
def fresh_info(tmp_path_factory):
    """`dkern info --json` with its KeOps check compiling into an empty KeOps cache folder
    (measured ~9 s on this 2-core machine); returns (exit code, report, files built)."""
    import contextlib
    import io

    # imported here first, so this process keeps its own KeOps cache folder (gpu_visible()
    # no longer imports pykeops where no CUDA driver library is found)
    import pykeops.config  # noqa: F401

    from dkern.backends.select import keops_status

    cache = tmp_path_factory.mktemp("keops-cache")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("KEOPS_CACHE_FOLDER", str(cache))  # read by the check's child process
        keops_status.cache_clear()
        try:
            code = cli.main(["info", "--json"])
        finally:
            keops_status.cache_clear()
    return code, json.loads(out.getvalue()), [p for p in cache.rglob("*") if p.is_file()]


@pytest.mark.keops
@pytest.mark.slow
def test_info_reports_backends_with_a_real_keops_check(fresh_info):
    """An "available" that compiled nothing (a cached answer, no child run) fails here."""
    import pykeops

    from dkern.backends import gpu_visible

    code, report, built = fresh_info
    assert code == 0
    assert report["backends"]["numpy"]["available"] is True
    assert report["gpu_visible"] is gpu_visible()
    keops = report["backends"]["keops"]
    if keops["available"]:
        device = "GPU" if report["gpu_visible"] else "CPU"
        assert keops["detail"].startswith("pykeops ")
        assert keops["detail"].endswith(f"{pykeops.__version__}, compiled and ran on {device}")
        assert built, "KeOps reported available but nothing was compiled"
        if device == "CPU":  # the check's reduction: pykeops_cpp_<hash>.cpython-*.so
            assert any(p.name.startswith("pykeops_cpp_") and p.suffix == ".so" for p in built)
    else:  # a failed compile names itself
        assert keops["detail"].startswith(("KeOps check compile", "check compile took over"))


@pytest.mark.keops
@pytest.mark.slow
def test_info_keops_detail_is_the_version_line_after_a_fresh_compile(fresh_info):
    import pykeops

    _, report, _ = fresh_info
    keops = report["backends"]["keops"]
    if not keops["available"]:
        pytest.skip(f"KeOps does not work here: {keops['detail']}")
    device = "GPU" if report["gpu_visible"] else "CPU"
    assert keops["detail"] == f"pykeops {pykeops.__version__}, compiled and ran on {device}"


@pytest.mark.keops
def test_info_reports_keops_unavailable_when_the_check_computes_a_wrong_sum(capsys, monkeypatch,
                                                                            keops_recheck):
    """The check compares KeOps' reduction with numpy: a wrong reference (numpy's sum + 1)
    must turn KeOps off, in `dkern info` and for backend="keops"."""
    from dkern import gram
    from dkern.backends import BackendUnavailableError, select
    from dkern.kernels import Gaussian

    if not select.keops_status().available:
        pytest.skip(f"KeOps does not work here: {select.keops_status().detail}")
    select.keops_status.cache_clear()
    wrong = select._KEOPS_CHECK.replace("(x @ x.T).sum(", "(x @ x.T + 1).sum(")
    assert wrong != select._KEOPS_CHECK
    monkeypatch.setattr(select, "_KEOPS_CHECK", wrong)
    code, out, _ = run(capsys, "info", "--json")
    keops = json.loads(out)["backends"]["keops"]
    assert code == 0 and keops["available"] is False
    assert keops["detail"].startswith("KeOps check compile failed: AssertionError"), keops
    with pytest.raises(BackendUnavailableError, match="KeOps does not work here"):
        gram(Gaussian(1.0), np.ones((3, 2)), backend="keops")


@pytest.mark.distributed
def test_make_data_writes_a_store_that_reads_back(capsys, tmp_path):
    store = str(tmp_path / "d.zarr")
    code, out, _ = run(capsys, "make-data", "--out", store, "--n", "5000", "--d", "3",
                       "--n-test", "100", "--chunk-rows", "1000", "--workers", "1", "--json")
    assert code == 0 and json.loads(out)["n"] == 5000
    X, y = open_array(store, "X").compute(), open_array(store, "y").compute()
    assert X.shape == (5000, 3) and y.shape == (5000,) and np.all(np.abs(X) <= 1)
    resid = y - np.sin(3 * X[:, 0]) - 0.5 * np.cos(2 * X.sum(1) / np.sqrt(3))
    assert abs(resid.std() - 0.1) < 0.01  # the documented target, noise sigma 0.1
    assert read_attrs(store)["n"] == 5000
    code, _, err = run(capsys, "make-data", "--out", store, "--n", "10", "--d", "3",
                       "--workers", "1")
    assert code == 1 and "overwrite" in err
    np.testing.assert_array_equal(open_array(store, "X").compute(), X)  # refused: untouched


@pytest.mark.distributed
def test_demo_fits_predicts_and_reports(capsys, tmp_path):
    store = str(tmp_path / "demo.zarr")
    code, out, _ = run(capsys, "demo", "--n", "6000", "--n-test", "500", "--d", "3",
                       "--centers", "200", "--chunk-rows", "2000", "--alpha", "0.1",
                       "--lengthscale", "1.0",
                       "--workers", "2", "--json", "--store", store)
    report = json.loads(out)
    assert code == 0 and report["solver"] == "nystrom" and report["centers"] == 200
    # y_test is noise-free; training noise is 0.1 and the signal's std about 0.7
    assert report["test_rmse"] < 0.1
    pred, y_test = open_array(store, "pred").compute(), open_array(store, "y_test").compute()
    assert np.sqrt(np.mean((pred - y_test) ** 2)) == pytest.approx(report["test_rmse"], abs=1e-5)
    again = ["demo", "--n", "3000", "--n-test", "300", "--d", "3", "--centers", "100",
             "--workers", "1", "--json", "--store", store]
    with pytest.raises(SystemExit) as exc:  # before a cluster starts; nothing replaced
        cli.main(again)
    assert exc.value.code == 2 and "already holds ['X', 'X_test', 'pred', 'y', 'y_test'], " \
        "which the demo writes; pass --overwrite" in capsys.readouterr().err
    assert open_array(store, "pred").shape == (500,)
    code, out, _ = run(capsys, *again, "--overwrite")
    assert code == 0, "a second demo with --overwrite replaces its arrays"
    assert open_array(store, "pred").shape == (300,)


@pytest.mark.distributed
def test_fit_then_predict_from_the_shell(capsys, tmp_path, monkeypatch, _session_cluster):
    """On the session's cluster (--scheduler): the embedded one's start is the make-data
    and demo tests' subject, not this one's."""
    at = ["--scheduler", _session_cluster.scheduler.address]
    store, model = str(tmp_path / "d.zarr"), str(tmp_path / "model.zarr")
    assert run(capsys, "make-data", "--out", store, "--n", "3000", "--d", "2", "--n-test",
               "300", *at, "--quiet")[0] == 0
    args = ["fit", "--data", store, "--x", "X", "--y", "y", "--kernel",
            "Gaussian(lengthscale=0.5)", "--alpha", "0.1", "--solver", "nystrom", "--centers",
            "60", "--model", model, *at, "--json", "--checkpoint",
            str(tmp_path / "ck"), "--checkpoint-every", "1", "--row-chunks", "700"]
    # --row-chunks: the rows per task the memory refusal advises (a store's chunks are
    # otherwise merged to about 16 MiB)
    from argparse import Namespace

    from dkern.cli.fit import _training_rows

    assert _training_rows(Namespace(data=store, x="X", row_chunks=700)).chunks[0][:4] == \
        (700, 700, 700, 700)
    # more rows than X has: one chunk (10**23 reached dask's own 'isnan' error)
    assert _training_rows(Namespace(data=store, x="X", row_chunks=10**23)).chunks[0] == (3000,)
    code, out, _ = run(capsys, *args)
    assert code == 0 and json.loads(out)["solver"] == "nystrom"
    # a fresh fit (resumed from iteration 0) whose checkpoint goes once the model is saved
    assert json.loads(out)["resumed_from"] == 0 and not (tmp_path / "ck").exists()
    import dkern

    def no_fit(*_, **__):
        raise AssertionError("fit ran although its model could not be saved")

    monkeypatch.setattr(dkern.KernelRidge, "fit", no_fit)
    code, _, err = run(capsys, *args)
    # an existing model is not replaced silently, and the refusal comes before the fit
    assert code == 1 and "overwrite" in err
    monkeypatch.undo()
    predict = ["predict", "--model", model, "--data", store, "--x", "X_test", "--out", "pred",
               "--y", "y_test", *at, "--json"]
    code, out, _ = run(capsys, *predict)
    assert code == 0
    # the stored predictions: the dense normal equations (K_nmᵀ K_nm + α K_mm) β = K_nmᵀ y on
    # the saved model's centres; the reported RMSE is theirs
    C = dkern.load(model).centers_
    X, y = open_array(store, "X").compute(), open_array(store, "y").compute()
    X_test, y_test = open_array(store, "X_test").compute(), open_array(store, "y_test").compute()
    Knm = _gaussian(X, C, 0.5)
    want = _gaussian(X_test, C, 0.5) @ np.linalg.solve(Knm.T @ Knm + 0.1 * _gaussian(C, C, 0.5),
                                                       Knm.T @ y)
    pred = open_array(store, "pred").compute()
    # fit's default tol is 1e-6 (demo's 1e-3 once leaked into it through a shared argparse
    # parent: the fit stopped at a residual of 4e-4 and these differed by 3.9e-4)
    assert np.linalg.norm(pred - want) / np.linalg.norm(want) <= 1e-5
    assert json.loads(out)["rmse"] == pytest.approx(np.sqrt(np.mean((pred - y_test) ** 2)),
                                                    rel=1e-12)
    code, _, err = run(capsys, *predict)
    assert code == 1 and "pass --overwrite" in err  # the predictions are not replaced
    code, again, _ = run(capsys, *predict, "--overwrite")
    assert code == 0 and json.loads(again)["rmse"] == json.loads(out)["rmse"]


def test_demo_without_a_store_leaves_no_files_behind(capsys, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the demo's folder goes
    code, out, _ = run(capsys, "demo", "--n", "2000", "--n-test", "200", "--d", "2",
                       "--centers", "50", "--lengthscale", "0.5", "--workers", "1", "--json")
    assert code == 0 and "removed" in json.loads(out)["store"]
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("dkern-demo-")]
    assert left == []  # it left a 15 MB store per run


def test_a_killed_worker_is_one_message_with_the_fix(capsys, monkeypatch):
    from types import SimpleNamespace

    from distributed import KilledWorker

    def dies(args):
        raise KilledWorker("('dk-kblocks-1', 0, 0)",
                           SimpleNamespace(address="tcp://127.0.0.1:1"), 3)

    monkeypatch.setattr(cli.info, "run", dies)
    code, out, err = run(capsys, "info", "--quiet")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "out of memory" in err and "memory_limit" in err


def test_a_lost_scheduler_is_one_message_with_the_fix(capsys, monkeypatch):
    """The scheduler dying mid-run (distributed cancels every future) or a cluster of other
    versions: one line naming the fix, not distributed's tracebacks."""
    from distributed.client import FutureCancelledError

    from dkern.runtime.checks import ClusterVersionError

    def lost(args):
        raise FutureCancelledError("finalize-1", reason="scheduler-connection-lost")

    monkeypatch.setattr(cli.info, "run", lost)
    code, out, err = run(capsys, "info", "--quiet")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "scheduler-connection-lost" in err and "run the same command again" in err

    def other_versions(args):
        raise ClusterVersionError("the Dask cluster runs other versions than this client of "
                                  "packages dkern needs to agree: dask 1 != 2. Install the "
                                  "same versions on every node (one environment for client, "
                                  "scheduler and workers), or pass check_versions=False to "
                                  "dkern.connect to go on at your own risk.")

    monkeypatch.setattr(cli.info, "run", other_versions)
    code, out, err = run(capsys, "info", "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "Install the same versions" in err and "check_versions" not in err


def test_fit_and_demo_keep_their_own_tol_defaults():
    parser = cli._parser()
    fit = parser.parse_args(["fit", "--data", "d", "--x", "X", "--y", "y", "--model", "m"])
    assert (fit.tol, parser.parse_args(["demo"]).tol) == (1e-6, 1e-3)


def _gaussian(A, B, ell):
    """Independent dense Gaussian kernel (scipy's cdist)."""
    from scipy.spatial.distance import cdist

    return np.exp(-cdist(A, B, "sqeuclidean") / (2 * ell**2))


@pytest.fixture
def saved_model(tmp_path):
    """A store (X 40 × 2, X_test 30 rows, one with NaN in X_bad, y_test and a 20-row y_short)
    and an exact model fitted on it in this process (no cluster)."""
    rng = np.random.default_rng(0)
    X, X_test = rng.uniform(-1, 1, (40, 2)), rng.uniform(-1, 1, (30, 2))
    X_bad = X_test.copy()
    X_bad[5, 0] = np.nan
    store, model = str(tmp_path / "d.zarr"), str(tmp_path / "model.zarr")
    write_arrays(store, {"X_test": X_test, "X_bad": X_bad, "y_test": X_test[:, 0],
                         "y_short": X_test[:20, 0], "Y2": X_test}, chunk_rows=10)
    dkern.save(dkern.KernelRidge(Gaussian(0.5), alpha=0.1, solver="exact").fit(X, X[:, 0]),
               model)
    return store, model


@pytest.mark.parametrize("truth", ["y_short", "Y2"])
def test_predict_refuses_a_wrong_y_before_writing(capsys, saved_model, truth):
    store, model = saved_model
    code, _, err = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                       "--out", "pred", "--y", truth, "--workers", "1")
    shape = "(20,)" if truth == "y_short" else "(30, 2)"
    assert code == 1
    assert f"--y '{truth}' has shape {shape}, but the predictions for --x 'X_test' will have " \
           "shape (30,)" in err
    assert "pred" not in list_arrays(store)  # refused before the predictions were written


@pytest.mark.parametrize(("outputs", "message"), [
    (["--out", "X_test"], "--out 'X_test' would replace the input --x 'X_test'"),
    (["--out", "y_test", "--y", "y_test"], "--out 'y_test' would replace the input --y"),
    (["--out", "pred", "--std", "--std-out", "X_test"],
     "--std-out 'X_test' would replace the input --x 'X_test'"),
    (["--out", "y", "--std", "--y", "y_std"], "--std's array 'y_std' would replace the input --y"),
])
def test_predict_outputs_may_not_replace_its_inputs(capsys, saved_model, outputs, message):
    """Even with --overwrite: the input (and an RMSE of the predictions against themselves)
    would be lost. A usage error, before the model is read; the store is unchanged."""
    store, model = saved_model
    before = {name: open_array(store, name)[:] for name in list_arrays(store)}
    with pytest.raises(SystemExit) as exc:
        cli.main(["predict", "--model", model, "--data", store, "--x", "X_test", "--overwrite",
                  "--workers", "1", *outputs])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert sorted(list_arrays(store)) == sorted(before)
    for name, values in before.items():
        np.testing.assert_array_equal(open_array(store, name)[:], values)


@pytest.mark.parametrize("outputs", [["--out", "/tmp/pred.zarr"],
                                     ["--out", "pred", "--std", "--std-out", "/abs/std"]])
def test_predict_refuses_an_absolute_output_path(capsys, saved_model, outputs):
    """--out is an array inside --data: an absolute path (a file the user meant) became a
    group 'tmp' of the data store. A usage error naming the flag; the store is unchanged."""
    store, model = saved_model
    before = sorted(list_arrays(store))
    with pytest.raises(SystemExit) as exc:
        cli.main(["predict", "--model", model, "--data", store, "--x", "X_test",
                  "--workers", "1", *outputs])
    assert exc.value.code == 2 and "names an array inside the --data store" in (
        capsys.readouterr().err)
    assert sorted(list_arrays(store)) == before


def test_fit_refuses_a_checkpoint_folder_holding_other_data_before_fitting(
        capsys, saved_model, tmp_path):
    """With a solver that writes no checkpoint (exact) the folder was only looked at when
    removing the checkpoint after the save: the model was saved, then the command failed."""
    store, _ = saved_model
    other = tmp_path / "notes"
    other.mkdir()
    (other / "a.txt").write_text("x")
    code, _, err = run(capsys, "fit", "--data", store, "--x", "X_test", "--y", "y_test",
                       "--solver", "exact", "--model", str(tmp_path / "new.zarr"),
                       "--checkpoint", str(other), "--workers", "1")
    assert code == 1 and "is not a dkern checkpoint" in err
    assert not (tmp_path / "new.zarr").exists() and os.listdir(other) == ["a.txt"]


def test_refusal_names_the_overwrite_flag_not_the_keyword(capsys, saved_model, tmp_path):
    store, model = saved_model
    code, _, err = run(capsys, "fit", "--data", store, "--x", "X_test", "--y", "y_test",
                       "--model", model, "--workers", "1")
    assert code == 1 and "--overwrite" in err and "overwrite=True" not in err


@pytest.mark.parametrize(("flag", "under"), [("--model", "f.txt/model.zarr"),
                                              ("--model", "f.txt/a/model.zarr"),
                                              ("--model", "f.txt"),
                                              ("--checkpoint", "f.txt/ckpt"),
                                              ("--model", "f.txt/a::b.zarr")])
def test_fit_refuses_a_path_under_a_file_before_fitting(capsys, saved_model, tmp_path,
                                                        monkeypatch, flag, under):
    """Issue: --model under a regular file passed the pre-fit check; the whole fit ran,
    then saving failed with a bare "[Errno 20] Not a directory"."""
    store, _ = saved_model
    (tmp_path / "f.txt").write_text("notes")
    monkeypatch.setattr(dkern.KernelRidge, "fit", lambda *a, **k: pytest.fail("the fit ran"))
    paths = {"--model": str(tmp_path / "new.zarr"), flag: str(tmp_path / under)}
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", "--data", store, "--x", "X_test", "--y", "y_test", "--workers", "1",
                  *(part for item in paths.items() for part in item)])
    err = capsys.readouterr().err
    where = "is" if under == "f.txt" else f"lies under {str(tmp_path / 'f.txt')!r}, which is"
    assert exc.value.code == 2
    assert f"{flag} {paths[flag]!r} {where} a file, not a folder" in err
    assert f"pass a new path in a folder, e.g. in {str(tmp_path)!r}" in err
    assert (tmp_path / "f.txt").read_text() == "notes" and not (tmp_path / "new.zarr").exists()


@pytest.mark.parametrize("command", [["make-data", "--n", "10", "--d", "2", "--out"],
                                     ["demo", "--n", "100", "--store"]])
def test_store_paths_under_a_file_are_refused_before_a_cluster_starts(capsys, tmp_path,
                                                                     command):
    """make-data --out and demo --store under a regular file failed with a bare
    "[Errno 20] Not a directory" once the cluster ran."""
    (tmp_path / "f.txt").write_text("notes")
    flag = command[-1]
    with pytest.raises(SystemExit) as exc:
        cli.main([*command, str(tmp_path / "f.txt" / "d.zarr"), "--workers", "1"])
    assert exc.value.code == 2 and f"{flag} " in (err := capsys.readouterr().err)
    assert "which is a file, not a folder" in err and (tmp_path / "f.txt").read_text() == "notes"


def test_fit_refuses_a_model_path_under_a_link_to_nothing(capsys, saved_model, tmp_path):
    """A dangling link is named as such, not as a file."""
    store, _ = saved_model
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", "--data", store, "--x", "X_test", "--y", "y_test", "--workers", "1",
                  "--model", str(tmp_path / "dangling" / "m.zarr")])
    assert exc.value.code == 2 and "which is a link to nothing" in capsys.readouterr().err


@pytest.mark.distributed
def test_quiet_error_output_is_the_message_alone(saved_model):
    """A task's error on a worker (NaN in X, found as its chunk is read): the command prints
    its one-line message, no worker log or traceback before it (a real process)."""
    store, model = saved_model
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "dkern", "predict", "--model", model, "--data", store, "--x",
         "X_bad", "--out", "pred", "--workers", "1", "--quiet"],
        env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stdout == ""
    assert re.fullmatch(r"dkern predict: error: X contains NaN or infinity in rows \[0, \d+\) "
                        r"\(first at row 5\)\. Drop or impute those rows\.\n", result.stderr), \
        result.stderr


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["make-data", "--out", "x.zarr", "--n", "0", "--d", "3"])
    assert exc.value.code == 2


def test_unwritable_output_path_is_exit_1_with_the_os_message(capsys, tmp_path):
    """An error only the file system finds (a path under a file is now refused before the
    cluster starts: test_store_paths_under_a_file_are_refused_before_a_cluster_starts)."""
    too_long = tmp_path / ("x" * 300) / "x.zarr"
    code, _, err = run(capsys, "make-data", "--out", str(too_long), "--n", "10",
                       "--d", "2", "--workers", "1")
    assert code == 1 and "File name too long" in err and "Traceback" not in err


def test_unreachable_scheduler_names_the_address_and_the_fix(capsys):
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        code, _, err = run(capsys, "demo", "--scheduler", "tcp://127.0.0.1:1")
    assert code == 1
    assert "could not reach the Dask scheduler at 'tcp://127.0.0.1:1'" in err
    assert "embedded LocalCluster" in err


def test_connect_rejects_a_non_address():
    with pytest.raises(ValueError, match="tcp://host:8786"):
        connect("localhost-8786")


@pytest.mark.distributed
def test_connect_uses_env_address(monkeypatch, cluster_client):
    monkeypatch.setenv("DKERN_SCHEDULER_ADDRESS", cluster_client.scheduler.address)
    with connect() as client:
        assert client.scheduler.address == cluster_client.scheduler.address
        assert len(client.nthreads()) == 2


@pytest.mark.distributed
def test_embedded_cluster_workers_get_the_malloc_settings():
    import os

    import dask

    from dkern.runtime import WORKER_MALLOC_ENV

    with connect(n_workers=1) as client:
        env = client.run(lambda: {k: os.environ.get(k) for k in WORKER_MALLOC_ENV})
        pids = list(client.run(os.getpid).values())
        cluster = client.cluster
    # leaving the with block closed the embedded cluster too, and its worker is gone
    assert cluster.status.name == "closed"
    deadline = time.monotonic() + 10  # the fork server reaps its children as they exit
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert list(env.values()) == [WORKER_MALLOC_ENV]
    # scoped to the cluster's creation: the user's Dask config is left as it was
    assert "MALLOC_MMAP_THRESHOLD_" not in dask.config.get("distributed.nanny.pre-spawn-environ")


def test_workers_of_a_later_cluster_see_variables_set_since_the_first(monkeypatch):
    """Workers fork from one server started with the first embedded cluster's environment;
    a variable set after it still reaches the workers of the next cluster, and connect()
    with threads only (processes=False) starts no worker process to give it to."""
    with connect(n_workers=1) as client:
        client.cluster.close()
    monkeypatch.setenv("DKERN_TEST_LATER_VARIABLE", "set after the first cluster")
    with connect(n_workers=1) as client:
        seen = client.run(lambda: os.environ.get("DKERN_TEST_LATER_VARIABLE"))
        client.cluster.close()
    assert list(seen.values()) == ["set after the first cluster"]
    with connect(n_workers=1, processes=False) as client:
        assert client.run(lambda: 1)
        client.cluster.close()


def test_workers_fork_from_the_server_unless_the_user_names_a_start_method(monkeypatch):
    """dkern's embedded workers are forks of its fork server, restarted ones too; a start
    method the user's Dask config names (here by its environment variable) is kept."""
    def command_line():
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().decode(errors="replace")

    with connect(n_workers=1) as client:
        (forked,) = client.run(command_line).values()
        # a restart forks again, after connect's settings are gone (it spawned, and the
        # worker never came back)
        client.restart(timeout=60)
        (again,) = client.run(command_line).values()
        client.cluster.close()
    assert "forkserver" in again
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD", "spawn")
    with connect(n_workers=1) as client:
        (spawned,) = client.run(command_line).values()
        client.cluster.close()
    assert "forkserver" in forked and "spawn_main" in spawned


@pytest.fixture
def gp_store(tmp_path):
    """A store with 500 training rows (X, y) and 200 test rows (X_test, y_test) in 2-d."""
    rng = np.random.default_rng(1)
    X, X_test = rng.uniform(-2, 2, (500, 2)), rng.uniform(-2, 2, (200, 2))
    y = np.sin(2 * X[:, 0]) * X[:, 1] + 0.1 * rng.normal(size=500)
    y_test = np.sin(2 * X_test[:, 0]) * X_test[:, 1]
    store = str(tmp_path / "gp.zarr")
    write_arrays(store, {"X": X, "y": y, "X_test": X_test, "y_test": y_test}, chunk_rows=128)
    return store, (X, y, X_test, y_test)


@pytest.mark.distributed
def test_gp_fit_and_predict_std_equal_the_same_model_fitted_in_python(capsys, tmp_path,
                                                                     gp_store, _session_cluster):
    from sklearn.gaussian_process import GaussianProcessRegressor as SkGP
    from sklearn.gaussian_process import kernels as sk

    from dkern.kernels import from_repr

    store, (X, y, X_test, y_test) = gp_store
    at = ["--scheduler", _session_cluster.scheduler.address]  # the session's cluster
    model = str(tmp_path / "gp-model.zarr")
    code, out, _ = run(capsys, "fit", "--model-type", "gp", "--data", store, "--x", "X", "--y",
                       "y", "--kernel", "1.0 * Gaussian(lengthscale=1.0)", "--alpha", "0.01",
                       "--optimizer", "lbfgs", "--model", model, *at, "--json")
    report = json.loads(out)
    assert code == 0 and (report["model_type"], report["solver"]) == ("gp", "exact")
    # the optimizer ran: the same fit in Python learns the same hyperparameters
    learned = from_repr(report["kernel"])
    python = dkern.GaussianProcessRegressor(1.0 * Gaussian(1.0), alpha=0.01, optimizer="lbfgs",
                                            random_state=0).fit(X, y)
    np.testing.assert_allclose(learned.theta, python.kernel_.theta, rtol=1e-6)
    assert not np.allclose(learned.theta, 0.0)  # it moved from the start (1.0, 1.0)
    code, out, _ = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                       "--out", "pred", "--std", "--y", "y_test", *at, "--json")
    assert code == 0 and json.loads(out)["std_out"] == f"{store}::pred_std"
    mean, std = (open_array(store, name).compute() for name in ("pred", "pred_std"))
    # the model the command saved, refitted in Python with its kernel: mean and std agree
    same = dkern.GaussianProcessRegressor(learned, alpha=0.01, optimizer=None).fit(X, y)
    want_mean, want_std = same.predict(X_test, return_std=True)
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=1e-10 * np.abs(want_mean).max())
    np.testing.assert_allclose(std, want_std, rtol=0, atol=1e-10 * want_std.max())
    # and scikit-learn's GP with those hyperparameters (an independent implementation)
    c, ell = np.exp(learned.theta)
    sk_mean, sk_std = SkGP(sk.ConstantKernel(c) * sk.RBF(ell), alpha=0.01,
                           optimizer=None).fit(X, y).predict(X_test, return_std=True)
    np.testing.assert_allclose(mean, sk_mean, rtol=0, atol=1e-8 * np.abs(sk_mean).max())
    np.testing.assert_allclose(std, sk_std, rtol=0, atol=1e-8 * sk_std.max())
    assert json.loads(out)["rmse"] == pytest.approx(np.sqrt(np.mean((mean - y_test) ** 2)),
                                                    rel=1e-12)
    code, _, err = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                       "--out", "pred", "--std", *at)
    assert code == 1 and "['pred', 'pred_std']" in err and "pass --overwrite" in err
    np.testing.assert_array_equal(open_array(store, "pred_std").compute(), std)  # untouched


@pytest.mark.distributed
def test_sparse_gp_predict_of_1000_centres_without_the_large_graph_warning(capsys, tmp_path,
                                                                           _session_cluster):
    """The sparse GP's two 1,000 x 1,000 factors (16 MB) travel in the predict graph, past
    distributed's 10 MB warning, which tells a command's user to scatter data they never
    see; the command reports only graphs over 1 GB. The std still equals the same model's
    in Python."""
    rng = np.random.default_rng(3)
    X, X_test = rng.uniform(-2, 2, (1_200, 2)), rng.uniform(-2, 2, (100, 2))
    store, model = str(tmp_path / "s.zarr"), str(tmp_path / "m.zarr")
    write_arrays(store, {"X": X, "y": np.sin(X[:, 0]), "X_test": X_test}, chunk_rows=600)
    at = ["--scheduler", _session_cluster.scheduler.address]
    code, _, _ = run(capsys, "fit", "--model-type", "gp", "--solver", "nystrom", "--centers",
                     "1000", "--data", store, "--x", "X", "--y", "y", "--alpha", "0.1",
                     "--model", model, *at)
    assert code == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, _ = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                         "--out", "pred", "--std", *at)
    assert code == 0
    assert not [w for w in caught if "large graph" in str(w.message)]
    _, want = dkern.load(model).predict(X_test, return_std=True)
    got = open_array(store, "pred_std").compute()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * want.max())


@pytest.mark.distributed
def test_predict_of_a_one_column_gp_checks_y_and_refuses_a_stale_std(capsys, tmp_path, gp_store,
                                                                     _session_cluster):
    """A GP fitted on y (n, 1) predicts (m,): --y (m,) is the right truth and its RMSE the
    real one (it was refused, and a (m, 1) --y broadcast into an m x m difference). A
    mean-only --overwrite beside an earlier --std is refused: the std would go stale."""
    store, (X, y, X_test, y_test) = gp_store
    at = ["--scheduler", _session_cluster.scheduler.address]
    model = str(tmp_path / "gp-model.zarr")
    gp = dkern.GaussianProcessRegressor(Gaussian(1.0), alpha=0.01, optimizer=None)
    dkern.save(gp.fit(X, y[:, None]), model)
    code, out, _ = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                       "--out", "pred", "--std", "--y", "y_test", *at, "--json")
    assert code == 0
    want = gp.predict(X_test)
    assert json.loads(out)["rmse"] == pytest.approx(np.sqrt(np.mean((want - y_test) ** 2)),
                                                    rel=1e-10)
    std = open_array(store, "pred_std").compute()
    code, _, err = run(capsys, "predict", "--model", model, "--data", store, "--x", "X",
                       "--out", "pred", "--overwrite", *at)
    assert code == 1 and "holds 'pred_std' from an earlier prediction" in err
    np.testing.assert_array_equal(open_array(store, "pred_std").compute(), std)
    assert open_array(store, "pred").shape == (200,)  # nothing was written


@pytest.mark.parametrize(("command", "message"), [
    (["predict", "--model", "{tmp}/d.zarr", "--data", "{tmp}/d.zarr", "--x", "X_test", "--out",
      "alpha", "--overwrite"], "--data '{tmp}/d.zarr' and --model '{tmp}/d.zarr' are the same"),
    (["predict", "--model", "{tmp}/d.zarr/m.zarr", "--data", "{tmp}/d.zarr", "--x", "X_test",
      "--out", "p"], "one holds the other: the predictions would be written into the model"),
    (["fit", "--data", "{tmp}/d.zarr", "--x", "X_test", "--y", "y_test", "--solver", "cg",
      "--model", "{tmp}/ck/m.zarr", "--checkpoint", "{tmp}/ck"],
     "--checkpoint '{tmp}/ck' and --model '{tmp}/ck/m.zarr' are the same store or one holds"),
    (["fit", "--data", "{tmp}/d.zarr", "--x", "X_test", "--y", "y_test", "--solver", "cg",
      "--model", "{tmp}/m.zarr", "--checkpoint", "{tmp}/d.zarr/ck"],
     "--checkpoint '{tmp}/d.zarr/ck' and --data '{tmp}/d.zarr' are the same store or one"),
    # a file:// URL names the same folder (the fit saved the model, then deleted it)
    (["fit", "--data", "{tmp}/d.zarr", "--x", "X_test", "--y", "y_test", "--solver", "cg",
      "--model", "file://{tmp}/ck/m.zarr", "--checkpoint", "{tmp}/ck"],
     "--checkpoint '{tmp}/ck' and --model 'file://{tmp}/ck/m.zarr' are the same store"),
    # a model saved in the data store, which `dkern predict` then refused
    (["fit", "--data", "{tmp}/d.zarr", "--x", "X_test", "--y", "y_test",
      "--model", "local://{tmp}/d.zarr/m.zarr"],
     "--data '{tmp}/d.zarr' and --model 'local://{tmp}/d.zarr/m.zarr' are the same store"),
])
def test_stores_that_overlap_are_usage_errors(capsys, tmp_path, command, message):
    """Refused before any work: the fit removes its checkpoint store recursively once the
    model is saved (a model inside it was deleted), and predictions written into a model's
    store could replace its arrays."""
    tmp = str(tmp_path)
    write_arrays(f"{tmp}/d.zarr", {"X_test": np.zeros((5, 2)), "y_test": np.zeros(5)})
    with pytest.raises(SystemExit) as exc:
        cli.main([part.format(tmp=tmp) for part in command])
    assert exc.value.code == 2 and message.format(tmp=tmp) in capsys.readouterr().err
    assert sorted(list_arrays(f"{tmp}/d.zarr")) == ["X_test", "y_test"]


FIT = ["fit", "--data", "d.zarr", "--x", "X", "--y", "y", "--model", "m.zarr"]
PREDICT = ["predict", "--model", "m.zarr", "--data", "d.zarr", "--x", "X", "--out", "p/mean"]


@pytest.mark.parametrize(("argv", "message"), [
    ([*FIT, "--optimizer", "lbfgs"], "--optimizer applies to --model-type gp only, not krr"),
    ([*FIT, "--model-type", "gp", "--max-iter", "5"], "--max-iter applies to --model-type krr"),
    ([*FIT, "--model-type", "gp", "--center-method", "leverage"],
     "--center-method applies to --model-type krr only, not gp"),
    ([*FIT, "--model-type", "svm"], "argument --model-type: invalid choice: 'svm'"),
    ([*FIT, "--model-type", "gp", "--optimizer", "adam"], "argument --optimizer: invalid choice"),
    ([*PREDICT, "--std-out", "p/std"], "--std-out names the array of standard deviations; add "
                                       "--std"),
    ([*PREDICT, "--std", "--std-out", "q/std"], "--std-out 'q/std' must be another array of "
                                                "the group of --out ('p')"),
    ([*PREDICT, "--std", "--std-out", "p/mean"], "must be another array of the group of --out"),
], ids=["optimizer-krr", "max-iter-gp", "center-method-gp", "bad-type", "bad-optimizer",
        "std-out-alone", "std-out-elsewhere", "std-out-is-out"])
def test_options_of_the_other_model_type_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    ([*FIT, "--alpha", "-1"], "argument --alpha: must be a finite number >= 0; got -1"),
    ([*FIT, "--alpha", "nan"], "argument --alpha: must be a finite number >= 0; got nan"),
    ([*FIT, "--tol", "0"], "argument --tol: must be a finite number > 0; got 0"),
    (["demo", "--tol", "inf"], "argument --tol: must be a finite number > 0; got inf"),
    (["make-data", "--out", "d.zarr", "--n", "10", "--d", "2", "--n-test", "-5"],
     "argument --n-test: must be an integer >= 0; got -5"),
])
def test_bad_numbers_are_usage_errors_before_a_cluster_starts(capsys, argv, message):
    """They used to pass the parser, start the cluster, and fail in the library naming its
    keyword (n_test) or with 'math domain error' (plan --tol inf)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_std_of_a_kernel_ridge_model_is_refused_before_writing(capsys, saved_model):
    store, model = saved_model
    code, _, err = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                       "--out", "pred", "--std", "--workers", "1")
    assert code == 1
    assert "--std: the model" in err and "is a KernelRidge, which has no predictive variance" \
        in err and "--model-type gp" in err
    assert "pred" not in list_arrays(store)


def test_predict_with_a_classifier_model_is_refused_before_writing(capsys, saved_model,
                                                                   tmp_path):
    """dkern predict writes regression outputs; a saved classifier gets a clear message, not
    a TypeError from predict(out=...)."""
    store, _ = saved_model
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, (40, 2))
    model = str(tmp_path / "gpc.zarr")
    dkern.save(dkern.GaussianProcessClassifier(optimizer=None).fit(X, X[:, 0] > 0), model)
    code, _, err = run(capsys, "predict", "--model", model, "--data", store, "--x", "X_test",
                       "--out", "pred", "--workers", "1")
    assert code == 1
    assert "is a GaussianProcessClassifier" in err and "predict_proba" in err
    assert "pred" not in list_arrays(store)


def test_help_shows_each_commands_own_defaults(capsys):
    """`--help` ends an option's line with its default: fit's and demo's tol differ."""
    helps = {}
    for command in ("fit", "demo", "predict", "make-data", "store", "fsck", "info"):
        with pytest.raises(SystemExit) as exit_:
            cli.main([command, "--help"])
        assert exit_.value.code == 0
        helps[command] = " ".join(capsys.readouterr().out.split())
    assert "relative residual to reach (default: 1e-06)" in helps["fit"]
    assert "relative residual to reach (default: 0.001)" in helps["demo"]
    assert "(default: krr)" in helps["fit"] and "(default: None)" not in helps["fit"]


@pytest.fixture
def no_cluster(monkeypatch):
    """cluster_client of fit and predict, recording the args it was called with and
    running the command on dask's local scheduler (no cluster starts)."""
    import contextlib

    from dkern.cli import fit, predict

    calls = []

    @contextlib.contextmanager
    def recorder(args):
        calls.append(args)
        yield None

    monkeypatch.setattr(fit, "cluster_client", recorder)
    monkeypatch.setattr(predict, "cluster_client", recorder)
    return calls


@pytest.mark.parametrize("argv, message", [
    (["--x", "Xmissing", "--y", "y"], "Xmissing"),
    (["--x", "y", "--y", "y"], "expected (n, d)"),
    (["--x", "X", "--y", "y_short"], "expected (40,) or (40, t)"),
])
def test_fit_checks_its_arrays_before_a_cluster_starts(capsys, tmp_path, no_cluster, argv,
                                                       message):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (40, 2))
    store = str(tmp_path / "d.zarr")
    write_arrays(store, {"X": X, "y": X[:, 0], "y_short": X[:20, 0]}, chunk_rows=10)
    code, _, err = run(capsys, "fit", "--data", store, *argv, "--model",
                       str(tmp_path / "m.zarr"))
    assert code == 1 and message in err and not no_cluster
    assert not (tmp_path / "m.zarr").exists()


def test_cluster_commands_get_absolute_store_paths(capsys, tmp_path, monkeypatch, no_cluster):
    """Relative --data/--model are resolved on the client: a remote scheduler's workers
    would resolve them against their own folder."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (40, 2))
    write_arrays(str(tmp_path / "d.zarr"), {"X": X, "y": X[:, 0], "Xt": X[:5],
                                            "Xt3": rng.uniform(size=(5, 3))}, chunk_rows=10)
    monkeypatch.chdir(tmp_path)
    code, _, _ = run(capsys, "fit", "--data", "d.zarr", "--x", "X", "--y", "y", "--model",
                     "m.zarr", "--solver", "exact", "--quiet")
    assert code == 0
    assert (no_cluster[0].data, no_cluster[0].model) == (str(tmp_path / "d.zarr"),
                                                         str(tmp_path / "m.zarr"))
    code, _, err = run(capsys, "predict", "--model", "m.zarr", "--data", "d.zarr", "--x", "Xt3",
                       "--out", "p")
    assert code == 1 and "fitted on 2 features, so expected (m, 2)" in err
    assert len(no_cluster) == 1  # refused before a cluster
    code, _, _ = run(capsys, "predict", "--model", "m.zarr", "--data", "d.zarr", "--x", "Xt",
                     "--out", "p", "--quiet")
    assert code == 0 and no_cluster[1].data == str(tmp_path / "d.zarr")
    np.testing.assert_allclose(open_array(str(tmp_path / "d.zarr"), "p").compute(),
                               dkern.load(str(tmp_path / "m.zarr")).predict(X[:5]), rtol=1e-12)
