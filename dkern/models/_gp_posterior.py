"""The posterior a :class:`~dkern.models.GaussianProcessRegressor` solves ``C a = t`` with:
fitted (dense Cholesky or preconditioned CG), and rebuilt from a model file's state
(exact, CG or the sparse GP's SGPR statistics) as the fit left it.

The posterior that answers the variance beside it is
:func:`dkern.models.posteriors.variance_posterior`'s; the sparse GP's is fitted with its
hyperparameters (:func:`._gp_sparse_learning.learned_sparse_posterior`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import Kernel
from ..solvers import EXACT_MAX_N
from ._validation import in_memory
from .posteriors import CGPosterior, ExactPosterior, SparsePosterior
from .posteriors.exact import log_marginal_likelihood

#: The SGPR statistics' arrays in a sparse model's file, under the posterior's names.
SPARSE_ARRAYS = ("L", "P", "b", "yty")


@dataclass(frozen=True)
class Solved:
    """``C a = t`` solved: the posterior, the iterations it took, and ``ln p(t | θ)``."""

    posterior: ExactPosterior | CGPosterior
    n_iter: int
    converged: bool
    log_marginal_likelihood: float


def solve(solver: str, kernel: Kernel, X: Any, y: Any, alpha: float, *, lml: float,
          rank: int, pivot_seed: int, tol: float, backend: str, **cg_options: Any) -> Solved:
    """``C a = t`` by Cholesky (``"exact"``) or CG (``"cg"``, with ``cg_options``: progress,
    callback, checkpoint, checkpoint_every); ``lml`` if known, else the exact ``ln p(t | θ)``
    where it is cheap (from the Cholesky factor) or n <= ``EXACT_MAX_N``, else NaN."""
    n = X.shape[0]
    if solver == "exact":
        posterior = ExactPosterior.fit(kernel, X, in_memory(y), alpha, backend=backend)
        if np.isnan(lml):  # free from this factor
            lml = posterior.log_marginal_likelihood(in_memory(y).reshape(n, -1))
        return Solved(posterior, 1, True, lml)
    cg_posterior, result = CGPosterior.fit(kernel, X, y, alpha=alpha, rank=rank,
                                           pivot_seed=pivot_seed, tol=tol, backend=backend,
                                           **cg_options)
    if np.isnan(lml) and n <= EXACT_MAX_N:
        lml = log_marginal_likelihood(kernel, in_memory(X), in_memory(y).reshape(n, -1),
                                      alpha, False)[0]
    return Solved(cg_posterior, result.n_iter, bool(result.converged.all()), lml)


def sparse_file_state(posterior: Any, scalars: Any) -> dict[str, Any]:
    """The SGPR statistics of ``posterior`` (a :class:`SparsePosterior`) by their file
    names (``scalars``: the ``sgpr_*`` names of the scalars)."""
    stats = posterior.state()
    return {**{name: stats[name] for name in SPARSE_ARRAYS},
            **{name: stats[name[len("sgpr_"):]] for name in scalars}}


def rebuilt(solver: str, kernel: Kernel, state: dict[str, Any], scalars: Any, *, alpha: float,
            rank: int, tol: float, backend: str) -> ExactPosterior | CGPosterior | SparsePosterior:
    """The solver's posterior from a model file's ``state`` (by file names); the CG
    preconditioner is rebuilt on first use from the same pivots (``pivot_seed``)."""
    if solver == "nystrom":
        posterior = SparsePosterior.from_state({
            "kernel": kernel, "centers": state["centers"], "alpha": alpha,
            **{name: state[name] for name in SPARSE_ARRAYS},
            **{name[len("sgpr_"):]: state[name] for name in scalars}})
        posterior.backend = backend  # how to compute, not part of the file's state
        return posterior
    if solver == "exact":
        return ExactPosterior(kernel, np.asarray(state["X_train"]), np.asarray(state["alpha"]),
                              state["L"], backend=backend)
    return CGPosterior(kernel, state["X_train"], state["alpha"], alpha=alpha, rank=rank,
                       pivot_seed=state["pivot_seed"], tol=tol, backend=backend)
