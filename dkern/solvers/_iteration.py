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

Rounding in ``A`` bounds the true residual from below (Falkon with an
ill-conditioned ``K_mm``, float32 products). A column *stalls* there, and stops
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
import dask.array as da
import numpy as np

from .._failures import worker_failures
from ..errors import DkernError, NotPositiveDefiniteError
from .checkpoint import Checkpoint, decode

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
#: The vectors a checkpoint holds: iterate, residual, direction and ``S = A P``.
_VECTORS = ("X", "R", "P", "S")


class Coefficients(NamedTuple):
    """The recurrence of a preconditioned CG run, which is Lanczos' (Saad 2003, §6.7.3):
    per column, the first ``γ₀ = r₀ᵀ M r₀`` and each step's ``α`` and ``β`` (0 where the
    column did not move) give the tridiagonal ``T`` of ``M^{1/2} A M^{1/2}`` from
    ``M^{1/2} r₀`` (:func:`dkern.solvers.slq.lanczos_tridiagonal`)."""

    gamma0: np.ndarray  # (t,)
    alpha: np.ndarray  # (k, t)
    beta: np.ndarray  # (k, t); beta[i] formed direction i from direction i - 1


class LoopResult(NamedTuple):
    x: Vectors
    n_iter: int
    residuals: np.ndarray
    converged: np.ndarray
    stalled: np.ndarray  # (t,): stopped at the attainable accuracy, above tol
    coefficients: Coefficients | None = None  # None after resuming from a checkpoint


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
    return _dots([(a, b)])[0]


def _dots(pairs: list[tuple[Vectors, Vectors]]) -> list[Vectors]:
    """Column-wise float64 inner products of several pairs of (n, t) vectors, each (t,).

    With dask vectors all of them come from one blockwise pass over the row chunks and one
    tree sum: an iteration's graph (client-side construction and scheduler tasks) is then a
    few layers instead of a product and a reduction per inner product.
    """
    if not isinstance(pairs[0][0], da.Array):
        return [(a * b).sum(axis=0, dtype=np.float64) for a, b in pairs]
    total = _stacked_dots(pairs)
    return [total[k] for k in range(len(pairs))]


def _stacked_dots(pairs: list[tuple[da.Array, da.Array]]) -> da.Array:
    """The inner products of :func:`_dots` as one lazy (p, t) array (dask vectors)."""
    vectors = list({id(v): v for pair in pairs for v in pair}.values())
    where = {id(v): i for i, v in enumerate(vectors)}
    index = tuple((where[id(a)], where[id(b)]) for a, b in pairs)
    args = [x for v in vectors for x in (v, "ij")]
    partial = da.blockwise(_dots_block, "ipj", *args, index=index, new_axes={"p": len(pairs)},
                           adjust_chunks={"i": 1}, dtype=np.float64,
                           meta=np.empty((0, 0, 0)), token="dk-cg-dots")
    return partial.sum(axis=0)


def _dots_block(*blocks: np.ndarray, index: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The (1, p, t) partial inner products of one row chunk, summed as ``_dot`` would."""
    return np.stack([(blocks[a] * blocks[b]).sum(axis=0, dtype=np.float64)
                     for a, b in index])[None]


def _axpy(Y: Vectors, V: Vectors, a: np.ndarray, *, minus: bool = False) -> Vectors:
    """``Y + V a`` (``Y − V a`` with ``minus``) for a per-column (t,) a; shape (n, t).

    With dask vectors whose columns are one chunk: one blockwise layer, each block
    computed as dask's two elementwise layers compute it (the same floats), built without
    dask's metadata inference, which made most of a small solve's graph-building time.
    """
    if not (isinstance(Y, da.Array) and isinstance(V, da.Array)
            and len(Y.chunks[1]) == 1 and len(V.chunks[1]) == 1):
        return Y - V * a if minus else Y + V * a
    dtype = np.result_type(Y.dtype, V.dtype, a.dtype)
    return da.blockwise(_axpy_block, "ij", Y, "ij", V, "ij", a=a, minus=minus, dtype=dtype,
                        meta=np.empty((0, 0), dtype), token="dk-cg-axpy")


def _axpy_block(y: np.ndarray, v: np.ndarray, *, a: np.ndarray, minus: bool) -> np.ndarray:
    """One task: ``y ± v a`` for a block of rows."""
    return y - v * a if minus else y + v * a


def _check_finite(values: Scalars, k: int) -> None:
    for name, v in values._asdict().items():
        bad = ~np.isfinite(v)
        if bad.any():
            raise DkernError(
                f"CG iteration {k}: the inner product {name} is {v[bad][0]} for right-hand side "
                f"column {int(np.argmax(bad))}. The operator or preconditioner produced NaN/Inf "
                "(check the data, the kernel parameters and alpha); no solution is returned.")


def _check_preconditioner(gamma: np.ndarray, active: np.ndarray, k: int, name: str) -> None:
    """Raise unless ``γ = rᵀM r > 0`` on every active column (``r ≠ 0`` there).

    An indefinite M breaks CG's recurrences without any other sign: β = γ / γ_old
    and the step length stay finite, and the iterate goes wherever they lead.
    """
    bad = active & ~(gamma > 0)
    if bad.any():
        j = int(np.argmax(bad))
        raise NotPositiveDefiniteError(
            f"CG iteration {k}: rᵀMr = {gamma[j]:.3e} <= 0 for right-hand side column {j}, so "
            f"the preconditioner {name} is not positive definite and CG would return a wrong "
            "solution. Its apply(R) must be an SPD approximation of A⁻¹: fix it, or use "
            "JacobiPreconditioner / NystromPreconditioner, or no preconditioner.")


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


class _LoopState:
    """What block CG carries from one iteration to the next, and its step functions.

    Vectors (each (n, t), persisted): the iterate X, residual R, direction P and
    ``S = A P``. Per-column arrays (t,): ``gamma_old``, the activity of the last
    step, the stall flags and the relative residuals ``rel`` of the latest check.
    """

    def __init__(self, matvec: Callable[[Vectors], Vectors], B: Vectors, X: Vectors,
                 x0_given: bool, checkpoint: Checkpoint | None = None) -> None:
        self.matvec, self.B, self.checkpoint = matvec, B, checkpoint
        (bnorm,) = dask.compute(np.sqrt(_dot(B, B)))
        self.bnorm = np.where(bnorm > 0, bnorm, 1.0)  # a zero column is solved by x = 0 at once
        saved = checkpoint.load() if checkpoint is not None else None
        if saved is None:
            R = B - matvec(X) if x0_given else B
            self.X, self.R = dask.persist(X, R)
        self.P: Vectors = None
        self.S: Vectors = None
        self.gamma_old = np.ones_like(self.bnorm)
        self.was_active = np.zeros(self.bnorm.shape, dtype=bool)
        self.stalled = np.zeros(self.bnorm.shape, dtype=bool)
        self.last_failed = np.full(self.bnorm.shape, np.inf)  # true residual at last failed check
        self.rel = np.full(self.bnorm.shape, np.inf)
        self.replaced: list[tuple[int, np.ndarray]] = []  # (iteration, true residual)
        self.history: list[np.ndarray] = []
        # (α, β) of each step and the first γ: not checkpointed, so gone after a resume
        self.steps: list[tuple[np.ndarray, np.ndarray]] | None = [] if saved is None else None
        self.gamma0 = np.zeros_like(self.bnorm)
        self.k, self.since_refresh = 0, 0
        self.is_true, self.verify, self.replacing = True, False, False
        if saved is not None:
            self._restore(saved)

    def _state(self) -> dict[str, Any]:
        """Everything but the vectors that the next iteration reads (see checkpoint)."""
        return {"iteration": self.k, "since_refresh": self.since_refresh,
                "flags": [self.is_true, self.verify, self.replacing],
                "gamma_old": self.gamma_old, "was_active": self.was_active,
                "stalled": self.stalled, "last_failed": self.last_failed, "rel": self.rel,
                "replaced": self.replaced}

    def _restore(self, meta: dict[str, Any]) -> None:
        assert self.checkpoint is not None
        for name, value in self.checkpoint.vectors(meta["arrays"], self.B).items():
            setattr(self, name, value)
        state = decode(meta, list(self._state()))
        self.k, self.since_refresh = state["iteration"], state["since_refresh"]
        self.is_true, self.verify, self.replacing = state["flags"]
        # A saved R is never taken as the true residual: a stop then waits for B − A X
        # computed from the saved X. Checkpoints are saved after a step, where it is not
        # true anyway, so an honest resume takes the same steps; one whose R does not
        # belong to its X (edited, or a finished solve's marked unfinished) no longer ends
        # "converged" on it: the true residual's jump reads as a stall, which warns.
        self.is_true = False
        self.gamma_old, self.was_active = state["gamma_old"], state["was_active"]
        self.stalled, self.last_failed = state["stalled"], state["last_failed"]
        self.rel, self.replaced = state["rel"], [(int(i), r) for i, r in state["replaced"]]
        self.history = list(self.checkpoint.history())

    def save(self) -> None:
        """Checkpoint the state, and go on from the vectors read back (cuts the lineage)."""
        assert self.checkpoint is not None
        self.checkpoint.save({name: getattr(self, name) for name in _VECTORS},
                             np.vstack(self.history), self._state())
        for name, value in self.checkpoint.vectors(list(_VECTORS), self.B).items():
            setattr(self, name, value)

    def replace_residual(self) -> None:
        """Residual replacement: R = B − A X, before this step's matvecs."""
        # s = A p is recursive too (s' = w + βs) and drifts like r: refresh both
        self.R, self.S = dask.persist(self.B - self.matvec(self.X),
                                      self.matvec(self.P) if self.P is not None else None)
        self.is_true, self.since_refresh, self.replacing = True, 0, True

    def confirm(self) -> None:
        """The recursive residual says stop: replace it by the true one, checked next."""
        (self.R,) = dask.persist(self.B - self.matvec(self.X))
        self.is_true, self.since_refresh, self.verify = True, 0, True

    def check_true(self, tol: float, max_iter: int) -> bool:
        """Judge the refreshed residual alone; True when the loop is to stop."""
        (rho,) = dask.compute(_dot(self.R, self.R))
        _check_finite(Scalars(*[rho] * 6), self.k)
        recursive, self.rel = self.rel, np.sqrt(rho) / self.bnorm
        self.history[self.k:] = [self.rel]
        failed = self.rel > tol
        self.stalled |= failed & ((self.rel > STALL_GAP * recursive)
                                  | (self.rel > STALL_GAIN * self.last_failed))
        self.last_failed = np.where(failed, self.rel, np.inf)
        self.verify = False
        return not (failed & ~self.stalled).any() or self.k >= max_iter

    def scalars(self, U: Vectors, W: Vectors) -> Scalars:
        """Every inner product of the iteration, in one ``dask.compute``."""
        R, P, S = self.R, self.P, self.S
        pairs = [(R, R), (R, U), (U, W)] + ([(U, S), (P, S), (R, P)] if P is not None else [])
        if isinstance(R, da.Array):  # one (p, t) array: no graph layer per inner product
            (stacked,) = dask.compute(_stacked_dots(pairs))
            values = list(stacked)
        else:
            values = _dots(pairs)
        values += [0 * self.bnorm] * (6 - len(pairs))
        s = Scalars(*(np.asarray(v, dtype=np.float64) for v in values))
        _check_finite(s, self.k)
        return s

    def judge(self, rho: np.ndarray, tol: float) -> np.ndarray:
        """Record the residuals ``√ρ / ‖b‖`` and return the columns still active."""
        self.rel = np.sqrt(np.maximum(rho, 0.0)) / self.bnorm
        self.history[self.k:] = [self.rel]
        if self.replacing:
            self.stalled |= (self.rel > tol) & _no_gain_since(
                self.replaced, self.k - STALL_WINDOW, self.rel)
            self.replaced.append((self.k, self.rel))
            self.replacing = False
        return (self.rel > tol) & ~self.stalled

    def step(self, s: Scalars, U: Vectors, W: Vectors, active: np.ndarray) -> None:
        """New direction ``p' = u + βp``, ``s' = w + βs`` and the step along it."""
        beta, pAp = _direction_step(s, self.gamma_old, ~self.was_active, active)
        dtype = self.R.dtype
        P = U if self.P is None else _axpy(U, self.P, beta.astype(dtype))
        S = W if self.S is None else _axpy(W, self.S, beta.astype(dtype))
        if (active & (pAp <= TRUST[np.dtype(dtype)] * s.delta)).any():
            # the fused p'ᵀAp' cancelled below the vectors' precision: take it directly
            P, S = dask.persist(P, S)
            (pAp,) = dask.compute(_dot(P, S))
        alpha = _step_length(s.gamma + beta * s.rp, pAp, active, self.k).astype(dtype)
        if self.steps is not None:
            if self.k == 0:
                self.gamma0 = s.gamma.copy()
            self.steps.append((alpha.astype(np.float64), beta))
        X, R = _axpy(self.X, P, alpha), _axpy(self.R, S, alpha, minus=True)
        self.X, self.R, self.P, self.S = dask.persist(X, R, P, S)
        self.gamma_old = np.where(active, s.gamma, self.gamma_old)
        self.was_active = active
        self.k, self.since_refresh, self.is_true = self.k + 1, self.since_refresh + 1, False

    def result(self, tol: float) -> LoopResult:
        if self.checkpoint is not None:
            self.checkpoint.complete(np.vstack(self.history), self._state())
        last = self.history[-1]
        coefficients = None
        if self.steps is not None:
            t = len(self.bnorm)
            alpha, beta = (np.array([step[i] for step in self.steps]).reshape(-1, t)
                           for i in (0, 1))
            coefficients = Coefficients(self.gamma0, alpha, beta)
        return LoopResult(self.X, self.k, np.vstack(self.history), last <= tol,
                          self.stalled & (last > tol), coefficients)


@worker_failures()  # a block that kills its workers is named, not a bare KilledWorker
def block_cg_loop(matvec: Callable[[Vectors], Vectors], precond: Callable[[Vectors], Vectors],
                  B: Vectors, X: Vectors, *, x0_given: bool, tol: float, max_iter: int,
                  refresh_every: int,
                  callback: Callable[[int, np.ndarray], None] | None = None,
                  progress: Any = None, precond_name: str = "",
                  checkpoint: Checkpoint | None = None) -> LoopResult:
    """Run block PCG from X on ``A X = B``; see the module docstring for the algorithm.

    B is persisted first: the residual refreshes re-read it, and a B read from a
    store would otherwise be read (and verified) again at each. ``precond_name``
    names the preconditioner in the error raised when ``rᵀMr <= 0``. With a
    ``checkpoint``, the loop resumes from its saved state (X is then unused) and
    saves its state every ``checkpoint.every`` iterations.
    """
    (B,) = dask.persist(B)
    st = _LoopState(matvec, B, X, x0_given, checkpoint)
    while True:
        # the iteration number reaches the scheduler's task annotations (the dashboard)
        with dask.annotate(dkern_iteration=st.k):
            if st.since_refresh >= refresh_every:
                st.replace_residual()
            if st.verify and st.check_true(tol, max_iter):
                break
            U = precond(st.R)
            U, W = dask.persist(U, matvec(U))
            s = st.scalars(U, W)
            active = st.judge(s.rho, tol)
            _check_preconditioner(s.gamma, active, st.k, precond_name or "in use")
            _report(st.k, st.rel, active, callback, progress)
            if not active.any() or st.k >= max_iter:
                if st.is_true:
                    break
                st.confirm()
                continue
            st.step(s, U, W, active)
            if checkpoint is not None and checkpoint.due(st.k):
                st.save()
    return st.result(tol)


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
        progress.update(k, float(rel.max()))
    logger.debug("CG iteration %d: max relative residual %.3e, %d of %d columns active",
                 k, rel.max(), active.sum(), active.size)


class SolveProgress:
    """A tqdm bar (a widget in Jupyter) of an iterative solve: the iterations done and the
    largest relative residual against ``tol``. It has no total: a solve stops at ``tol``,
    usually long before ``max_iter``, so a percentage or an ETA to ``max_iter`` would
    mislead, and a converged solve would end as a bar cut short (red in Jupyter)."""

    def __init__(self, desc: str, tol: float) -> None:
        from tqdm.auto import tqdm

        self.tol = tol
        self.bar = tqdm(total=None, desc=desc, unit="it")

    def update(self, k: int, residual: float) -> None:
        """Iteration ``k`` done, its largest relative residual ``residual``."""
        self.bar.n = k
        self.bar.set_postfix_str(f"residual={residual:.2e}, tol={self.tol:.0e}")

    def close(self) -> None:
        self.bar.close()
