"""``check_psd``: is a kernel positive semi-definite on (a sample of) some data?"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg

from .base import Kernel

logger = logging.getLogger(__name__)

#: Largest sample ``check_psd`` factorises densely (an n×n eigenproblem in memory).
MAX_PSD_SAMPLE = 4000


class PSDReport(NamedTuple):
    """What ``check_psd`` found on its sample."""

    min_eigenvalue: float
    max_eigenvalue: float
    n_samples: int
    tolerance: float

    @property
    def is_psd(self) -> bool:
        """True when the smallest eigenvalue is above ``-tolerance``."""
        return self.min_eigenvalue >= -self.tolerance


def check_psd(kernel: Kernel, X: Any, n: int = 1000, *, random_state: int | None = 0) -> PSDReport:
    """Smallest eigenvalue of the Gram matrix of ``kernel`` on ``n`` rows sampled from ``X``.

    A valid kernel gives a positive semi-definite Gram matrix for any data, so a
    clearly negative eigenvalue proves the kernel (or a composition) invalid.
    The tolerance ``n · eps · λ_max · 10`` separates rounding from real negativity.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n_samples, n_features)
        numpy or dask array (only the sampled rows are read).
    n : int, default=1000
        Sample size, at most ``MAX_PSD_SAMPLE`` (the eigenproblem is dense).
    random_state : int or None, default=0

    Returns
    -------
    PSDReport
        ``min_eigenvalue``, ``max_eigenvalue``, ``n_samples``, ``tolerance``, ``is_psd``.
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"check_psd: kernel must be a dkern kernel; got {type(kernel).__name__}.")
    if not 2 <= n <= MAX_PSD_SAMPLE:
        raise ValueError(f"check_psd: n must be between 2 and {MAX_PSD_SAMPLE} (a dense "
                         f"eigenproblem); got n={n}.")
    if not hasattr(X, "shape"):  # lists, tuples: the dense sample is small anyway
        X = np.asarray(X, dtype=np.float64)
    if len(X.shape) != 2 or X.shape[0] < 1:
        raise ValueError(f"check_psd: X must have shape (n_samples, n_features) with at least "
                         f"one row; got shape {X.shape}.")
    n_rows = X.shape[0]
    rng = np.random.default_rng(random_state)
    rows = np.sort(rng.choice(n_rows, min(n, n_rows), replace=False))
    sample = np.asarray(X[rows], dtype=np.float64)
    eig = scipy.linalg.eigvalsh(kernel(sample))
    lo, hi = float(eig[0]), float(eig[-1])
    tol = float(10.0 * len(sample) * np.finfo(np.float64).eps * max(abs(hi), 1.0))
    report = PSDReport(lo, hi, len(sample), tol)
    logger.info("check_psd(%r): min eigenvalue %.3e, max %.3e on %d rows -> %s", kernel, lo, hi,
                len(sample), "PSD" if report.is_psd else "NOT PSD")
    return report
