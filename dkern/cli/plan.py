"""``dkern plan``: a fit's or a prediction's time and per-worker memory, before the run.

``dkern plan fit`` and ``dkern plan predict`` take the options of ``dkern fit`` and
``dkern predict`` (the store and arrays, or the model, whose shapes are read, nothing
computed), or the sizes themselves (``--n``, ``--d``, ``--centers``, ``--test-rows``), and
the cluster to plan for (``--workers``, ``--threads``, ``--memory-limit``; by default what
``dkern.connect()`` starts here). The model is :mod:`dkern.planner`; this module parses
and prints. ``--calibrate`` measures this machine's rates and stores them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ._common import positive_float, positive_int

_IGNORED = "accepted so that a fit or predict command line plans as it is; no effect here"


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    from ..planner.plan import SOLVERS

    parser = sub.add_parser("plan", parents=[common],
                            help="predict a fit's or a prediction's time and per-worker "
                                 "memory, before running it")
    parser.add_argument("task", nargs="?", choices=["fit", "predict"],
                        help="what to plan (optional with --calibrate)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure this machine's rates now and store them in the cache "
                             "folder ($DKERN_CACHE_DIR, default ~/.cache/dkern)")
    what = parser.add_argument_group("what runs (as dkern fit / predict)")
    what.add_argument("--model-type", choices=["krr", "gp"], default=None,
                      help="krr (default) or gp; with --model, the model's")
    what.add_argument("--solver", choices=list(SOLVERS), default="auto")
    what.add_argument("--centers", type=positive_int, default=None,
                      help="Nystrom centres M (default sqrt(n)); selects nystrom with auto")
    what.add_argument("--tol", type=positive_float, default=1e-6,
                      help="relative residual to reach")
    what.add_argument("--max-iter", type=positive_int, default=None)
    what.add_argument("--iterations", type=positive_int, default=None,
                      help="CG iterations to plan for (default: an estimate from tol)")
    what.add_argument("--optimizer", choices=["none", "lbfgs"], default=None)
    what.add_argument("--std", action="store_true", help="predict: a GP's std as well")
    data = parser.add_argument_group("the data: a store's arrays, or their sizes")
    data.add_argument("--data", default=None, help="store path or fsspec URL")
    data.add_argument("--x", default=None, help="fit: training rows; predict: rows to predict")
    data.add_argument("--y", default=None, help="fit: targets (their columns are counted)")
    data.add_argument("--model", default=None, help="predict: the saved model")
    data.add_argument("--n", type=positive_int, default=None,
                      help="fit: training rows; predict: the model's training rows")
    data.add_argument("--d", type=positive_int, default=None, help="features")
    data.add_argument("--targets", type=positive_int, default=1, help="target columns")
    data.add_argument("--test-rows", type=positive_int, default=None, help="predict: rows")
    data.add_argument("--chunk-rows", type=positive_int, default=None,
                      help="rows per stored chunk (default: the store's, else dkern "
                           "make-data's 100,000)")
    data.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    where = parser.add_argument_group("the cluster (default: what dkern.connect() starts here)")
    where.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1)
    where.add_argument("--threads", type=positive_int, default=1, help="threads per worker")
    where.add_argument("--memory-limit", type=_bytes, default=None,
                       help="per worker, e.g. 4GB (default: this machine's memory times "
                            "threads / cores, as LocalCluster)")
    ignored = parser.add_argument_group("ignored", _IGNORED)
    for flag in ("--kernel", "--alpha", "--backend", "--seed", "--center-method", "--out",
                 "--std-out", "--checkpoint", "--checkpoint-every", "--scheduler"):
        ignored.add_argument(flag, default=None, help=argparse.SUPPRESS)
    ignored.add_argument("--overwrite", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run, usage_error=parser.error)


def _bytes(text: str) -> int:
    from dask.utils import parse_bytes

    try:
        value = parse_bytes(text)
    except (ValueError, OverflowError):  # OverflowError: 1e400GB is an infinite size
        raise argparse.ArgumentTypeError(
            f"expected a size such as 4GB or 512MiB; got {text!r}") from None
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"expected a size below 9e9 GB; got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive size; got {text!r}")
    return int(value)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..planner import Cluster

    _check_usage(args)
    cluster = Cluster(args.workers, args.threads, args.memory_limit or _default_limit(args))
    rates, path, measured = _rates(args)
    report: dict[str, Any] = {"rates": str(path), "calibrated_now": measured}
    if args.task is None:
        return {**report, "machine": rates.machine, "measured": rates.measured}
    plan = _plan_fit(args, cluster, rates) if args.task == "fit" else \
        _plan_predict(args, cluster, rates)
    if not args.quiet:
        for warning in plan.warnings:
            print(f"dkern plan: warning: {warning}", file=sys.stderr)
    return {"task": args.task, **plan.report(), **report}


def _check_usage(args: argparse.Namespace) -> None:
    """Exit 2 for an incomplete description: each message names the options to give."""
    if args.task is None and not args.calibrate:
        args.usage_error("give what to plan, fit or predict (or --calibrate alone)")
    if args.task is None:
        return
    if args.data is not None and args.x is None:
        args.usage_error("--data names the store; add --x, the array of rows")
    if args.optimizer == "lbfgs":
        args.usage_error("--optimizer lbfgs runs a number of steps known only as it runs; plan "
                         "the fit with the learned kernel (--optimizer none)")
    if args.task == "fit" and args.data is None and (args.n is None or args.d is None):
        args.usage_error("fit needs the data: --data and --x (and --y), as dkern fit, or "
                         "--n and --d")
    if args.task == "predict":
        if args.model is None and (args.d is None or args.n is None and args.centers is None):
            args.usage_error("predict needs the model: --model, or --d with --centers "
                             "(Nystrom) or --n (the training rows of an exact/cg model)")
        if args.data is None and args.test_rows is None:
            args.usage_error("predict needs the rows: --data and --x, or --test-rows")


def _default_limit(args: argparse.Namespace) -> int:
    """LocalCluster's default: the machine's memory times the worker's share of the cores."""
    import psutil

    cores = os.cpu_count() or 1
    return int(psutil.virtual_memory().total * min(1.0, args.threads / cores))


def _rates(args: argparse.Namespace) -> tuple[Any, Any, bool]:
    """The stored calibration, or one measured now (and stored) when asked or missing."""
    from ..planner import calibrate, load_rates, rates_path, save_rates

    rates = None if args.calibrate else load_rates()
    if rates is not None:
        return rates, rates_path(), False
    if not args.calibrate and not args.quiet:
        state = "no usable calibration (the log above says why)" if rates_path().exists() \
            else "no calibration"
        print(f"dkern plan: {state} of this machine at {rates_path()}: measuring its "
              "rates now, once (`dkern plan --calibrate` measures them again)", file=sys.stderr)
    rates = calibrate(workers=args.workers)
    return rates, save_rates(rates), True


def _stored_data(args: argparse.Namespace, rows_for: str) -> Any:
    """The :class:`~dkern.planner.Data` of ``--x`` in ``--data`` (its shape and chunks), or
    of the sizes given."""
    from ..io.synthetic import DEFAULT_CHUNK_ROWS
    from ..planner import Data

    if args.data is None:
        n = args.n if rows_for == "fit" else args.test_rows
        itemsize = 4 if args.dtype == "float32" else 8
        return Data(n, args.d, args.chunk_rows or DEFAULT_CHUNK_ROWS, itemsize, args.targets)
    from ..io import open_array

    X = open_array(args.data, args.x)
    if X.ndim != 2:
        raise ValueError(f"--x {args.x!r} has shape {X.shape}; expected (n, d), one row per "
                         "sample.")
    targets = args.targets
    if args.y is not None:
        y = open_array(args.data, args.y)
        targets = 1 if y.ndim == 1 else y.shape[1]
    return Data(X.shape[0], X.shape[1], args.chunk_rows or X.chunks[0][0], X.dtype.itemsize,
                targets)


def _plan_fit(args: argparse.Namespace, cluster: Any, rates: Any) -> Any:
    from ..planner import plan_fit

    data = _stored_data(args, "fit")
    return plan_fit(data, cluster, rates, model_type=args.model_type or "krr",
                    solver=args.solver, centers=args.centers, tol=args.tol,
                    max_iter=args.max_iter, iterations=args.iterations)


def _plan_predict(args: argparse.Namespace, cluster: Any, rates: Any) -> Any:
    """The model's kind and size, from ``--model`` or the options, then the plan."""
    import dataclasses

    from ..planner import default_centers, plan_predict

    if args.model is not None:
        kind, columns, d, targets = _saved_model(args)
        args.d = d
        args.targets = targets
    else:
        solver = args.solver if args.solver != "auto" else (
            "nystrom" if args.centers else "cg")
        if args.n is None and (solver != "nystrom" or args.centers is None):
            args.usage_error(f"predict with a {solver} model needs its training rows: --n"
                             + (" (or the centres, --centers)" if solver == "nystrom" else ""))
        is_gp = args.model_type == "gp"
        if args.std and not is_gp:
            args.usage_error("--std plans a Gaussian process's standard deviations; add "
                             "--model-type gp, or drop --std")
        kind = ("sgpr" if is_gp else "nystrom") if solver == "nystrom" else "expansion"
        columns = (args.centers or default_centers(args.n)) if solver == "nystrom" else args.n
        if is_gp and kind == "expansion" and args.std:
            raise ValueError(_NO_EXACT_STD)
    test = _stored_data(args, "predict")
    test = dataclasses.replace(test, targets=args.targets)
    return plan_predict(test, cluster, rates, kind=kind, columns=columns)


_NO_EXACT_STD = ("--std of an exact or cg Gaussian process (a solve per test point) is not "
                 "modelled by dkern plan; plan the mean alone (drop --std), or fit the sparse "
                 "GP (--solver nystrom --centers M)")


def _saved_model(args: argparse.Namespace) -> tuple[str, int, int, int]:
    """``(kind, columns, d, targets)`` of the model at ``--model``."""
    from .. import GaussianProcessRegressor, KernelRidge, load

    model = load(args.model)
    if not isinstance(model, KernelRidge | GaussianProcessRegressor):
        raise ValueError(f"dkern plan predict plans regression predictions; the model "
                         f"{args.model!r} is a {type(model).__name__}.")
    is_gp = isinstance(model, GaussianProcessRegressor)
    if args.std and not is_gp:  # as dkern predict refuses it
        raise ValueError(f"--std: the model {args.model!r} is a {type(model).__name__}, which "
                         "has no predictive variance; drop --std.")
    coef = model.alpha_ if is_gp else model.dual_coef_
    targets = 1 if coef.ndim == 1 else coef.shape[1]
    if model.solver_ == "nystrom":
        return ("sgpr" if is_gp else "nystrom"), len(model.centers_), model.n_features_in_, \
            targets
    if is_gp and args.std:
        raise ValueError(_NO_EXACT_STD)
    return "expansion", coef.shape[0], model.n_features_in_, targets
