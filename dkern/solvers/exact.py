"""The dense Cholesky factor of ``K + alpha I`` and the exact solve it gives, for small n only.

:func:`cholesky_factor` is the one dense factorisation of dkern's regression models: kernel
ridge's ``solver="exact"`` and the GP's (Rasmussen & Williams 2006, Alg. 2.1) both use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla

from ..errors import NotPositiveDefiniteError
from ..kernels import Kernel

#: Largest n exact_solve accepts: the OpenBLAS in the numpy/scipy wheels can segfault in
#: multithreaded Cholesky at larger n (benchmarks/RESULTS.md, "Solver notes"); this limit
#: leaves a margin (and K alone is 1.15 GB in float64).
EXACT_MAX_N = 12_000


def exact_solve(kernel: Kernel, X: Any, y: Any, alpha: float) -> np.ndarray:
    """Solve kernel ridge regression exactly with a dense Cholesky factorisation.

    .. math:: (K + \\alpha I)\\, c = y

    ``alpha`` is added to the diagonal as scikit-learn's ``KernelRidge`` does.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
        Held in memory; n <= ``EXACT_MAX_N``.
    y : array-like of shape (n,) or (n, t)
    alpha : float
        Diagonal shift, >= 0 (0 only if K itself is positive definite).

    Returns
    -------
    ndarray of shape (n,) or (n, t), float64
        The dual coefficients c.

    Raises
    ------
    ValueError
        n above ``EXACT_MAX_N``, mismatched y, or non-finite input.
    NotPositiveDefiniteError
        ``K + alpha I`` is not numerically positive definite.
    """
    Xn, yn = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if Xn.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {Xn.shape}.")
    n = Xn.shape[0]
    if n > EXACT_MAX_N:
        raise ValueError(f"exact_solve holds the dense {n} x {n} kernel matrix and is limited to "
                         f"n <= {EXACT_MAX_N} (dense Cholesky in the bundled OpenBLAS can "
                         "crash for larger n); use solver='cg' (dkern.solvers.cg) or "
                         "solver='nystrom' (dkern.solvers.falkon) for larger data.")
    if yn.ndim not in (1, 2) or yn.shape[0] != n:
        raise ValueError(f"y must have shape ({n},) or ({n}, t), one row per row of X; got "
                         f"shape {yn.shape}.")
    if not (np.all(np.isfinite(Xn)) and np.all(np.isfinite(yn))):
        raise ValueError("X or y contains NaN or infinity; drop or impute those rows.")
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0; got {alpha!r}.")
    return sla.cho_solve((cholesky_factor(kernel, Xn, alpha), True), yn, check_finite=False)


def cholesky_factor(kernel: Kernel, X: np.ndarray, alpha: float) -> np.ndarray:
    """Lower Cholesky factor L of ``K(X, X) + alpha I``; shape (n, n), upper triangle zero.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d), float64, in memory
    alpha : float
        Added to the diagonal (the ridge penalty, or a GP's noise variance).

    Raises
    ------
    NotPositiveDefiniteError
        The matrix is not numerically positive definite.
    """
    C = np.asarray(kernel(X), dtype=np.float64)
    C[np.diag_indices_from(C)] += alpha
    try:
        return sla.cholesky(C, lower=True, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError as err:
        raise NotPositiveDefiniteError(
            f"K + alpha I (n={len(X)}, alpha={alpha:g}) is not numerically positive definite "
            f"({err}). Increase alpha (the value added to the diagonal), e.g. alpha=1e-6, or "
            "check the kernel with dkern.kernels.check_psd.") from None
