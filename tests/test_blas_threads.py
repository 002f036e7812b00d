"""BLAS's thread count is one setting for the whole process: the single-threaded sections
that dask's threads enter side by side must leave it as they found it.

The BLAS is a stand-in here (one process-wide count, saved and restored as threadpoolctl's
limiter does): the OpenBLAS of numpy's and scipy's wheels (0.3.30, 0.3.31) ignores a raise
of the count from any thread while a thread that lowered it lives, which no protocol of the
lowering threads can get around (see ``single_threaded_blas``)."""

import threading

import dask.array as da
import numpy as np
import pytest

import dkern
from dkern.backends import numpy_backend
from dkern.backends.numpy_backend import single_threaded_blas
from dkern.kernels import Matern


class ProcessBlas:
    """One thread count for the process; ``limit`` saves it, sets it, and restores it."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def limit(self, *, limits: int, user_api: str) -> "Limiter":
        return Limiter(self, limits)


class Limiter:
    def __init__(self, blas: ProcessBlas, limits: int) -> None:
        self.blas, self.saved = blas, blas.threads
        blas.threads = limits

    def restore_original_limits(self) -> None:
        self.blas.threads = self.saved

    def __enter__(self) -> "Limiter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore_original_limits()


@pytest.fixture
def blas(monkeypatch):
    fake = ProcessBlas(threads=4)
    monkeypatch.setattr(numpy_backend, "_blas_controller", lambda: fake)
    return fake


def test_overlapping_sections_restore_the_threads_they_found(blas):
    """Thread A enters, B enters, A leaves, B leaves (forced by events): one BLAS thread
    while either is inside, the 4 found before once both are out. Saving and restoring
    per entry left 1 (B saved A's 1 and restored it last)."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with single_threaded_blas():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def second():
        a_in.wait(10)
        with single_threaded_blas():
            b_in.set()
            a_out.wait(10)
            seen["inside after A left"] = blas.threads

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["inside after A left"] == 1
    assert blas.threads == 4


def test_a_threaded_pass_leaves_the_callers_blas_threads(blas):
    """A numpy-backend product (BLAS tiles: a Matérn) on dask's threaded scheduler (64
    blocks, 8 at a time), then the caller's BLAS count: what it was before."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2_000, 3))
    v = rng.normal(size=(2_000, 1))
    Xd = da.from_array(X, chunks=(250, -1))
    op = dkern.gram(Matern(1.0, nu=1.5), Xd, Xd, backend="numpy")
    got = (op @ v).compute(scheduler="threads", num_workers=8)
    assert blas.threads == 4
    K = Matern(1.0, nu=1.5)(X, X)
    np.testing.assert_allclose(got, K @ v, rtol=0, atol=1e-12 * (K @ np.abs(v)).max())
