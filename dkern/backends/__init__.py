"""How one kernel block times one vector block is computed: numpy/BLAS or KeOps."""

from __future__ import annotations

from .blocks import BlockBackend, KeopsBlocks, NumpyBlocks, block_backend
from .keops_backend import matvec_block_keops
from .numpy_backend import default_tile, matvec_block_numpy
from .select import (
    BACKENDS,
    BackendStatus,
    BackendUnavailableError,
    backend_statuses,
    gpu_visible,
    keops_status,
    resolve_backend,
)

__all__ = [
    "BACKENDS", "BackendStatus", "BackendUnavailableError", "BlockBackend", "KeopsBlocks",
    "NumpyBlocks", "backend_statuses", "block_backend", "default_tile",
    "gpu_visible", "keops_status", "matvec_block_keops", "matvec_block_numpy", "resolve_backend",
]
