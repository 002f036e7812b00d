"""Task prefixes on the dashboard say what the tasks do, and carry no iteration number.

A CG solve, a Nyström (Falkon) fit and predictions run on a LocalCluster; the scheduler's
task prefixes (what the dashboard groups by) are compared with dkern's names and with
the generic dask steps cluster/task-names.md lists.
"""

import pathlib
import re
import warnings

import dask.array as da
import numpy as np
import pytest

import dkern
from dkern.errors import ConvergenceWarning
from dkern.kernels import Gaussian
from dkern.solvers import JacobiPreconditioner

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # a LocalCluster, ~11 s

DOC = pathlib.Path(__file__).parent.parent / "cluster" / "task-names.md"


def _generic_words() -> set[str]:
    """The words of dask's own step names, from the doc's last section."""
    section = DOC.read_text().split("## Dask's own steps", 1)[1]
    return set(re.findall(r"`([a-z_]+)`", section))


@pytest.fixture(scope="module")
def prefixes():
    """Task prefixes the scheduler saw while fitting and predicting (threads: fast start)."""
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(5)
    X = rng.normal(size=(600, 3))
    y = np.sin(X[:, 0])
    Xd = da.from_array(X, chunks=(150, -1))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter stops early, on purpose
        common = {"kernel": Gaussian(1.0), "alpha": 0.1, "backend": "numpy", "random_state": 0}
        # CG on K + alpha I as KernelRidge(solver="cg") runs it, with the cheap Jacobi
        # preconditioner (the model's rank-300 Nyström one takes 20 s to build here)
        A = dkern.gram(common["kernel"], Xd, backend="numpy") + common["alpha"]
        cg = dkern.solvers.cg(A, y, preconditioner=JacobiPreconditioner(A), tol=1e-10,
                              max_iter=6)
        exact = dkern.KernelRidge(solver="exact", **common).fit(X, y)
        exact.predict(Xd[:300]).compute()
        ny = dkern.KernelRidge(solver="nystrom", n_centers=40, max_iter=8, **common).fit(Xd, y)
        ny.predict(X[:100])
        assert cg.n_iter >= 2 and ny.n_iter_ >= 2  # several iterations ran
        return client.run_on_scheduler(lambda dask_scheduler: set(dask_scheduler.task_prefixes))


def test_dkern_work_has_names_that_say_what_it_does(prefixes):
    joined = " ".join(sorted(prefixes))
    for name in ("dk-gram-mv", "dk-gram-mv-sum", "dk-diag",
                 "dk-ktk-v", "dk-kt-y", "dk-predict",
                 "dk-predict-sum", "dk-check-X"):
        assert re.search(rf"(^|-){re.escape(name)}(-|$| )", joined), (name, sorted(prefixes))
    old = {"dkern-gram", "dkern-knm-normal", "dkern-knm-cached", "dkern-diag", "dkern-pick",
           "dkern-gram-matvec", "dkern-nystrom-knmtknm", "dkern-predict"}
    assert not old & prefixes


def _shown(prefix):
    """How distributed's progress bars label a prefix (diagnostics/progress_stream.py)."""
    return prefix if len(prefix) <= 15 else prefix[:12] + "..."


def test_prefixes_stay_distinct_as_the_dashboard_cuts_them(prefixes):
    """The progress bars show a prefix over 15 characters as its first 12 and "...":
    before, "dk-knm..." stood for three different passes."""
    own = sorted(p for p in prefixes if p.startswith("dk-") and p.count("dk-") == 1)
    assert len(own) >= 8, own
    assert len({_shown(p) for p in own}) == len(own), [_shown(p) for p in own]
    documented = re.findall(r"^\| `(dk-[a-z-]+)`", DOC.read_text(), flags=re.M)
    assert len(documented) >= 20 and all(len(p) <= 15 for p in documented), \
        [p for p in documented if len(p) > 15]


def test_no_prefix_carries_an_iteration_number(prefixes):
    assert not [p for p in prefixes if re.search(r"\d", p)], sorted(prefixes)


def test_every_other_prefix_is_a_documented_dask_step(prefixes):
    """A prefix without a dkern name is made of the generic words cluster/task-names.md
    lists, so everything the dashboard shows is explained there."""
    words = _generic_words()
    assert {"add", "sum", "rechunk"} <= words
    unexplained = [p for p in prefixes if "dk-" not in p and set(p.split("-")) - words]
    assert not unexplained, f"add these dask steps to {DOC.name}: {sorted(unexplained)}"
