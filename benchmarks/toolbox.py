"""The classic toolbox against scikit-learn: KDE, Nadaraya–Watson and exact kNN, side by side.

    python benchmarks/toolbox.py                       # n = 1,000,000 from Zarr, d = 8
    python benchmarks/toolbox.py --queries 2000 --only knn    # issue 12's kNN target
    python benchmarks/toolbox.py --n 100000 --queries 1000    # a quick try
    python benchmarks/toolbox.py --source memory --queries 2000   # issue 28: small batches
    python benchmarks/toolbox.py --source memory --only knn --queries 100000 \
        --knn-references brute --query-range 0:20000 --no-write   # one slice of a long run

dkern reads the training rows from a float64 Zarr store on an embedded LocalCluster
(``dkern.connect()``), or with ``--source memory`` gets them in memory as scikit-learn
does (numpy in, numpy out: small passes then run in the calling process,
:mod:`dkern.operators.in_process`). The references, in memory: ``KernelDensity`` (tree,
exact: atol = rtol = 0) and a blocked numpy KDE (the log-sum-exp of the dense block,
1,000 query rows at a time (fewer past 16,777 training rows: 128 MiB a block), threaded
over the cores, BLAS on one thread each); the same
numpy loop for Nadaraya–Watson; ``KNeighborsRegressor`` brute force (``n_jobs`` = the
cores) and its default (``algorithm="auto"``: a k-d tree here), with a row for the fits
(dkern orders in-memory rows into tiles there, scikit-learn builds its tree). Where the
tree KDE would take too long at full size, both run at ``--sk-n`` training rows as well,
so every ratio compares the two at the same size in the same run. ``--query-range``
times the rows ``A:B`` of the ``--queries`` query rows only (the same rows as in the full
set), so a reference too slow for one run can be timed in slices. Prints a table and
rewrites its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from scipy.special import logsumexp
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, update_section  # noqa: E402

import dkern  # noqa: E402
from dkern.io import write_array  # noqa: E402

BANDWIDTH, K = 0.5, 10


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def _threaded_blocks(block, Q, block_rows):
    """``block(Q[i:i + block_rows])`` for every block of query rows, concatenated: the
    blocks on a pool of one thread per core, BLAS on one thread in each."""
    def run(i):
        return block(Q[i:i + block_rows])

    # one process-wide limit, set and restored by this thread (BLAS's thread count is global)
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(os.cpu_count()) as pool:
        return np.concatenate(list(pool.map(run, range(0, len(Q), block_rows))))


def _log_weights(X, xx, q, h):
    """The Gaussian log weights ``-‖q − x‖² / 2h²`` of a block of query rows."""
    return -0.5 * (np.einsum("ij,ij->i", q, q)[:, None] + xx[None] - 2 * q @ X.T) / h**2


def _block_rows(n):
    """Query rows per block: 1,000, or fewer so a block's (rows, n) weights take 128 MiB."""
    return max(1, min(1_000, 2**24 // n))


def numpy_nadaraya_watson(X, t, Q, h):
    """The formula in float64, log-domain weights, :func:`_block_rows` query rows at a time."""
    xx = np.einsum("ij,ij->i", X, X)

    def one(q):
        L = _log_weights(X, xx, q, h)
        W = np.exp(L - L.max(axis=1, keepdims=True))
        return W @ t / W.sum(axis=1)

    return _threaded_blocks(one, Q, _block_rows(len(X)))


def numpy_kde(X, Q, h):
    """The Gaussian log-density by the dense log-sum-exp, :func:`_block_rows` query rows at
    a time."""
    xx = np.einsum("ij,ij->i", X, X)
    offset = -np.log(len(X)) - 0.5 * X.shape[1] * np.log(2 * np.pi * h * h)
    return _threaded_blocks(lambda q: logsumexp(_log_weights(X, xx, q, h), axis=1) + offset,
                            Q, _block_rows(len(X)))


def dkern_kde(rows, Q):
    return dkern.KernelDensity(bandwidth=BANDWIDTH).fit(rows).score_samples(Q)


def sklearn_kde(X, Q):
    from sklearn.neighbors import KernelDensity

    return KernelDensity(bandwidth=BANDWIDTH).fit(X).score_samples(Q)


def dkern_nw(rows, t, Q):
    return dkern.NadarayaWatson(bandwidth=BANDWIDTH).fit(rows, t).predict(Q)


def compare(name, ours, references, sizes, n_ref):
    """Rows of the table: ``ours(n)`` at every size; each ``(label, reference(n))`` up to
    ``n_ref`` (None: at every size)."""
    rows = []
    for n in sizes:
        t_ours, got = timed(ours, n)
        for label, reference, limit in references:
            if n > (limit or n):
                rows.append((f"{name} ({label})", n, t_ours, None, None))
                continue
            t_ref, ref = timed(reference, n)
            rows.append((f"{name} ({label})", n, t_ours, t_ref, float(np.abs(got - ref).max())))
    return rows


#: scikit-learn's kNN searches by ``--knn-references`` name: label and options.
KNN_REFERENCES = {"brute": ("`algorithm='brute'`", {"algorithm": "brute",
                                                    "n_jobs": os.cpu_count()}),
                  "auto": ("default `algorithm='auto'`", {})}


def knn(rows, X, t, Q, references=tuple(KNN_REFERENCES), n_check=2_000):
    """dkern's exact kNN regression against scikit-learn's brute force (on every core) and
    its default search, all three timed on ``predict`` (the neighbour search and the mean
    of k targets), and a row for the fits (dkern's against the default's: brute force
    only stores the rows); the indices are compared on the first ``n_check`` queries
    (``kneighbors``, untimed)."""
    from sklearn.neighbors import KNeighborsRegressor

    n = len(X)
    t_fit, model = timed(dkern.KNeighborsRegressor(n_neighbors=K).fit, rows, t)
    t_ours, got = timed(model.predict, Q)
    same = model.kneighbors(Q[:n_check])[1]
    out = []
    for name in references:
        label, options = KNN_REFERENCES[name]
        t_sk_fit, reference = timed(KNeighborsRegressor(n_neighbors=K, **options).fit, X, t)
        if name == "auto":
            out.append((f"KNeighborsRegressor fit, k = {K} (scikit-learn {label}: its tree; "
                        "dkern: the rows' tile order)", n, t_fit, t_sk_fit, None))
        t_sk, ref = timed(reference.predict, Q)
        equal = float((same == reference.kneighbors(Q[:n_check])[1]).mean())
        out.append((f"KNeighborsRegressor, k = {K} (scikit-learn {label}; indices equal "
                    f"on the first {min(n_check, len(Q)):,} queries: {equal:.4%})", n, t_ours,
                    t_sk, float(np.abs(got - ref).max())))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--sk-n", type=int, default=100_000,
                        help="training rows for the scikit-learn KDE / numpy N-W comparison")
    parser.add_argument("--only", nargs="+", choices=["kde", "nw", "knn"],
                        default=["kde", "nw", "knn"])
    parser.add_argument("--source", choices=["zarr", "memory"], default="zarr",
                        help="dkern's training rows: a Zarr store, or numpy in memory")
    parser.add_argument("--knn-references", nargs="+", choices=list(KNN_REFERENCES),
                        default=list(KNN_REFERENCES), help="scikit-learn's kNN searches timed")
    parser.add_argument("--query-range", metavar="A:B",
                        help="time the query rows A:B of the --queries rows only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(args.n, 8))
    t = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2
    Q = rng.uniform(-2, 2, size=(args.queries, 8))
    if args.query_range:
        start, stop = (int(v) for v in args.query_range.split(":"))
        Q = Q[start:stop]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, dkern.connect():
        url = str(Path(tmp) / "toolbox.zarr")
        sizes, n_ref = sorted({min(args.sk_n, args.n), args.n}), min(args.sk_n, args.n)
        if args.source == "zarr":
            for n in sizes:
                write_array(X[:n], url, f"X{n}", chunk_rows=62_500)

        def source(n):
            return (url, f"X{n}") if args.source == "zarr" else X[:n]

        if "kde" in args.only:
            rows += compare("KernelDensity (Gaussian)", lambda n: dkern_kde(source(n), Q),
                            [("scikit-learn's tree", lambda n: sklearn_kde(X[:n], Q), n_ref),
                             ("numpy, threaded", lambda n: numpy_kde(X[:n], Q, BANDWIDTH),
                              None)], sizes, n_ref)
        if "nw" in args.only:
            rows += compare("Nadaraya–Watson (Gaussian)",
                            lambda n: dkern_nw(source(n), t[:n], Q),
                            [("numpy, threaded",
                              lambda n: numpy_nadaraya_watson(X[:n], t[:n], Q, BANDWIDTH),
                              n_ref)], sizes, n_ref)
        if "knn" in args.only:
            rows += knn(source(args.n), X, t, Q, args.knn_references)
    where = "from Zarr" if args.source == "zarr" else "in memory"
    table = markdown_table(
        ["method (reference)", "training rows", f"dkern {where} (s)", "reference (s)",
         "reference / dkern", "max abs difference"],
        [[name, f"{n:,}", f"{ours:.2f}", "-" if ref is None else f"{ref:.2f}",
          "-" if ref is None else f"{ref / ours:.2f}", "-" if err is None else f"{err:.1e}"]
         for name, n, ours, ref, err in rows])
    data = ("reading a float64 Zarr store in chunks of 62,500 rows" if args.source == "zarr"
            else "given the rows in memory, as the references")
    option = "" if args.source == "zarr" else " --source memory"
    rows_used = (f"{len(Q):,} query rows" if not args.query_range else
                 f"the query rows {args.query_range} of {args.queries:,}")
    body = (f"## Toolbox (`benchmarks/toolbox.py{option}`)\n\nMachine: {machine()}.\n\n"
            f"d = 8, {rows_used}, bandwidth {BANDWIDTH}; dkern on "
            f"`dkern.connect()` (embedded LocalCluster, 2 workers) {data}; references in "
            f"memory, threaded over {os.cpu_count()} cores where they can be.\n\n{table}\n")
    print(body)
    if not args.no_write:
        suffix = ("" if args.source == "zarr" else "-memory") + (
            f"-rows-{args.query_range.replace(':', '-')}" if args.query_range else "")
        update_section(f"toolbox-{'-'.join(args.only)}-{args.queries}{suffix}", body)


if __name__ == "__main__":
    main()
