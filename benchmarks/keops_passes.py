"""The projection passes with backend="numpy" and backend="keops", on the same arrays, in one run:
SGPR statistics (sparse fit) and prediction, leverage-score centre selection, and the Nyström
preconditioner's columns (uniform and RPCholesky pivots).

    python benchmarks/keops_passes.py                  # n = 20,000 rows, d = 8, M = 200
    python benchmarks/keops_passes.py --write          # also rewrite its section of RESULTS.md

Times are the best of --repeats after a warm-up call (which compiles KeOps' formulas), with
dask's synchronous scheduler: one core, the pass alone. "diff" is the largest difference
between the two backends' results relative to the largest numpy value.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import best_time, machine, markdown_table, update_section  # noqa: E402

from dkern.kernels import Gaussian  # noqa: E402
from dkern.solvers import NystromPreconditioner, select_centers  # noqa: E402
from dkern.solvers.sgpr import sgpr_predict, sgpr_statistics  # noqa: E402


def passes(X: da.Array, y: np.ndarray, Z: np.ndarray, R: da.Array, M: int) -> dict:
    """name -> (backend -> result) callables of every pass."""
    kernel = Gaussian(2.0)

    def fit(b):
        return sgpr_statistics(kernel, X, y, Z, backend=b).P

    def predict(b):
        stats = sgpr_statistics(kernel, X, y, Z, backend="numpy")
        return np.column_stack(dask.compute(*sgpr_predict(stats, 0.1, X, backend=b)))

    def leverage(b):
        return select_centers(X, M, method="leverage", kernel=kernel, alpha=1e-3,
                              random_state=0, backend=b)

    def preconditioner(pivots):
        return lambda b: NystromPreconditioner(kernel, X, 1e-3, M, pivots=pivots,
                                               random_state=0, backend=b).apply(R).compute()

    return {"sparse fit (SGPR statistics)": fit, "sparse predict (mean, variance)": predict,
            "leverage centre selection": leverage,
            "Nyström preconditioner, uniform": preconditioner("uniform"),
            "Nyström preconditioner, RPCholesky": preconditioner("rpcholesky")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--centers", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default="", help="run the passes whose name contains this")
    parser.add_argument("--write", action="store_true", help="rewrite the RESULTS.md section")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    Xn = rng.normal(size=(args.n, args.d))
    y = np.sin(Xn[:, 0]) + 0.1 * rng.normal(size=args.n)
    X = da.from_array(Xn, chunks=(args.chunk, -1))
    R = da.from_array(rng.normal(size=(args.n, 1)), chunks=(args.chunk, -1))
    Z = Xn[rng.choice(args.n, args.centers, replace=False)]
    rows = []
    with dask.config.set(scheduler="synchronous"):
        for name, run in passes(X, y, Z, R, args.centers).items():
            if args.only not in name:
                continue
            t_np, want = best_time(functools.partial(run, "numpy"), args.repeats)
            t_ko, got = best_time(functools.partial(run, "keops"), args.repeats)
            diff = np.abs(got - want).max() / np.abs(want).max()
            rows.append([name, f"{t_np:.2f}", f"{t_ko:.2f}", f"{t_ko / t_np:.1f}x",
                         f"{diff:.1e}"])
            print(*rows[-1], sep=" | ", flush=True)
    body = (f"n = {args.n:,}, d = {args.d}, M = {args.centers}, chunks of {args.chunk:,} rows, "
            f"float64, synchronous scheduler; {machine()}\n\n"
            + markdown_table(["pass", "numpy s", "keops s", "keops/numpy", "diff"], rows))
    print(body)
    if args.write:
        update_section("keops-passes", body)


if __name__ == "__main__":
    main()
