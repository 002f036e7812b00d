"""Block conjugate gradient for SPD operators known only by their matvec.

The vectors (iterate, residual, direction) stay on the cluster as persisted
dask arrays; only per-column scalars come to the client, all of one iteration
in one ``dask.compute``. The loop itself is in :mod:`dkern.solvers._iteration`.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import dask.array as da
import numpy as np
from dask.base import tokenize

from ..errors import ConvergenceWarning
from ._checks import integer, positive_number, square_operator
from ._iteration import Coefficients, LoopResult, SolveProgress, block_cg_loop, stall_advice
from .checkpoint import CHECKPOINT_EVERY, Checkpoint

logger = logging.getLogger(__name__)

#: Steps between true-residual refreshes: float32's recursive residual drifts
#: away from the true one within a few dozen steps (benchmarks/RESULTS.md, "Solver notes").
REFRESH_EVERY = {np.dtype(np.float64): 50, np.dtype(np.float32): 10}


class LinearOperator(Protocol):
    """What ``cg`` needs of A: its shape, dtype and ``matvec`` on dask (n, t) arrays."""

    shape: tuple[int, int]
    dtype: Any

    def matvec(self, V: Any) -> da.Array: ...


class Preconditioner(Protocol):
    """An approximation of ``A⁻¹``: ``apply`` maps dask (n, t) to dask (n, t), lazily."""

    def apply(self, R: da.Array) -> da.Array: ...


@dataclass(frozen=True)
class CGResult:
    """The outcome of :func:`cg`.

    Attributes
    ----------
    x : dask.array.Array of shape (n,) or (n, t)
        The solution, persisted on the cluster (shaped like B).
    n_iter : int
        CG steps taken.
    residuals : ndarray of shape (n_iter + 1, t)
        Relative residuals ``||b - A x|| / ||b||`` per step and column; the last
        row is the true residual, recomputed from x.
    converged : ndarray of bool, shape (t,)
        Whether each column reached ``tol`` (judged on the true residual).
    coefficients : Coefficients or None
        The recurrence's ``γ₀``, ``α``, ``β`` per column: the Lanczos tridiagonal of the
        preconditioned operator (:mod:`dkern.solvers.slq`); None after a checkpoint resume.
    """

    x: da.Array
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray
    coefficients: Coefficients | None = None


def cg(A: LinearOperator, B: Any, *, x0: Any = None, preconditioner: Preconditioner | None = None,
       tol: float = 1e-6, max_iter: int | None = None,
       callback: Callable[[int, np.ndarray], None] | None = None,
       refresh_every: int | None = None, progress: bool = False,
       checkpoint: str | os.PathLike[str] | None = None,
       checkpoint_every: int = CHECKPOINT_EVERY) -> CGResult:
    """Solve ``A X = B`` for a symmetric positive definite operator by block CG.

    .. math:: A X = B, \\quad \\text{column } j \\text{ stops when }
              \\|b_j - A x_j\\| \\le \\mathrm{tol}\\, \\|b_j\\|

    Parameters
    ----------
    A : Operator or object with ``shape``, ``dtype`` and ``matvec``
        E.g. ``dkern.gram(kernel, X) + alpha`` (``(K + alpha I)``, the same
        ``alpha`` scikit-learn's ``KernelRidge`` adds to the diagonal).
    B : array-like of shape (n,) or (n, t)
        numpy or dask (e.g. read from Zarr); each column is a right-hand side with its own
        stopping test. It is persisted on the cluster at the start, so it is read once.
    x0 : array-like of shape like B, optional
        Starting guess; zero by default.
    preconditioner : object with ``apply(R)``, optional
        E.g. :class:`JacobiPreconditioner` or :class:`NystromPreconditioner`; ``apply``
        must be symmetric positive definite, which is checked as CG runs.
    tol : float, default=1e-6
        Relative residual each column must reach; > 0. A column whose true residual
        stops falling above tol (rounding in ``A`` sets a floor) stops there, unconverged,
        and the ConvergenceWarning names the tol it can reach.
    max_iter : int, optional
        At most this many steps; default ``10 n``, capped at 10 000.
    callback : callable, optional
        ``callback(iteration, relative_residuals)`` on the client, with an (t,) array.
    refresh_every : int, optional
        Steps between true-residual refreshes; default 50 (float64) or 10 (float32).
    progress : bool, default=False
        Show a tqdm bar with the iteration and the largest relative residual.
    checkpoint : str or os.PathLike, optional
        A folder or fsspec URL (seen by the client and every worker) where the solve
        saves its state every ``checkpoint_every`` iterations
        (:mod:`dkern.solvers.checkpoint`). Calling ``cg`` again on the same problem
        resumes from the last checkpoint (logged at INFO: "resumed from iteration N")
        and ends with the result of an uninterrupted solve, bitwise on the same
        chunking. A checkpoint of another problem is refused. When the solve ends it
        is marked complete and kept: the returned ``x`` is recomputed from it if a
        worker is lost; delete it with :func:`remove_checkpoint`.
    checkpoint_every : int, default=CHECKPOINT_EVERY (50)
        Iterations between checkpoints; each writes four (n, t) arrays. Checkpoints also
        keep the scheduler's task count flat over long solves.

    Returns
    -------
    CGResult
        ``x`` (persisted dask array), ``n_iter``, ``residuals`` (n_iter + 1, t), ``converged`` (t,).

    Raises
    ------
    NotPositiveDefiniteError
        When a direction has ``pᵀAp <= 0`` (A is not positive definite), or a residual
        has ``rᵀ M r <= 0`` (the preconditioner M is not positive definite).
    DkernError
        When an inner product becomes NaN or infinite.
    """
    n = square_operator(A, "alpha")
    dtype = np.dtype(A.dtype)
    Bd, one_column = _as_vectors(A, B, "B")
    max_iter = min(10 * n, 10_000) if max_iter is None else integer(max_iter, "max_iter")
    refresh = REFRESH_EVERY.get(dtype, 50) if refresh_every is None else integer(
        refresh_every, "refresh_every")
    tol = positive_number(tol, "tol", ", e.g. 1e-6")
    X0 = da.zeros_like(Bd) if x0 is None else _as_vectors(A, x0, "x0", like=Bd)[0]
    apply = preconditioner.apply if preconditioner is not None else (lambda R: R)
    name = type(preconditioner).__name__ if preconditioner is not None else "(none)"
    saved = None if checkpoint is None else Checkpoint(
        checkpoint, checkpoint_every, _fingerprint(A, apply, Bd, X0, x0 is not None, tol,
                                                   refresh), "cg")
    bar = SolveProgress("dkern cg", tol) if progress else None
    try:
        out = block_cg_loop(A.matvec, apply, Bd, X0, x0_given=x0 is not None,
                            tol=float(tol), max_iter=max_iter, refresh_every=refresh,
                            callback=callback, progress=bar, precond_name=name,
                            checkpoint=saved)
    finally:
        if bar is not None:
            bar.close()
    _warn_if_not_converged(out, tol)
    logger.info("CG: %d iterations, largest relative residual %.3e", out.n_iter,
                out.residuals[-1].max())
    x = out.x[:, 0] if one_column else out.x
    return CGResult(x, out.n_iter, out.residuals, out.converged, out.coefficients)


def _fingerprint(A: Any, apply: Callable[[da.Array], da.Array], B: da.Array, X0: da.Array,
                 x0_given: bool, tol: float, refresh: int) -> dict[str, str]:
    """What identifies the solve: dask names of B, of A B and of the preconditioner applied
    to B (the graphs are built, not computed), of x0, and the settings."""
    return {"data": B.name, "operator": A.matvec(B).name, "preconditioner": apply(B).name,
            "x0": X0.name if x0_given else "zero",
            "settings": tokenize(float(tol), refresh, B.chunks, str(B.dtype))}


def _as_vectors(A: Any, B: Any, name: str, like: da.Array | None = None) -> tuple[da.Array, bool]:
    """B as a dask (n, t) array of A's dtype, chunked like A's columns; and whether B was 1-D."""
    n = A.shape[0]
    Bn = B if isinstance(B, da.Array) else np.asarray(B)
    if Bn.ndim not in (1, 2) or Bn.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) or ({n}, t) to match A of shape "
                         f"{A.shape}; got shape {Bn.shape}.")
    if Bn.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold numbers (bool, integer or float); got dtype "
                        f"{Bn.dtype}. Convert it, e.g. {name}.astype(numpy.float64).")
    if like is not None and (Bn.reshape(n, -1).shape != like.shape):
        raise ValueError(f"{name} must have the shape of B, {like.shape}; got {Bn.shape}.")
    if not isinstance(Bn, da.Array) and not np.all(np.isfinite(Bn)):
        raise ValueError(f"{name} contains NaN or infinity; CG would return NaN. Clean the "
                         "right-hand side first.")
    B2 = Bn.reshape(n, -1).astype(A.dtype)
    chunks = (getattr(A, "col_chunks", None) or "auto", -1)
    Bd = B2.rechunk(chunks) if isinstance(B2, da.Array) else da.from_array(B2, chunks=chunks)
    if isinstance(Bn, da.Array):
        Bd = da.map_blocks(_finite_block, Bd, name, dtype=Bd.dtype, meta=Bd._meta)
    return Bd, Bn.ndim == 1


def _finite_block(block: np.ndarray, name: str) -> np.ndarray:
    """Pass a block of a dask right-hand side through, refusing NaN/Inf."""
    if not np.all(np.isfinite(block)):
        raise ValueError(f"{name} contains NaN or infinity; CG would return NaN. Clean the "
                         "right-hand side first.")
    return block


def _warn_if_not_converged(out: LoopResult, tol: float) -> None:
    if out.converged.all():
        return
    advice = stall_advice(out) or (
        " Raise max_iter, loosen tol, increase alpha (better conditioned system), or pass a "
        "preconditioner (NystromPreconditioner).")
    warnings.warn(
        f"CG stopped after {out.n_iter} iterations with {int((~out.converged).sum())} of "
        f"{out.converged.size} right-hand sides above tol={tol:g} (largest relative residual "
        f"{out.residuals[-1].max():.2e}).{advice}", ConvergenceWarning, stacklevel=3)
