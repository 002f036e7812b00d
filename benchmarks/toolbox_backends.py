"""The toolbox's passes per backend: KDE, Nadaraya–Watson and exact kNN, numpy vs KeOps.

    python benchmarks/toolbox_backends.py                      # 20,000 × 8 rows, both ways
    python benchmarks/toolbox_backends.py --n 100000 --no-write
    python benchmarks/toolbox_backends.py --shared             # say other work shared the cores

Training rows and query rows are in memory (chunks of ``--chunk`` rows), computed on
dask's threaded scheduler; each pass runs once per backend on a small problem first
(KeOps compiles a formula once per machine, not per call), then ``--repeats`` times per
backend, alternating, and the best time is kept. The table gives the largest difference
between the two results. Prints a table and rewrites its section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, update_section  # noqa: E402

import dkern  # noqa: E402

BANDWIDTH, K = 0.5, 10
BACKENDS = ("numpy", "keops")
SHARED = (" The host was shared with another process running tests on the same cores: "
          "absolute times are noisy, the ratios (both backends alternating in one run) less so.")


def passes(X: da.Array, t: np.ndarray, Q: np.ndarray) -> dict:
    """Each pass as ``run(backend) -> result``."""
    def kde(backend):
        return dkern.KernelDensity(bandwidth=BANDWIDTH, backend=backend).fit(X).score_samples(Q)

    def nw(backend):
        return dkern.NadarayaWatson(bandwidth=BANDWIDTH, backend=backend).fit(X, t).predict(Q)

    def knn(backend):
        model = dkern.KNeighborsRegressor(K, backend=backend).fit(X, t)
        dist, ind = model.kneighbors(Q)
        return np.hstack([dist, ind])  # indices compare exactly in float64 below 2^53

    return {"KernelDensity (Gaussian)": kde, "NadarayaWatson (Gaussian)": nw,
            f"KNeighborsRegressor.kneighbors, k = {K}": knn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="training rows")
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--shared", action="store_true",
                        help="say in the section that other work shared the host's cores")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(args.n, 8))
    t = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2
    Q = rng.uniform(-2, 2, size=(args.queries, 8))
    rows = []
    with dask.config.set(scheduler="threads"):
        for warm in passes(da.from_array(X[:500], chunks=(250, -1)), t[:500], Q[:50]).values():
            for backend in BACKENDS:
                warm(backend)  # compile KeOps' formulas
        for name, run in passes(da.from_array(X, chunks=(args.chunk, -1)), t, Q).items():
            best, out = {b: np.inf for b in BACKENDS}, {}
            for _ in range(args.repeats):
                for backend in BACKENDS:
                    start = time.perf_counter()
                    out[backend] = run(backend)
                    best[backend] = min(best[backend], time.perf_counter() - start)
            diff = float(np.abs(out["keops"] - out["numpy"]).max())
            rows.append([name, f"{best['numpy']:.2f}", f"{best['keops']:.2f}",
                         f"{best['numpy'] / best['keops']:.2f}", f"{diff:.1e}"])
    table = markdown_table(["pass", "numpy (s)", "keops (s)", "numpy / keops",
                            "max abs difference"], rows)
    body = (f"## Toolbox per backend (`benchmarks/toolbox_backends.py`)\n\nMachine: "
            f"{machine()}.\n\n{args.n:,} training rows × 8 features in chunks of "
            f"{args.chunk:,}, {args.queries:,} query rows, bandwidth {BANDWIDTH}; dask's "
            f"threaded scheduler; no GPU: KeOps on CPU; best of {args.repeats}, alternating, "
            f"formulas compiled beforehand.{SHARED if args.shared else ''}\n\n{table}\n")
    print(body)
    if not args.no_write:
        update_section(f"toolbox-backends-{args.n}", body)


if __name__ == "__main__":
    main()
