"""``dkern make-data``: write a synthetic regression Zarr store, chunk by chunk."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ._common import (
    check_creatable,
    cluster_client,
    nonnegative_float,
    nonnegative_int,
    positive_int,
)


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("make-data", parents=[common, cluster],
                            help="write a synthetic regression Zarr store, chunk by chunk")
    parser.add_argument("--out", required=True, help="store path or fsspec URL")
    parser.add_argument("--n", type=positive_int, required=True, help="training rows")
    parser.add_argument("--d", type=positive_int, required=True, help="features")
    parser.add_argument("--n-test", type=nonnegative_int, default=0,
                        help="test rows (X_test, y_test)")
    parser.add_argument("--chunk-rows", type=positive_int, default=None,
                        help="rows per chunk (default: 100,000, fewer when the workers' "
                             "measured free memory needs it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=nonnegative_float, default=0.1,
                        help="standard deviation of the Gaussian noise added to y")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace arrays already there")
    parser.set_defaults(run=run, usage_error=parser.error, written_store="out",
                        store_paths=("out",))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..io import make_regression_store

    check_creatable("--out", args.out, args.usage_error)  # before a cluster starts
    start = time.perf_counter()
    with cluster_client(args):
        make_regression_store(args.out, args.n, args.d, chunk_rows=args.chunk_rows,
                              seed=args.seed, noise=args.noise, n_test=args.n_test,
                              overwrite=args.overwrite, dtype=np.dtype(args.dtype))
    return {"store": str(args.out), "n": args.n, "d": args.d, "n_test": args.n_test,
            "seconds": round(time.perf_counter() - start, 2)}
