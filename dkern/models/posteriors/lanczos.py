"""The LOVE posterior: variances from a Lanczos decomposition of ``C⁻¹`` (Pleiss et al. 2018).

On top of a :class:`~.cg.CGPosterior` (its operator, preconditioner and mean):
:func:`dkern.solvers.lanczos.lanczos_decomposition` gives an orthonormal basis V of the
r preconditioner columns and k Lanczos vectors, with ``H = Vᵀ C V = L Lᵀ`` and
``C⁻¹ ≈ V H⁻¹ Vᵀ ≼ C⁻¹``. With ``W = K(X*, X) V`` (one operator product, r + k columns)::

    var(x*) = k(x*, x*) - ||L⁻¹ W[x*]ᵀ||²,       cov = K(X*, X*) - (L⁻¹ Wᵀ)ᵀ (L⁻¹ Wᵀ),

both at least the exact posterior's (the covariance minus the exact one is positive
semi-definite, so it is PSD itself) and at most the prior's. The decomposition costs
k + r matvecs with C, once, on the first variance asked for; the mean stays the CG
posterior's ``K(X*, X) a``.

The error is small only once r + k covers the eigenvalues of K above alpha, so the
decomposition checks itself, once: the LOVE std at ``CHECK_ROWS`` training rows (drawn
by the pivot seed) against their exact std (dense Cholesky up to ``CHECK_DENSE_MAX_N``
rows, else one block-CG solve, exact to ``tol``). It aims at a relative error of
``LOVE_RTOL`` anywhere, so asks ``LOVE_RTOL / CHECK_MARGIN`` of those rows. At the
estimator's default ranks a larger error doubles r (new RPCholesky columns and Lanczos
steps), up to ``MAX_DOUBLINGS`` times; ranks a user chose are kept. An error still
above target is warned about (ConvergenceWarning) with its figure, and each choice is
logged. The check depends only on the model (rows, kernel, alpha, ranks and pivot
seed), not on the test points asked for: a model loaded from a file recomputes the
same basis.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import dask.array as da
import numpy as np
import scipy.linalg as sla

from ...backends.projections import residual_diag
from ...errors import (
    ConvergenceWarning,
    MemoryLimitError,
    NotPositiveDefiniteError,
    caller_stacklevel,
)
from ...operators import gram
from ...solvers import NystromPreconditioner
from ...solvers.exact import cholesky_factor
from ...solvers.lanczos import LanczosResult, lanczos_decomposition, lanczos_predict
from ...solvers.sampling import gather_rows
from .._validation import as_generator
from .cg import CGPosterior

logger = logging.getLogger(__name__)

#: The relative error of the LOVE std the check aims at, at any point.
LOVE_RTOL = 1e-2
#: Training rows whose LOVE std the check compares with their exact std (by CG: one
#: block solve with this many right-hand sides).
CHECK_ROWS = 32
#: The check asks ``LOVE_RTOL / CHECK_MARGIN`` of its rows: the largest error over 400
#: test points measured up to 3.1 times the largest of 32 random training rows (NYC
#: weather, n = 1,800, and ggplot2 diamonds, n = 2,000, at r = 300 to 600).
CHECK_MARGIN = 3
#: Up to this many training rows the check's reference is the dense Cholesky factor of
#: ``K + alpha I`` (128 MB at 4,000 rows); above, one block-CG solve (exact to ``tol``).
CHECK_DENSE_MAX_N = 4_000
#: Doublings of r the check may make (at the default ranks) before it warns.
MAX_DOUBLINGS = 2
#: ``GaussianProcessRegressor``'s defaults (``lanczos_rank``, ``preconditioner_rank``):
#: only a basis at these ranks is grown; ranks a user chose are kept, and warned about.
DEFAULT_RANKS = (100, 300)


class LanczosPosterior:
    """LOVE variances and covariances beside a CG posterior's mean.

    Parameters
    ----------
    base : CGPosterior
        Gives the mean, the operator ``C`` and the preconditioner whose span V starts from.
    y : ndarray or dask.array.Array of shape (n,) or (n, t)
        The targets: the first column starts the Lanczos steps.
    lanczos_rank : int
        k, the Lanczos steps (at most n − r).
    """

    def __init__(self, base: CGPosterior, y: Any, lanczos_rank: int) -> None:
        self.base, self.y, self.lanczos_rank = base, y, lanczos_rank
        self.decomposition: LanczosResult | None = None  # computed on first use

    @property
    def weights(self) -> Any:
        return self.base.weights

    def mean(self, Xt: Any) -> da.Array:
        """The CG posterior's ``K(Xt, X) a``, lazy."""
        return self.base.mean(Xt)

    def mean_and_variance(self, Xt: Any) -> tuple[Any, Any]:
        return self.mean(Xt), self.variance(Xt)

    def decomposed(self) -> LanczosResult:
        """``V`` and ``H`` of ``C``, computed once and checked (see the module docstring):
        on the CG preconditioner's columns, or on 2r or 4r columns when the default
        ranks missed the check's target."""
        if self.decomposition is None:
            self.decomposition = self._checked(self._decompose(self.base.preconditioner()))
        return self.decomposition

    def _decompose(self, pre: NystromPreconditioner) -> LanczosResult:
        """The decomposition on ``pre``'s factor columns and k Lanczos steps. At most
        n − r steps fit beside the r columns; when the factor spans all n rows (small n)
        its last column is left to one Lanczos step, so V spans everything and the
        variances are exact."""
        A = self.base.operator()
        n = A.shape[0]
        r = min(pre.factor.shape[1], n - 1)
        span = pre if r == pre.factor.shape[1] else _Span(pre.factor[:, :r])
        return lanczos_decomposition(A, _start(self.y, n), min(self.lanczos_rank, n - r),
                                     preconditioner=span)  # type: ignore[arg-type]

    def _checked(self, result: LanczosResult) -> LanczosResult:
        """``result``, or (at the default ranks) one on 2r or 4r preconditioner columns,
        whose std at the check's training rows is within ``LOVE_RTOL / CHECK_MARGIN`` of
        the exact one; else the last one tried, with a ConvergenceWarning giving its
        error."""
        n = self.base.X.shape[0]
        if result.rank >= n:  # V spans every row: the variances are exact
            return result
        error_of = self._std_error_check()
        error = error_of(result)
        if (self.lanczos_rank, self.base.rank) == DEFAULT_RANKS:
            result, error = self._grown(result, error, error_of)
        r, k = result.n_augmented, result.rank - result.n_augmented
        logger.info("LOVE check: r = %d, k = %d: largest relative std error %.2e at %d "
                    "training rows (target %.1e)", r, k, error, min(CHECK_ROWS, n),
                    LOVE_RTOL / CHECK_MARGIN)
        if error > LOVE_RTOL / CHECK_MARGIN:
            _warn_inaccurate(error, min(CHECK_ROWS, n), r, k)
        return result

    def _grown(self, result: LanczosResult, error: float,
               error_of: Callable[[LanczosResult], float]) -> tuple[LanczosResult, float]:
        """Double r (new RPCholesky columns from the pivot seed, new Lanczos steps) while
        the error is above target, at most ``MAX_DOUBLINGS`` times and r <= n."""
        base, n = self.base, self.base.X.shape[0]
        for _ in range(MAX_DOUBLINGS):
            if error <= LOVE_RTOL / CHECK_MARGIN or result.rank >= n:
                break
            rank = min(2 * result.n_augmented, n)
            logger.info("LOVE check: r = %d, k = %d: largest relative std error %.2e at %d "
                        "training rows (target %.1e): r -> %d", result.n_augmented,
                        result.rank - result.n_augmented, error, min(CHECK_ROWS, n),
                        LOVE_RTOL / CHECK_MARGIN, rank)
            try:
                pre = NystromPreconditioner(base.kernel, base.X, base.alpha, rank,
                                            pivots="rpcholesky",
                                            random_state=as_generator(base.pivot_seed),
                                            backend=base.backend)
            except MemoryLimitError as exc:
                logger.info("LOVE check: r not raised: %s", exc)
                break
            result = self._decompose(pre)
            error = 0.0 if result.rank >= n else error_of(result)
        return result, error

    def _std_error_check(self) -> Callable[[LanczosResult], float]:
        """The check: ``CHECK_ROWS`` training rows drawn by the pivot seed, their exact std
        (:func:`_exact_variance`), and a function giving a decomposition's largest
        relative std error there."""
        base = self.base
        n = base.X.shape[0]
        seed = int(base.pivot_seed) if isinstance(base.pivot_seed, Integral) else 0
        rows = np.sort(np.random.default_rng(seed).choice(n, min(CHECK_ROWS, n),
                                                          replace=False))
        Xs = (gather_rows(base.X, rows) if isinstance(base.X, da.Array)
              else np.asarray(base.X)[rows])
        want = np.sqrt(_exact_variance(base, Xs))
        # CG's variance is exact to about tol times the prior's: below sqrt(tol) times the
        # prior std a std is not resolved, so errors there are relative to that floor
        scale = np.maximum(want, np.sqrt(base.tol * np.asarray(base.kernel.diag(Xs))))
        cross = gram(base.kernel, Xs, base.X, backend=base.backend, dtype=np.float64)

        def error_of(result: LanczosResult) -> float:
            got = np.sqrt(lanczos_predict(result, cross)[1].compute())
            return float(np.max(np.abs(got - want) / scale))

        return error_of

    def variance(self, Xt: Any) -> Any:
        """Latent variances at Xt (m, d), in ``[exact, prior]``; (m,), dask for dask Xt."""
        base = self.base
        _, var = lanczos_predict(self.decomposed(), gram(base.kernel, Xt, base.X,
                                                         backend=base.backend,
                                                         dtype=np.float64))
        return var if isinstance(Xt, da.Array) else var.compute()

    def covariance(self, Xt: np.ndarray) -> np.ndarray:
        """Latent covariance at Xt (m, d); shape (m, m), symmetric, PSD up to rounding."""
        base, result = self.base, self.decomposed()
        cross = gram(base.kernel, Xt, base.X, backend=base.backend, dtype=np.float64)
        W = cross.matvec(result.V).astype(np.float64).compute()  # shape: (m, r + k)
        S = sla.solve_triangular(np.linalg.cholesky(result.H), W.T, lower=True)  # (r + k, m)
        cov = np.asarray(base.kernel(Xt), dtype=np.float64) - S.T @ S
        return (cov + cov.T) / 2

    def state(self) -> dict[str, Any]:
        """The CG posterior's state, the targets and k (the decomposition is recomputed)."""
        return {**self.base.state(), "y": self.y, "lanczos_rank": self.lanczos_rank}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LanczosPosterior:
        return cls(CGPosterior.from_state(state), state["y"], state["lanczos_rank"])

    def rebound(self) -> LanczosPosterior:
        """The same posterior without what is persisted on the cluster (for a new client)."""
        return self.from_state(self.state())


@dataclass(frozen=True)
class _Span:
    """Leading columns of a preconditioner's orthonormal factor, (n, r): all that
    ``lanczos_decomposition`` reads of its ``preconditioner`` argument."""

    factor: da.Array


def _exact_variance(base: CGPosterior, Xs: np.ndarray) -> np.ndarray:
    """Latent variances at Xs (s, d), >= 0: from the dense Cholesky factor of ``C`` up to
    ``CHECK_DENSE_MAX_N`` training rows, else (or if that factor fails) by one block-CG
    solve with the s columns ``K(X, Xs)``, exact to ``tol``; shape (s,)."""
    with warnings.catch_warnings():  # CG's rounding to negative variances: 0, silently here
        warnings.filterwarnings("ignore", "Predicted variances smaller than 0")
        if base.X.shape[0] <= CHECK_DENSE_MAX_N:
            X = np.asarray(base.X.compute() if isinstance(base.X, da.Array) else base.X,
                           dtype=np.float64)
            try:
                L = cholesky_factor(base.kernel, X, base.alpha)
            except NotPositiveDefiniteError:
                logger.info("LOVE check: K + alpha I has no dense Cholesky factor; by CG")
            else:  # Rasmussen & Williams (2006), Alg. 2.1 line 5
                cross = np.asarray(base.kernel(Xs, X), dtype=np.float64)  # shape: (s, n)
                return np.maximum(residual_diag(np.asarray(base.kernel.diag(Xs)), cross, L),
                                  0.0)
        return np.asarray(base.variance(Xs))


def _warn_inaccurate(error: float, rows: int, r: int, k: int) -> None:
    """The check's ConvergenceWarning: the error measured at ``rows`` training rows."""
    warnings.warn(
        f"variance='lanczos': the LOVE std is off by up to {error:.2e} (relative) at {rows} "
        f"training rows checked against exact variances, and other points by up to about "
        f"{CHECK_MARGIN} times that, with r = {r} preconditioner columns and k = {k} "
        f"Lanczos vectors; LOVE aims at {LOVE_RTOL:g}. It is accurate once r + k exceeds "
        "the number of eigenvalues of K above alpha: raise preconditioner_rank (and "
        "lanczos_rank), or use variance='cg' (exact to tol).", ConvergenceWarning,
        stacklevel=caller_stacklevel())


def _start(y: Any, n: int) -> Any:
    """The first target column; ones where it is all zero (e.g. constant normalised y):
    the variances do not depend on y, only the Krylov space the steps explore does."""
    b = y if y.ndim == 1 else y[:, 0]
    norm = float(da.linalg.norm(b).compute() if isinstance(b, da.Array) else np.linalg.norm(b))
    return b if norm > 0 else np.ones(n)



