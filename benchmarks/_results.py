"""Shared helpers of the benchmark scripts: machine facts, timing, and RESULTS.md sections."""

from __future__ import annotations

import atexit
import ctypes
import datetime
import functools
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

RESULTS = Path(__file__).with_name("RESULTS.md")
NAIVE_BLOCK_ROWS = 1000


def machine() -> str:
    """One line naming the machine, for the table headers, with its speed now: the speed
    probe, float64 GEMM and dkern's exp with every core busy (:func:`host_rates`)."""
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gib = psutil.virtual_memory().total / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {gib:.0f} GiB, Python {platform.python_version()}, "
            f"numpy {np.__version__}, {datetime.date.today().isoformat()}; speed probe "
            f"{speed_probe():,.0f} M entries/s; {host_rates()}")


def gpu_line() -> str:
    """The GPU, its multiprocessors, driver and CUDA, and which GPU backends work, for a
    table's machine line (empty facts under Triton's interpreter on the CPU)."""
    import torch

    import dkern.backends.select as select
    from dkern.runtime.gpus import gpu_facts

    if not torch.cuda.is_available():
        return "; no CUDA GPU (a dry run: Triton's interpreter on the CPU)"
    props = torch.cuda.get_device_properties(0)
    driver = next((g["driver"] for g in gpu_facts()), "?")
    return (f"; GPU {props.name} ({props.multi_processor_count} multiprocessors), driver "
            f"{driver}, CUDA {torch.version.cuda} (torch {torch.__version__}); "
            f"triton: {select.triton_status().detail}; keops: {select.keops_status().detail}")


def speed_probe() -> float:
    """Throughput of the naive float64 loop (n = m = 4,000, d = 8) right now, in M entries/s.

    These machines are shared and their speed drifts several-fold over a day; this number,
    taken when a section is written, says how fast the machine was for that section.
    """
    rng = np.random.default_rng(0)
    X, Z = rng.standard_normal((2, 4_000, 8))
    v = rng.standard_normal((4_000, 1))
    seconds, _ = best_time(lambda: naive_numpy(X, Z, v, np.sqrt(8.0)), 3)
    return 4_000**2 / seconds / 1e6


def naive_numpy(X: np.ndarray, Z: np.ndarray, v: np.ndarray, ell: float) -> np.ndarray:
    """The straightforward loop: X_b @ Z.T -> sq. distances -> exp -> @ v, 1000 rows at a time."""
    out = np.empty((len(X), v.shape[1]), dtype=X.dtype)
    zz = (Z * Z).sum(1)
    for i in range(0, len(X), NAIVE_BLOCK_ROWS):
        Xb = X[i:i + NAIVE_BLOCK_ROWS]
        D = (Xb * Xb).sum(1)[:, None] + zz[None, :] - 2 * Xb @ Z.T
        out[i:i + NAIVE_BLOCK_ROWS] = np.exp(-D / (2 * ell**2)) @ v
    return out


def naive_numpy_threaded(X: np.ndarray, Z: np.ndarray, v: np.ndarray, ell: float,
                         threads: int | None = None) -> np.ndarray:
    """:func:`naive_numpy` on ``threads`` row blocks side by side (default: every core),
    BLAS single-threaded in each: the naive loop at its best on this machine (numpy's
    exp and matrix products release the GIL)."""
    threads = threads or os.cpu_count() or 1
    bounds = np.linspace(0, len(X), threads + 1).astype(int)
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        parts = pool.map(lambda i: naive_numpy(X[bounds[i]:bounds[i + 1]], Z, v, ell),
                         range(threads))
        return np.concatenate(list(parts))


#: Flops of dkern_exp_nonpositive (kernels/dkern_exp.h; FMAs count 2): 7 to reduce by
#: ln 2 / 2, 19 for the degree-9 polynomial, 1 to scale.
EXP_FLOPS = 27
#: Flops of one fused Gaussian entry beyond its 3 d of distance (a difference, a multiply
#: and an add per feature): the exp, 1 for the lengthscale and 2 to accumulate. The
#: issue's count (16 + 15 + 2 = 33 at d = 8) assumes a 15-flop exp.
FUSED_EXP_FLOPS = EXP_FLOPS + 3


@functools.cache
def gemm_gflops(size: int = 1_500) -> float:
    """float64 GEMM flops per second, every core busy: one single-threaded ``size``-square
    product per core at once (as the workers run BLAS), best of 3; measured once a run, so
    the machine line and a bound computed from it quote the same reading."""
    rng = np.random.default_rng(0)
    cores = os.cpu_count() or 1
    A = rng.standard_normal((cores, size, size))

    def products(i: int) -> int:
        A[i] @ A[i]
        return 2 * size**3

    # one limit for the process, set and restored here: BLAS's thread count is global, and
    # threads each restoring what they found would leave it at 1 for the rest of the run
    with threadpool_limits(1, user_api="blas"):
        _side_by_side(products, cores)  # warm-up
        return max(flops / wall for flops, wall in
                   (_side_by_side(products, cores) for _ in range(3))) / 1e9


def host_rates() -> str:
    """This host's float64 GEMM and compiled-exp rates now, every core busy, as text."""
    return (f"float64 GEMM {gemm_gflops():.0f} GFLOP/s, dkern's full-range exp "
            f"{exp_rates(0.2)['exp_per_s'] / 1e9:.2f} G/s ({os.cpu_count()} cores busy)")


def peak_rates(seconds: float = 0.5) -> dict[str, float]:
    """This host's peak rates, every core busy: ``fma_gflops`` (float64 multiply-adds at 2
    flops, from benchmarks/_peak.c built by dkern's native machinery; zero where the C
    build is not available) and those of :func:`exp_rates`."""
    from dkern.kernels import native

    lib = native.Native("peak_fma", Path(__file__).with_name("_peak.c"), "DKERN_PEAK",
                        "no peak measurement", headers=(native.HERE / "dkern_vec.h",))
    fma, _ = native.load(lib, lambda library: library.dkern_peak_fma,
                         lambda function: (True, "a benchmark"))
    cores = os.cpu_count() or 1
    rates = {"fma_gflops": 0.0, **exp_rates(seconds)}
    if fma is not None:
        fma.argtypes, fma.restype = [ctypes.c_long, ctypes.c_void_p], ctypes.c_long
        sink = np.zeros(cores)
        rounds = int(2e8 * seconds)
        lanes, wall = _side_by_side(lambda i: fma(rounds, sink[i:].ctypes.data), cores)
        rates["fma_gflops"] = 2 * lanes / wall / 1e9
    return rates


def exp_rates(seconds: float = 0.5) -> dict[str, float]:
    """Values per second of ``exp_per_s`` (dkern's compiled full-range float64 exp, that of
    the tiles, ``fastexp.exp``, on an L2-sized array, every core busy; the fused loop's exp
    is another, for v <= 0) and ``numpy_exp_per_s`` (numpy's, one thread)."""
    from dkern.kernels import fastexp

    cores = os.cpu_count() or 1
    x = -np.linspace(0.0, 30.0, 16_384)  # 128 KiB: in L2, and a call's overhead is small
    out = np.empty((cores, x.size))  # written in place: a fresh array each call page-faults
    per_call = max(100, int(4_000 * seconds))  # calls a thread: long enough to time

    def exps(i: int) -> int:
        for _ in range(per_call):
            fastexp.exp(x, out=out[i])
        return per_call * x.size

    values, wall = _side_by_side(exps, cores)
    seconds_numpy, _ = best_time(lambda: [np.exp(x, out=out[0]) for _ in range(per_call)], 3)
    return {"exp_per_s": values / wall, "numpy_exp_per_s": per_call * x.size / seconds_numpy}


def _side_by_side(work: Callable[[int], int], threads: int) -> tuple[int, float]:
    """(the sum of ``work(i)`` over ``threads`` threads run at once, their wall time)."""
    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        done = sum(pool.map(work, range(threads)))
        return done, time.perf_counter() - start


def fused_bound(rates: dict[str, float], d: int) -> float:
    """Entries per second a fused Gaussian of d features could reach at the peak flop rate
    (``3 d + FUSED_EXP_FLOPS`` flops an entry)."""
    return rates["fma_gflops"] * 1e9 / (3 * d + FUSED_EXP_FLOPS)


def peak_rss_gb() -> float:
    """This process's peak resident set size in GB, from /proc/self/status (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that across fork + exec, so a worker
    spawned by a process at 3.6 GB reports 3.6 GB however little it uses itself.
    """
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib * 1024 / 1e9


def reset_peak_rss() -> None:
    """Restart this process's peak-RSS count (Linux ``clear_refs``), so a benchmark part
    reports its own peak, not that of the parts before it in the same process."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def scratch_dir(prefix: str) -> str:
    """A new temporary folder, removed with everything in it when this process exits: the
    stores a benchmark writes (tens to hundreds of MB each) do not pile up in /tmp."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def best_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls after one warm-up call, and the last result."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def update_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace the section between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = f"{text.rstrip()}\n\n{block}\n"
    path.write_text(text)


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
