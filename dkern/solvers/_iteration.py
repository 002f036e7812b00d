"""The block preconditioned CG loop, written once for dask and for numpy vectors.

One reduction per iteration: the loop is the single-synchronisation variant of
Chronopoulos & Gear (1989), "s-step iterative methods for symmetric linear
systems", §2. With ``u = M r`` and ``w = A u`` formed before any scalar is
known, every inner product of the iteration comes back from one
``dask.compute``:

* ``γ = rᵀu`` (so ``β = γ / γ_old``), ``ρ = rᵀr`` (the convergence test);
* ``δ = uᵀw``, ``ε = uᵀs`` and ``φ = pᵀs`` with ``s = A p`` of the previous
  direction, so the new direction ``p' = u + βp`` has
  ``p'ᵀAp' = δ + 2βε + β²φ`` exactly (no orthogonality assumed, so the
  identity survives residual replacement), and ``s' = w + βs`` needs no matvec.
  The step is the exact line search ``α = rᵀp' / p'ᵀAp'`` with
  ``rᵀp' = γ + β rᵀp`` (``ρ_p = rᵀp``, same reduction): it equals ``γ / p'ᵀAp'``
  while ``r ⊥ p``, and stays a descent step after residual replacement breaks that.
  When that sum cancels to below ``TRUST · δ`` (the terms' rounding would
  dominate it: ill-conditioned systems, float32 vectors) ``p'ᵀs'`` is computed
  directly in a second, rare reduction.

Each column has its own step: a column whose relative residual is below
``tol`` gets ``α = 0`` and stops moving. The recursive residual is replaced by
the true ``B − AX`` every ``refresh_every`` steps and before stopping
(van der Vorst & Ye 2000, "Residual replacement strategies"), so the history's
last row and the convergence flags are always true residuals.

Rounding in ``A`` bounds the true residual from below (Falkon at n = 10⁶ with
an ill-conditioned ``K_mm``: about 1e-6). A column *stalls* there, and stops
with ``converged = False``, when a check of its true residual fails tol and
either finds it over ``STALL_GAP`` times the recursive one (the updates fell
below rounding) or not ``STALL_GAIN`` times smaller than at its previous failed
check, or when a residual replacement finds it no smaller than at the
replacement at least ``STALL_WINDOW`` iterations before (the recursive residual
is stuck too). Without this a tol under the floor would run to ``max_iter``.

With dask vectors, ``persist`` keeps X, R, P, S on the cluster and the graph of
each iteration starts from persisted chunks, so it never grows; with numpy
vectors (Falkon's M-dimensional system) ``persist`` and ``compute`` pass them
through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import dask
import numpy as np

from ..errors import DkernError, NotPositiveDefiniteError

logger = logging.getLogger("dkern.solvers.cg")

#: The fused ``p'ᵀAp' = δ + 2βε + β²φ`` is trusted while it exceeds this fraction of δ;
#: below it (ill-conditioning, float32) one more reduction computes ``p'ᵀs'`` directly.
TRUST = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-2}

#: A failed true-residual check stalls a column when the true residual exceeds the
#: recursive one by this factor, or has not fallen by STALL_GAIN since the last failed check.
STALL_GAP, STALL_GAIN = 10.0, 0.5
#: ... or when a residual replacement finds no decrease over at least this many iterations.
STALL_WINDOW = 50

Vectors = Any  # dask.array.Array or numpy.ndarray of shape (n, t)


class LoopResult(NamedTuple):
    x: Vectors
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray
    stalled: np.ndarray  # (t,): stopped at the attainable accuracy, above tol


class Scalars(NamedTuple):
    """The inner products of one iteration, each of shape (t,), float64."""

    rho: np.ndarray  # rᵀr
    gamma: np.ndarray  # rᵀu
    delta: np.ndarray  # uᵀw
    eps: np.ndarray  # uᵀs_old
    phi: np.ndarray  # pᵀs_old
    rp: np.ndarray  # rᵀp_old


def _dot(a: Vectors, b: Vectors) -> Vectors:
    """Column-wise inner products in float64; shape (t,)."""
    return (a * b).sum(axis=0, dtype=np.float64)


def _check_finite(values: Scalars, k: int) -> None:
    for name, v in values._asdict().items():
        bad = ~np.isfinite(v)
        if bad.any():
            raise DkernError(
                f"CG iteration {k}: the inner product {name} is {v[bad][0]} for right-hand side "
                f"column {int(np.argmax(bad))}. The operator or preconditioner produced NaN/Inf "
                "(check the data, the kernel parameters and alpha); no solution is returned.")


def _direction_step(s: Scalars, gamma_old: np.ndarray, restart: np.ndarray,
                    active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """β per column (0 for ``restart`` and inactive columns) and the fused ``p'ᵀAp'``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.where(restart | ~active, 0.0, s.gamma / gamma_old)
    return beta, s.delta + 2.0 * beta * s.eps + beta * beta * s.phi  # module docstring


def _step_length(rp: np.ndarray, pAp: np.ndarray, active: np.ndarray, k: int) -> np.ndarray:
    """α = rᵀp' / p'ᵀAp' per column (0 for inactive ones); raise if p'ᵀAp' <= 0."""
    bad = active & ~(pAp > 0)
    if bad.any():
        j = int(np.argmax(bad))
        raise NotPositiveDefiniteError(
            f"CG iteration {k}: pᵀAp = {pAp[j]:.3e} <= 0 for column {j}, so the operator is "
            "not positive definite. Either the kernel is not positive semi-definite (check it "
            "with dkern.kernels.check_psd) or alpha is too small or negative: use alpha > 0 "
            "large enough to dominate rounding, e.g. 1e-6 times the largest kernel value.")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(active, rp / pAp, 0.0)


def block_cg_loop(matvec: Callable[[Vectors], Vectors], precond: Callable[[Vectors], Vectors],
                  B: Vectors, X: Vectors, *, x0_given: bool, tol: float, max_iter: int,
                  refresh_every: int,
                  callback: Callable[[int, np.ndarray], None] | None = None,
                  progress: Any = None) -> LoopResult:
    """Run block PCG from X on ``A X = B``; see the module docstring for the algorithm."""
    (bnorm,) = dask.compute(np.sqrt(_dot(B, B)))
    bnorm = np.where(bnorm > 0, bnorm, 1.0)  # a zero column is solved by x = 0 at once
    R = B - matvec(X) if x0_given else B
    X, R = dask.persist(X, R)
    P = S = None
    gamma_old = np.ones_like(bnorm)
    was_active = np.zeros(bnorm.shape, dtype=bool)
    stalled = np.zeros(bnorm.shape, dtype=bool)
    last_failed = np.full(bnorm.shape, np.inf)  # true residual at the column's last failed check
    rel = np.full(bnorm.shape, np.inf)  # relative residuals of the latest check
    replaced: list[tuple[int, np.ndarray]] = []  # (iteration, true residual) at replacements
    history: list[np.ndarray] = []
    k, since_refresh, is_true, verify, replacing = 0, 0, True, False, False
    while True:
        if since_refresh >= refresh_every:  # residual replacement, before this step's matvecs
            # s = A p is recursive too (s' = w + βs) and drifts like r: refresh both
            R, S = dask.persist(B - matvec(X), matvec(P) if P is not None else None)
            is_true, since_refresh, replacing = True, 0, True
        if verify:  # a refreshed residual after the recursive one said "stop": check it alone
            (rho,) = dask.compute(_dot(R, R))
            _check_finite(Scalars(*[rho] * 6), k)
            recursive, rel = rel, np.sqrt(rho) / bnorm
            history[k:] = [rel]
            failed = rel > tol
            stalled |= failed & ((rel > STALL_GAP * recursive) | (rel > STALL_GAIN * last_failed))
            last_failed = np.where(failed, rel, np.inf)
            active, verify = failed & ~stalled, False
            if not active.any() or k >= max_iter:
                break
        U = precond(R)
        W = matvec(U)
        U, W = dask.persist(U, W)
        lazy = [_dot(R, R), _dot(R, U), _dot(U, W)]
        lazy += [_dot(U, S), _dot(P, S), _dot(R, P)] if P is not None else [0 * bnorm] * 3
        s = Scalars(*(np.asarray(v, dtype=np.float64) for v in dask.compute(*lazy)))
        _check_finite(s, k)
        rel = np.sqrt(np.maximum(s.rho, 0.0)) / bnorm
        history[k:] = [rel]
        if replacing:
            stalled |= (rel > tol) & _no_gain_since(replaced, k - STALL_WINDOW, rel)
            replaced.append((k, rel))
            replacing = False
        active = (rel > tol) & ~stalled
        _report(k, rel, active, callback, progress)
        done = not active.any() or k >= max_iter
        if done and is_true:
            break
        if done:  # the recursive residual says stop: confirm with the true one B - A X
            (R,) = dask.persist(B - matvec(X))
            is_true, since_refresh, verify = True, 0, True
            continue
        beta, pAp = _direction_step(s, gamma_old, ~was_active, active)
        P = U if P is None else U + P * beta.astype(R.dtype)
        S = W if S is None else W + S * beta.astype(R.dtype)
        if (active & (pAp <= TRUST[np.dtype(R.dtype)] * s.delta)).any():
            # the fused p'ᵀAp' cancelled below the vectors' precision: take it directly
            P, S = dask.persist(P, S)
            (pAp,) = dask.compute(_dot(P, S))
        alpha = _step_length(s.gamma + beta * s.rp, pAp, active, k).astype(R.dtype)
        X, R = X + P * alpha, R - S * alpha
        X, R, P, S = dask.persist(X, R, P, S)
        gamma_old = np.where(active, s.gamma, gamma_old)
        was_active = active
        k, since_refresh, is_true = k + 1, since_refresh + 1, False
    last = history[-1]
    return LoopResult(X, k, np.vstack(history), last <= tol, stalled & (last > tol))


def _no_gain_since(replaced: list[tuple[int, np.ndarray]], k: int, rel: np.ndarray) -> np.ndarray:
    """Columns whose residual ``rel`` is no smaller than at the last replacement at or before k."""
    earlier = [r for i, r in replaced if i <= k]
    return rel >= earlier[-1] if earlier else np.zeros(rel.shape, dtype=bool)


def stall_advice(out: LoopResult) -> str:
    """A sentence for the ConvergenceWarning when columns stalled, else ``""``."""
    if not out.stalled.any():
        return ""
    floor = out.residuals[-1][out.stalled].max()
    return (f" The true residual stopped decreasing near {floor:.1e}: rounding in the operator "
            f"limits the attainable accuracy, so use tol >= {2 * floor:.0e} or a larger alpha.")


def _report(k: int, rel: np.ndarray, active: np.ndarray,
            callback: Callable[[int, np.ndarray], None] | None, progress: Any) -> None:
    """Tell the callback, the progress bar and the log about iteration k (scalars only)."""
    if callback is not None:
        callback(k, rel.copy())
    if progress is not None:
        progress.n = k
        progress.set_postfix(residual=f"{rel.max():.2e}", active=int(active.sum()))
    logger.debug("CG iteration %d: max relative residual %.3e, %d of %d columns active",
                 k, rel.max(), active.sum(), active.size)


def progress_bar(total: int, desc: str) -> Any:
    """A tqdm bar for an iterative solve: iteration, largest relative residual, elapsed."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="it")
