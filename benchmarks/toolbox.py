"""The classic toolbox against scikit-learn: KDE, Nadaraya–Watson and exact kNN, side by side.

    python benchmarks/toolbox.py                       # n = 1,000,000 from Zarr, d = 8
    python benchmarks/toolbox.py --queries 2000 --only knn    # issue 12's kNN target
    python benchmarks/toolbox.py --n 100000 --queries 1000    # a quick try

dkern reads the training rows from a float64 Zarr store on an embedded LocalCluster
(``dkern.connect()``); scikit-learn gets the same rows in memory: ``KernelDensity``
(tree, exact: atol = rtol = 0), a blocked numpy Nadaraya–Watson (the formula in the log
domain, 1,000 query rows at a time), ``KNeighborsRegressor(algorithm="brute")``. Where
scikit-learn would take too long at full size (KDE), both run at ``--sk-n`` training rows
as well, so every ratio compares the two at the same size in the same run. Prints a table
and rewrites its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, update_section  # noqa: E402

import dkern  # noqa: E402
from dkern.io import write_array  # noqa: E402

BANDWIDTH, K = 0.5, 10


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def numpy_nadaraya_watson(X, t, Q, h, block=1_000):
    """The formula in float64, log-domain weights, ``block`` query rows at a time."""
    out = np.empty(len(Q))
    for i in range(0, len(Q), block):
        q = Q[i:i + block]
        L = -0.5 * (np.einsum("ij,ij->i", q, q)[:, None] + np.einsum("ij,ij->i", X, X)[None]
                    - 2 * q @ X.T) / h**2
        W = np.exp(L - L.max(axis=1, keepdims=True))
        out[i:i + block] = W @ t / W.sum(axis=1)
    return out


def dkern_kde(url, n, Q):
    return dkern.KernelDensity(bandwidth=BANDWIDTH).fit((url, f"X{n}")).score_samples(Q)


def sklearn_kde(X, Q):
    from sklearn.neighbors import KernelDensity

    return KernelDensity(bandwidth=BANDWIDTH).fit(X).score_samples(Q)


def dkern_nw(url, n, t, Q):
    return dkern.NadarayaWatson(bandwidth=BANDWIDTH).fit((url, f"X{n}"), t).predict(Q)


def compare(name, ours, reference, sizes, n_ref):
    """Rows of the table: ``ours(n)`` at every size, ``reference(n)`` up to ``n_ref``."""
    rows = []
    for n in sizes:
        t_ours, got = timed(ours, n)
        t_ref, ref = timed(reference, n) if n <= n_ref else (None, None)
        err = None if ref is None else float(np.abs(got - ref).max())
        rows.append((name, n, t_ours, t_ref, err))
    return rows


def knn(url, X, t, Q, n_check=2_000):
    """dkern's exact kNN regression from Zarr against scikit-learn's brute force in memory.

    Both time ``predict`` (the neighbour search and the mean of k targets); the indices
    are compared on the first ``n_check`` queries (``kneighbors``, untimed).
    """
    from sklearn.neighbors import KNeighborsRegressor

    n = len(X)
    model = dkern.KNeighborsRegressor(n_neighbors=K).fit((url, f"X{n}"), t)
    reference = KNeighborsRegressor(n_neighbors=K, algorithm="brute").fit(X, t)
    t_ours, got = timed(model.predict, Q)
    t_sk, ref = timed(reference.predict, Q)
    same = float((model.kneighbors(Q[:n_check])[1]
                  == reference.kneighbors(Q[:n_check])[1]).mean())
    return [(f"KNeighborsRegressor, k = {K} (scikit-learn `algorithm='brute'`; indices equal "
             f"on the first {min(n_check, len(Q)):,} queries: {same:.4%})", n, t_ours, t_sk,
             float(np.abs(got - ref).max()))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--sk-n", type=int, default=100_000,
                        help="training rows for the scikit-learn KDE / numpy N-W comparison")
    parser.add_argument("--only", nargs="+", choices=["kde", "nw", "knn"],
                        default=["kde", "nw", "knn"])
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(args.n, 8))
    t = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2
    Q = rng.uniform(-2, 2, size=(args.queries, 8))
    rows = []
    with tempfile.TemporaryDirectory() as tmp, dkern.connect():
        url = str(Path(tmp) / "toolbox.zarr")
        for n in {min(args.sk_n, args.n), args.n}:
            write_array(X[:n], url, f"X{n}", chunk_rows=62_500)
        sizes, n_ref = sorted({min(args.sk_n, args.n), args.n}), min(args.sk_n, args.n)
        if "kde" in args.only:
            rows += compare("KernelDensity (Gaussian; scikit-learn)",
                            lambda n: dkern_kde(url, n, Q), lambda n: sklearn_kde(X[:n], Q),
                            sizes, n_ref)
        if "nw" in args.only:
            rows += compare("Nadaraya–Watson (Gaussian; numpy)",
                            lambda n: dkern_nw(url, n, t[:n], Q),
                            lambda n: numpy_nadaraya_watson(X[:n], t[:n], Q, BANDWIDTH),
                            sizes, n_ref)
        if "knn" in args.only:
            rows += knn(url, X, t, Q)
    table = markdown_table(
        ["method (reference)", "training rows", "dkern from Zarr (s)", "reference (s)",
         "reference / dkern", "max abs difference"],
        [[name, f"{n:,}", f"{ours:.1f}", "-" if ref is None else f"{ref:.1f}",
          "-" if ref is None else f"{ref / ours:.2f}", "-" if err is None else f"{err:.1e}"]
         for name, n, ours, ref, err in rows])
    body = (f"## Toolbox (`benchmarks/toolbox.py`)\n\nMachine: {machine()}.\n\n"
            f"d = 8, {args.queries:,} query rows, bandwidth {BANDWIDTH}; dkern on "
            "`dkern.connect()` (embedded LocalCluster, 2 workers) reading a float64 Zarr "
            f"store in chunks of 62,500 rows; references in memory.\n\n{table}\n")
    print(body)
    if not args.no_write:
        update_section(f"toolbox-{'-'.join(args.only)}-{args.queries}", body)


if __name__ == "__main__":
    main()
