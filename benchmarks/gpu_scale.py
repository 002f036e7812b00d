"""Nyström KRR at n = 10⁷ and the sparse GP at n = 10⁶ on one GPU worker, against the CPU
cluster of the same machine: the GPU issue's acceptance points, in one timed run.

    python benchmarks/gpu_scale.py                   # on the lent GPU machine, every default
    python benchmarks/gpu_scale.py --n 20000 --m-centres 200 --test-n 2000 --cpu-n 5000 \\
        --gp-n 5000 --gp-test 2000 --gp-centres 100 --backend keops --results /tmp/r.md
                                                     # a smoke run on a CPU-only host

Phases, in this order, each timed, each catching its own failure (the section is rewritten
after every phase, so a run cut short keeps what it measured):

1. A CPU ``LocalCluster`` (``dkern.connect()``: one worker per core) writes the synthetic
   stores in parallel (``dkern.io.make_regression_store``: X uniform on [-1, 1]^8,
   y = sin(3 x0) + 0.5 cos(2 Σx/√8) + 0.1 N(0, 1), noise-free test targets): ``--n`` rows
   for KRR, ``--gp-n`` for the GP, each with its test rows.
2. (a) on the CPU cluster, backend "numpy": ``KernelRidge(solver="nystrom")`` (Falkon) on the
   first ``--cpu-n`` rows of the same store, same M, same fixed iteration count.
3. (b) on the CPU cluster, backend "numpy": the SGPR fit on all ``--gp-n`` rows and its mean
   and std at the test rows, the reference the GPU's predictions are compared with (the same
   ``random_state`` and data draw the same centres; the script checks they are equal).
4. One GPU worker (``dkern.connect(gpus=1)``; ``--no-gpu``: a plain 1-worker cluster); for
   each ``--backend`` (KeOps first), after a small warm-up fit that compiles its formulas:
   (a) the Falkon fit on all ``--n`` rows read from Zarr, predictions at the test rows;
   (b) the SGPR fit on ``--gp-n`` rows and mean + std at ``--gp-test`` points, compared
   with the CPU numpy fit and, at ``--gp-check`` points, with the predictive formulas written
   out densely in numpy from the fitted model's own M-sized statistics.

Falkon runs exactly ``--iterations`` iterations on both sides (``tol`` is set below what
float64 can reach), so its time per iteration compares like with like: each iteration is
one pass over the rows computing ``K_nmᵀ (K_nm v)``, n·M kernel values, linear in n. The
per-iteration time comes from the solver's callback (time between the first and the last
iteration), apart from the work before the loop (centres, the preconditioner's sample and
factors, ``K_nmᵀ y``, compiling) and after it (two more passes: the last residual and the
normal-equation residual). Phases are skipped, not started, when the ``--budget`` left is
below what they are expected to take; a Falkon loop still running at its deadline stops
there and reports the iterations it timed; a phase still running 5 s past the budget is cut
short (the section is written with a note, the process exits with status 3).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import dask
import numpy as np
import scipy.linalg as sla

sys.path.insert(0, str(Path(__file__).parent))
from _results import (  # noqa: E402
    RESULTS,
    machine,
    markdown_table,
    peak_rss_gb,
    reset_peak_rss,
    update_section,
)
from gp import KERNEL as GP_KERNEL  # noqa: E402
from krr import ALPHA, ELL, rmse  # noqa: E402

import dkern  # noqa: E402
from dkern.errors import ConvergenceWarning  # noqa: E402
from dkern.io import make_regression_store, open_array, read_attrs  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402
from dkern.runtime.gpus import GPU_WORKER_THREADS, gpu_facts, visible_gpus  # noqa: E402

SECTION = "gpu-scale"
#: Below anything float64 Falkon reaches here, so both sides run exactly --iterations.
FIXED_TOL = 1e-14
#: Seconds a phase is expected to need when no earlier backend has measured it: below
#: this much budget left it is skipped (a first estimate; a later backend uses the
#: measured time of the same phase instead).
FIRST_GUESS = {"krr-gpu": 60.0, "gp-gpu": 55.0, "krr-cpu": 20.0, "gp-cpu": 20.0}
#: Budget kept for closing the clusters and writing the section.
RESERVE_S = 8.0
#: The CPU cluster's Falkon loop stops after this many seconds (its per-iteration time is
#: then from the iterations it ran), so that the GPU phases keep their budget.
CPU_LOOP_CAP_S = 30.0
#: A phase still running this many seconds after the budget's end is cut short: the section
#: is written with a note saying so and the process exits (status 3), so that a session's
#: own time limit does not kill the run before it has written what it measured.
HARD_STOP_AFTER_S = 5.0
_WRITING = threading.Lock()


class OutOfTime(Exception):
    """The budget ran out inside a Falkon loop."""


class Run:
    """The arguments, the clock and everything measured so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.end = self.t0 + args.budget
        self.machine = ""
        self.gpu = ""
        self.worker = ""
        self.worker_side = ""
        self.stores: dict[str, str] = {}
        self.sigma2 = 0.01
        self.krr_rows: list[list[Any]] = []
        self.gp_rows: list[list[Any]] = []
        self.notes: list[str] = []
        self.took: dict[str, float] = {}
        self.cpu_gp: dict[str, Any] = {}
        self.cpu_krr_ns: float | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.end - time.perf_counter()


def say(run: Run, message: str) -> None:
    """A progress line with the seconds since the start (the output is read remotely)."""
    print(f"[{run.elapsed():7.1f} s] {message}", flush=True)


def run_phase(run: Run, name: str, kind: str, fn: Callable[[], Any], reserve: float = 0.0) -> Any:
    """Run ``fn`` unless the budget left (less ``reserve`` for later phases) is below what
    ``kind`` is expected to take; record a skip or a failure as a note. Returns fn's result
    or None."""
    need = run.took.get(kind, FIRST_GUESS.get(kind, 0.0))
    left = run.left() - RESERVE_S - reserve
    if left < need:
        kept = f" after keeping {reserve:.0f} s for a later phase" if reserve else ""
        run.notes.append(f"{name}: **skipped**, {left:.0f} s of budget left{kept}, about "
                         f"{need:.0f} s needed.")
        say(run, f"skip {name}: {left:.0f} s left{kept}, about {need:.0f} s needed")
        return None
    say(run, f"start {name} ({left:.0f} s of budget left)")
    start = time.perf_counter()
    try:
        result = fn()
    except Exception as err:  # one failing phase must not lose the others' figures
        traceback.print_exc()
        sys.stdout.flush()
        run.notes.append(f"{name}: **failed** after {time.perf_counter() - start:.1f} s: "
                         f"`{type(err).__name__}: {str(err)[:300]}`")
        say(run, f"FAILED {name}: {type(err).__name__}: {err}")
        result = None
    else:
        run.took[kind] = time.perf_counter() - start
        say(run, f"done {name} in {run.took[kind]:.1f} s")
    write_section(run)
    return result


# ----------------------------------------------------------------------- memory
def worker_reset() -> None:
    """Run on each worker: restart its peak-RSS count."""
    reset_peak_rss()


def worker_peak() -> float:
    """Run on each worker: its peak RSS in GB since the last reset."""
    return peak_rss_gb()


class PhaseMemory:
    """A phase's peak memory: the RSS of the client (with the scheduler) and of its largest
    worker (VmHWM, reset as the phase starts), and, with a GPU, the GPU memory in use
    (``nvidia-smi`` sampled every 0.5 s: every process on GPU 0, this client's CUDA context
    included)."""

    def __init__(self, client: Any, gpu: bool) -> None:
        self.client, self.gpu, self.peak_mib = client, gpu, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "-i", "0",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=10).stdout
                self.peak_mib = max(self.peak_mib, int(out.strip().splitlines()[0]))
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass
            self._stop.wait(0.5)

    def __enter__(self) -> PhaseMemory:
        reset_peak_rss()
        self.client.run(worker_reset)
        if self.gpu:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.gpu:
            self._thread.join(timeout=15)

    def text(self) -> str:
        workers = self.client.run(worker_peak)
        out = f"client {peak_rss_gb():.1f} GB, worker {max(workers.values()):.1f} GB"
        return out + (f", GPU {self.peak_mib / 1024:.1f} GiB" if self.gpu else "")


def close(client: Any) -> None:
    """Close the client and its embedded cluster (closing the client alone leaves the
    cluster that connect() passed it running)."""
    cluster = client.cluster
    client.close()
    if cluster is not None:
        cluster.close()


# ------------------------------------------------------------------------- data
def write_stores(run: Run) -> None:
    """The KRR and GP stores, written by the CPU cluster's workers in parallel."""
    a = run.args
    root = a.workdir or tempfile.mkdtemp(prefix="dkern-gpu-scale-")
    run.stores["root"] = root
    dtype = np.dtype(a.dtype)
    jobs, written = [], []
    if "a" in a.only:
        jobs.append(("krr", a.n, a.test_n, a.chunk_rows))
    if "b" in a.only:  # about 32 chunks: two per worker of a 16-core CPU cluster
        jobs.append(("gp", a.gp_n, a.gp_test, max(1_000, -(-a.gp_n // 32))))
    for name, n, n_test, chunk_rows in jobs:
        url = os.path.join(root, f"{name}.zarr")
        start = time.perf_counter()
        make_regression_store(url, n, 8, chunk_rows=min(chunk_rows, n), n_test=n_test, seed=0,
                              dtype=dtype)
        run.stores[name] = url
        written.append(f"{name}: {n:,} + {n_test:,} test rows in chunks of "
                       f"{min(chunk_rows, n):,}, {time.perf_counter() - start:.1f} s")
        say(run, f"wrote {url}: {written[-1]}")
    if "gp" in run.stores:
        run.sigma2 = read_attrs(run.stores["gp"])["noise"] ** 2
    run.notes.append(f"Zarr stores ({a.dtype}, d = 8) written in parallel by the CPU "
                     f"cluster: {'; '.join(written)}.")


def load(url: str, name: str, rows: Any = None) -> np.ndarray:
    arr = open_array(url, name)
    return (arr if rows is None else arr[rows]).compute()


# ------------------------------------------------------------------- (a) Falkon
class IterationClock:
    """Falkon's callback: the time of every iteration (the call for iteration 0 comes when
    the loop starts, after the set-up); raises OutOfTime past ``deadline``, once two
    iterations are timed."""

    def __init__(self, run: Run, label: str, deadline: float) -> None:
        self.run, self.label, self.deadline, self.times = run, label, deadline, []

    def __call__(self, iteration: int, residuals: np.ndarray) -> None:
        self.times.append(time.perf_counter())
        step = self.times[-1] - self.times[-2] if len(self.times) > 1 else float("nan")
        say(self.run, f"{self.label} iteration {iteration}: residual "
                      f"{np.max(residuals):.2e}, {step:.2f} s")
        # two iterations at least: the per-iteration time is what a stopped loop still gives
        if self.times[-1] > self.deadline and 2 <= iteration < self.run.args.iterations:
            raise OutOfTime(f"the budget ran out after {iteration} iterations")


def fit_krr(run: Run, X: Any, y: Any, backend: str, label: str, deadline: float
            ) -> tuple[Any, dict[str, float]]:
    """Falkon with exactly --iterations iterations; the model (None if the deadline stopped
    it) and the times: fit, before the loop, per iteration, after the loop."""
    model = dkern.KernelRidge(Gaussian(ELL), alpha=ALPHA, solver="nystrom",
                              n_centers=run.args.m_centres, tol=FIXED_TOL,
                              max_iter=run.args.iterations, backend=backend, random_state=0)
    clock = IterationClock(run, label, deadline)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():  # the fixed count ends above tol by design
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X, y, callback=clock)
    except OutOfTime as stop:
        run.notes.append(f"{label}: the Falkon loop was stopped by the budget ({stop}); "
                         "its per-iteration time is from the iterations it ran.")
        model = None
    fit_s = time.perf_counter() - start
    t = clock.times
    per = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")
    return model, {"fit": fit_s, "per": per, "iters": max(0, len(t) - 1),
                   "before": (t[0] - start) if t else float("nan"),
                   "after": (start + fit_s - t[-1]) if t else float("nan")}


def krr_row(run: Run, side: str, backend: str, n: int, times: dict[str, float], model: Any,
            url: str, mem: str) -> float:
    """Predict the test rows, append the table row; returns ns per row-iteration."""
    pred_s, err, resid = float("nan"), "-", "-"
    if model is not None:
        start = time.perf_counter()
        pred = model.predict((url, "X_test")).compute()
        pred_s = time.perf_counter() - start
        err = f"{rmse(pred, load(url, 'y_test')):.4f}"
        resid = f"{model.residuals_[-1].max():.1e}"
    per, M = times["per"], run.args.m_centres
    ns = per / n * 1e9
    warm = f"{times['warm']:.1f}" if times.get("warm") else "-"
    run.krr_rows.append([side, backend, f"{n:,}", f"{M:,}", times["iters"], warm,
                         f"{times['fit']:.1f}", f"{times['before']:.1f}", f"{per:.3f}",
                         f"{times['after']:.1f}", f"{ns:,.1f}", f"{n * M / per / 1e9:.3g}",
                         f"{pred_s:.1f}", err, resid, mem])
    return ns


def krr_cpu(run: Run, client: Any) -> None:
    """(a) on the CPU cluster: the first --cpu-n rows of the KRR store, backend numpy."""
    a, url = run.args, run.stores["krr"]
    n = min(a.cpu_n, a.n)
    rows = max(1, -(-n // (2 * len(client.scheduler_info()["workers"]))))  # 2 chunks a worker
    X = open_array(url, "X")[:n].rechunk((rows, -1))
    y = open_array(url, "y")[:n].rechunk((rows,))
    deadline = min(run.end - RESERVE_S, time.perf_counter() + CPU_LOOP_CAP_S)
    with PhaseMemory(client, gpu=False) as mem:
        model, times = fit_krr(run, X, y, "numpy", "CPU numpy", deadline)
    run.cpu_krr_ns = krr_row(run, cpu_side(client), "numpy", n, times, model, url, mem.text())


def warm_up(run: Run, backend: str, part: str) -> float:
    """Seconds of a small fit and prediction on the worker with ``backend``, which compiles
    the formulas the timed fit then finds compiled (KeOps' and Triton's depend on d, the
    dtype and the right-hand side's width, not on n)."""
    if backend == "numpy":
        return 0.0
    start = time.perf_counter()
    if part == "a":
        url, rows = run.stores["krr"], min(run.args.n, 2_000)
        model = dkern.KernelRidge(Gaussian(ELL), alpha=ALPHA, solver="nystrom",
                                  n_centers=min(100, rows), max_iter=1, backend=backend,
                                  random_state=0)
    else:  # the whitened blocks' width is M's: the same M as the timed fit
        url, rows = run.stores["gp"], min(run.args.gp_n, max(2 * run.args.gp_centres, 2_000))
        model = gp_model(run, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(open_array(url, "X")[:rows], open_array(url, "y")[:rows])
    Xt = open_array(url, "X_test")[:10]
    dask.compute(model.predict(Xt, return_std=True) if part == "b" else model.predict(Xt))
    say(run, f"warm-up {part} {backend}: {time.perf_counter() - start:.1f} s")
    return time.perf_counter() - start


def krr_gpu(run: Run, client: Any, backend: str, deadline: float) -> None:
    """(a) on the GPU worker: all --n rows from the Zarr store."""
    url = run.stores["krr"]
    warm = warm_up(run, backend, "a")
    with PhaseMemory(client, gpu=run.args.gpu_visible) as mem:
        model, times = fit_krr(run, (url, "X"), (url, "y"), backend, f"GPU {backend}", deadline)
    times["warm"] = warm
    ns = krr_row(run, run.worker_side, backend, run.args.n, times, model, url, mem.text())
    if run.cpu_krr_ns and np.isfinite(ns):
        run.notes.append(
            f"(a) {backend}: {ns:,.1f} ns per row-iteration on the GPU worker against "
            f"{run.cpu_krr_ns:,.1f} on the CPU cluster: **{run.cpu_krr_ns / ns:.3g}×** the CPU "
            f"cluster's throughput, measured at different n ({run.args.n:,} and "
            f"{min(run.args.cpu_n, run.args.n):,} rows). An iteration's kernel work is "
            "linear in n, but the CPU's time per iteration at its smaller n also holds work "
            "that does not grow with n (the preconditioner's M-sized solves, dask's "
            "per-iteration overhead), so this ratio overstates the GPU's lead at equal n. "
            f"Scaled linearly, the CPU cluster would need about "
            f"{run.cpu_krr_ns * run.args.n / 1e9:.3g} s per iteration at n = {run.args.n:,}: "
            "an extrapolation, not measured.")


# ---------------------------------------------------------------------- (b) SGPR
def gp_model(run: Run, backend: str) -> Any:
    return dkern.GaussianProcessRegressor(GP_KERNEL, alpha=run.sigma2, optimizer=None,
                                          solver="nystrom", variance="nystrom",
                                          n_centers=run.args.gp_centres, random_state=0,
                                          backend=backend)


def fit_gp(run: Run, backend: str, n_test: int) -> tuple[Any, np.ndarray, np.ndarray, list]:
    """SGPR fit on the GP store, mean and std at its first ``n_test`` test rows; the model,
    mean, std and [fit s, predict s]."""
    url = run.stores["gp"]
    model = gp_model(run, backend)
    start = time.perf_counter()
    model.fit((url, "X"), (url, "y"))
    fit_s = time.perf_counter() - start
    say(run, f"SGPR {backend} fitted in {fit_s:.1f} s")
    Xt = open_array(url, "X_test")[:n_test]
    mean, std = dask.compute(*model.predict(Xt, return_std=True))
    return model, mean, std, [fit_s, time.perf_counter() - start - fit_s]


def dense_sgpr(model: Any, Xc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The SGPR (Titsias) mean and latent std at Xc (m, d), written out densely in numpy from
    the fitted model's M-sized statistics (dkern.solvers.sgpr's notation): with
    ``A = L⁻¹ K_u*`` and ``A_B = L_B⁻¹ A``, mean ``K_*u w`` and variance
    ``k** − ‖A‖² + ‖A_B‖²``."""
    post = model._posterior_here()
    st = post.stats
    Kuc = np.asarray(st.kernel(st.centers, Xc), dtype=np.float64)  # shape: (M, m)
    A = sla.solve_triangular(st.L, Kuc, lower=True)
    LB = np.linalg.cholesky(np.eye(len(st.P)) + st.P / post.noise)
    AB = sla.solve_triangular(LB, A, lower=True)
    prior = np.asarray(st.kernel.diag(Xc), dtype=np.float64)
    var = np.minimum(np.maximum(prior - (A * A).sum(0), 0.0) + (AB * AB).sum(0), prior)
    return Kuc.T @ np.asarray(model.alpha_), np.sqrt(var)


def gp_row(run: Run, side: str, backend: str, model: Any, mean: np.ndarray, std: np.ndarray,
           times: list, mem: str, reference: bool = False) -> None:
    """Append the GP table row: RMSE, and the differences from the CPU fit and the dense
    formulas at --gp-check test points."""
    url, a = run.stores["gp"], run.args
    truth = load(url, "y_test")[:len(mean)]
    idx = np.sort(np.random.default_rng(3).choice(len(mean), min(a.gp_check, len(mean)),
                                                  replace=False))
    dmean, dstd = dense_sgpr(model, load(url, "X_test", idx))
    dense = f"{np.abs(mean[idx] - dmean).max():.1e} / {np.abs(std[idx] - dstd).max():.1e}"
    vs_cpu = ["(reference)" if reference else "-"] * 2  # "-": no CPU fit to compare with
    if run.cpu_gp and not reference:
        k = min(len(mean), len(run.cpu_gp["mean"]))
        same = np.array_equal(model.centers_, run.cpu_gp["centers"])
        vs_cpu = [f"{np.abs(mean[:k] - run.cpu_gp['mean'][:k]).max():.1e}",
                  f"{np.abs(std[:k] - run.cpu_gp['std'][:k]).max():.1e}"
                  + ("" if same else " (**other centres**)")]
    warm = f"{times[2]:.1f}" if len(times) > 2 and times[2] else "-"
    run.gp_rows.append([side, backend, f"{a.gp_n:,}",
                        f"{a.gp_centres:,}", f"{len(mean):,}", warm, f"{times[0]:.1f}",
                        f"{times[1]:.1f}", f"{rmse(mean, truth):.4f}", *vs_cpu,
                        f"{len(idx)}: {dense}", mem])


def gp_cpu(run: Run, client: Any) -> None:
    """(b) on the CPU cluster, backend numpy: the reference fit and predictions."""
    n_test = run.args.gp_test if run.args.gp_cpu_test is None else run.args.gp_cpu_test
    with PhaseMemory(client, gpu=False) as mem:
        model, mean, std, times = fit_gp(run, "numpy", max(1, min(n_test, run.args.gp_test)))
    gp_row(run, cpu_side(client), "numpy", model, mean, std, times, mem.text(), reference=True)
    run.cpu_gp = {"mean": mean, "std": std, "centers": model.centers_}


def gp_gpu(run: Run, client: Any, backend: str) -> None:
    """(b) on the GPU worker: fit and mean + std at all --gp-test points."""
    warm = warm_up(run, backend, "b")
    with PhaseMemory(client, gpu=run.args.gpu_visible) as mem:
        model, mean, std, times = fit_gp(run, backend, run.args.gp_test)
    times.append(warm)
    gp_row(run, run.worker_side, backend, model, mean, std, times, mem.text())


# ---------------------------------------------------------------------- clusters
def cpu_side(client: Any) -> str:
    return f"CPU cluster ({len(client.scheduler_info()['workers'])} workers × 1 thread)"


def worker_device() -> dict[str, str]:
    """Run on the GPU worker: what it sees."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    try:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    except Exception as err:  # torch missing or broken: say so, the phases will too
        name = f"torch: {type(err).__name__}"
    return {"visible": seen, "device": name, "ld_preload": os.environ.get("LD_PRELOAD", "")}


def gpu_client(run: Run) -> Any:
    """One GPU worker (``connect(gpus=1)``), or with --no-gpu one plain worker as a stand-in."""
    a = run.args
    threads = {} if a.gpu_threads is None else {"threads_per_worker": a.gpu_threads}
    client = (dkern.connect(n_workers=1, threads_per_worker=a.gpu_threads or GPU_WORKER_THREADS)
              if a.no_gpu else dkern.connect(gpus=1, **threads))
    [(address, info)] = client.run(worker_device).items()
    run.worker = (f"worker `{address}`: CUDA_VISIBLE_DEVICES={info['visible']}, sees "
                  f"{info['device']}; LD_PRELOAD {'set' if info['ld_preload'] else 'unset'}")
    nthreads = a.gpu_threads or GPU_WORKER_THREADS
    run.worker_side = (f"GPU worker (1 × {nthreads} threads)" if not a.no_gpu
                       else f"1 CPU worker × {nthreads} threads (--no-gpu)")
    say(run, run.worker)
    return client


def gpu_phases(run: Run) -> None:
    """Every backend's (a) then (b), on one GPU worker. The first backend's (a) leaves its
    (b) the time (b) is expected to take: its Falkon loop stops early rather than eat it."""
    a = run.args
    client = run_phase(run, "start the GPU worker", "start-gpu", lambda: gpu_client(run))
    if client is None:
        return
    try:
        for backend in a.backend:
            if "a" in a.only:
                keep = (run.took.get("gp-gpu", FIRST_GUESS["gp-gpu"])
                        if "b" in a.only and backend == a.backend[0] else 0.0)
                deadline = run.end - RESERVE_S - keep
                run_phase(run, f"(a) KRR n = {a.n:,} on the GPU worker, {backend}", "krr-gpu",
                          lambda b=backend, d=deadline: krr_gpu(run, client, b, d),
                          reserve=keep)
            if "b" in a.only:
                run_phase(run, f"(b) SGPR n = {a.gp_n:,} on the GPU worker, {backend}",
                          "gp-gpu", lambda b=backend: gp_gpu(run, client, b))
    finally:
        close(client)


def cpu_phases(run: Run) -> bool:
    """The stores, then (a) and (b) on the CPU cluster; False when the stores failed."""
    a = run.args
    client = dkern.connect(**({} if a.cpu_workers is None else {"n_workers": a.cpu_workers}))
    say(run, f"CPU cluster: {cpu_side(client)}")
    try:
        if run_phase(run, "write the stores", "write", lambda: write_stores(run) or True) is None:
            return False
        if "a" in a.only and a.cpu_n > 0:
            run_phase(run, f"(a) KRR n = {min(a.cpu_n, a.n):,} on the CPU cluster", "krr-cpu",
                      lambda: krr_cpu(run, client))
        if "b" in a.only:
            run_phase(run, f"(b) SGPR n = {a.gp_n:,} on the CPU cluster", "gp-cpu",
                      lambda: gp_cpu(run, client))
    finally:
        close(client)
    return True


# ----------------------------------------------------------------------- report
def versions() -> str:
    found = []
    for name in ("torch", "triton", "pykeops", "dask", "distributed", "zarr"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} -")
    return ", ".join(found)


def backend_details() -> str:
    """What dkern's checks found of KeOps and Triton in this process, for those it checked
    (a check not made yet is not started here: KeOps' may compile for minutes)."""
    from dkern.backends.select import keops_status, triton_status

    found = [f"{check().detail}" for check in (keops_status, triton_status)
             if check.cache_info().currsize]
    return f" Backends: {'; '.join(found)}." if found else ""


def blas_threads() -> str:
    """The client's BLAS and its threads (the Falkon preconditioner is factored there)."""
    from threadpoolctl import threadpool_info

    pools = {f"{p.get('internal_api')} {p.get('num_threads')} threads": None
             for p in threadpool_info() if p.get("user_api") == "blas"}  # numpy's and scipy's
    return f"client BLAS: {', '.join(pools) or '?'}"


def write_section(run: Run) -> None:
    """The RESULTS.md section from what was measured so far."""
    with _WRITING:
        _write_section(run)


def _write_section(run: Run) -> None:
    a = run.args
    smoke = "" if a.gpu_visible and not a.no_gpu else " — SMOKE RUN, NO GPU (not a result)"
    krr_head = ["side", "backend", "n", "M", "iterations", "warm-up (s)", "fit (s)",
                "before loop (s)", "per iteration (s)", "after loop (s)", "ns / row·iteration",
                "effective G K_nm values / s", f"predict {a.test_n:,} (s)", "test RMSE",
                "last residual", "peak memory"]
    gp_head = ["side", "backend", "n", "M", "test points", "warm-up (s)", "fit (s)",
               "predict mean + std (s)", "test RMSE", "max abs Δ mean vs CPU",
               "max abs Δ std vs CPU", "points: max abs Δ mean / Δ std vs dense formulas",
               "peak memory"]
    parts = ([f"Falkon KRR at n = {a.n:,}"] if "a" in a.only else []) + (
        [f"SGPR at n = {a.gp_n:,}"] if "b" in a.only else [])
    body = [f"## GPU scale: {', '.join(parts)} (`benchmarks/gpu_scale.py`){smoke}", "",
            f"Machine: {run.machine}{run.gpu}; {blas_threads()}. {versions()}."
            f"{backend_details()} {run.worker}.", "",
            f"`{' '.join(sys.argv[1:]) or '(defaults)'}`; budget {a.budget:.0f} s, "
            f"{run.elapsed():.0f} s used when written.", ""]
    if "a" in a.only:
        body += [f"### (a) Nyström KRR (Falkon), d = 8, Gaussian ℓ = {ELL}, α = {ALPHA}, "
                 f"exactly {a.iterations} iterations (tol = {FIXED_TOL:g}), from a {a.dtype} "
                 "Zarr store", "", markdown_table(krr_head, run.krr_rows) if run.krr_rows
                 else "(no row measured)", "",
                 "ns / row·iteration: the per-iteration time over n (each iteration is one "
                 "pass computing K_nmᵀ(K_nm v): n·M kernel values, linear in n; KeOps and "
                 "Triton evaluate each twice, numpy once per tile), timed by the "
                 "solver's callback from the loop's start to its last iteration. 'before loop' "
                 "is the fit's time until the loop starts (centres, the preconditioner's row "
                 "sample and its factors on the client, K_nmᵀy, compiling); 'after loop' the "
                 "last residual and the normal-equation residual (two passes). Test RMSE "
                 "against the noise-free targets. 'warm-up': a 2,000-row fit and a 10-row "
                 "prediction with the same backend just before, untimed in the fit: it "
                 "compiles the KeOps / Triton formulas (on the worker and, for the checks "
                 "that `backend=` runs, in the client).", ""]
    if "b" in a.only:
        body += [f"### (b) Sparse GP (SGPR), d = 8, `{GP_KERNEL!r}`, α = σ² = {run.sigma2:g}, "
                 f"`optimizer=None`, M = {a.gp_centres:,} centres, mean + std", "",
                 markdown_table(gp_head, run.gp_rows) if run.gp_rows else "(no row measured)",
                 "", "vs CPU: the numpy backend's fit on the CPU cluster (same data, same "
                 "centres), over the test points both predicted; dense formulas: the "
                 "predictive mean and std recomputed in plain numpy from the model's own "
                 "M-sized statistics, at randomly drawn test points. 'warm-up' as in (a), "
                 "with the fit's M.", ""]
    body += ["Notes:", ""] + [f"- {note}" for note in run.notes]
    update_section(SECTION, "\n".join(body), Path(a.results))


# ------------------------------------------------------------------------- main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="(a) training rows on the GPU")
    p.add_argument("--m-centres", type=int, default=10_000, help="(a) Nyström centres M")
    p.add_argument("--test-n", type=int, default=100_000, help="(a) test rows")
    p.add_argument("--chunk-rows", type=int, default=250_000, help="(a) rows per Zarr chunk")
    p.add_argument("--cpu-n", type=int, default=100_000,
                   help="(a) rows the CPU cluster fits (the first of the store); 0 skips it")
    p.add_argument("--iterations", type=int, default=10, help="(a) Falkon iterations, both sides")
    p.add_argument("--gp-n", type=int, default=1_000_000, help="(b) training rows")
    p.add_argument("--gp-test", type=int, default=1_000_000, help="(b) test points on the GPU")
    p.add_argument("--gp-cpu-test", type=int, default=None,
                   help="(b) test points the CPU reference predicts (default: all --gp-test)")
    p.add_argument("--gp-centres", type=int, default=1_000, help="(b) SGPR centres M")
    p.add_argument("--gp-check", type=int, default=300,
                   help="(b) test points checked against the dense formulas")
    p.add_argument("--backend", nargs="+", choices=["keops", "triton", "numpy"],
                   default=["keops", "triton"], help="GPU-worker backends, in this order")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="stored dtype (every solver computes in float64)")
    p.add_argument("--only", nargs="+", choices=["a", "b"], default=["a", "b"])
    p.add_argument("--budget", type=float, default=185.0, help="seconds for the whole run")
    p.add_argument("--no-gpu", action="store_true",
                   help="a plain 1-worker cluster instead of connect(gpus=1) (smoke runs)")
    p.add_argument("--gpu-threads", type=int, default=None,
                   help=f"threads of the GPU worker (default dkern's, {GPU_WORKER_THREADS})")
    p.add_argument("--cpu-workers", type=int, default=None,
                   help="CPU cluster workers (default dkern's: one per core)")
    p.add_argument("--workdir", default=None, help="where the stores go (default: a temp dir)")
    p.add_argument("--keep-data", action="store_true", help="leave the stores on disk")
    p.add_argument("--results", default=str(RESULTS), help="the markdown file to update")
    return p.parse_args(argv)


def hard_stop(run: Run) -> None:
    """Runs in a thread: past the budget's end by HARD_STOP_AFTER_S, write the section with
    a note and exit (the clusters' processes follow their parent)."""
    time.sleep(max(0.0, run.left() + HARD_STOP_AFTER_S))
    run.notes.append(f"**Cut short** at {run.elapsed():.0f} s: a phase was still running "
                     f"{HARD_STOP_AFTER_S:.0f} s past the budget's end (see the log for which).")
    say(run, "HARD STOP: the budget is spent; writing the section and exiting")
    write_section(run)
    sys.stdout.flush()
    os._exit(3)


def main() -> None:
    args = parse()
    run = Run(args)
    args.gpu_visible = visible_gpus() > 0
    say(run, f"gpu_scale: {' '.join(sys.argv[1:]) or '(defaults)'}; GPUs visible: "
             f"{visible_gpus()}; LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}")
    run.machine = machine()
    facts = gpu_facts()
    run.gpu = "".join(f"; GPU {f['name']} ({f['memory']}), driver {f['driver']}, CUDA "
                      f"{f['cuda']}" for f in facts[:1]) or "; no GPU visible"
    if not args.gpu_visible and not args.no_gpu:
        say(run, "no GPU visible: connect(gpus=1) starts its worker anyway (a smoke run)")
    say(run, blas_threads())
    write_section(run)
    threading.Thread(target=hard_stop, args=(run,), daemon=True).start()
    try:
        if cpu_phases(run):
            gpu_phases(run)
    finally:
        write_section(run)
        if not args.keep_data and "root" in run.stores and not args.workdir:
            shutil.rmtree(run.stores["root"], ignore_errors=True)
        say(run, f"section {SECTION!r} written to {args.results}")
    print(Path(args.results).read_text().split(f"<!-- {SECTION}:start -->")[1]
          .split(f"<!-- {SECTION}:end -->")[0], flush=True)


if __name__ == "__main__":
    main()
