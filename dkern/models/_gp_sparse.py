"""The sparse GP of ``solver="nystrom"``: Titsias' SGPR on M centres, over the solver layer.

The fit reads X in passes of :func:`dkern.solvers.sgpr.sgpr_statistics` (one pass:
M-sized sums) and, per optimizer step, :func:`~dkern.solvers.sgpr.sgpr_bound_gradient`
(one more pass). X is made a persisted dask array once per fit, so numpy input is
sent to the cluster once rather than with every evaluation; dask and Zarr input is
read from where it lives on each pass. Everything kept after the fit is M-sized.

With ``L = chol(K_uu)``, ``L_B = chol(I + P/s)`` and ``c = L_B⁻¹ b / s`` (the
statistics' notation), the predictive of one test block ``A = L⁻¹ K_u*`` is

    mean = K_*u w,  w = L⁻ᵀ L_B⁻ᵀ c,       cov = K_** − AᵀA + (L_B⁻¹A)ᵀ(L_B⁻¹A),

the SGPR posterior q(f*), positive semi-definite (the naive Nyström covariance is not).
"""

from __future__ import annotations

import logging
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ..errors import NotPositiveDefiniteError
from ..io import as_rows
from ..kernels import Kernel
from ..operators import data_rows
from ..solvers import select_centers
from ..solvers.sgpr import SGPRStatistics, sgpr_bound, sgpr_bound_gradient, sgpr_statistics

logger = logging.getLogger(__name__)

#: Jitters added to K_uu's diagonal (relative to the mean prior variance k(z, z)), tried in
#: turn: the smallest with which K_uu factors is used. A jitter ε shrinks Q_nn's
#: eigenvalues λ below ε to about λ²/ε: with all 300 rows of tests/test_gp_sparse.py's data
#: as centres, ε = 1e-6 moves the mean by 5e-4 (relative) from the exact GP's, 1e-10 by 1e-7.
SGPR_JITTERS = (1e-10, 1e-8, 1e-6, 1e-4)


def training_data(X: Any, y: Any) -> tuple[da.Array, da.Array]:
    """X (float64 rows) and y (n, t) as dask arrays with X's row chunks; numpy input
    persisted once, so every pass of the fit names its chunks instead of resending them."""
    Xd = data_rows(X, dtype=np.float64)
    Yd = as_rows(y, name="y", ndim=(1, 2), dtype=np.float64)
    Yd = Yd.reshape(Yd.shape[0], -1).rechunk((Xd.chunks[0], -1))
    if not isinstance(y, da.Array):
        (Yd,) = dask.persist(Yd)
    return Xd, Yd


def centers(X: da.Array, n_centers: int | None, rng: np.random.Generator) -> np.ndarray:
    """M distinct rows of X drawn uniformly (default M = round(√n), at most 10,000)."""
    return np.ascontiguousarray(select_centers(X, n_centers, random_state=rng))


class SparseBound:
    """``(kernel, eval_gradient) -> (F, ∂F/∂θ)``: the SGPR bound of a kernel on fixed centres.

    Each call costs one pass over X (two with the gradient). The statistics of the
    latest call are kept, so the fit does not read X again for the θ it ends at.
    """

    def __init__(self, X: da.Array, y: da.Array, Z: np.ndarray, alpha: float) -> None:
        self.X, self.y, self.Z, self.alpha = X, y, Z, alpha
        self._last: SGPRStatistics | None = None

    def statistics(self, kernel: Kernel) -> SGPRStatistics:
        """The statistics of ``kernel`` (reused from the latest call when it was the same)."""
        if self._last is not None and self._last.kernel == kernel:
            return self._last
        for jitter in SGPR_JITTERS[:-1]:
            try:  # K_uu is factored before X is read: a failed jitter costs no pass
                self._last = sgpr_statistics(kernel, self.X, self.y, self.Z, jitter=jitter)
                return self._last
            except NotPositiveDefiniteError:
                logger.debug("SGPR: K_uu does not factor with jitter %g; trying more", jitter)
        self._last = sgpr_statistics(kernel, self.X, self.y, self.Z, jitter=SGPR_JITTERS[-1])
        return self._last

    def __call__(self, kernel: Kernel, eval_gradient: bool) -> tuple[float, np.ndarray]:
        """The bound and (if asked) ``∂F/∂θ`` of ``kernel`` (σ² fixed); -inf where K_uu
        is not positive definite, so an optimizer steps away from such θ."""
        p = len(kernel.theta)
        try:
            stats = self.statistics(kernel)
            if not eval_gradient:
                return sgpr_bound(stats, self.alpha), np.zeros(p)
            value, grad = sgpr_bound_gradient(stats, self.X, self.y, self.alpha)
        except (NotPositiveDefiniteError, np.linalg.LinAlgError):
            return -np.inf, np.zeros(p)
        return value, grad[:p]  # the last entry, ∂F/∂log σ², is for a learnable noise


def noise_factor(stats: SGPRStatistics, s: float) -> tuple[np.ndarray, np.ndarray]:
    """``L_B = chol(I + P/s)`` (M, M) and ``c = L_B⁻¹ b / s`` (M, t)."""
    LB = np.linalg.cholesky(np.eye(len(stats.P)) + stats.P / s)
    return LB, sla.solve_triangular(LB, stats.b, lower=True) / s


def weights(stats: SGPRStatistics, s: float) -> np.ndarray:
    """``w = L⁻ᵀ L_B⁻ᵀ c`` with ``mean(x*) = k(x*, Z) w``; shape (M, t)."""
    LB, c = noise_factor(stats, s)
    inner = sla.solve_triangular(LB, c, lower=True, trans="T")
    return sla.solve_triangular(stats.L, inner, lower=True, trans="T")


def covariance(stats: SGPRStatistics, s: float, Xt: np.ndarray) -> np.ndarray:
    """Latent SGPR posterior covariance at Xt (m, d); shape (m, m), symmetric PSD."""
    LB, _ = noise_factor(stats, s)
    A = sla.solve_triangular(stats.L, np.asarray(stats.kernel(stats.centers, Xt),
                                                 dtype=np.float64), lower=True)
    AB = sla.solve_triangular(LB, A, lower=True)
    cov = np.asarray(stats.kernel(Xt), dtype=np.float64) - A.T @ A + AB.T @ AB
    return (cov + cov.T) / 2


def restore(kernel: Kernel, arrays: dict[str, np.ndarray], scalars: dict[str, Any]
            ) -> SGPRStatistics:
    """The statistics from a model file's arrays (centers, L, P, b, yty) and scalars."""
    return SGPRStatistics(kernel, arrays["centers"], arrays["L"], arrays["P"], arrays["b"],
                          arrays["yty"], float(scalars["sgpr_trace"]), int(scalars["sgpr_n"]),
                          float(scalars["sgpr_jitter"]))
