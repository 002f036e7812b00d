"""Kernelised gradient descent: the representer-theorem learner, on the lazy Gram operator.

For a loss ``(1/n) Σ ℓ(f(xᵢ), yᵢ) + (λ/2) ‖f‖²`` over the RKHS, the functional gradient at
``f = Σⱼ βⱼ k(·, xⱼ)`` is again a combination of the ``k(·, xᵢ)``, so gradient descent
never leaves their span and moves the coefficients only:

.. math:: \\beta \\leftarrow \\beta + \\frac{\\eta}{n}\\, r(\\beta), \\qquad
          r(\\beta) = -n \\times (\\text{the gradient's coefficients}),

e.g. ``r = y − (K + αI)β`` for squared loss with ``α = nλ``: the functional gradient
step ``β ← β + (η/n)(y − Kβ)`` of Yao, Rosasco & Caponnetto (2007), with the ridge term.
:func:`descend` runs ``x ← x + τ r(x)`` (``τ = η/n``)
for any residual map ``r``; :func:`gd` is the linear case, where the fixed point is the
solution of ``A x = b`` and ``τ = 1 / λ_max(A)`` comes from a few Lanczos steps
(:func:`top_eigenvalue`).

Vectors stay on the cluster, persisted each iteration (so an iteration's graph starts
from persisted chunks and does not grow); one iteration is one ``r(x)`` (one Gram
matvec) and one ``dask.compute`` of the column norms.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..errors import ConvergenceWarning, DkernError
from ._checks import integer, positive_number, square_operator
from ._iteration import SolveProgress, _dot
from .cg import LinearOperator, _as_vectors
from .checkpoint import CHECKPOINT_EVERY, Checkpoint, decode
from .lanczos import lanczos_decomposition

logger = logging.getLogger(__name__)

#: Lanczos steps behind the step size: the top Ritz value of a kernel matrix converges
#: within a few steps (its top eigenvalue is well separated), and 20 cost 20 matvecs.
LANCZOS_STEPS = 20
#: Default iteration cap of :func:`gd`: gradient descent needs about κ ln(1/tol)
#: iterations (κ = λ_max / λ_min), many more than CG's √κ ln(2/tol).
GD_MAX_ITER = 10_000

Residual = Callable[[da.Array], da.Array]


@dataclass(frozen=True)
class GDResult:
    """The outcome of :func:`gd` or :func:`descend`.

    Attributes
    ----------
    x : dask.array.Array of shape (n,) or (n, t)
        The last iterate, persisted on the cluster (shaped like B for :func:`gd`).
    n_iter : int
        Steps taken.
    residuals : ndarray of shape (n_iter + 1, t)
        ``‖r(x_k)‖ / ‖r(x_0)‖`` per step and column, each from ``r`` itself (no recursion).
    converged : ndarray of bool, shape (t,)
        Whether each column reached ``tol``.
    step : float
        τ, the step ``x ← x + τ r(x)`` (for :func:`gd` by default ``1 / λ̂``, λ̂ the
        estimate of ``λ_max(A)``).
    """

    x: da.Array
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray
    step: float


def top_eigenvalue(A: LinearOperator, *, steps: int = LANCZOS_STEPS,
                   random_state: Any = None) -> float:
    """An upper estimate of ``λ_max(A)`` for a symmetric positive definite lazy operator.

    ``steps`` Lanczos steps from a random start (drawn on the cluster) give the top Ritz
    pair ``(θ, z)``, ``‖z‖ = 1``; one more matvec gives ``ρ = ‖A z − θ z‖``, and A has an
    eigenvalue in ``[θ − ρ, θ + ρ]``. ``θ ≤ λ_max`` always; ``θ + ρ`` is returned (an
    upper bound once the Ritz value has found the top eigenvalue, as it does within a few
    steps for kernel matrices). Logged at INFO.

    Parameters
    ----------
    A : Operator, e.g. ``dkern.gram(kernel, X) + alpha``
    steps : int, default=LANCZOS_STEPS (20)
        Lanczos steps, capped at n.
    random_state : int or numpy Generator, optional
        Seeds the start vector.

    Returns
    -------
    float
    """
    n = square_operator(A, "alpha")
    steps = min(integer(steps, "steps"), n)
    seed = int(np.random.default_rng(random_state).integers(2**31 - 1))
    chunks = getattr(A, "col_chunks", None) or "auto"
    start = da.random.RandomState(seed).standard_normal(n, chunks=(chunks,))
    lz = lanczos_decomposition(A, start, steps)
    theta, vecs = np.linalg.eigh(lz.H)
    z = lz.V @ da.from_array(vecs[:, -1:])  # shape: (n, 1), unit norm
    (rho,) = dask.compute(da.sqrt(((A.matvec(z) - theta[-1] * z) ** 2).sum()))
    logger.info("top eigenvalue: %d Lanczos steps give θ = %.6g with residual %.2e",
                lz.rank, theta[-1], rho)
    return float(theta[-1] + rho)


def gd(A: LinearOperator, B: Any, *, step: float | None = None, tol: float = 1e-6,
       max_iter: int | None = None, callback: Callable[[int, np.ndarray], None] | None = None,
       progress: bool = False, random_state: Any = None,
       checkpoint: str | os.PathLike[str] | None = None,
       checkpoint_every: int = CHECKPOINT_EVERY) -> GDResult:
    """Solve ``A X = B`` (A symmetric positive definite) by gradient descent.

    .. math:: x \\leftarrow x + \\tau\\,(b - A x), \\qquad \\tau = 1 / \\lambda_{\\max}(A)

    is gradient descent on ``½ xᵀAx − bᵀx`` with the ``1/L`` step of an L-smooth
    objective (for ``A = K + αI``, gradient descent on the KRR objective in the RKHS:
    Yao, Rosasco & Caponnetto's (2007) ``β ← β + (η/n)(y − (K + αI)β)`` with
    ``η = n τ``). Each column's
    residual falls by at least ``1 − λ_min/λ_max`` per step, and the step stays
    convergent if the estimate of ``λ_max`` is low by less than a factor 2. Start at 0.

    Parameters
    ----------
    A : Operator or object with ``shape``, ``dtype`` and ``matvec``
        E.g. ``dkern.gram(kernel, X) + alpha``.
    B : array-like of shape (n,) or (n, t)
        numpy or dask; persisted on the cluster.
    step : float, optional
        τ; by default ``1 / top_eigenvalue(A)``.
    tol : float, default=1e-6
        Each column stops when ``‖b − A x‖ ≤ tol ‖b‖``.
    max_iter : int, optional
        Default ``GD_MAX_ITER`` (10 000).
    callback : callable, optional
        ``callback(iteration, relative_residuals)`` on the client, (t,) array.
    progress : bool, default=False
        Show a tqdm bar.
    random_state : int or numpy Generator, optional
        Seeds the Lanczos start of the step-size estimate.
    checkpoint : str or os.PathLike, optional
        A folder or fsspec URL where the iterate is saved every ``checkpoint_every``
        iterations; calling ``gd`` again on the same problem resumes there (with the
        saved step, no new estimate) and ends bitwise equal to an uninterrupted solve
        (see :func:`dkern.solvers.cg`).
    checkpoint_every : int, default=CHECKPOINT_EVERY (50)

    Returns
    -------
    GDResult
    """
    square_operator(A, "alpha")
    Bd, one_column = _as_vectors(A, B, "B")
    (Bd,) = dask.persist(Bd)
    tol = positive_number(tol, "tol", ", e.g. 1e-6")

    def estimate() -> float:
        lam = top_eigenvalue(A, random_state=random_state)
        logger.info("gd: step τ = 1/λ_max = %.6g (λ_max(A) ≈ %.6g)", 1 / lam, lam)
        return 1.0 / lam

    saved = None if checkpoint is None else Checkpoint(
        checkpoint, checkpoint_every, {"data": Bd.name, "operator": A.matvec(Bd).name,
                                       "settings": tokenize(tol, step, Bd.chunks, str(Bd.dtype))},
        "gd")
    out = descend(lambda X: Bd - A.matvec(X), da.zeros_like(Bd),
                  step=estimate if step is None else step, tol=tol, max_iter=max_iter,
                  callback=callback, progress=progress, checkpoint=saved)
    x = out.x[:, 0] if one_column else out.x
    return GDResult(x, out.n_iter, out.residuals, out.converged, out.step)


def descend(residual: Residual, X0: da.Array, *, step: float | Callable[[], float],
            tol: float = 1e-6, max_iter: int | None = None,
            callback: Callable[[int, np.ndarray], None] | None = None, progress: bool = False,
            name: str = "gd", checkpoint: Checkpoint | None = None) -> GDResult:
    """Run ``x ← x + τ r(x)`` column by column until ``‖r(x)‖ ≤ tol ‖r(x₀)‖``.

    Parameters
    ----------
    residual : callable
        ``r(X)``: a lazy dask (n, t) array from a dask (n, t) array, minus the gradient
        (up to a positive factor) of a smooth objective.
    X0 : dask.array.Array of shape (n, t)
        Start.
    step : float or callable
        τ > 0, or a function returning it (not called when resuming from a checkpoint,
        which holds the step it was saved with).
    tol, max_iter, callback, progress
        As for :func:`gd`; a converged column stops moving.
    name : str
        Names the solver in messages and the log.
    checkpoint : Checkpoint, optional
        Saves ``X`` every ``checkpoint.every`` iterations and resumes from it.

    Returns
    -------
    GDResult
    """
    tol = positive_number(tol, "tol", ", e.g. 1e-6")
    max_iter = GD_MAX_ITER if max_iter is None else integer(max_iter, "max_iter")
    X, history, norm0, k, step = _start(X0, step, checkpoint)
    bar = SolveProgress(f"dkern {name}", tol) if progress else None
    try:
        while True:
            with dask.annotate(dkern_iteration=k):
                X, R = dask.persist(X, residual(X))
                (rho,) = dask.compute(_dot(R, R))
            rel, norm0 = _relative(rho, norm0, k, name)
            history.append(rel)
            active = rel > tol
            _report(k, rel, callback, bar, name)
            if not active.any() or k >= max_iter:
                break
            X = X + R * (step * active).astype(R.dtype)
            k += 1
            if checkpoint is not None and checkpoint.due(k):
                X = _save(checkpoint, X, history, {"iteration": k, "step": step, "norm0": norm0})
    finally:
        if bar is not None:
            bar.close()
    residuals = np.vstack(history)
    if checkpoint is not None:
        checkpoint.complete(residuals, {"iteration": k, "step": step, "norm0": norm0})
    converged = residuals[-1] <= tol
    if not converged.all():
        warnings.warn(f"{name} stopped after {k} iterations with {int((~converged).sum())} of "
                      f"{converged.size} columns above tol={tol:g} (largest relative residual "
                      f"{residuals[-1].max():.2e}). Gradient descent needs about "
                      "κ·ln(1/tol) iterations: raise max_iter, loosen tol, or increase alpha.",
                      ConvergenceWarning, stacklevel=3)
    logger.info("%s: %d iterations, largest relative residual %.3e", name, k,
                residuals[-1].max())
    return GDResult(X, k, residuals, converged, step)


def _start(X0: da.Array, step: float | Callable[[], float],
           checkpoint: Checkpoint | None) -> tuple[da.Array, list[np.ndarray], Any, int, float]:
    """Iterate, residual history, ‖r(x₀)‖ (None: not known yet), iteration and step to
    start from: X0 and a fresh step, or the checkpoint's state."""
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is None:
        tau = step() if callable(step) else step
        return X0, [], None, 0, positive_number(tau, "step", " (the gradient step τ)")
    assert checkpoint is not None
    state = decode(saved, ["iteration", "step", "norm0"])
    X = checkpoint.vectors(["X"], X0)["X"]
    return X, list(checkpoint.history()), state["norm0"], state["iteration"], state["step"]


def _save(checkpoint: Checkpoint, X: da.Array, history: list[np.ndarray],
          state: dict[str, Any]) -> da.Array:
    """Save the iterate and go on from the copy read back (cuts the lineage)."""
    (X,) = dask.persist(X)
    checkpoint.save({"X": X}, np.vstack(history), state)
    return checkpoint.vectors(["X"], X)["X"]


def _relative(rho: np.ndarray, norm0: np.ndarray | None, k: int,
              name: str) -> tuple[np.ndarray, np.ndarray]:
    """``‖r‖ / ‖r(x₀)‖`` per column (a zero start residual counts as 1), and ‖r(x₀)‖."""
    bad = ~np.isfinite(rho)
    if bad.any():
        raise DkernError(f"{name} iteration {k}: the residual of column {int(np.argmax(bad))} is "
                         "NaN or infinite, so the iteration diverged or the data hold NaN/Inf. "
                         "Check the data and the kernel parameters; a step given by hand must "
                         "be below 2 / λ_max.")
    norm = np.sqrt(rho)
    if norm0 is None:
        norm0 = np.where(norm > 0, norm, 1.0)
    return norm / norm0, norm0


def _report(k: int, rel: np.ndarray, callback: Callable[[int, np.ndarray], None] | None,
            bar: Any, name: str) -> None:
    if callback is not None:
        callback(k, rel.copy())
    if bar is not None:
        bar.update(k, float(rel.max()))
    logger.debug("%s iteration %d: max relative residual %.3e", name, k, rel.max())
