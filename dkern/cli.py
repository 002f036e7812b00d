"""The ``dkern`` command: ``info``, ``make-data`` and ``demo``.

The command line is the one place that writes to the terminal; the library
itself only logs. ``--json`` prints one JSON object for scripts, ``--quiet``
prints nothing but errors. Exit codes: 0 done, 1 a failure dkern diagnosed
(the message says what to change), 2 bad command-line usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import __version__
from .errors import DkernError

logger = logging.getLogger("dkern")


def _info(args: argparse.Namespace) -> dict[str, Any]:
    import dask
    import distributed
    import psutil
    import zarr

    from .backends import backend_statuses, gpu_visible

    return {
        "dkern": __version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "packages": {"numpy": np.__version__, "dask": dask.__version__,
                     "distributed": distributed.__version__, "zarr": zarr.__version__},
        "gpu_visible": gpu_visible(),
        "backends": {s.name: {"available": s.available, "detail": s.detail}
                     for s in backend_statuses()},
        "scheduler": os.environ.get("DKERN_SCHEDULER_ADDRESS") or "embedded LocalCluster",
    }


def _make_data(args: argparse.Namespace) -> dict[str, Any]:
    from .io import make_regression_store

    start = time.perf_counter()
    with _client(args):
        make_regression_store(args.out, args.n, args.d, chunk_rows=args.chunk_rows,
                              seed=args.seed, noise=args.noise, n_test=args.n_test,
                              overwrite=args.overwrite, dtype=np.dtype(args.dtype))
    return {"store": str(args.out), "n": args.n, "d": args.d, "n_test": args.n_test,
            "seconds": round(time.perf_counter() - start, 2)}


def _demo(args: argparse.Namespace) -> dict[str, Any]:
    """Build a Zarr store, then time Gram matvecs on the cluster."""
    import dask.array as da

    from . import gram
    from .io import make_regression_store, open_array
    from .kernels import Gaussian

    store = args.store or os.path.join(tempfile.mkdtemp(prefix="dkern-demo-"), "demo.zarr")
    report: dict[str, Any] = {"store": store, "n": args.n, "m": args.m, "d": args.d}
    with _client(args) as client:
        report["dashboard"] = client.dashboard_link
        start = time.perf_counter()
        make_regression_store(store, args.n, args.d, chunk_rows=args.chunk_rows, seed=0,
                              overwrite=True)
        report["make_data_s"] = round(time.perf_counter() - start, 2)
        X = open_array(store, "X")
        op = gram(Gaussian(lengthscale=0.5), X, X[: args.m], backend=args.backend)
        seconds = []
        for i in range(args.repeats):
            # a new vector each time: the same one would hit results the cluster still holds
            v = da.random.default_rng(i).standard_normal(args.m, chunks=op.col_chunks)
            start = time.perf_counter()
            result = _run_with_progress(client, op @ v, f"matvec {i + 1}/{args.repeats}", args)
            seconds.append(time.perf_counter() - start)
        best = min(seconds)
        report.update(backend=op.backend, matvec_s=[round(s, 3) for s in seconds],
                      entries_per_s=round(args.n * args.m / best),
                      result_norm=float(np.linalg.norm(result)))
    return report


def _run_with_progress(client: Any, array: Any, label: str, args: argparse.Namespace) -> Any:
    """Compute ``array`` on the cluster with a progress bar over its output chunks."""
    from distributed import as_completed, futures_of
    from tqdm import tqdm

    persisted = client.persist(array)
    futures = futures_of(persisted)
    for _ in tqdm(as_completed(futures), total=len(futures), desc=label, unit="chunk",
                  disable=args.quiet or args.json, file=sys.stderr):
        pass
    return client.compute(persisted).result()  # this client: tests may hold another default


class _client:
    """Context manager: ``dkern.connect`` for the run, closed (with its cluster) after."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __enter__(self) -> Any:
        from .runtime import connect

        kwargs = {} if self.args.scheduler else {"n_workers": self.args.workers}
        self.client = connect(self.args.scheduler, **kwargs)
        return self.client

    def __exit__(self, *exc: object) -> None:
        cluster = self.client.cluster
        self.client.close()
        if cluster is not None:
            cluster.close()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dkern", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dkern {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object")
    common.add_argument("--quiet", action="store_true", help="print nothing but errors")
    common.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    cluster = argparse.ArgumentParser(add_help=False)
    cluster.add_argument("--scheduler", default=None,
                         help="Dask scheduler address (default: $DKERN_SCHEDULER_ADDRESS, "
                              "else an embedded LocalCluster)")
    cluster.add_argument("--workers", type=_positive_int, default=os.cpu_count() or 1,
                         help="worker processes of the embedded LocalCluster")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", parents=[common], help="versions, backends (with a real KeOps "
                   "compile check) and whether a GPU is visible").set_defaults(run=_info)
    make = sub.add_parser("make-data", parents=[common, cluster],
                          help="write a synthetic regression Zarr store, chunk by chunk")
    make.add_argument("--out", required=True, help="store path or fsspec URL")
    make.add_argument("--n", type=_positive_int, required=True, help="training rows")
    make.add_argument("--d", type=_positive_int, required=True, help="features")
    make.add_argument("--n-test", type=int, default=0, help="test rows (X_test, y_test)")
    make.add_argument("--chunk-rows", type=_positive_int, default=100_000)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--noise", type=float, default=0.1)
    make.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    make.add_argument("--overwrite", action="store_true", help="replace arrays already there")
    make.set_defaults(run=_make_data)
    demo = sub.add_parser("demo", parents=[common, cluster],
                          help="make a store and time Gram matvecs on the cluster")
    demo.add_argument("--n", type=_positive_int, default=200_000)
    demo.add_argument("--m", type=_positive_int, default=20_000, help="columns of K(X, X[:m])")
    demo.add_argument("--d", type=_positive_int, default=8)
    demo.add_argument("--chunk-rows", type=_positive_int, default=25_000)
    demo.add_argument("--repeats", type=_positive_int, default=3)
    demo.add_argument("--backend", choices=["auto", "numpy", "keops"], default="auto")
    demo.add_argument("--store", default=None, help="where to write (default: a temp dir)")
    demo.set_defaults(run=_demo)
    return parser


def _print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
    elif not args.quiet:
        for key, value in report.items():
            print(f"{key:>16}: {json.dumps(value) if isinstance(value, dict | list) else value}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dkern`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    run: Callable[[argparse.Namespace], dict[str, Any]] = args.run
    try:
        report = run(args)
    except (DkernError, ValueError, TypeError, FileNotFoundError) as err:
        print(f"dkern {args.command}: error: {err}", file=sys.stderr)
        return 1
    _print_report(report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
