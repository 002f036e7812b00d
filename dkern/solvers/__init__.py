"""Solvers for kernel systems: block CG with preconditioners, Falkon, and dense Cholesky.

Every solver sees the kernel matrix only through lazy operators over dask row
chunks; vectors of length n stay on the cluster.
"""

from __future__ import annotations

from .cg import CGResult, cg
from .preconditioners import JacobiPreconditioner, NystromPreconditioner

__all__ = ["CGResult", "JacobiPreconditioner", "NystromPreconditioner", "cg"]
