"""The one ``solver="auto"`` policy of the kernel models: never a less accurate model unasked.

Kernel ridge and the GP regressor both solve ``(K + alpha I) a = y``, the Laplace GP
classifier Newton systems of the same size; ``"auto"`` picks the
dense Cholesky up to ``EXACT_MAX_N`` rows, preconditioned CG above (the same solution, to
``tol``), and the Nyström/sparse model only when its centres were asked for.
:func:`variance_posterior` says which posterior answers the GP's ``variance`` beside the
solver's weights.
"""

from __future__ import annotations

from typing import Any

from .cg import CGPosterior
from .lanczos import LanczosPosterior


def choose_solver(n: int, n_centers: int | None, *, exact_max_n: int) -> tuple[str, str]:
    """``"exact"``, ``"cg"`` or ``"nystrom"`` for n training rows, and why (for the log).

    Parameters
    ----------
    n : int
        Training rows.
    n_centers : int or None
        The estimator's ``n_centers``; given, it asks for ``"nystrom"``.
    exact_max_n : int
        The largest n the dense solver takes (``dkern.solvers.EXACT_MAX_N``).
    """
    if n_centers is not None:
        return "nystrom", f"n_centers={n_centers} was given"
    if n <= exact_max_n:
        return "exact", f"n={n} <= EXACT_MAX_N={exact_max_n}: dense Cholesky"
    return "cg", f"n={n} > EXACT_MAX_N={exact_max_n}: preconditioned CG, the exact model to tol"


def check_solver_fits(solver: str, n: int, n_centers: int | None, *, exact_max_n: int,
                      instead: str = "solver='cg' or 'nystrom'") -> None:
    """Raise if ``solver`` cannot take n rows: a dense solve above ``exact_max_n``, or more
    centres than rows. ``instead`` names the solvers the message suggests."""
    if solver == "exact" and n > exact_max_n:
        raise ValueError(f"solver='exact' holds the dense n x n matrices of the system and its "
                         f"factor and allows n <= {exact_max_n}; got n={n}. Use {instead}.")
    if solver == "nystrom" and n_centers is not None and n_centers > n:
        raise ValueError(f"n_centers={n_centers} is more centres than the {n} training "
                         f"rows (centres are distinct rows of X); use n_centers <= {n}.")


def variance_posterior(solved: Any, variance: str, *, alpha: float, rank: int,
                       pivot_seed: Any, tol: float, y: Any, lanczos_rank: int) -> Any:
    """The posterior that answers ``variance``, beside ``solved``'s weights (its mean).

    ``"exact"`` / ``"nystrom"``: ``solved`` itself. ``"cg"``: ``solved`` if it is a CG
    posterior, else a CG posterior over the same weights. ``"lanczos"``: LOVE on top of
    that CG posterior (its operator and preconditioner), started from the targets y.
    """
    if variance in ("exact", "nystrom") or (variance == "cg" and isinstance(solved, CGPosterior)):
        return solved
    base = solved if isinstance(solved, CGPosterior) else CGPosterior(
        solved.kernel, solved.X, solved.weights, alpha=alpha, rank=rank,
        pivot_seed=pivot_seed, tol=tol, backend=solved.backend)
    return base if variance == "cg" else LanczosPosterior(base, y, lanczos_rank)
