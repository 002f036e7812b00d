"""Which backend computes the blocks: availability checks and the ``"auto"`` choice."""

from __future__ import annotations

import functools
import logging
import os
from typing import NamedTuple

import numpy as np

from ..errors import DkernError

logger = logging.getLogger(__name__)

# KeOps prints its compile steps and CUDA probing to stdout unless told not to; dkern
# reports backend facts through logging and `dkern info` instead. A user's own
# KEOPS_VERBOSE setting wins.
os.environ.setdefault("KEOPS_VERBOSE", "0")

BACKENDS = ("auto", "numpy", "keops")


class BackendUnavailableError(DkernError):
    """An explicitly requested backend cannot run on this machine."""


class BackendStatus(NamedTuple):
    """Whether a backend works here, and why (not)."""

    name: str
    available: bool
    detail: str


@functools.lru_cache(maxsize=1)
def keops_status() -> BackendStatus:
    """Import pykeops and compile and run a tiny reduction, checking its result.

    Cached per process: the first call may compile (~10 s), later ones are free.
    """
    try:
        import pykeops
        from pykeops.numpy import LazyTensor

        pykeops.set_verbose(False)
        x = np.arange(6, dtype=np.float64).reshape(3, 2)
        got = (LazyTensor(x[:, None, :]) | LazyTensor(x[None, :, :])).sum(axis=1)
        want = (x @ x.T).sum(axis=1, keepdims=True)
        if not np.allclose(got, want):
            return BackendStatus("keops", False, f"compiled, but a check reduction gave {got.ravel()}")
    except Exception as err:  # any failure means "not usable here", with the reason
        return BackendStatus("keops", False, f"{type(err).__name__}: {err}".strip()[:300])
    device = "GPU" if gpu_visible() else "CPU"
    return BackendStatus("keops", True, f"pykeops {pykeops.__version__}, compiled and ran on {device}")


@functools.lru_cache(maxsize=1)
def gpu_visible() -> bool:
    """True when pykeops sees a CUDA GPU."""
    try:
        import pykeops.config

        return bool(pykeops.config.gpu_available)
    except Exception:
        return False


def backend_statuses() -> list[BackendStatus]:
    """The status of every concrete backend (for ``dkern info``)."""
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {}).get("name", "BLAS")
    return [BackendStatus("numpy", True, f"numpy {np.__version__} with {blas}"), keops_status()]


def resolve_backend(backend: str) -> str:
    """The concrete backend (``"numpy"`` or ``"keops"``) for a requested one.

    ``"auto"`` takes KeOps when it works and sees a GPU, and the tiled numpy
    backend on CPUs, where cache-sized BLAS tiles beat KeOps' CPU reductions
    (benchmarks/gram.py); the reason is logged.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")
    if backend == "numpy":
        return backend
    status = keops_status()
    if backend == "keops":
        if not status.available:
            raise BackendUnavailableError(
                f"backend='keops' was requested but KeOps does not work here ({status.detail}). "
                "Use backend='numpy' or 'auto', and see `dkern info`.")
        return backend
    if status.available and gpu_visible():
        logger.info("backend='auto' chose keops: %s", status.detail)
        return "keops"
    reason = "no GPU visible" if status.available else f"KeOps unavailable ({status.detail})"
    logger.info("backend='auto' chose numpy: %s; tiled BLAS is the fastest CPU path", reason)
    return "numpy"
