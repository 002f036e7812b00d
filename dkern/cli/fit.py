"""``dkern fit``: fit kernel ridge regression or a Gaussian process on arrays of a
Zarr store, and save the model.

Which options one model type only takes, and the estimator the flags describe:
``dkern.KernelRidge`` (``--model-type krr``) or ``dkern.GaussianProcessRegressor``
(``gp``, whose model file gives ``dkern predict --std``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ..solvers.checkpoint import CHECKPOINT_EVERY
from ._common import (
    check_creatable,
    cluster_client,
    overlapping,
    positive_int,
    solver_arguments,
)

#: Options of ``dkern fit`` that one model type only takes (attribute -> flag). Their
#: parser defaults are None, so a given option is told from an absent one; the model
#: builders fill in the defaults named in their help.
MODEL_ONLY_OPTIONS = {"krr": {"center_method": "--center-method", "max_iter": "--max-iter"},
                      "gp": {"optimizer": "--optimizer"}}


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("fit", parents=[common, cluster],
                            help="fit kernel ridge regression or a Gaussian process on arrays "
                                 "of a Zarr store")
    parser.add_argument("--model-type", choices=["krr", "gp"], default="krr",
                        help="krr: dkern.KernelRidge; gp: dkern.GaussianProcessRegressor (its "
                             "model file gives `dkern predict --std`)")
    solver_arguments(parser, tol=1e-6, alpha_help="krr: the ridge penalty, (K + alpha I) c = "
                     "y; gp: the noise variance added to the diagonal (scikit-learn's alpha)")
    parser.add_argument("--data", required=True, help="store path or fsspec URL")
    parser.add_argument("--x", required=True, help="array of training rows (n, d)")
    parser.add_argument("--y", required=True, help="array of targets (n,) or (n, t)")
    parser.add_argument("--row-chunks", type=positive_int, default=None,
                        help="rows of --x per task (default: whole Zarr chunks, merged to "
                             "about 16 MiB); fewer rows need less worker memory")
    _add_model_options(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None,
                        help="folder or fsspec URL (seen by every worker) where CG / Falkon "
                             "save their state every --checkpoint-every iterations; rerunning "
                             "the same command resumes there (the report's resumed_from), and "
                             "the checkpoint is removed once the model is saved")
    parser.add_argument("--checkpoint-every", type=positive_int, default=CHECKPOINT_EVERY,
                        help="iterations between checkpoints")
    parser.add_argument("--model", required=True,
                        help="where to save the model (a Zarr group)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a model already there")
    parser.set_defaults(run=run, usage_error=parser.error, written_store="model",
                        store_paths=("data", "model", "checkpoint"))


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """--kernel, and how the model is solved (some for one model type only)."""
    parser.add_argument("--kernel", default="Gaussian(lengthscale=1.0)",
                        help="a kernel expression, e.g. '2.0 * Matern(lengthscale=0.5, nu=1.5)'")
    parser.add_argument("--solver", choices=["auto", "exact", "cg", "nystrom"], default="auto",
                        help="auto: exact (dense Cholesky) up to dkern.solvers.EXACT_MAX_N rows, "
                             "preconditioned CG above (the same model, to --tol; each iteration "
                             "is a pass over n^2 kernel values); nystrom only if asked for or "
                             "--centers is given (for gp: the sparse GP of Titsias on the "
                             "centres)")
    parser.add_argument("--centers", type=positive_int, default=None,
                        help="Nystrom centres M (default: sqrt(n)); with --solver auto, "
                             "selects nystrom")
    parser.add_argument("--center-method", choices=["uniform", "leverage"], default=None,
                        help="krr only (default uniform)")
    parser.add_argument("--max-iter", type=positive_int, default=None, help="krr only")
    parser.add_argument("--optimizer", choices=["none", "lbfgs"], default=None,
                        help="gp only. none (default): --kernel's hyperparameters are used as "
                             "given, as for krr, and the fit is one solve of predictable cost; "
                             "lbfgs: maximise the log marginal likelihood over them within "
                             "their bounds first (exact, for n <= dkern.solvers.EXACT_MAX_N, "
                             "with solver exact/cg; the sparse GP's bound with nystrom, two "
                             "passes over the data per step, often dozens of steps)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from .. import save
    from ..models.persist import check_can_save
    from ..solvers import SolveMonitor, check_checkpoint_location, remove_checkpoint

    _check_model_options(args)
    for flag, path in (("--model", args.model), ("--data", args.data)):
        if args.checkpoint is not None and overlapping(args.checkpoint, path):
            # the checkpoint is removed, recursively, once the model is saved
            args.usage_error(f"--checkpoint {args.checkpoint!r} and {flag} {path!r} are the "
                             "same store or one holds the other; the fit's checkpoints need "
                             "a store of their own, e.g. --checkpoint ckpt.zarr")
    if overlapping(args.data, args.model):  # `dkern predict` could not use such a model
        args.usage_error(f"--data {args.data!r} and --model {args.model!r} are the same store "
                         "or one holds the other, which `dkern predict` refuses (it writes "
                         "predictions into --data). Save the model in a store of its own, "
                         "e.g. --model model.zarr")
    for flag, path in (("--model", args.model), ("--checkpoint", args.checkpoint)):
        if path is not None:  # refuse now, not after the fit
            check_creatable(flag, path, args.usage_error)
    check_can_save(args.model, overwrite=args.overwrite)
    if args.checkpoint is not None:  # it is removed after the save: refuse another's data now
        check_checkpoint_location(args.checkpoint)
    model = _gp_model(args) if args.model_type == "gp" else _krr_model(args)
    _check_training_arrays(args)
    monitor = SolveMonitor()
    with cluster_client(args):
        start = time.perf_counter()
        model.fit(_training_rows(args), (args.data, args.y), callback=monitor)
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


def _training_rows(args: argparse.Namespace) -> Any:
    """``--x``: the store reference, or with ``--row-chunks`` its rows in chunks of that
    many (each task reads the Zarr chunks its rows lie in)."""
    if args.row_chunks is None:
        return (args.data, args.x)
    from ..io import open_array

    X = open_array(args.data, args.x)
    return X.rechunk({0: min(args.row_chunks, max(X.shape[0], 1))})  # more: one chunk


def _check_training_arrays(args: argparse.Namespace) -> None:
    """Open ``--x`` and ``--y`` here, before a cluster starts: a wrong store, array name or
    shape is then an error within a second rather than after the cluster's start."""
    from ..io import open_array

    X, y = open_array(args.data, args.x), open_array(args.data, args.y)
    if X.ndim != 2:
        raise ValueError(f"--x {args.x!r} has shape {X.shape}; expected (n, d), one row per "
                         "sample: pass the array of training rows.")
    if y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
        raise ValueError(f"--y {args.y!r} has shape {y.shape}; expected ({X.shape[0]},) or "
                         f"({X.shape[0]}, t), one target per row of --x {args.x!r}.")


def _check_model_options(args: argparse.Namespace) -> None:
    """Exit 2 naming the first given option that the other model type only takes."""
    for model_type, options in MODEL_ONLY_OPTIONS.items():
        given = [flag for dest, flag in options.items() if getattr(args, dest) is not None]
        if model_type != args.model_type and given:
            args.usage_error(f"{given[0]} applies to --model-type {model_type} only, not "
                             f"{args.model_type}; drop it, or pass --model-type {model_type}")


def _krr_model(args: argparse.Namespace) -> Any:
    """The unfitted ``KernelRidge`` of ``dkern fit`` (``--model-type krr``)."""
    from .. import KernelRidge
    from ..kernels import from_repr

    return KernelRidge(from_repr(args.kernel), alpha=args.alpha, solver=args.solver,
                       n_centers=args.centers, centers=args.center_method or "uniform",
                       tol=args.tol, max_iter=args.max_iter, backend=args.backend,
                       random_state=args.seed, verbose=not (args.quiet or args.json),
                       checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)


def _gp_model(args: argparse.Namespace) -> Any:
    """The unfitted ``GaussianProcessRegressor`` of ``dkern fit --model-type gp``."""
    from .. import GaussianProcessRegressor
    from ..kernels import from_repr

    optimizer = "lbfgs" if args.optimizer == "lbfgs" else None
    return GaussianProcessRegressor(from_repr(args.kernel), alpha=args.alpha,
                                    solver=args.solver, n_centers=args.centers,
                                    optimizer=optimizer, tol=args.tol, backend=args.backend,
                                    random_state=args.seed,
                                    verbose=not (args.quiet or args.json),
                                    checkpoint=args.checkpoint,
                                    checkpoint_every=args.checkpoint_every)
