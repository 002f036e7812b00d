"""KDE and Nadaraya–Watson at 1,000,000 training rows × 100,000 queries, beside the Gram
matvec's rate in the same run (issue 28: "at the Gram matvec's rate, <= 150 s here").

    python benchmarks/smoothing.py                      # the full size; writes RESULTS.md
    python benchmarks/smoothing.py --n 100000 --queries 10000 --no-write   # a quick try

Both estimators get their rows in memory (numpy in, numpy out) on ``dkern.connect()``;
at this size a call is far over the in-process limit, so it runs on the embedded cluster.
Each kernel entry of KDE is one Gaussian weight of a log-sum-exp; of Nadaraya–Watson, one
weight of two weighted sums. The Gram matvec is ``dkern.gram(Gaussian, X, Z) @ v`` at
n = m = 20,000 in this process (best of 3), timed before and after the estimators, so the
ratio compares rates of the same minutes. The first ``--check`` queries are compared with
the dense numpy formulas of benchmarks/toolbox.py (max abs difference).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import best_time, machine, markdown_table, update_section  # noqa: E402
from toolbox import BANDWIDTH, numpy_kde, numpy_nadaraya_watson  # noqa: E402

import dkern  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402

GRAM_N, D = 20_000, 8


def gram_rate() -> float:
    """Entries per second of dkern's Gram matvec, n = m = GRAM_N, d = D, in this process."""
    rng = np.random.default_rng(5)
    X, Z = rng.uniform(-2, 2, (2, GRAM_N, D))
    v = rng.standard_normal((GRAM_N, 1))
    Xd, Zd = (da.from_array(a, chunks=(GRAM_N // 2, D)) for a in (X, Z))
    product = dkern.gram(Gaussian(BANDWIDTH), Xd, Zd, backend="numpy") @ v
    seconds, _ = best_time(lambda: product.compute(scheduler="threads"), 3)
    return GRAM_N**2 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--check", type=int, default=1_000,
                        help="queries compared with the dense numpy formulas")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(args.n, D))
    t = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2
    Q = rng.uniform(-2, 2, size=(args.queries, D))
    entries = args.n * args.queries
    before = gram_rate()
    rows = []
    with dkern.connect():
        for name, fit_call, reference in [
            ("KernelDensity.score_samples",
             lambda: dkern.KernelDensity(bandwidth=BANDWIDTH).fit(X).score_samples,
             lambda q: numpy_kde(X, q, BANDWIDTH)),
            ("NadarayaWatson.predict",
             lambda: dkern.NadarayaWatson(bandwidth=BANDWIDTH).fit(X, t).predict,
             lambda q: numpy_nadaraya_watson(X, t, q, BANDWIDTH)),
        ]:
            call = fit_call()
            start = time.perf_counter()
            got = call(Q)
            seconds = time.perf_counter() - start
            err = float(np.abs(got[:args.check] - reference(Q[:args.check])).max())
            rows.append([name, seconds, entries / seconds, err])
            print(f"{name}: {seconds:.1f} s", file=sys.stderr)
    after = gram_rate()
    gram = (before + after) / 2
    table = markdown_table(
        ["call", "seconds", "M entries/s", "of the Gram matvec's rate", "≤ 150 s",
         f"max abs difference, first {args.check:,} queries"],
        [[name, f"{s:.1f}", f"{rate / 1e6:.0f}", f"{rate / gram:.0%}",
          "yes" if s <= 150 else "**no**", f"{err:.1e}"] for name, s, rate, err in rows])
    body = (f"## Kernel smoothing at the Gram matvec's rate (`benchmarks/smoothing.py`)\n\n"
            f"Machine: {machine()}.\n\n"
            f"{args.n:,} training rows × {args.queries:,} queries, d = {D}, uniform on "
            f"[-2, 2]^{D}, Gaussian bandwidth {BANDWIDTH}; rows in memory, `dkern.connect()` "
            f"(embedded LocalCluster, one worker per core). The Gram matvec in this process "
            f"(n = m = {GRAM_N:,}, best of 3): {before / 1e6:.0f} M entries/s before, "
            f"{after / 1e6:.0f} after.\n\n{table}\n")
    print(body)
    if not args.no_write:
        update_section("smoothing-rate", body)


if __name__ == "__main__":
    main()
