"""Which solver and variance method a :class:`~dkern.models.GaussianProcessRegressor` uses:
its parameter checks and the ``"auto"`` choices, with errors that name the fix; and what
each solver's model file holds (:data:`MODEL_FILE`)."""

from __future__ import annotations

import logging
from numbers import Integral
from typing import Any

import numpy as np

from ._model_file import FileLayout, ModelFile, centers_dim, targets_dim
from ._validation import check_alpha, check_choice, check_optional_int
from .posteriors import check_solver_fits, choose_solver

# the estimator's choices are logged under the estimator's module, where users filter them
logger = logging.getLogger("dkern.models.gaussian_process")

#: Solvers of ``C a = y`` and variance methods the estimator offers (``"auto"`` first).
SOLVERS = ("auto", "exact", "cg", "nystrom")
VARIANCES = ("auto", "exact", "cg", "lanczos", "nystrom")


def checked_methods(solver: object, variance: object, n_centers: object,
                    lanczos_rank: object, preconditioner_rank: object) -> tuple[str, str]:
    """The ``solver`` and ``variance`` parameters, checked before any data is read."""
    solver = check_choice(solver, "solver", SOLVERS)
    variance = check_choice(variance, "variance", VARIANCES)
    check_optional_int(n_centers, "n_centers", 1)
    checked_lanczos_rank(lanczos_rank)
    checked_preconditioner_rank(preconditioner_rank)
    if n_centers is not None and solver in ("exact", "cg"):
        raise ValueError(f"n_centers={n_centers!r} sets the centres of the sparse GP, "
                         f"solver='nystrom'; solver={solver!r} uses every training row. "
                         "Leave n_centers=None, or use solver='nystrom'.")
    return solver, variance


def resolve(solver: str, variance: str, n_centers: int | None, n: int, alpha: Any, *,
            exact_max_n: int) -> tuple[str, str, float]:
    """``"auto"`` resolved for n training rows (:func:`.posteriors.choose_solver`, the
    policy kernel ridge shares), the pair checked to go together, and the noise ``alpha``
    checked for them (:func:`checked_noise`)."""
    if solver == "auto":
        solver, why = choose_solver(n, n_centers, exact_max_n=exact_max_n)
        logger.info("GaussianProcessRegressor: solver='auto' chose %r (%s)", solver, why)
    check_solver_fits(solver, n, n_centers, exact_max_n=exact_max_n)
    if variance == "auto":
        variance = solver
    if variance == "lanczos" and solver == "nystrom":
        raise ValueError("variance='lanczos' decomposes the exact GP's C = K + alpha I over all "
                         "training rows; solver='nystrom' fits the sparse GP, whose predictive "
                         "variance is variance='nystrom'. Use solver='exact' or 'cg' with "
                         "variance='lanczos', or variance='nystrom' (or 'auto') with "
                         "solver='nystrom'.")
    if (variance == "nystrom") != (solver == "nystrom"):
        raise ValueError(f"variance='nystrom' is the sparse GP's own predictive and goes with "
                         f"solver='nystrom' only; got solver={solver!r}, variance="
                         f"{variance!r}. Use solver='nystrom' with variance='nystrom' or "
                         "'auto', or another variance with another solver.")
    if variance == "exact" and solver != "exact":
        raise ValueError(f"variance='exact' uses the Cholesky factor of solver='exact'; got "
                         f"solver={solver!r}. Use variance='cg' (exact to tol) or "
                         "solver='exact'.")
    noise = checked_noise(alpha, solver)
    if variance == "lanczos" and noise == 0:
        raise ValueError("alpha must be > 0 for variance='lanczos' (its Nyström basis and "
                         "Lanczos steps work on K + alpha I); got 0.0. Use e.g. alpha=1e-6.")
    return solver, variance, noise


def checked_lanczos_rank(value: object) -> int:
    """``lanczos_rank`` as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"lanczos_rank must be an integer >= 1 (the Lanczos steps k of "
                         f"variance='lanczos'); got {value!r}. Use e.g. lanczos_rank=100.")
    return int(value)


def checked_preconditioner_rank(value: object) -> int:
    """``preconditioner_rank`` as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"preconditioner_rank must be an integer >= 1 (the columns r of the "
                         f"Nyström preconditioner of solver='cg' and of the basis of "
                         f"variance='lanczos'); got {value!r}. Use e.g. "
                         f"preconditioner_rank=300.")
    return int(value)


def checked_noise(alpha: Any, solver: str) -> float:
    """``alpha``, the noise variance, as a float: one number, >= 0 for ``"exact"``, > 0
    otherwise."""
    if np.size(alpha) != 1:  # scikit-learn also takes one value per training row
        raise ValueError(f"alpha must be one number, the noise variance added to every "
                         f"diagonal entry (dkern has no per-row noise); got an array of "
                         f"shape {np.shape(alpha)}. Pass one float, e.g. "
                         f"alpha=float(np.mean(alpha)).")
    value = alpha.item() if isinstance(alpha, np.ndarray) else alpha  # shape (1,)
    return check_alpha(value, solver, role="the noise variance added to the diagonal",
                       example="1e-6")


#: The SGPR statistics' scalars in a ``"nystrom"`` model's file (the posterior's
#: ``trace``, ``n`` and ``jitter``).
SPARSE_SCALARS = {"sgpr_trace": "number", "sgpr_n": "positive", "sgpr_jitter": "number"}

#: The regressor's model file (:mod:`dkern.models.persist`) per solver: arrays by dimension
#: (``n`` rows, ``m`` centres, ``d`` features, ``t`` targets; "t?": (n,) or (n, t)). Exact
#: and CG models keep the training data and ``pivot_seed`` (the CG preconditioner is
#: rebuilt from the same pivots); sparse ones only the M-sized SGPR statistics.
#: "fitted_kernel" is ``kernel_``; the private names are the estimator's target scaling
#: and its posterior's state.
MODEL_FILE = ModelFile(
    marker="alpha_", kernel="learned", dims=(centers_dim, targets_dim),
    layouts={solver: FileLayout(
        arrays=({"centers": ("m", "d"), "alpha": ("m", "t?"), "L": ("m", "m"),
                 "P": ("m", "m"), "b": ("m", "t"), "yty": ("t",)} if solver == "nystrom"
                else {"X_train": ("n", "d"), "y_train": ("n", "t?"), "alpha": ("n", "t?")}
                | ({"L": ("n", "n")} if solver == "exact" else {})),
        scalars={"solver_": "str", "n_iter_": "count", "converged_": "bool",
                 "n_features_in_": "positive", "variance_": "str",
                 "log_marginal_likelihood_value_": "number or null",
                 "y_train_mean": "numbers", "y_train_std": "numbers"}
        | (SPARSE_SCALARS if solver == "nystrom" else {"pivot_seed": "count"}),
        lazy=("alpha",) if solver == "nystrom" else ("alpha", "X_train", "y_train"),
        private=frozenset({"y_train_mean", "y_train_std"}
                          | ({"L", "P", "b", "yty", *SPARSE_SCALARS}
                             if solver == "nystrom" else {"pivot_seed"})))
        for solver in SOLVERS[1:]})
