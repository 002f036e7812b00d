"""Which backend computes the blocks: availability checks and the ``"auto"`` choice."""

from __future__ import annotations

import ctypes.util
import functools
import glob
import importlib.util
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

BACKENDS = ("auto", "numpy", "keops", "triton")


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
import ctypes, sys
for lib in sys.argv[1:]:  # the libraries pin_pip_nvrtc loaded into the parent
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
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
    A crash or a wrong result makes KeOps unavailable, with the reason. A crash is
    retried once with the pip package's libnvrtc preloaded (:func:`nvrtc_preload`):
    if that runs, the reason names the ``LD_PRELOAD`` to set before Python starts.
    """
    done = _run_keops_check()
    if isinstance(done, str):
        return BackendStatus("keops", False, done)
    if done.returncode < 0 and (preload := nvrtc_preload()):
        retried = _run_keops_check(preload)
        if not isinstance(retried, str) and retried.returncode == 0:
            return BackendStatus("keops", False, (
                f"KeOps check compile crashed (signal {-done.returncode}), and ran with "
                f"LD_PRELOAD={preload} (this process maps two libnvrtc builds; see "
                "benchmarks/RESULTS.md): export that before starting Python and the workers"))
    if done.returncode != 0:
        how = (f"crashed (signal {-done.returncode})" if done.returncode < 0
               else f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return BackendStatus("keops", False, f"KeOps check compile {how}"[:300])
    device = "GPU" if gpu_visible() else "CPU"
    # The version is the check's last line; a user's PYKEOPS_VERBOSE=1 adds compile lines before it.
    version = (done.stdout.strip().splitlines() or ["?"])[-1]
    pinned = " (pip's libnvrtc loaded first)" if _PINNED else ""
    return BackendStatus("keops", True,
                         f"pykeops {version}, compiled and ran on {device}{pinned}")


def _run_keops_check(preload: str | None = None) -> subprocess.CompletedProcess | str:
    """The KeOps check in a child process (with ``preload`` prepended to LD_PRELOAD), or
    why it did not finish."""
    env = None
    if preload:
        env = {**os.environ, "LD_PRELOAD": ":".join(
            p for p in (preload, os.environ.get("LD_PRELOAD")) if p)}
    try:
        pinned = _PINNED.split(":") if _PINNED else []
        return subprocess.run([sys.executable, "-c", _KEOPS_CHECK, *pinned], capture_output=True,
                              text=True, timeout=KEOPS_CHECK_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"check compile took over {KEOPS_CHECK_TIMEOUT_S} s"


def nvrtc_preload() -> str | None:
    """``libnvrtc-builtins:libnvrtc`` of the pip package ``nvidia-cuda-nvrtc``, if installed.

    Seen on an H100 with CUDA 13 (benchmarks/RESULTS.md): a process that mapped both the
    CUDA toolkit's libnvrtc.so.13, which keopscore finds, and this package's, which was
    loaded there as well, crashed in KeOps' first compile; preloading this one (and its
    builtins, which it does not find by itself) avoided it.
    """
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*"))):
            builtins = sorted(glob.glob(os.path.join(os.path.dirname(lib),
                                                     "libnvrtc-builtins.so.*")))
            if builtins:
                return f"{builtins[0]}:{lib}"
    return None


def pin_pip_nvrtc() -> str | None:
    """Load the pip package's libnvrtc and its builtins (:func:`nvrtc_preload`) into this
    process's global symbol scope, where a CUDA driver is present, and return their paths.

    KeOps' compiled ``nvrtc_jit.so`` records no library for its nvrtc calls, so they bind
    to what the process's global scope holds first; loading these before KeOps first
    compiles aims to do what ``LD_PRELOAD`` of them did on CUDA 13 (benchmarks/RESULTS.md),
    in every dkern process, workers included, with nothing to export. It is done when dkern
    is imported, as a later load could come after KeOps' own (verified on an H200:
    benchmarks/RESULTS.md). Without pykeops, a CUDA driver or that package, nothing is
    loaded; ``DKERN_PIN_NVRTC=0`` leaves it out.
    """
    if os.environ.get("DKERN_PIN_NVRTC", "1") == "0" or \
            importlib.util.find_spec("pykeops") is None:
        return None
    preload = nvrtc_preload()
    if preload is None or ctypes.util.find_library("cuda") is None:
        return None
    try:
        for lib in preload.split(":"):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        logger.debug("pip's libnvrtc not loaded: %s", err)
        return None
    return preload


_PINNED = pin_pip_nvrtc()


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


@functools.lru_cache(maxsize=1)
def triton_status() -> BackendStatus:
    """Whether Triton kernels can run here: on a CUDA GPU, or on the CPU through Triton's
    interpreter when ``TRITON_INTERPRET=1`` (slow; how CI checks them). Cached per process.

    On a GPU a tiny Gaussian product is compiled, run and checked against numpy.
    """
    from .triton_backend import interpreting

    missing = [name for name in ("torch", "triton") if importlib.util.find_spec(name) is None]
    if missing:
        return BackendStatus("triton", False, f"{' and '.join(missing)} not installed: "
                             'pip install "dkern[gpu]"')
    if not interpreting() and ctypes.util.find_library("cuda") is None:
        # checked before importing torch, which costs seconds on every CPU-only worker
        return BackendStatus("triton", False, "no CUDA driver (libcuda) on this machine "
                             "(TRITON_INTERPRET=1 runs the kernels on the CPU, slowly)")
    import torch
    import triton

    versions = f"triton {triton.__version__}, torch {torch.__version__}"
    if interpreting():
        return BackendStatus("triton", True, f"{versions}, interpreter on the CPU "
                             "(TRITON_INTERPRET=1: for checking, not speed)")
    if not torch.cuda.is_available():
        return BackendStatus("triton", False, f"{versions}, but torch sees no CUDA GPU "
                             "(TRITON_INTERPRET=1 runs the kernels on the CPU, slowly)")
    try:
        _check_triton_product()
    except Exception as err:  # a compile or driver error: report it, don't raise
        return BackendStatus("triton", False, f"{versions}: check kernel failed: "
                             f"{type(err).__name__}: {err}"[:300])
    return BackendStatus("triton", True, f"{versions}, on {torch.cuda.get_device_name()}")


def _check_triton_product() -> None:
    from ..kernels import Gaussian
    from .triton_backend import matvec_block_triton

    x = np.linspace(0.0, 1.0, 12).reshape(4, 3)
    got = matvec_block_triton(Gaussian(1.0), x, x, np.ones(4))
    want = Gaussian(1.0)(x, x).sum(axis=1, keepdims=True)
    if not np.allclose(got, want, rtol=1e-12, atol=0.0):
        raise ArithmeticError(f"Gaussian product {got.ravel()} != numpy's {want.ravel()}")


def backend_statuses() -> list[BackendStatus]:
    """The status of every concrete backend (for ``dkern info``)."""
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {}).get("name", "BLAS")
    return [BackendStatus("numpy", True, f"numpy {np.__version__} with {blas}; float64 exp: "
                          f"{fastexp.status()}"), keops_status(), triton_status()]


#: The GPU-capable backends a caller may name: their check (looked up when called, so a
#: replaced check is the one used), and what its failure means.
_REQUESTED = {"keops": (lambda: keops_status(), "KeOps does not work here"),
              "triton": (lambda: triton_status(), "Triton cannot run here")}


def resolve_backend(backend: str) -> str:
    """The concrete backend (``"numpy"``, ``"keops"`` or ``"triton"``) for a requested one.

    ``"auto"`` takes KeOps when it works and sees a GPU, else Triton when it works
    on a GPU (never its CPU interpreter, which is for checking), and the tiled numpy
    backend on CPUs, where cache-sized BLAS tiles beat KeOps' CPU reductions
    (benchmarks/gram.py); the reason is logged.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")
    if backend == "numpy":
        return backend
    if backend in _REQUESTED:
        check, failure = _REQUESTED[backend]
        if not (status := check()).available:
            raise BackendUnavailableError(
                f"backend={backend!r} was requested but {failure} ({status.detail}). "
                "Use backend='numpy' or 'auto', and see `dkern info`.")
        return backend
    if not gpu_visible():
        reason = "no GPU visible to KeOps"
    elif not (status := keops_status()).available:
        reason = f"a GPU is visible but KeOps does not work ({status.detail})"
    else:
        logger.info("backend='auto' chose keops: %s", status.detail)
        return "keops"
    from .triton_backend import interpreting

    if not interpreting() and (triton := triton_status()).available:
        logger.info("backend='auto' chose triton (%s): %s", reason, triton.detail)
        return "triton"
    logger.info("backend='auto' chose numpy: %s; tiled BLAS is the fastest CPU path", reason)
    return "numpy"
