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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import scipy.linalg as sla

from ...operators import gram
from ...solvers.lanczos import LanczosResult, lanczos_decomposition, lanczos_predict
from .cg import CGPosterior


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
        """``V`` and ``H`` of ``C``, computed once. At most n − r steps fit beside the r
        factor columns; when the factor spans all n rows (small n) its last column is
        left to one Lanczos step, so V spans everything and the variances are exact."""
        if self.decomposition is None:
            A, pre = self.base.operator(), self.base.preconditioner()
            n = A.shape[0]
            r = min(pre.factor.shape[1], n - 1)
            span = pre if r == pre.factor.shape[1] else _Span(pre.factor[:, :r])
            self.decomposition = lanczos_decomposition(
                A, _start(self.y, n), min(self.lanczos_rank, n - r),
                preconditioner=span)  # type: ignore[arg-type]
        return self.decomposition

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


def _start(y: Any, n: int) -> Any:
    """The first target column; ones where it is all zero (e.g. constant normalised y):
    the variances do not depend on y, only the Krylov space the steps explore does."""
    b = y if y.ndim == 1 else y[:, 0]
    norm = float(da.linalg.norm(b).compute() if isinstance(b, da.Array) else np.linalg.norm(b))
    return b if norm > 0 else np.ones(n)



