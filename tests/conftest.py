"""Shared fixtures: a LocalCluster with two worker processes for the distributed tests, and
the figures the reliability tests measure (written to benchmarks/reliability/, shown at the end
of the test log)."""

import compileall
import json
import os
from pathlib import Path

import dask
import pytest
from threadpoolctl import threadpool_limits

# Triton's kernels run on the CPU through its interpreter here (tests/test_triton.py), in
# this process and in the workers of the clusters tests start; "auto" never picks it.
os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One pytest process per core: a second BLAS thread in each oversubscribes the cores, and
    # OpenBLAS' waiting threads then stall small factorisations (a 324 × 324 dpotri: 1,488 ms
    # on two threads against 4 ms on one, benchmarks/RESULTS.md "Mauna Loa").
    threadpool_limits(1, user_api="blas")

#: Where the reliability tests' figures go: one JSON file per figure set, not tracked by git
#: (benchmarks/RESULTS.md holds the recorded ones).
FIGURES = Path(__file__).resolve().parents[1] / "benchmarks" / "reliability"
_measured: dict[str, dict] = {}
FIGURES_PROPERTY = "dkern_figures"


def pytest_configure(config):
    """Write dkern's bytecode once, in the controlling process. Where PYTHONDONTWRITEBYTECODE
    is set (as on this project's hosts) every process the tests start would otherwise compile
    dkern's source again: about 0.8 s of CPU per process, and the suite starts hundreds
    (command-line runs, scripts, workers). compileall writes whatever that variable says."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(__file__).resolve().parents[1] / "dkern", quiet=1)


@pytest.fixture(autouse=True)
def _dask_scheduler_left_as_found():
    """Fail the test that leaves dask's global scheduler changed (a client left open as
    the default, a ``dask.config.set`` outside ``with``): the files that ran after it in
    the same process would compute on a closed client ("no Client active")."""
    before = dask.config.get("scheduler", None)
    yield
    after = dask.config.get("scheduler", None)
    if after != before:
        dask.config.set(scheduler=before)  # so the next tests are not failed for it too
        pytest.fail(f"the test left dask's scheduler set to {after!r} (was {before!r}): "
                    "close its clients, or set the scheduler in a with block")


@pytest.fixture
def record_figures(request):
    """``record_figures(name, **figures)``: merge figures into benchmarks/reliability/name.json
    and into the test log's summary."""
    def record(name: str, **figures) -> None:
        path = FIGURES / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data.update(figures)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        # through the test's report, which pytest-xdist sends from its worker processes to
        # the process that writes the summary
        request.node.user_properties.append((FIGURES_PROPERTY, json.dumps({name: figures})))
    return record


def pytest_runtest_logreport(report):
    """Collect the figures a test recorded (in this process or in an xdist worker)."""
    for key, value in report.user_properties:
        if key == FIGURES_PROPERTY:
            for name, figures in json.loads(value).items():
                _measured.setdefault(name, {}).update(figures)


def pytest_terminal_summary(terminalreporter):
    """The figures measured in this run, one line each, so the CI log shows them."""
    if not _measured:
        return
    terminalreporter.section("dkern reliability figures (benchmarks/reliability/*.json)")
    for name, figures in sorted(_measured.items()):
        for key, value in sorted(figures.items()):
            text = json.dumps(value, sort_keys=True)
            if len(text) > 400:  # per-trial detail: in the JSON file only
                text = text[:400] + " ..."
            terminalreporter.write_line(f"{name}.{key}: {text}")


@pytest.fixture(scope="session")
def _session_cluster():
    """A LocalCluster with two single-threaded worker processes, started once per session.

    Its client is not made the global default: a test that does not ask for it runs on
    dask's local scheduler, whatever ran before it."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def cluster_client(_session_cluster):
    """A real ``distributed`` client, the scheduler of every dask call in the test."""
    with dask.config.set(scheduler=_session_cluster):
        yield _session_cluster


@pytest.fixture
def sync_scheduler():
    """Run dask graphs in this thread (fast, and tracemalloc sees every allocation)."""
    with dask.config.set(scheduler="synchronous"):
        yield


#: The test files that take longest (minutes of cluster starts, kills and crashes): run
#: first. The test command's ``--dist loadfile --no-loadscope-reorder`` hands files to the
#: two processes in collection order; xdist's default order (most tests first) left these
#: few-test files for last, one process alone on them for 10 minutes (CI, 2026-11-26).
LONGEST_FILES = ("test_checkpoint.py", "test_examples.py", "test_worker_loss.py",
                 "test_multihost.py", "test_memory_limits.py", "test_io_crash.py",
                 "test_outlive_client.py", "test_client_bytes.py", "test_tls.py",
                 "test_gp_regression.py", "test_xarray.py")


def pytest_collection_modifyitems(config, items):
    """The longest files first (a stable sort: the same order in every xdist process);
    tests marked ``gpu`` skip cleanly without a CUDA GPU that KeOps can use (CI has none)."""
    first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))
    _skip_gpu_tests(items)


def _skip_gpu_tests(items):
    from dkern.backends import gpu_visible, keops_status

    if not any("gpu" in item.keywords for item in items):
        return
    if gpu_visible() and keops_status().available:
        return
    reason = ("needs a CUDA GPU visible to KeOps" if not gpu_visible()
              else f"a GPU is visible but KeOps does not work: {keops_status().detail}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
