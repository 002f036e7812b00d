"""Posterior variances and covariances by block CG on the lazy ``C = K + alpha I``.

For a batch of test points the columns ``B = K(X, X*)`` are the right-hand sides of one
block-CG solve ``C V = B`` (with the fit's preconditioner), and

    var(x*_j) = k(x*_j, x*_j) - B[:, j]ᵀ V[:, j],     cov = K(X*, X*) - K(X*, X) V,

exact to the solver's ``tol``. ``B`` stays a lazy dask array over X's row chunks: it is
read once by CG and once more for the products.
"""

from __future__ import annotations

from typing import Any

import dask
import numpy as np

from ..kernels import Kernel
from ..operators import gram
from ..solvers import cg
from ._gp_exact import clip_variance

#: Bytes of the block-CG vectors (about six (n, b) float64 arrays) of one batch of test points.
CG_VARIANCE_BYTES = 2**30


def cg_variance(kernel: Kernel, X: Any, A: Any, P: Any, Xt: np.ndarray, *, tol: float,
                backend: str) -> np.ndarray:
    """Latent variances at Xt (m, d) for training rows X (n, d); shape (m,).

    ``A`` is the operator ``C``, ``P`` its preconditioner. Test points go in batches
    of at most ``CG_VARIANCE_BYTES / (48 n)`` columns, one CG solve each.
    """
    n, m = X.shape[0], len(Xt)
    cols = max(1, min(m, CG_VARIANCE_BYTES // (6 * 8 * n)))
    var = np.empty(m)
    for j0 in range(0, m, cols):
        Xb = Xt[j0:j0 + cols]
        B = gram(kernel, X, Xb, backend=backend, dtype=np.float64).kernel_blocks()  # (n, b)
        V = cg(A, B, preconditioner=P, tol=tol).x.rechunk(B.chunks)
        (quad,) = dask.compute((B * V).sum(axis=0))
        var[j0:j0 + cols] = kernel.diag(Xb) - quad
    return clip_variance(var)


def cg_covariance(kernel: Kernel, X: Any, A: Any, P: Any, Xt: np.ndarray, *, tol: float,
                  backend: str) -> np.ndarray:
    """Latent covariance at Xt (m, d); shape (m, m), symmetrised."""
    B = gram(kernel, X, Xt, backend=backend, dtype=np.float64).kernel_blocks()
    V = cg(A, B, preconditioner=P, tol=tol).x
    quad = (gram(kernel, Xt, X, backend=backend, dtype=np.float64) @ V).compute()
    cov = np.asarray(kernel(Xt), dtype=np.float64) - quad
    return (cov + cov.T) / 2  # the two sides of CG's solution agree to tol only
