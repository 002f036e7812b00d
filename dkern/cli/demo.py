"""``dkern demo``: Zarr store -> Nyström KRR fit on the cluster -> predictions written
back -> test RMSE."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from ._common import (
    check_creatable,
    cluster_client,
    positive_float,
    positive_int,
    rmse,
    solver_arguments,
)


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("demo", parents=[common, cluster],
                            help="make a store, fit Nystrom KRR, predict to the store, report")
    # tol 1e-3: the demo's test RMSE is that of a tight fit, in a fraction of the time
    # (measured: benchmarks/RESULTS.md, "Figures behind two defaults").
    solver_arguments(parser, tol=1e-3)
    parser.add_argument("--n", type=positive_int, default=200_000)
    parser.add_argument("--n-test", type=positive_int, default=20_000)
    parser.add_argument("--d", type=positive_int, default=8)
    parser.add_argument("--centers", type=positive_int, default=1_000)
    parser.add_argument("--lengthscale", type=positive_float, default=3.0)
    parser.add_argument("--chunk-rows", type=positive_int, default=50_000)
    parser.add_argument("--store", default=None,
                        help="where to write (default: a temp dir); it must not hold the "
                             "demo's arrays (X, y, X_test, y_test, pred) unless --overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the demo's arrays in an existing --store")
    parser.set_defaults(run=run, usage_error=parser.error, written_store="store",
                        store_paths=("store",))


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.store is not None:  # before a cluster starts
        check_creatable("--store", args.store, args.usage_error)
        taken = sorted(DEMO_ARRAYS & _members(args.store))
        if taken and not args.overwrite:
            args.usage_error(f"--store {args.store!r} already holds {taken}, which the demo "
                             "writes; pass --overwrite to replace them, or another --store")
    if args.store is None:  # a store of its own, removed afterwards
        with tempfile.TemporaryDirectory(prefix="dkern-demo-") as folder:
            report = _run_demo(args, os.path.join(folder, "demo.zarr"))
        return {**report, "store": "(temporary, removed; keep one with --store)"}
    return _run_demo(args, args.store)


#: The arrays the demo writes to its store.
DEMO_ARRAYS = frozenset({"X", "y", "X_test", "y_test", "pred"})


def _members(url: str) -> set[str]:
    """The names of the arrays and groups in the store at ``url`` (dkern's and plain
    ones); none when there is no Zarr group there."""
    import zarr

    from ..errors import StoreError
    from ..io import list_arrays

    try:
        names = set(list_arrays(url))
    except StoreError:
        names = set()
    try:
        return names | set(zarr.open_group(url, mode="r").keys())
    except (FileNotFoundError, ValueError, TypeError, zarr.errors.GroupNotFoundError):
        return names


def _run_demo(args: argparse.Namespace, store: str) -> dict[str, Any]:
    from .. import KernelRidge
    from ..io import make_regression_store
    from ..kernels import Gaussian

    report: dict[str, Any] = {"store": store, "n": args.n, "d": args.d, "n_test": args.n_test}
    with cluster_client(args) as client:
        report["dashboard"] = client.dashboard_link
        start = time.perf_counter()
        make_regression_store(store, args.n, args.d, chunk_rows=args.chunk_rows,
                              n_test=args.n_test, seed=0,
                              overwrite=args.overwrite)
        report["make_data_s"] = round(time.perf_counter() - start, 2)
        model = KernelRidge(Gaussian(lengthscale=args.lengthscale), alpha=args.alpha,
                            solver="nystrom", n_centers=args.centers, tol=args.tol,
                            backend=args.backend, random_state=0,
                            verbose=not (args.quiet or args.json))
        start = time.perf_counter()
        model.fit((store, "X"), (store, "y"))
        report.update(fit_s=round(time.perf_counter() - start, 2), solver=model.solver_,
                      centers=len(model.centers_), iterations=model.n_iter_,
                      converged=model.converged_)
        start = time.perf_counter()
        model.predict((store, "X_test"), out=(store, "pred"),
                      overwrite=args.overwrite)
        report["predict_s"] = round(time.perf_counter() - start, 2)
        report["test_rmse"] = round(rmse(store, "pred", "y_test"), 5)
        report["noise_sd"] = 0.1  # y_test is noise-free; 0.1 is the training noise level
    return report
