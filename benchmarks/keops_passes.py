"""Every pass with backend="numpy" and backend="keops", on the same arrays, in one run:
SGPR statistics (sparse fit) and prediction, leverage-score centre selection, the Nyström
preconditioner's columns (uniform and RPCholesky pivots), kernel ridge by preconditioned
CG and by Falkon, and GP variances by CG and by Lanczos (LOVE).

    python benchmarks/keops_passes.py                  # n = 10,000 rows (CG, GP, leverage: 800)
    python benchmarks/keops_passes.py --write          # also rewrite its section of RESULTS.md
    python benchmarks/keops_passes.py --write --shared # ... saying other work shared the cores

Each pass runs once per backend on a small problem first (the warm-up that compiles KeOps'
formulas: the same kernel, d and right-hand-side widths), then ``--repeats`` times per
backend, alternating, and the best time is kept; dask's synchronous scheduler: one core,
the pass alone. "diff" is the largest difference between the two backends' results
relative to the largest numpy value. "KeOps reductions" counts the KeOps reductions of
the last keops run (the numpy runs must have none): proof that KeOps did the work.

The CG and GP passes do an n × n kernel matvec per CG iteration, and leverage selection
under KeOps is slow on CPU (many reductions with wide right-hand sides), so they run on the
first ``--n-solve`` rows (Falkon's iterations are n × M). The exact GP's variance is not
timed: it reads ``kernel(X, x*)`` directly (one dense Cholesky, no backend). Falkon runs
twice: as ``KernelRidge`` runs it, where ``K_nm`` fits the cache budget and is computed
once as dense blocks (numpy's work under either backend: no KeOps reduction), and with
``cache_bytes=0``, where every iteration recomputes ``K_nm`` through the backend.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, update_section  # noqa: E402

from dkern.kernels import Gaussian  # noqa: E402
from dkern.models import GaussianProcessRegressor, KernelRidge  # noqa: E402
from dkern.solvers import NystromPreconditioner, falkon, select_centers  # noqa: E402
from dkern.solvers.sgpr import sgpr_predict, sgpr_statistics  # noqa: E402

BACKENDS = ("numpy", "keops")
KERNEL = Gaussian(2.0)
ALPHA, GP_ALPHA, TOL = 1e-3, 1e-2, 1e-10
SHARED = ("The host was shared with another process running tests on the same cores: "
          "absolute times are noisy, the ratios (both backends alternating in one run) less so. ")


def passes(X: da.Array, y: np.ndarray, Z: np.ndarray, R: da.Array, M: int, Xs: da.Array,
           ys: np.ndarray, Xt: np.ndarray) -> dict[str, Callable[[str], np.ndarray]]:
    """name -> ``run(backend) -> result`` of every pass; Xs, ys: the CG/GP rows, Xt: test points."""
    kernel = KERNEL

    def fit(b):
        return sgpr_statistics(kernel, X, y, Z, backend=b).P

    def predict(b):
        stats = sgpr_statistics(kernel, X, y, Z, backend="numpy")
        return np.column_stack(dask.compute(*sgpr_predict(stats, 0.1, X, backend=b)))

    def leverage(b):
        return select_centers(Xs, M, method="leverage", kernel=kernel, alpha=ALPHA,
                              random_state=0, backend=b)

    def preconditioner(pivots):
        return lambda b: NystromPreconditioner(kernel, X, ALPHA, M, pivots=pivots,
                                               random_state=0, backend=b).apply(R).compute()

    def krr_cg(b):
        model = KernelRidge(kernel, alpha=ALPHA, solver="cg", tol=TOL, random_state=0,
                            backend=b).fit(Xs, ys)
        return np.asarray(model.dual_coef_)

    def krr_falkon(b):
        model = KernelRidge(kernel, alpha=ALPHA, solver="nystrom", n_centers=M, tol=TOL,
                            random_state=0, backend=b).fit(X, y)
        return np.asarray(model.dual_coef_)

    def falkon_uncached(b):  # K_nm recomputed by the backend in every iteration
        return falkon(kernel, X, y, Z, ALPHA, tol=TOL, cache_bytes=0, random_state=0,
                      backend=b).beta

    def gp_std(variance):
        def run(b):
            gp = GaussianProcessRegressor(kernel, alpha=GP_ALPHA, optimizer=None, solver="cg",
                                          variance=variance, tol=TOL, random_state=0,
                                          backend=b).fit(Xs, ys)
            return np.column_stack(gp.predict(Xt, return_std=True))
        return run

    return {"sparse fit (SGPR statistics)": fit, "sparse predict (mean, variance)": predict,
            "leverage centre selection (n_solve rows)": leverage,
            "Nyström preconditioner, uniform": preconditioner("uniform"),
            "Nyström preconditioner, RPCholesky": preconditioner("rpcholesky"),
            f"KernelRidge(solver='cg', tol={TOL:g}) fit (n_solve rows)": krr_cg,
            f"KernelRidge(solver='nystrom', M) fit (Falkon, tol={TOL:g}; numpy caches K_nm, "
            "keops recomputes it)":
                krr_falkon,
            f"dkern.solvers.falkon(cache_bytes=0) (tol={TOL:g})": falkon_uncached,
            "GP solver='cg', variance='cg': fit + predict(return_std) (n_solve rows)":
                gp_std("cg"),
            "GP solver='cg', variance='lanczos': fit + predict(return_std) (n_solve rows)":
                gp_std("lanczos")}


def problem(n: int, n_solve: int, d: int, M: int, tests: int, chunk: int) -> tuple:
    """The arrays of :func:`passes`: n rows, the first n_solve of them for CG and the GP."""
    rng = np.random.default_rng(0)
    Xn = rng.normal(size=(n, d))
    y = np.sin(Xn[:, 0]) + 0.1 * rng.normal(size=n)
    X = da.from_array(Xn, chunks=(chunk, -1))
    R = da.from_array(rng.normal(size=(n, 1)), chunks=(chunk, -1))
    Z = Xn[rng.choice(n, M, replace=False)]
    Xs = da.from_array(Xn[:n_solve], chunks=(min(chunk, n_solve), -1))
    Xt = rng.normal(size=(tests, d))
    return X, y, Z, R, M, Xs, y[:n_solve], Xt


class ReductionSpy:
    """Counts the KeOps reductions run from its creation on, in ``count`` (every LazyTensor
    reduction goes through ``GenericLazyTensor.reduction``, as tests/test_backends.py's spy
    relies on)."""

    def __init__(self) -> None:
        from pykeops.common.lazy_tensor import GenericLazyTensor

        self.count = 0
        real = GenericLazyTensor.reduction

        def spy(lazy, *args, **kwargs):
            self.count += 1
            return real(lazy, *args, **kwargs)

        GenericLazyTensor.reduction = spy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--n-solve", type=int, default=800,
                        help="rows of the CG and GP passes (an n × n matvec per iteration)")
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--centers", type=int, default=200)
    parser.add_argument("--tests", type=int, default=500, help="test points of the GP passes")
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="", help="run the passes whose name contains this")
    parser.add_argument("--write", action="store_true", help="rewrite the RESULTS.md section")
    parser.add_argument("--shared", action="store_true",
                        help="say in the section that other work shared the host's cores")
    args = parser.parse_args()
    spy = ReductionSpy()
    warm = passes(*problem(400, 400, args.d, args.centers, args.tests, 200))
    full = passes(*problem(args.n, args.n_solve, args.d, args.centers, args.tests, args.chunk))
    rows = []
    with dask.config.set(scheduler="synchronous"):
        for name, run in full.items():
            if args.only not in name:
                continue
            for backend in BACKENDS:
                warm[name](backend)  # compiles the pass's KeOps formulas
            best, out, reductions = {b: np.inf for b in BACKENDS}, {}, {}
            for _ in range(args.repeats):
                for backend in BACKENDS:
                    spy.count = 0
                    start = time.perf_counter()
                    out[backend] = run(backend)
                    best[backend] = min(best[backend], time.perf_counter() - start)
                    reductions[backend] = spy.count
            if reductions["numpy"]:
                raise RuntimeError(f"{name}: backend='numpy' ran {reductions['numpy']} KeOps "
                                   "reductions")
            want = out["numpy"]
            diff = np.abs(out["keops"] - want).max() / np.abs(want).max()
            rows.append([name, f"{best['numpy']:.2f}", f"{best['keops']:.2f}",
                         f"{best['keops'] / best['numpy']:.1f}x", f"{diff:.1e}",
                         reductions["keops"]])
            print(*rows[-1], sep=" | ", flush=True)
    body = (f"## KeOps vs numpy per pass (`benchmarks/keops_passes.py`)\n\n"
            f"n = {args.n:,} (CG, GP and leverage passes: the first {args.n_solve:,} rows; "
            f"GP variances at {args.tests} test points), d = {args.d}, M = {args.centers}, "
            f"Gaussian(2.0), α = {ALPHA:g} (GP: {GP_ALPHA:g}), chunks of {args.chunk:,} rows, "
            f"float64, synchronous scheduler; best of {args.repeats} alternating runs after "
            f"a warm-up on 400 rows that compiles the formulas. No GPU: KeOps on CPU. "
            f"{machine()}. {SHARED if args.shared else ''}"
            "diff: largest |keops − numpy| over the largest |numpy|. KeOps reductions: those "
            "of the last keops run (the numpy runs had none). The exact GP's variance has no "
            "backend path (dense Cholesky and `kernel(X, x*)`), so it is not here. Falkon "
            "through KernelRidge: numpy caches K_nm as dense blocks when they fit, KeOps "
            "recomputes it in every pass; `cache_bytes=0` makes numpy recompute it too.\n\n"
            + markdown_table(["pass", "numpy s", "keops s", "keops/numpy", "diff",
                              "KeOps reductions"], rows))
    print(body)
    if args.write:
        update_section("keops-passes", body)


if __name__ == "__main__":
    main()
