"""Latent variances and covariances of the exact GP from LOVE's decomposition of ``C⁻¹``.

:func:`dkern.solvers.lanczos.lanczos_decomposition` gives an orthonormal basis V of
r preconditioner columns and k Lanczos vectors with ``H = Vᵀ C V = L Lᵀ``, and
``C⁻¹ ≈ V H⁻¹ Vᵀ ≼ C⁻¹``. With ``W = K(X*, X) V`` (one operator product, r + k columns)::

    var(x*) = k(x*, x*) - ||L⁻¹ W[x*]ᵀ||²,       cov = K(X*, X*) - (L⁻¹ Wᵀ)ᵀ (L⁻¹ Wᵀ),

both at least the exact posterior's (the covariance minus the exact one is positive
semi-definite, so it is PSD itself) and at most the prior's. Only the variances come
from here; the model's mean stays ``K(X*, X) alpha_`` from its solver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import scipy.linalg as sla

from ..kernels import Kernel
from ..operators import gram
from ..solvers import NystromPreconditioner
from ..solvers.lanczos import LanczosResult, lanczos_decomposition, lanczos_predict


@dataclass(frozen=True)
class _Span:
    """Leading columns of a preconditioner's orthonormal factor, (n, r): all that
    ``lanczos_decomposition`` reads of its ``preconditioner`` argument."""

    factor: da.Array


def decomposition(A: Any, y: Any, preconditioner: NystromPreconditioner,
                  rank: int) -> LanczosResult:
    """``rank`` Lanczos steps on ``A = C`` (n, n) from the targets, behind the factor's span.

    At most n − r steps fit beside the r factor columns; when the factor spans all n
    rows (small n) its last column is left to one Lanczos step, so V spans everything
    and the variances are exact.
    """
    n = A.shape[0]
    U = preconditioner.factor
    r = min(U.shape[1], n - 1)
    augmentation = preconditioner if r == U.shape[1] else _Span(U[:, :r])
    return lanczos_decomposition(A, _start(y, n), min(rank, n - r),
                                 preconditioner=augmentation)  # type: ignore[arg-type]


def _start(y: Any, n: int) -> Any:
    """The first target column; ones where it is all zero (e.g. constant normalised y):
    the variances do not depend on y, only the Krylov space the steps explore does."""
    b = y if y.ndim == 1 else y[:, 0]
    norm = float(da.linalg.norm(b).compute() if isinstance(b, da.Array) else np.linalg.norm(b))
    return b if norm > 0 else np.ones(n)


def variance(result: LanczosResult, kernel: Kernel, X: Any, Xt: Any, backend: str) -> Any:
    """Latent variances at Xt (m, d), in ``[exact, prior]``; shape (m,), dask for dask Xt."""
    _, var = lanczos_predict(result, gram(kernel, Xt, X, backend=backend, dtype=np.float64))
    return var if isinstance(Xt, da.Array) else var.compute()


def covariance(result: LanczosResult, kernel: Kernel, X: Any, Xt: np.ndarray,
               backend: str) -> np.ndarray:
    """Latent covariance at Xt (m, d); shape (m, m), symmetric, PSD up to rounding."""
    cross = gram(kernel, Xt, X, backend=backend, dtype=np.float64)
    W = cross.matvec(result.V).astype(np.float64).compute()  # shape: (m, r + k)
    S = sla.solve_triangular(np.linalg.cholesky(result.H), W.T, lower=True)  # (r + k, m)
    cov = np.asarray(kernel(Xt), dtype=np.float64) - S.T @ S
    return (cov + cov.T) / 2
