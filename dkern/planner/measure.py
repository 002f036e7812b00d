"""Measure :class:`~dkern.planner.rates.Rates` on this machine (``dkern plan --calibrate``).

Each figure is the best of a few runs of the very function a pass runs (the backend's
block functions, a Zarr read, a ``dask.compute`` on the embedded cluster), at sizes that
take well under a second, so the whole calibration takes well under a minute. Block
functions are timed in this process with single-threaded BLAS, as a worker runs them, while
forked copies run the same call on the other cores: a worker thread's rate while every core
of the machine is busy, as in a pass (the cores share caches, memory bandwidth and the
clock's boost; one call alone on an idle machine ran the sparse GP's blocks faster than a
pass did, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import scipy.linalg as sla

from .rates import Rates, code_digest, machine_name

logger = logging.getLogger(__name__)

__all__ = ["calibrate"]

#: Feature counts the block functions are timed at; ``a + b·d`` is fitted through them.
CALIBRATION_D = (2, 8, 32)
#: Rows × columns of the timed kernel blocks: larger than the L2 cache, as a pass's tiles.
BLOCK_ROWS, BLOCK_COLS = 8192, 1024
#: Centres of the timed sparse-GP blocks: the whitening work grows as M², the kernel as M.
SGPR_M = 1000
#: Rows of the timed store (one default-sized chunk of 100,000 rows of 8 float64 values
#: is 6.4 MB: three of them).
STORE_ROWS, STORE_CHUNK_ROWS, STORE_D = 300_000, 100_000, 8
#: Size of the client's timed GEMM and Cholesky.
CLIENT_N = 2000
REPEATS = 3
#: How the copies that keep the other cores busy are started: a fork runs the very call,
#: closures and all, without pickling it.
FORK = "fork"
#: The clock timings read: wall time. (A test on a shared host reads this process's CPU
#: time instead, which other processes' load does not stretch.)
clock: Callable[[], float] = time.perf_counter


def best_seconds(fn: Callable[[], Any], repeats: int = REPEATS, *, slots: int = 1) -> float:
    """The least time (by ``clock``) of ``repeats`` calls of ``fn``, after a warm-up call;
    with ``slots`` > 1, while ``slots - 1`` forked copies of this process call ``fn`` over
    and over (:func:`busy_copies`): one call's time beside the others, as a pass runs it."""
    if slots > 1 and FORK in multiprocessing.get_all_start_methods():
        with busy_copies(fn, slots - 1):
            return best_seconds(fn, repeats)
    fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


@contextlib.contextmanager
def busy_copies(fn: Callable[[], Any], copies: int) -> Iterator[None]:
    """Within the block, ``copies`` forked processes call ``fn`` until it ends: the other
    cores busy with the same work, as the other workers of a pass are. Processes, not
    threads, as a pass's workers are: OpenBLAS serialises calls from the threads of one
    process (two sparse-GP blocks on two threads took 1.9x one; benchmarks/RESULTS.md)."""
    context = multiprocessing.get_context(FORK)
    stop = context.Event()
    processes = [context.Process(target=_call_until, args=(fn, stop), daemon=True)
                 for _ in range(copies)]
    for process in processes:
        process.start()
    try:
        yield
    finally:
        stop.set()
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():  # a call that would not end: not worth waiting for
                process.kill()


def _call_until(fn: Callable[[], Any], stop: Any) -> None:
    while not stop.is_set():
        fn()


def calibrate(*, workers: int | None = None, backend: str = "auto") -> Rates:
    """Measure this machine's rates (tens of seconds at most).

    Parameters
    ----------
    workers : int, optional
        Workers of the embedded cluster whose start and round trips are timed (default:
        what ``dkern.connect()`` starts, one per core).
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        Whose block functions are timed.
    """
    from ..backends import block_backend, resolve_backend

    blocks = block_backend(resolve_backend(backend))
    slots = os.cpu_count() or 1
    measured: dict[str, Any] = {"backend": type(blocks).__name__, "calls_at_once": slots}
    entry = {name: _entry_fit(blocks, name, measured, slots=slots) for name in
             ("kernel_matvec", "normal_matvec", "kernel_block")}
    sgpr = _sgpr_rates(blocks, entry["kernel_block"], measured, slots=slots)
    read, write = _store_rates(measured)
    cluster = _cluster_rates(workers or slots, measured)
    cached = _cached_rate(measured, slots=slots)
    rates = Rates(entry_seconds=entry, cached_normal_entries_per_s=cached,
                  sgpr_statistics_units_per_s=sgpr[0], sgpr_predict_units_per_s=sgpr[1],
                  read_bytes_per_s=read, write_bytes_per_s=write, **_client_rates(measured),
                  **cluster, machine=machine_name(), code=code_digest(),
                  measured=measured)
    logger.info("dkern plan: calibrated %s", rates.machine)
    return rates


def _entry_fit(blocks: Any, name: str, measured: dict[str, Any],
               ds: tuple[int, ...] = CALIBRATION_D, slots: int = 1) -> list[float]:
    """``[a, b]`` of ``seconds per entry = a + b·d`` for one block function, by least
    squares through its times at the feature counts ``ds`` (the distance part grows with
    d; one d gives ``b = 0``), ``slots`` calls at once."""
    from ..kernels import Gaussian

    rng = np.random.default_rng(0)
    per_entry = []
    for d in ds:
        x, z = rng.standard_normal((BLOCK_ROWS, d)), rng.standard_normal((BLOCK_COLS, d))
        kernel = Gaussian(lengthscale=float(np.sqrt(d)))
        if name == "kernel_block":
            call = lambda x=x, z=z, k=kernel: blocks.kernel_block(x, z, kernel=k)  # noqa: E731
        elif name == "normal_matvec":
            v = rng.standard_normal((BLOCK_COLS, 1))
            call = lambda x=x, z=z, v=v, k=kernel: blocks.normal_matvec(x, z, v, kernel=k)  # noqa: E731
        else:
            v = rng.standard_normal((BLOCK_COLS, 1))
            call = lambda x=x, z=z, v=v, k=kernel: blocks.kernel_matvec(x, z, v, kernel=k)  # noqa: E731
        per_entry.append(best_seconds(call, slots=slots) / (BLOCK_ROWS * BLOCK_COLS))
    b, a = np.polyfit(np.array(ds, dtype=float), np.array(per_entry), 1) if len(ds) > 1 \
        else (0.0, per_entry[0])
    if b < 0:  # noise, not entries that get cheaper with d
        b, a = 0.0, float(np.mean(per_entry))
    measured[f"{name}_M_entries_per_s"] = {d: round(1e-6 / s, 1) for d, s in
                                           zip(ds, per_entry, strict=True)}
    return [float(max(a, 0.1 * per_entry[0])), float(b)]


def _cached_rate(measured: dict[str, Any], slots: int = 1) -> float:
    """Entries per second of ``Kᵀ (K v)`` over a cached block (BLAS matrix-vector, bound by
    memory bandwidth: the calls at once share it)."""
    from ..operators.nystrom import cached_normal_block

    rng = np.random.default_rng(1)
    K, v = rng.standard_normal((BLOCK_ROWS, BLOCK_COLS)), rng.standard_normal((BLOCK_COLS, 1))
    rate = K.size / best_seconds(lambda: cached_normal_block(K, v), slots=slots)
    measured["cached_normal_M_entries_per_s"] = round(rate / 1e6, 1)
    return rate


def _sgpr_rates(blocks: Any, kernel_fit: list[float], measured: dict[str, Any],
                slots: int = 1) -> tuple[float, float]:
    """``rows · M²`` per second of the sparse GP's statistics and prediction blocks, the
    kernel values' share (``kernel_block``'s rate) taken out."""
    from ..kernels import Gaussian
    from ..solvers.sgpr import whitening_rows

    rng = np.random.default_rng(2)
    d, rows, M = 8, 4096, SGPR_M
    x, z, y = rng.standard_normal((rows, d)), rng.standard_normal((M, d)), np.ones((rows, 1))
    kernel = Gaussian(lengthscale=3.0)
    L = np.linalg.cholesky(kernel(z, z) + 1e-6 * np.eye(M))
    LB, c = np.linalg.cholesky(2 * np.eye(M)), rng.standard_normal((M, 1))
    tile = whitening_rows(M)
    kernel_s = rows * M * (kernel_fit[0] + kernel_fit[1] * d)
    stats = best_seconds(lambda: blocks.sgpr_statistics(x, z, y, L, kernel=kernel, tile=tile),
                         slots=slots)
    pred = best_seconds(lambda: blocks.sgpr_predict(x, z, L, LB, c, kernel=kernel, tile=tile),
                        slots=slots)
    units = rows * M * M
    rates = (units / max(stats - kernel_s, 0.1 * stats), units / max(pred - kernel_s, 0.1 * pred))
    measured["sgpr_seconds_4096_rows_M_1000"] = {"statistics": round(stats, 4),
                                                  "predict": round(pred, 4)}
    return rates


def _store_rates(measured: dict[str, Any]) -> tuple[float, float]:
    """Bytes per second of array written to and read from a local Zarr store, one thread
    (dask's synchronous scheduler), chunk by chunk as a pass reads them."""
    import dask

    from ..io import open_array, write_array

    X = np.random.default_rng(3).standard_normal((STORE_ROWS, STORE_D))
    with tempfile.TemporaryDirectory(prefix="dkern-plan-") as folder, \
            dask.config.set(scheduler="synchronous"):
        url = os.path.join(folder, "store.zarr")
        write_s = best_seconds(lambda: write_array(X, url, "X", overwrite=True,
                                                   chunk_rows=STORE_CHUNK_ROWS), repeats=2)
        read_s = best_seconds(lambda: open_array(url, "X").compute())
    measured["store_MB_per_s"] = {"read": round(X.nbytes / read_s / 1e6, 1),
                                  "write": round(X.nbytes / write_s / 1e6, 1)}
    return X.nbytes / read_s, X.nbytes / write_s


def _client_rates(measured: dict[str, Any]) -> dict[str, float]:
    """The client's multithreaded GEMM and Cholesky flops, and the bytes per second of a
    triangular solve against one vector (memory-bound)."""
    rng = np.random.default_rng(4)
    A = rng.standard_normal((CLIENT_N, CLIENT_N))
    S = A @ A.T + CLIENT_N * np.eye(CLIENT_N)
    gemm = 2 * CLIENT_N**3 / best_seconds(lambda: A @ A)
    chol = CLIENT_N**3 / 3 / best_seconds(lambda: sla.cholesky(S, lower=False))
    T = np.triu(rng.standard_normal((2 * CLIENT_N, 2 * CLIENT_N))) + 4 * CLIENT_N * np.eye(
        2 * CLIENT_N)
    v = rng.standard_normal(2 * CLIENT_N)
    solve = T.nbytes / best_seconds(lambda: sla.solve_triangular(T, v, check_finite=False))
    measured["client_GFlops"] = {"gemm": round(gemm / 1e9, 1), "cholesky": round(chol / 1e9, 1)}
    return {"client_flops": gemm, "client_cholesky_flops": chol, "client_bytes_per_s": solve}


def pass_overheads() -> tuple[float, float]:
    """Seconds of one pass that does (almost) no work, on the current scheduler, and the
    extra seconds per task: Falkon's normal matvec over 2 and over 32 chunks of 16 rows
    (graph building, scheduling, the round trip: what every pass pays besides its blocks).
    """
    import dask
    import dask.array as da

    from ..kernels import Gaussian
    from ..operators.nystrom import NystromOperator

    rng = np.random.default_rng(5)
    v, times = np.ones((8, 1)), {}
    for chunks in (2, 32):
        (X,) = dask.persist(da.from_array(rng.standard_normal((16 * chunks, 2)), chunks=(16, 2)))
        op = NystromOperator(Gaussian(1.0), X, rng.standard_normal((8, 2)))
        times[chunks] = best_seconds(lambda op=op: dask.compute(op.normal_matvec(v)))
    return times[2], max(times[32] - times[2], 0.0) / 30


#: A command with no work: its imports, the embedded cluster's start, one tiny pass, the
#: cluster's stop and the interpreter's exit (which waits for the worker processes).
_EMPTY_COMMAND = ("import logging, dask.array, dkern.cli, dkern.models\n"
                  "from dkern.runtime import connect\n"
                  "with connect(n_workers={workers}, silence_logs=logging.CRITICAL):\n"
                  "    dask.array.ones(4, chunks=2).sum().compute()\n")


def _cluster_rates(workers: int, measured: dict[str, Any]) -> dict[str, Any]:
    """The embedded cluster's fixed costs: a command's start and stop (a fresh interpreter
    running :data:`_EMPTY_COMMAND`, exit included), a pass's overheads, and an idle worker's
    resident memory (after those passes: what a worker holds before a real pass)."""
    from ..runtime import connect
    from ..runtime.resources import process_rss

    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", _EMPTY_COMMAND.format(workers=workers)], check=True)
    command = time.perf_counter() - start
    start = time.perf_counter()
    client = connect(n_workers=workers, silence_logs=logging.CRITICAL)
    try:
        started = time.perf_counter() - start
        trip, per_task = pass_overheads()
        idle = max(client.run(process_rss).values())
    finally:
        client.close()
    measured["cluster"] = {"workers": workers, "empty_command_s": round(command, 2),
                           "connect_s": round(started, 2), "pass_ms": round(1e3 * trip, 1),
                           "task_ms": round(1e3 * per_task, 2)}
    return {"start_seconds": command, "round_trip_seconds": trip,
            "task_seconds": per_task, "worker_idle_bytes": int(idle)}
