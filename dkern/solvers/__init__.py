"""Solvers for kernel systems: block CG with preconditioners, Falkon, gradient descent and
dense Cholesky.

Every solver sees the kernel matrix only through lazy operators over dask row
chunks; vectors of length n stay on the cluster.
"""

from __future__ import annotations

from .centers import select_centers
from .cg import CGResult, cg
from .checkpoint import CHECKPOINT_EVERY, check_checkpoint_location, remove_checkpoint
from .exact import EXACT_MAX_N, exact_solve
from .falkon import NystromResult, falkon
from .gd import GDResult, descend, gd, top_eigenvalue
from .lanczos import LanczosResult, lanczos_decomposition, lanczos_predict
from .monitor import SolveMonitor
from .preconditioners import FalkonPreconditioner, JacobiPreconditioner, NystromPreconditioner
from .sgpr import (
    SGPRStatistics,
    sgpr_bound,
    sgpr_bound_gradient,
    sgpr_predict,
    sgpr_statistics,
)

__all__ = [
    "CHECKPOINT_EVERY", "EXACT_MAX_N", "CGResult", "FalkonPreconditioner", "GDResult",
    "JacobiPreconditioner",
    "LanczosResult",
    "NystromPreconditioner", "NystromResult", "SGPRStatistics", "SolveMonitor",
    "cg", "descend", "exact_solve", "falkon", "gd", "lanczos_decomposition", "lanczos_predict",
    "check_checkpoint_location", "remove_checkpoint", "select_centers",
    "sgpr_bound", "sgpr_bound_gradient", "sgpr_predict", "sgpr_statistics", "top_eigenvalue",
]
