"""The Laplace GP classifier's latent predictive: mean and variance of each binary problem
at test points, in batches (Rasmussen & Williams 2006, Alg. 3.2 lines 4–6).

:class:`~dkern.models.GaussianProcessClassifier` turns these into probabilities. The
exact solver reuses the Cholesky factors of B at the modes; CG solves with the columns
``k(X, x*)`` of each batch as right-hand sides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels import Kernel
from ..operators import gram
from . import _laplace
from ._validation import in_memory

#: Test points per batch in predictions: the exact solver holds an (n, PREDICT_BATCH) block
#: of k(X, X*) (n ≤ EXACT_MAX_N: at most 94 MB), CG solves with that many right-hand sides.
PREDICT_BATCH = 1000
#: ``"cg"`` predictions: at most this many values in the right-hand sides ``k(X, x*)`` of one
#: batch (128 MiB of float64 on the cluster), so test batches shrink as n grows.
CG_BATCH_VALUES = 2 ** 24

Latent = list[tuple[np.ndarray, np.ndarray]]


def latent_exact(X_fit: np.ndarray, kernels: list[Kernel], targets: list[np.ndarray],
                 pis: list[np.ndarray], factors: list[np.ndarray], X: Any) -> Latent:
    """Latent (mean, variance), each (m,), of every binary problem at the rows of X (m, d).

    ``X_fit`` (n, d) are the training rows; per problem its kernel, 0/1 targets (n,),
    ``σ(f̂)`` (n,) and the lower Cholesky factor of B at the mode (n, n).
    """
    def batch_latent(Xb: np.ndarray) -> Latent:
        def blocks(k: Kernel) -> tuple[np.ndarray, np.ndarray]:  # shapes: (b,), (n, b)
            return (np.asarray(k.diag(Xb), dtype=np.float64),
                    np.asarray(k(np.asarray(X_fit), Xb), dtype=np.float64))

        return [_laplace.dense_latent(K_star, k_diag, t, pi, L)
                for (k_diag, K_star), t, pi, L in zip(
                    _laplace.shared(kernels, blocks), targets, pis, factors, strict=True)]

    return _in_batches(X, PREDICT_BATCH, batch_latent)


def latent_cg(X_fit: Any, kernels: list[Kernel], targets: list[np.ndarray], pis: list[Any],
              X: Any, *, backend: str, tol: float, cg_max_iter: int | None) -> Latent:
    """As :func:`latent_exact`, each batch's ``k*ᵀ S B⁻¹ S k*`` solved by block CG to
    :func:`~dkern.models._laplace.amplitude_tol` of ``tol`` on the lazy Gram operator (never
    an n × n matrix)."""
    problems = []
    for k, t, pi in zip(kernels, targets, pis, strict=True):
        K = gram(k, X_fit, backend=backend, dtype=np.float64)
        problems.append((k, K, _laplace.lazy_vector(t, K), _laplace.lazy_vector(pi, K),
                         _laplace.amplitude_tol(K, tol)))

    def batch_latent(Xb: np.ndarray) -> Latent:
        out = []
        for k, K, t, pi, k_tol in problems:
            k_diag = np.asarray(k.diag(Xb), dtype=np.float64)
            K_star = gram(k, X_fit, Xb, backend=backend, dtype=np.float64)
            out.append(_laplace.cg_latent(K, K_star, k_diag, t, pi, k_tol, cg_max_iter))
        return out

    batch = max(1, min(PREDICT_BATCH, CG_BATCH_VALUES // X_fit.shape[0]))
    return _in_batches(X, batch, batch_latent)


def _in_batches(X: Any, batch: int, batch_latent: Callable[[np.ndarray], Latent]) -> Latent:
    """``batch_latent`` on consecutive row batches of X (numpy or dask), concatenated."""
    parts = [batch_latent(in_memory(X[i:i + batch])) for i in range(0, X.shape[0], batch)]
    return [(np.concatenate([p[j][0] for p in parts]), np.concatenate([p[j][1] for p in parts]))
            for j in range(len(parts[0]))]


