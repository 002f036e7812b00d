"""The Gaussian-process parts of ``dkern fit`` and ``dkern predict``.

Which options one model type only takes, the ``GaussianProcessRegressor`` the flags
describe, and its posterior mean and standard deviation written side by side.
Usage errors go through ``args.usage_error`` (the subcommand parser's ``error``: exit 2).
"""

from __future__ import annotations

import argparse
from typing import Any

#: Options of ``dkern fit`` that one model type only takes (attribute -> flag). Their
#: parser defaults are None, so a given option is told from an absent one; the model
#: builders fill in the defaults named in their help.
MODEL_ONLY_OPTIONS = {"krr": {"center_method": "--center-method", "max_iter": "--max-iter"},
                      "gp": {"optimizer": "--optimizer"}}


def check_model_options(args: argparse.Namespace) -> None:
    """Exit 2 naming the first given option that the other model type only takes."""
    for model_type, options in MODEL_ONLY_OPTIONS.items():
        given = [flag for dest, flag in options.items() if getattr(args, dest) is not None]
        if model_type != args.model_type and given:
            args.usage_error(f"{given[0]} applies to --model-type {model_type} only, not "
                             f"{args.model_type}; drop it, or pass --model-type {model_type}")


def gp_model(args: argparse.Namespace) -> Any:
    """The unfitted ``GaussianProcessRegressor`` of ``dkern fit --model-type gp``."""
    from . import GaussianProcessRegressor
    from .kernels import from_repr

    optimizer = "lbfgs" if args.optimizer == "lbfgs" else None
    return GaussianProcessRegressor(from_repr(args.kernel), alpha=args.alpha,
                                    solver=args.solver, n_centers=args.centers,
                                    optimizer=optimizer, tol=args.tol, backend=args.backend,
                                    random_state=args.seed,
                                    verbose=not (args.quiet or args.json),
                                    checkpoint=args.checkpoint,
                                    checkpoint_every=args.checkpoint_every)


def std_path(args: argparse.Namespace) -> str | None:
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


def write_gp_predictions(model: Any, args: argparse.Namespace, std_out: str | None) -> None:
    """The posterior mean at ``--out`` (and the std at ``std_out``), published together."""
    from .io import write_arrays

    paths = [args.out.strip("/")] + ([std_out] if std_out else [])
    group = paths[0].rpartition("/")[0]
    result = model.predict((args.data, args.x), return_std=std_out is not None)
    values = result if std_out is not None else (result,)
    write_arrays(args.data, {p.rpartition("/")[2]: v for p, v in zip(paths, values, strict=True)},
                 group=group, overwrite=args.overwrite)


def refuse_taken(args: argparse.Namespace, std_out: str | None) -> None:
    """The refusal ``write_arrays`` would give for a taken ``--out``/``std_out``, given
    before any work (a GP's cg variances are computed before the write)."""
    from .errors import StoreError
    from .models._validation import existing_arrays

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
