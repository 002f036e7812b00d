"""Kept for ``benchmarks/gp.py``, which counts the SGPR bound's evaluations here; the sparse
GP lives in :mod:`.posteriors.sparse`."""

from __future__ import annotations

from .posteriors.sparse import SparseBound

__all__ = ["SparseBound"]
