"""``dkern predict``: predict with a saved model, writing the predictions to the store.

Every refusal comes before any work: outputs that would replace the inputs, a
``--y`` of the wrong shape, a taken ``--out``. A Gaussian process's posterior mean
and (with ``--std``) standard deviation are published together, atomically.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ._common import cluster_client, overlapping, rmse


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("predict", parents=[common, cluster],
                            help="predict with a saved model, writing to the store")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="store holding X and receiving --out")
    parser.add_argument("--x", required=True, help="array of rows to predict")
    parser.add_argument("--out", required=True, help="new array for the predictions")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an array already named --out")
    parser.add_argument("--y", default=None, help="array of true values: report the RMSE")
    parser.add_argument("--std", action="store_true",
                        help="gp models only: also write the posterior standard deviation "
                             "(latent: the noise alpha not included, as scikit-learn's "
                             "return_std)")
    parser.add_argument("--std-out", default=None,
                        help="with --std: the array for it, in --out's group (default "
                             "<out>_std); mean and std are published together, atomically")
    parser.set_defaults(run=run, usage_error=parser.error, written_store="data",
                        store_paths=("data", "model"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from .. import GaussianProcessRegressor, KernelRidge, load

    for flag, path in (("--out", args.out), ("--std-out", args.std_out)):
        if path is not None and path.startswith("/"):  # a file-system path, most likely
            args.usage_error(f"{flag} names an array inside the --data store (e.g. 'pred' or "
                             f"'results/pred'); got {path!r}, an absolute path. Pass the "
                             "array's path within the store, without a leading '/'")
    std_out = _std_path(args)  # usage errors before the model is read
    if overlapping(args.data, args.model):
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
    m = _checked_rows(model, args)  # before a cluster starts
    if args.y:
        _check_truth(model, args, m)  # before any work: a failed --y leaves the store untouched
    if is_gp:
        _refuse_taken(args, std_out)
    with cluster_client(args):
        start = time.perf_counter()
        if is_gp:
            _write_gp_predictions(model, args, std_out)
        else:
            model.predict((args.data, args.x), out=(args.data, args.out),
                          overwrite=args.overwrite)
        report = {"model": args.model, "out": f"{args.data}::{args.out}",
                  "predict_s": round(time.perf_counter() - start, 2)}
        if std_out is not None:
            report["std_out"] = f"{args.data}::{std_out}"
        if args.y:
            report["rmse"] = rmse(args.data, args.out, args.y)
    return report


def _std_path(args: argparse.Namespace) -> str | None:
    """Where ``--std`` writes: ``--std-out``, else ``<out>_std``; in ``--out``'s group."""
    if not args.std:
        if args.std_out is not None:
            args.usage_error("--std-out names the array of standard deviations; add --std")
        return None
    path = (args.std_out or f"{args.out.rstrip('/')}_std").strip("/")
    out = args.out.strip("/")
    group = out.rpartition("/")[0]
    if path.rpartition("/")[0] != group or path == out:
        args.usage_error(f"--std-out {path!r} must be another array of the group of --out "
                         f"({group!r}): the mean and std are published together, in one "
                         "atomic step")
    return path


def _refuse_outputs_over_inputs(args: argparse.Namespace, std_out: str | None) -> None:
    """A usage error when ``--out`` or the std's array is ``--x`` or ``--y`` or a group
    holding one: ``--overwrite`` would replace the data the command reads (and with ``--y``
    the RMSE would compare the predictions with themselves)."""
    from ..io import path_within

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


def _checked_rows(model: Any, args: argparse.Namespace) -> int:
    """The number of rows of ``--x``; refuses one that is missing or whose rows are not
    the model's features."""
    from ..io import open_array

    X = open_array(args.data, args.x)
    d = model.n_features_in_
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"--x {args.x!r} has shape {X.shape}; the model {args.model!r} was "
                         f"fitted on {d} features, so expected (m, {d}) (nothing was written).")
    return X.shape[0]


def _check_truth(model: Any, args: argparse.Namespace, m: int) -> None:
    """Refuse a ``--y`` whose shape is not that of the predictions for the m rows of
    ``--x``."""
    from ..io import open_array

    coef = model.dual_coef_ if hasattr(model, "dual_coef_") else model.alpha_  # KRR or GP
    targets = coef.shape[1:]
    if targets == (1,) and not hasattr(model, "dual_coef_"):
        targets = ()  # a GP fitted on y (n, 1) predicts (m,), as scikit-learn's
    want = (m, *targets)
    got = open_array(args.data, args.y).shape
    if got != want:
        raise ValueError(f"--y {args.y!r} has shape {got}, but the predictions for --x "
                         f"{args.x!r} will have shape {want}; pass the array of true values "
                         "for the rows of --x (nothing was written).")


def _refuse_taken(args: argparse.Namespace, std_out: str | None) -> None:
    """The refusal ``write_arrays`` would give for a taken ``--out``/``std_out``, given
    before any work (a GP's cg variances are computed before the write)."""
    from ..errors import StoreError
    from ..models._validation import existing_arrays

    paths = [args.out.strip("/")] + ([std_out] if std_out else [])
    present = set(existing_arrays(args.data, paths[0].rpartition("/")[0]))
    taken = [p for p in paths if p.rpartition("/")[2] in present]
    if taken and not args.overwrite:
        raise StoreError(f"{args.data!r} already has arrays {taken}; pass --overwrite to "
                         "replace them (nothing was computed).")
    stale = f"{paths[0]}_std"  # the std an earlier `--std` wrote beside this mean
    if taken and std_out is None and stale.rpartition("/")[2] in present:
        raise StoreError(f"{args.data!r} holds {stale!r} from an earlier prediction, which a "
                         f"new mean alone would leave beside {paths[0]!r}, no longer matching. "
                         "Add --std to replace both, or write to another --out (nothing was "
                         "computed).")


def _write_gp_predictions(model: Any, args: argparse.Namespace, std_out: str | None) -> None:
    """The posterior mean at ``--out`` (and the std at ``std_out``), published together."""
    from ..io import write_arrays

    paths = [args.out.strip("/")] + ([std_out] if std_out else [])
    group = paths[0].rpartition("/")[0]
    result = model.predict((args.data, args.x), return_std=std_out is not None)
    values = result if std_out is not None else (result,)
    write_arrays(args.data, {p.rpartition("/")[2]: v for p, v in zip(paths, values, strict=True)},
                 group=group, overwrite=args.overwrite)
