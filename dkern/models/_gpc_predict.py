"""The classifier's latent predictive: mean and variance of each binary problem, in batches.

:class:`~dkern.models.gp_classifier.GaussianProcessClassifier` turns these into
probabilities. The exact solver reuses the Cholesky factors of B at the modes (rebuilt
from ``pi_`` for a loaded model); CG solves with the columns ``k(X, x*)`` of each batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
from sklearn.utils.validation import check_is_fitted

from ..kernels import Kernel
from ..operators import gram
from . import _laplace
from ._validation import check_X, in_memory

if TYPE_CHECKING:
    from .gp_classifier import GaussianProcessClassifier

#: Test points per batch in predictions: the exact solver holds an (n, PREDICT_BATCH) block
#: of k(X, X*) (n ≤ EXACT_MAX_N: at most 94 MB), CG solves with that many right-hand sides.
PREDICT_BATCH = 1000
#: ``"cg"`` predictions: at most this many values in the right-hand sides ``k(X, x*)`` of one
#: batch (128 MiB of float64 on the cluster), so test batches shrink as n grows.
CG_BATCH_VALUES = 2 ** 24

Latent = list[tuple[np.ndarray, np.ndarray]]


def latent(gpc: GaussianProcessClassifier, X: Any) -> Latent:
    """Latent (mean, variance), each (m,), of every binary problem at the rows of X."""
    check_is_fitted(gpc, "pi_")
    Xv = check_X(gpc, X, reset=False)
    Xv = Xv if Xv.dtype == np.float64 else Xv.astype(np.float64)
    if gpc.solver_ == "exact":
        factors = _factors(gpc)

        def batch_latent(Xb: np.ndarray) -> Latent:
            return _latent_exact(gpc, Xb, factors)
        batch = PREDICT_BATCH
    else:
        problems = []
        for k, t, pi in zip(gpc._kernels(), gpc._targets(), gpc._pis(), strict=True):
            K = gram(k, gpc.X_fit_, backend=gpc.backend, dtype=np.float64)
            problems.append((k, K, _laplace.lazy_vector(t, K), _laplace.lazy_vector(pi, K)))
        batch = max(1, min(PREDICT_BATCH, CG_BATCH_VALUES // gpc.X_fit_.shape[0]))

        def batch_latent(Xb: np.ndarray) -> Latent:
            return _latent_cg(gpc, Xb, problems)
    parts = [batch_latent(in_memory(Xv[i:i + batch])) for i in range(0, Xv.shape[0], batch)]
    return [(np.concatenate([p[j][0] for p in parts]), np.concatenate([p[j][1] for p in parts]))
            for j in range(len(parts[0]))]


def _latent_exact(gpc: GaussianProcessClassifier, Xb: np.ndarray,
                  factors: list[np.ndarray]) -> Latent:
    def blocks(k: Kernel) -> tuple[np.ndarray, np.ndarray]:  # shapes: (b,), (n, b)
        return (np.asarray(k.diag(Xb), dtype=np.float64),
                np.asarray(k(np.asarray(gpc.X_fit_), Xb), dtype=np.float64))

    return [_laplace.dense_latent(K_star, k_diag, t, pi, L)
            for (k_diag, K_star), t, pi, L in zip(
                _laplace.shared(gpc._kernels(), blocks), gpc._targets(), gpc._pis(), factors,
                strict=True)]


def _latent_cg(gpc: GaussianProcessClassifier, Xb: np.ndarray,
               problems: list[tuple[Kernel, Any, da.Array, da.Array]]) -> Latent:
    out = []
    for k, K, t, pi in problems:
        k_diag = np.asarray(k.diag(Xb), dtype=np.float64)
        K_star = gram(k, gpc.X_fit_, Xb, backend=gpc.backend, dtype=np.float64)
        out.append(_laplace.cg_latent(K, K_star, k_diag, t, pi, gpc.tol, gpc.max_iter))
    return out


def _factors(gpc: GaussianProcessClassifier) -> list[np.ndarray]:
    """Cholesky factors of B at the mode, rebuilt from ``pi_`` when absent (a loaded model)."""
    chols = getattr(gpc, "_chols", None)
    if chols is None:
        Ks = _laplace.dense_grams(gpc._kernels(), np.asarray(gpc.X_fit_, dtype=np.float64))
        chols = gpc._chols = [_laplace.dense_factor(K, pi)[1]
                              for K, pi in zip(Ks, gpc._pis(), strict=True)]
    return chols
