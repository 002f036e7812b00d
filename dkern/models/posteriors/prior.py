"""The prior: what an unfitted GP regressor answers, as scikit-learn's does before ``fit``.

Mean 0, variance ``k(x, x)``, covariance ``K(X*, X*)`` (Rasmussen & Williams 2006, eq. 2.13
with no data).
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from ...kernels import Kernel


class PriorPosterior:
    """The GP prior of ``kernel``, answering as a posterior conditioned on nothing."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def mean(self, Xt: Any) -> Any:
        """Zeros, shape (m,); dask (chunked as Xt's rows) for dask Xt."""
        if isinstance(Xt, da.Array):
            return da.zeros(Xt.shape[0], chunks=Xt.chunks[0])
        return np.zeros(len(Xt))

    def std(self, Xt: Any) -> Any:
        """``sqrt(k(x, x))`` per row, shape (m,); lazy per row chunk for dask Xt."""
        if isinstance(Xt, da.Array):
            return da.map_blocks(_prior_std_block, Xt, kernel=self.kernel, drop_axis=1,
                                 dtype=np.float64, meta=np.empty((0,)))
        return _prior_std_block(Xt, self.kernel)

    def covariance(self, Xt: np.ndarray) -> np.ndarray:
        """``K(Xt, Xt)``, shape (m, m)."""
        return self.kernel(Xt)


def _prior_std_block(X: np.ndarray, kernel: Kernel) -> np.ndarray:
    """``sqrt(k(x, x))`` of each row of a block: the prior's standard deviation."""
    return np.sqrt(kernel.diag(X))
