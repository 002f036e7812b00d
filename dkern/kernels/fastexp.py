"""``exp`` of float64 kernel tiles, compiled once per machine, with numpy as the fallback.

numpy vectorises float64 ``exp`` only on AVX-512 CPUs; on the others (AVX2 laptops
and servers, ARM) it costs ~5 ns a value, more than the rest of a Gaussian tile
together. ``fastexp.c`` is a loop the C compiler vectorises (several times numpy's
speed there, within a few ulp: benchmarks/RESULTS.md). It is compiled the first time
a process needs it, like KeOps compiles its formulas, into ``$DKERN_CACHE_DIR`` (default
``~/.cache/dkern``) under a name that hashes the source, the flags, the compiler and
the CPU's features, so a cache shared by different machines never runs code built
for another CPU. A freshly loaded library is checked against ``numpy.exp`` before
use; without a compiler, or if the check fails, dkern logs why and uses
``numpy.exp``. ``DKERN_FASTEXP=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fastexp.c")
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-shared", "-fPIC")
#: The largest error against numpy.exp accepted when a freshly built library is checked.
MAX_ULP = 4.0


def exp(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``numpy.exp(a, out=out)``, through the compiled loop for C-contiguous float64 arrays.

    Parameters
    ----------
    a : ndarray of any shape
    out : ndarray of a's shape and dtype, optional
        May be ``a`` itself (in place).

    Returns
    -------
    ndarray of a's shape
    """
    fast = _load()[0]
    if (fast is None or a.dtype != np.float64 or not a.flags.c_contiguous
            or (out is not None and (out.dtype != np.float64 or not out.flags.c_contiguous
                                     or out.shape != a.shape))):
        return np.exp(a, out=out)
    if out is None:
        out = np.empty_like(a)
    fast(a.ctypes.data, out.ctypes.data, a.size)
    return out


def status() -> str:
    """One line for ``dkern info``: whether the compiled exp is in use, and why not."""
    return _load()[1]


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, str]:
    """This machine's checked ``dkern_exp`` function and a status line, or None and the reason.

    Built and checked once per process; the reason for a fallback is logged.
    """
    if os.environ.get("DKERN_FASTEXP", "1") == "0":
        return _fallback("turned off by DKERN_FASTEXP=0")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return _fallback("no C compiler (cc/gcc) on PATH")
    try:
        path = _build(compiler)
        function = ctypes.CDLL(str(path)).dkern_exp
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", None) or str(err)
        return _fallback(f"building it with {compiler} failed: {detail.strip()[:200]}")
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ssize_t]
    function.restype = None
    if (ulp := _ulp_error(function)) > MAX_ULP:
        return _fallback(f"the build differs from numpy.exp by {ulp:.1f} ulp")
    return function, f"compiled ({Path(compiler).name}), within {ulp:.2f} ulp of numpy.exp"


def _fallback(reason: str) -> tuple[None, str]:
    logger.info("dkern fast exp unavailable, using numpy.exp: %s", reason)
    return None, f"numpy.exp ({reason})"


def _build(compiler: str) -> Path:
    """Compile fastexp.c unless this machine's build is cached; return the library's path."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version,
                                    platform.machine(), _cpu_features()]).encode()).hexdigest()
    cache = Path(os.environ.get("DKERN_CACHE_DIR") or Path.home() / ".cache" / "dkern")
    path = cache / f"fastexp-{key[:20]}.so"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    # Build under a temporary name and rename: processes building at once each publish a
    # complete library, and no process ever loads a half-written one.
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("dkern fast exp compiled to %s", path)
    return path


def _cpu_features() -> str:
    """The CPU's feature flags (Linux), so ``-march=native`` builds are keyed by CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    flags = [line for line in text.splitlines() if line.startswith(("flags", "Features"))]
    return flags[0] if flags else platform.processor()


def _ulp_error(function: Any) -> float:
    """Largest error of ``function`` against numpy.exp, in ulp, over the finite range."""
    x = np.concatenate([np.linspace(-745.0, 709.7, 20_001), np.linspace(-1.0, 1.0, 2_001)])
    got = np.empty_like(x)
    function(x.ctypes.data, got.ctypes.data, x.size)
    want = np.exp(x)
    normal = want > np.finfo(np.float64).tiny
    special = np.array([np.nan, np.inf, -np.inf, 710.0, -746.0])
    got_special = np.empty_like(special)
    function(special.ctypes.data, got_special.ctypes.data, special.size)
    with np.errstate(over="ignore"):
        if not np.array_equal(got_special, np.exp(special), equal_nan=True):
            return np.inf
    return float(np.max(np.abs(got[normal] - want[normal]) / np.spacing(want[normal])))
