"""``K + alpha·I``: a square operator with a constant added to its diagonal."""

from __future__ import annotations

from numbers import Real

import dask.array as da
import numpy as np

from .base import Operator


class ShiftedOperator(Operator):
    """``base + alpha · I`` for a square ``base`` operator (``op + alpha``).

    The same ``alpha`` scikit-learn's ``KernelRidge`` adds: ``(K + alpha I) c = y``.
    """

    def __init__(self, base: Operator, alpha: float) -> None:
        if not base.is_square:
            raise ValueError(f"op + alpha adds alpha·I and needs a square operator over one set of "
                             f"points (gram(kernel, X)); got shape {base.shape} with Z given.")
        if not np.isfinite(alpha):
            raise ValueError(f"alpha must be a finite number; got {alpha!r}.")
        self.base, self.alpha = base, alpha
        self.shape, self.dtype, self.col_chunks = base.shape, base.dtype, base.col_chunks

    @property
    def is_square(self) -> bool:
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        KV = self.base._matvec(V)
        if len(KV.chunks[1]) != 1 or len(V.chunks[1]) != 1:
            return KV + self.alpha * V
        # one layer instead of two elementwise ones, its meta given: a CG step builds this
        # graph every iteration, and dask's metadata inference cost more than small blocks
        dtype = (np.empty(0, KV.dtype) + self.alpha * np.empty(0, V.dtype)).dtype
        return da.blockwise(_shift_block, "ij", KV, "ij", V, "ij", alpha=self.alpha,
                            dtype=dtype, meta=np.empty((0, 0), dtype), token="dk-shift")

    def diag(self) -> da.Array:
        """The diagonal ``diag(base) + alpha``; shape (n,)."""
        return self.base.diag() + self.alpha  # type: ignore[attr-defined]

    @property
    def T(self) -> ShiftedOperator:
        return ShiftedOperator(self.base.T, self.alpha)  # type: ignore[attr-defined]

    def __add__(self, alpha: float) -> Operator:
        if not isinstance(alpha, Real):
            return NotImplemented
        return ShiftedOperator(self.base, self.alpha + float(alpha))

    __radd__ = __add__


def _shift_block(kv: np.ndarray, v: np.ndarray, *, alpha: float) -> np.ndarray:
    """One task: ``K v + alpha v`` for a block of rows, as the two elementwise layers
    compute it."""
    return kv + alpha * v
