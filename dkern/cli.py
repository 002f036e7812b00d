"""The ``dkern`` command: ``info``, ``make-data``, ``fit``, ``predict``, ``demo``, ``fsck``.

The command line is the one place that writes to the terminal; the library
itself only logs. ``--json`` prints one JSON object for scripts, ``--quiet``
prints nothing but errors. Exit codes: 0 done, 1 a failure dkern diagnosed
(the message says what to change), 2 bad command-line usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from distributed import KilledWorker

from . import __version__
from ._cli_gp import (
    check_model_options,
    gp_model,
    refuse_taken,
    std_path,
    write_gp_predictions,
)
from .errors import DkernError
from .solvers.checkpoint import CHECKPOINT_EVERY

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


def _fit(args: argparse.Namespace) -> dict[str, Any]:
    from . import save
    from .models.persist import check_can_save
    from .solvers import SolveMonitor, remove_checkpoint

    check_model_options(args)
    for flag, path in (("--model", args.model), ("--data", args.data)):
        if args.checkpoint is not None and _overlapping(args.checkpoint, path):
            # the checkpoint is removed, recursively, once the model is saved
            args.usage_error(f"--checkpoint {args.checkpoint!r} and {flag} {path!r} are the "
                             "same store or one holds the other; the fit's checkpoints need "
                             "a store of their own, e.g. --checkpoint ckpt.zarr")
    check_can_save(args.model, overwrite=args.overwrite)  # refuse now, not after the fit
    model = gp_model(args) if args.model_type == "gp" else _krr_model(args)
    monitor = SolveMonitor()
    with _client(args):
        start = time.perf_counter()
        model.fit((args.data, args.x), (args.data, args.y), callback=monitor)
        fit_s = time.perf_counter() - start
        save(model, args.model, overwrite=args.overwrite)
    report = {"model": args.model, "model_type": args.model_type,
              "kernel": repr(model.kernel_), "solver": model.solver_,
              "n_iter": model.n_iter_, "converged": model.converged_, "fit_s": round(fit_s, 2)}
    if args.checkpoint is not None:  # the saved model holds the result now
        remove_checkpoint(args.checkpoint)
        report["resumed_from"] = monitor.iterations[0] if monitor.iterations else 0
    if args.model_type == "gp":  # NaN (not computed above EXACT_MAX_N rows) is JSON null
        lml = float(model.log_marginal_likelihood_value_)
        report["log_marginal_likelihood"] = None if np.isnan(lml) else lml
    return report


def _overlapping(a: str, b: str) -> bool:
    """Whether two store paths or URLs name the same store or one lies inside the other."""
    from .io import path_within, store_location

    a, b = store_location(a), store_location(b)
    return path_within(a, b) or path_within(b, a)


def _krr_model(args: argparse.Namespace) -> Any:
    from . import KernelRidge
    from .kernels import from_repr

    return KernelRidge(from_repr(args.kernel), alpha=args.alpha, solver=args.solver,
                       n_centers=args.centers, centers=args.center_method or "uniform",
                       tol=args.tol, max_iter=args.max_iter, backend=args.backend,
                       random_state=args.seed, verbose=not (args.quiet or args.json),
                       checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)


def _predict(args: argparse.Namespace) -> dict[str, Any]:
    from . import GaussianProcessRegressor, KernelRidge, load

    std_out = std_path(args)  # usage errors before the model is read
    if _overlapping(args.data, args.model):
        args.usage_error(f"--data {args.data!r} and --model {args.model!r} are the same store "
                         "or one holds the other: the predictions would be written into the "
                         "model's store. Keep the data (X and the predictions) in a store of "
                         "its own")
    _refuse_outputs_over_inputs(args, std_out)
    model = load(args.model)
    if not isinstance(model, KernelRidge | GaussianProcessRegressor):
        raise ValueError(f"dkern predict writes regression predictions; the model "
                         f"{args.model!r} is a {type(model).__name__}. Load it in Python "
                         "(dkern.load) and call predict / predict_proba there.")
    is_gp = isinstance(model, GaussianProcessRegressor)
    if std_out is not None and not is_gp:
        raise ValueError(f"--std: the model {args.model!r} is a {type(model).__name__}, which "
                         "has no predictive variance; fit a Gaussian process (dkern fit "
                         "--model-type gp), or drop --std.")
    if args.y:
        _check_truth(model, args)  # before any work: a failed --y leaves the store untouched
    if is_gp:
        refuse_taken(args, std_out)
    with _client(args):
        start = time.perf_counter()
        if is_gp:
            write_gp_predictions(model, args, std_out)
        else:
            model.predict((args.data, args.x), out=(args.data, args.out),
                          overwrite=args.overwrite)
        report = {"model": args.model, "out": f"{args.data}::{args.out}",
                  "predict_s": round(time.perf_counter() - start, 2)}
        if std_out is not None:
            report["std_out"] = f"{args.data}::{std_out}"
        if args.y:
            report["rmse"] = _rmse(args.data, args.out, args.y)
    return report


def _refuse_outputs_over_inputs(args: argparse.Namespace, std_out: str | None) -> None:
    """A usage error when ``--out`` or the std's array is ``--x`` or ``--y`` or a group
    holding one: ``--overwrite`` would replace the data the command reads (and with ``--y``
    the RMSE would compare the predictions with themselves)."""
    from .io import path_within

    inputs = {"--x": args.x.strip("/")}
    if args.y:
        inputs["--y"] = args.y.strip("/")
    outputs = {"--out": args.out.strip("/")}
    if std_out is not None:
        outputs["--std-out" if args.std_out else "--std's array"] = std_out
    for out_flag, out in outputs.items():
        for in_flag, path in inputs.items():
            if path_within(path, out):
                args.usage_error(f"{out_flag} {out!r} would replace the input {in_flag} "
                                 f"{path!r}; write the predictions to another array")


def _check_truth(model: Any, args: argparse.Namespace) -> None:
    """Refuse a ``--y`` whose shape is not that of the predictions for ``--x``."""
    from .io import open_array

    coef = model.dual_coef_ if hasattr(model, "dual_coef_") else model.alpha_  # KRR or GP
    targets = coef.shape[1:]
    if targets == (1,) and not hasattr(model, "dual_coef_"):
        targets = ()  # a GP fitted on y (n, 1) predicts (m,), as scikit-learn's
    want = (open_array(args.data, args.x).shape[0], *targets)
    got = open_array(args.data, args.y).shape
    if got != want:
        raise ValueError(f"--y {args.y!r} has shape {got}, but the predictions for --x "
                         f"{args.x!r} will have shape {want}; pass the array of true values "
                         "for the rows of --x (nothing was written).")


def _rmse(store: str, pred: str, truth: str) -> float:
    """Root mean squared error of two stored arrays, computed chunk by chunk."""
    import dask.array as da

    from .io import open_array

    predicted, true = open_array(store, pred), open_array(store, truth)
    if predicted.shape != true.shape:  # never let them broadcast into an m x m difference
        raise ValueError(f"--y {truth!r} has shape {true.shape}, the predictions {pred!r} "
                         f"{predicted.shape}; pass the true values for the rows of --x.")
    return float(da.sqrt(((predicted - true) ** 2).mean()).compute())


def _demo(args: argparse.Namespace) -> dict[str, Any]:
    """Zarr store -> Nyström KRR fit on the cluster -> predictions written back -> RMSE."""
    if args.store is None:  # a store of its own, removed afterwards
        with tempfile.TemporaryDirectory(prefix="dkern-demo-") as folder:
            report = _run_demo(args, os.path.join(folder, "demo.zarr"))
        return {**report, "store": "(temporary, removed; keep one with --store)"}
    return _run_demo(args, args.store)


def _run_demo(args: argparse.Namespace, store: str) -> dict[str, Any]:
    from . import KernelRidge
    from .io import make_regression_store
    from .kernels import Gaussian

    report: dict[str, Any] = {"store": store, "n": args.n, "d": args.d, "n_test": args.n_test}
    with _client(args) as client:
        report["dashboard"] = client.dashboard_link
        start = time.perf_counter()
        make_regression_store(store, args.n, args.d, chunk_rows=args.chunk_rows,
                              n_test=args.n_test, seed=0, overwrite=True)
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
        model.predict((store, "X_test"), out=(store, "pred"), overwrite=True)
        report["predict_s"] = round(time.perf_counter() - start, 2)
        report["test_rmse"] = round(_rmse(store, "pred", "y_test"), 5)
        report["noise_sd"] = 0.1  # y_test is noise-free; 0.1 is the training noise level
    return report


def _store_command(args: argparse.Namespace) -> dict[str, Any]:
    """``dkern store check|clean URL``: verify every array, or reclaim leftovers."""
    from .errors import StoreError
    from .io import check_store, clean_store

    if args.action == "clean":
        removed = clean_store(args.url, args.group, min_age=args.min_age)
        return {"store": args.url, "removed": removed}
    report = check_store(args.url, args.group)
    if not report.ok:
        raise StoreError(f"{args.url!r} is damaged: " + "; ".join(report.damage)
                         + " (`dkern store clean` never repairs damage: rewrite what is named.)")
    return {"store": args.url, "arrays": {k: list(v) for k, v in report.arrays.items()},
            "orphans": report.orphans}


def _fsck(args: argparse.Namespace) -> dict[str, Any]:
    """``dkern fsck STORE``: verify every array, then list (``--clean``: remove) leftovers.

    Leftovers are what no pointer uses (folders of killed or refused writes, ``*.partial``
    files); published arrays are never removed, and nothing at all from a damaged store,
    whose pointers may be what is damaged. No lock can be stale: dkern's are ``flock``
    locks, which the kernel releases when their process dies.
    """
    from .io import check_store, clean_store

    report = check_store(args.url, args.group)
    found = [] if not report.ok else clean_store(args.url, args.group, min_age=args.min_age,
                                                 dry_run=not args.clean)
    return {"store": args.url, "ok": report.ok, "damage": report.damage,
            "arrays": {k: list(v) for k, v in report.arrays.items()},
            "plain": report.plain,
            "removed" if args.clean else "would_remove": sorted(found),
            # too young (maybe a write still running), leased by a live writer, or damage
            "kept": sorted(set(report.orphans) - set(found))}


def _add_fsck_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    fsck = sub.add_parser("fsck", parents=[common],
                          help="verify every array of a store (pointers, metadata, every chunk "
                               "and its checksum) and list leftovers; --clean removes them")
    fsck.add_argument("url", help="store path or fsspec URL")
    fsck.add_argument("--group", default="", help="only this group (and those below it)")
    fsck.add_argument("--clean", action="store_true",
                      help="remove the leftovers listed as would_remove (never published "
                           "data; nothing when damage is found)")
    fsck.add_argument("--min-age", type=_nonnegative_float, default=None,
                      help="keep leftovers younger than this many seconds (default: 10 on "
                           "local disk, where live writers are also protected by a lease; "
                           "86400 on fsspec stores)")
    fsck.set_defaults(run=_fsck)


def _add_store_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    store = sub.add_parser("store", parents=[common],
                           help="check a store (every chunk and checksum) or clean it "
                                "(delete what no pointer uses); `dkern fsck` does both")
    store.add_argument("action", choices=["check", "clean"],
                       help="check: read every chunk, exit 1 naming any damage; clean: delete "
                            "leftovers no pointer uses")
    store.add_argument("url", help="store path or fsspec URL")
    store.add_argument("--group", default="", help="only this group (and those below it)")
    store.add_argument("--min-age", type=_nonnegative_float, default=None,
                       help="clean: keep leftovers younger than this many seconds (default: "
                            "10 on local disk, where live writers are also protected by a "
                            "lease; 86400 on fsspec stores)")
    store.set_defaults(run=_store_command)


class _client:
    """Context manager: ``dkern.connect`` for the run, closed (with its cluster) after."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __enter__(self) -> Any:
        from .runtime import connect

        kwargs = {} if self.args.scheduler else {
            "n_workers": self.args.workers,
            # Worker logs would repeat a task's error as a traceback before the message
            # main() prints; -v shows them.
            "silence_logs": logging.WARNING if self.args.verbose else logging.CRITICAL}
        if not self.args.verbose:  # a Ctrl-C'd gather logs "Task exception was never retrieved"
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        with _ctrl_c_ignored_by_new_processes():
            self.client = connect(self.args.scheduler, **kwargs)
        return self.client

    def __exit__(self, *exc: object) -> None:
        cluster = self.client.cluster
        self.client.close()
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def _ctrl_c_ignored_by_new_processes() -> Iterator[None]:
    """Ignore SIGINT while the embedded cluster starts, so its worker processes ignore it.

    Ctrl-C in a terminal signals the whole process group, and each worker would print
    a KeyboardInterrupt traceback; they stop when the command closes the cluster. An
    ignored signal stays ignored across ``exec``, and Python then installs no handler.
    The cost: a Ctrl-C during the cluster's start (seconds) is lost, and a worker that
    the nanny restarts later does not inherit this.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; got {text}")
    return value


def _solver_arguments(parser: argparse.ArgumentParser, *, tol: float,
                      alpha_help: str = "ridge penalty, (K + alpha I)") -> None:
    """--alpha, --tol and --backend, added to each command that solves. Each parser gets
    its own actions: with a shared parent parser, one command's default changed the
    other's (demo's tol=1e-3 became fit's)."""
    parser.add_argument("--alpha", type=float, default=1e-3, help=alpha_help)
    parser.add_argument("--tol", type=float, default=tol, help="relative residual to reach")
    parser.add_argument("--backend", choices=["auto", "numpy", "keops"], default="auto")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dkern", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dkern {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object")
    common.add_argument("--quiet", action="store_true", help="print nothing but errors")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="log at INFO level, and show the embedded cluster's worker logs")
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
    make.add_argument("--chunk-rows", type=_positive_int, default=None,
                      help="rows per chunk (default: 100,000, fewer when the workers' measured "
                           "free memory needs it)")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--noise", type=_nonnegative_float, default=0.1,
                      help="standard deviation of the Gaussian noise added to y")
    make.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    make.add_argument("--overwrite", action="store_true", help="replace arrays already there")
    make.set_defaults(run=_make_data)
    fit = sub.add_parser("fit", parents=[common, cluster],
                         help="fit kernel ridge regression or a Gaussian process on arrays of "
                              "a Zarr store")
    fit.add_argument("--model-type", choices=["krr", "gp"], default="krr",
                     help="krr: dkern.KernelRidge; gp: dkern.GaussianProcessRegressor (its "
                          "model file gives `dkern predict --std`)")
    _solver_arguments(fit, tol=1e-6, alpha_help="krr: the ridge penalty, (K + alpha I) c = y; "
                      "gp: the noise variance added to the diagonal (scikit-learn's alpha)")
    fit.add_argument("--data", required=True, help="store path or fsspec URL")
    fit.add_argument("--x", required=True, help="array of training rows (n, d)")
    fit.add_argument("--y", required=True, help="array of targets (n,) or (n, t)")
    fit.add_argument("--kernel", default="Gaussian(lengthscale=1.0)",
                     help="a kernel expression, e.g. '2.0 * Matern(lengthscale=0.5, nu=1.5)'")
    fit.add_argument("--solver", choices=["auto", "exact", "cg", "nystrom"], default="auto",
                     help="auto: exact (dense Cholesky) up to dkern.solvers.EXACT_MAX_N rows, "
                          "preconditioned CG above (the same model, to --tol; each iteration "
                          "is a pass over n^2 kernel values); nystrom only if asked for or "
                          "--centers is given (for gp: the sparse GP of Titsias on the "
                          "centres)")
    fit.add_argument("--centers", type=_positive_int, default=None,
                     help="Nystrom centres M (default: sqrt(n)); with --solver auto, "
                          "selects nystrom")
    fit.add_argument("--center-method", choices=["uniform", "leverage"], default=None,
                     help="krr only (default uniform)")
    fit.add_argument("--max-iter", type=_positive_int, default=None, help="krr only")
    fit.add_argument("--optimizer", choices=["none", "lbfgs"], default=None,
                     help="gp only. none (default): --kernel's hyperparameters are used as "
                          "given, as for krr, and the fit is one solve of predictable cost; "
                          "lbfgs: maximise the log marginal likelihood over them within their "
                          "bounds first (exact, for n <= dkern.solvers.EXACT_MAX_N, with "
                          "solver exact/cg; the sparse GP's bound with nystrom, two passes "
                          "over the data per step, often dozens of steps)")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--checkpoint", default=None,
                     help="folder or fsspec URL (seen by every worker) where CG / Falkon save "
                          "their state every --checkpoint-every iterations; rerunning the same "
                          "command resumes there (the report's resumed_from), and the "
                          "checkpoint is removed once the model is saved")
    fit.add_argument("--checkpoint-every", type=_positive_int, default=CHECKPOINT_EVERY,
                     help="iterations between checkpoints")
    fit.add_argument("--model", required=True, help="where to save the model (a Zarr group)")
    fit.add_argument("--overwrite", action="store_true", help="replace a model already there")
    fit.set_defaults(run=_fit, usage_error=fit.error)
    predict = sub.add_parser("predict", parents=[common, cluster],
                             help="predict with a saved model, writing to the store")
    predict.add_argument("--model", required=True)
    predict.add_argument("--data", required=True, help="store holding X and receiving --out")
    predict.add_argument("--x", required=True, help="array of rows to predict")
    predict.add_argument("--out", required=True, help="new array for the predictions")
    predict.add_argument("--overwrite", action="store_true",
                         help="replace an array already named --out")
    predict.add_argument("--y", default=None, help="array of true values: report the RMSE")
    predict.add_argument("--std", action="store_true",
                         help="gp models only: also write the posterior standard deviation "
                              "(latent: the noise alpha not included, as scikit-learn's "
                              "return_std)")
    predict.add_argument("--std-out", default=None,
                         help="with --std: the array for it, in --out's group (default "
                              "<out>_std); mean and std are published together, atomically")
    predict.set_defaults(run=_predict, usage_error=predict.error)
    demo = sub.add_parser("demo", parents=[common, cluster],
                          help="make a store, fit Nystrom KRR, predict to the store, report")
    # tol 1e-3: the demo's test RMSE is that of a tight fit, in a fraction of the time
    # (measured: benchmarks/RESULTS.md, "Figures behind two defaults").
    _solver_arguments(demo, tol=1e-3)
    demo.add_argument("--n", type=_positive_int, default=200_000)
    demo.add_argument("--n-test", type=_positive_int, default=20_000)
    demo.add_argument("--d", type=_positive_int, default=8)
    demo.add_argument("--centers", type=_positive_int, default=1_000)
    demo.add_argument("--lengthscale", type=float, default=3.0)
    demo.add_argument("--chunk-rows", type=_positive_int, default=50_000)
    demo.add_argument("--store", default=None,
                      help="where to write (default: a temp dir); the demo's arrays there "
                           "(X, y, X_test, y_test, pred) are replaced")
    demo.set_defaults(run=_demo)
    _add_store_parser(sub, common)
    _add_fsck_parser(sub, common)
    return parser


def _print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
    elif not args.quiet:
        for key, value in report.items():
            print(f"{key:>16}: {json.dumps(value) if isinstance(value, dict | list) else value}")


#: The store each command writes (the attribute of its flag), named after a Ctrl-C.
_WRITTEN_STORE = {"make-data": "out", "fit": "model", "predict": "data", "demo": "store"}


def _interrupted(args: argparse.Namespace) -> str:
    """The one line printed after a Ctrl-C: what state the written store is in."""
    message = f"dkern {args.command}: interrupted"
    store = getattr(args, _WRITTEN_STORE.get(args.command, ""), None)
    if store is None:  # demo without --store: its temporary folder was removed
        return message
    message += (f"; writes are published atomically, so {store!r} holds no half-written "
                f"array (`dkern fsck {store} --clean` removes the interrupted write's "
                "leftovers)")
    if getattr(args, "checkpoint", None) is not None:
        message += "; run the same command again to resume from its last checkpoint"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dkern`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    run: Callable[[argparse.Namespace], dict[str, Any]] = args.run
    try:
        report = run(args)
    except (DkernError, ValueError, TypeError, OSError) as err:  # OSError: paths, network
        # The library names its keyword argument; here it is a flag.
        message = str(err).replace("overwrite=True", "--overwrite")
        print(f"dkern {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C
    except KilledWorker as err:
        print(f"dkern {args.command}: error: a Dask worker died while running a task ({err}); "
              "the usual cause is a worker out of memory. Give the workers more memory "
              "(their memory_limit), or use smaller row chunks.", file=sys.stderr)
        return 1
    _print_report(report, args)
    if report.get("damage"):  # `dkern fsck` found damage: the report says what
        print(f"dkern {args.command}: error: {args.url!r} is damaged (see damage) and nothing "
              "was removed; rewrite what is named from its source, then run it again.",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
