"""Operands go to the cluster once: a solver iteration sends scalars and graph, not data."""

import numpy as np
import pytest

from dkern import gram
from dkern.kernels import Gaussian
from dkern.solvers import cg, falkon

pytestmark = [pytest.mark.distributed,
              pytest.mark.filterwarnings("ignore::dkern.errors.ConvergenceWarning")]

#: What one iteration may send from the client, whatever n is: its graph (a few tasks per
#: chunk pair, each naming the kernel) and the scalars of the step; measured ~5 KB.
ITERATION_BYTES = 32 * 1024


def _bytes_per_iteration(client, solve):
    """Median bytes the client sent to the scheduler per solver iteration (after the first)."""
    sent = []
    solve(lambda k, rel: sent.append(client.scheduler_comm.byte_count))
    return float(np.median(np.diff(sent[1:])))


def _data(n, rng):
    X = rng.uniform(-1, 1, size=(n, 8))  # 4,000 rows: 256 KB, far above ITERATION_BYTES
    return X, np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=n)


@pytest.mark.parametrize("n", [4_000, 8_000])  # each CG step is n² kernel values
def test_cg_iteration_sends_no_data(cluster_client, n):
    X, y = _data(n, np.random.default_rng(0))
    A = gram(Gaussian(1.0), X, backend="numpy") + 1e-2
    per_iter = _bytes_per_iteration(cluster_client, lambda cb: cg(
        A, y, tol=1e-30, max_iter=8, callback=cb, refresh_every=100))
    assert per_iter < ITERATION_BYTES, f"{per_iter:.0f} bytes per CG iteration at n={n}"


@pytest.mark.parametrize("n", [4_000, 16_000])
def test_falkon_iteration_sends_no_data(cluster_client, n):
    X, y = _data(n, np.random.default_rng(1))
    per_iter = _bytes_per_iteration(cluster_client, lambda cb: falkon(
        Gaussian(1.0), X, y, X[:50], 1e-3, tol=1e-30, max_iter=8, callback=cb, cache_bytes=0,
        backend="numpy"))
    assert per_iter < ITERATION_BYTES, f"{per_iter:.0f} bytes per Falkon iteration at n={n}"
