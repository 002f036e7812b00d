"""``exp`` of float64 kernel tiles, compiled once per machine, with numpy as the fallback.

numpy vectorises float64 ``exp`` only on AVX-512 CPUs; on the others (AVX2 laptops
and servers, ARM) it costs ~5 ns a value, more than the rest of a Gaussian tile
together. ``fastexp.c`` is a loop the C compiler vectorises (several times numpy's
speed there, within a few ulp: benchmarks/RESULTS.md), over the exp of ``dkern_exp.h``.
It is built and cached by :mod:`dkern.kernels.native` (compiled on first use into a
cache only the user can write, keyed by the CPU), and checked against ``numpy.exp``
before use; without a compiler, or if the check fails, dkern logs why and uses
``numpy.exp``. ``DKERN_FASTEXP=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from . import native

LIBRARY = native.Native("fastexp", native.HERE / "fastexp.c", "DKERN_FASTEXP", "numpy.exp",
                        headers=(native.HERE / "dkern_exp.h",))
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
    return native.load(LIBRARY, _bind, _check)


def _bind(library: ctypes.CDLL) -> Any:
    function = library.dkern_exp
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ssize_t]
    function.restype = None
    return function


def _check(function: Any) -> tuple[bool, str]:
    if (ulp := _ulp_error(function)) > MAX_ULP:
        return False, f"the build differs from numpy.exp by {ulp:.1f} ulp"
    return True, f"within {ulp:.2f} ulp of numpy.exp"


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
