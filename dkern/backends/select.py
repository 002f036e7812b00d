"""Which backend computes the blocks: availability checks and the ``"auto"`` choice."""

from __future__ import annotations

import ctypes.util
import functools
import logging
import os
import subprocess
import sys
from typing import NamedTuple

import numpy as np

from ..errors import DkernError
from ..kernels import fastexp

logger = logging.getLogger(__name__)

# KeOps prints its compile steps and CUDA probing to stdout unless told not to; dkern
# reports backend facts through logging and `dkern info` instead. pykeops reads
# PYKEOPS_VERBOSE (and then sets keopscore's KEOPS_VERBOSE); a user's own setting wins.
os.environ.setdefault("PYKEOPS_VERBOSE", "0")
os.environ.setdefault("KEOPS_VERBOSE", "0")

BACKENDS = ("auto", "numpy", "keops")


class BackendUnavailableError(DkernError):
    """An explicitly requested backend cannot run on this machine."""


class BackendStatus(NamedTuple):
    """Whether a backend works here, and why (not)."""

    name: str
    available: bool
    detail: str


# Run in a child process: on some CUDA set-ups (seen: pykeops 2.3 with CUDA 13.0 on an
# H100) KeOps segfaults while compiling, and that must not take the caller's process down.
_KEOPS_CHECK = """
import numpy as np, pykeops
from pykeops.numpy import LazyTensor
x = np.arange(6, dtype=np.float64).reshape(3, 2)
got = (LazyTensor(x[:, None, :]) | LazyTensor(x[None, :, :])).sum(axis=1)
assert np.allclose(got, (x @ x.T).sum(axis=1, keepdims=True)), got.ravel()
print(pykeops.__version__)
"""
KEOPS_CHECK_TIMEOUT_S = 300


@functools.lru_cache(maxsize=1)
def keops_status() -> BackendStatus:
    """Compile and run a tiny KeOps reduction in a child process and check its result.

    Cached per process: the first call may compile (~10 s), later ones are free.
    A crash or a wrong result makes KeOps unavailable, with the reason.
    """
    try:
        done = subprocess.run([sys.executable, "-c", _KEOPS_CHECK], capture_output=True,
                              text=True, timeout=KEOPS_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return BackendStatus("keops", False, f"check compile took over {KEOPS_CHECK_TIMEOUT_S} s")
    if done.returncode != 0:
        how = (f"crashed (signal {-done.returncode})" if done.returncode < 0
               else f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return BackendStatus("keops", False, f"KeOps check compile {how}"[:300])
    device = "GPU" if gpu_visible() else "CPU"
    # The version is the check's last line; a user's PYKEOPS_VERBOSE=1 adds compile lines before it.
    version = (done.stdout.strip().splitlines() or ["?"])[-1]
    return BackendStatus("keops", True, f"pykeops {version}, compiled and ran on {device}")


@functools.lru_cache(maxsize=1)
def gpu_visible() -> bool:
    """True when pykeops sees a CUDA GPU."""
    # KeOps takes a GPU only where it finds the CUDA driver library (keopscore's
    # cuda_config.set_use_cuda): without one the answer is known without importing
    # pykeops, which imports torch (3-7 s in every process that resolves "auto")
    if ctypes.util.find_library("cuda") is None:
        return False
    try:
        import pykeops.config

        return bool(pykeops.config.gpu_available)
    except Exception:
        return False


def backend_statuses() -> list[BackendStatus]:
    """The status of every concrete backend (for ``dkern info``)."""
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {}).get("name", "BLAS")
    return [BackendStatus("numpy", True, f"numpy {np.__version__} with {blas}; float64 exp: "
                          f"{fastexp.status()}"), keops_status()]


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
    if backend == "keops":
        status = keops_status()
        if not status.available:
            raise BackendUnavailableError(
                f"backend='keops' was requested but KeOps does not work here ({status.detail}). "
                "Use backend='numpy' or 'auto', and see `dkern info`.")
        return backend
    if not gpu_visible():
        reason = "no GPU visible"
    elif not (status := keops_status()).available:
        reason = f"a GPU is visible but KeOps does not work ({status.detail})"
    else:
        logger.info("backend='auto' chose keops: %s", status.detail)
        return "keops"
    logger.info("backend='auto' chose numpy: %s; tiled BLAS is the fastest CPU path", reason)
    return "numpy"
