"""Fused Gaussian block functions on the CPU: distances, kernel values and sums in registers.

The tiled path (:mod:`.numpy_backend`) stores each tile of kernel values, transforms it
and folds it into the result by BLAS. For a Gaussian on few features the distances are
cheap and the stores are not: ``fused_gaussian.c`` computes each kernel value and adds
``k(x_i, z_j) v_j`` to the row's sums at once, vectorised over columns by the C
compiler (AVX2, AVX-512 or NEON, whichever ``-march=native`` finds). It runs

- the kernel products ``k(x, z) @ v`` of ``Gaussian(l)`` (scalar or one lengthscale per
  feature) and ``c * Gaussian(l)``, White terms beside them left out (their cross blocks
  are zero): the family :func:`dkern.kernels.forms.gaussian_form` decides, as for the
  expanded derivative products; on at most :data:`MAX_FEATURES` features;
- the log-scaled smoothing sums ``[m, s₀ … s_T]`` of a Gaussian
  (:func:`dkern.backends.smoothing.weighted_log_sums_block`): as the plain product with
  ``m = 0`` (log weights are ≤ 0, so nothing overflows), and by an online log-sum-exp,
  whose ``m`` is the row's largest log weight, for the rows that product leaves below
  :data:`SHIFT_ZERO_MIN_SUM` (far from every training row: their weights underflow);

in float64 whatever the input precision (float32 rows are widened). Any other kernel,
more features, or a machine where the library is not built or fails its check against
numpy runs the tiled path, with the same results (within rounding).
``DKERN_FUSED_CPU=0`` turns it off; :func:`status` (``dkern info``) says which runs and
why. The library is built and cached by :mod:`dkern.kernels.native`.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from ..kernels import Gaussian, Kernel
from ..kernels import native as _native
from ..kernels.forms import gaussian_form

__all__ = ["MAX_FEATURES", "log_sums_block_fused", "matvec_block_fused", "status"]

#: Up to this many features the fused loop wins; above it the distances dominate and
#: BLAS's matrix product computes them faster (benchmarks/RESULTS.md, gram-cpu).
MAX_FEATURES = 64
LIBRARY = _native.Native("fused_gaussian", _native.HERE / "fused_gaussian.c",
                         "DKERN_FUSED_CPU", "BLAS tiles",
                         headers=(_native.HERE / "dkern_exp.h", _native.HERE / "dkern_vec.h"))
#: z is packed in blocks of this many rows (``PACK`` in fused_gaussian.c): the C loop reads
#: whole vectors of 2 × 8 doubles (AVX-512's width; AVX2 and NEON read fewer).
PAD = 16
#: A fresh build must match the dense numpy products this closely (relative to Σ|k v|).
CHECK_RTOL = 1e-13
#: Rows whose Gaussian weights sum to at least this unshifted keep that sum: every weight
#: the exp flushes to 0 (below e^-708) is then under e^-270 of it. Rows below it are summed
#: again around their largest log weight. The plain product skips the online maximum's
#: pass over each strip (the speed-up is in benchmarks/RESULTS.md).
SHIFT_ZERO_MIN_SUM = 2.0**-600

_P = ctypes.c_void_p
_N = ctypes.c_ssize_t
_D = ctypes.c_double


def matvec_block_fused(kernel: Kernel, x: np.ndarray, z: np.ndarray,
                       v: np.ndarray) -> np.ndarray | None:
    """``kernel(x, z) @ v`` by the fused loop, or None when it does not apply here
    (the caller then takes the tiled path): the library is not used here (:func:`status`
    says why), the kernel is not ``c · Gaussian`` (:func:`~dkern.kernels.forms.gaussian_form`)
    or x has more than :data:`MAX_FEATURES` features.

    Parameters
    ----------
    kernel : Kernel
    x : ndarray of shape (n, d)
    z : ndarray of shape (m, d)
    v : ndarray of shape (m, t)

    Returns
    -------
    ndarray of shape (n, t), float64, or None
    """
    run = _load()[0]
    if run is None or x.shape[1] > MAX_FEATURES:
        return None
    if (form := gaussian_form(kernel, x.shape[1])) is None:
        return None
    return _matvec(run, form.constant, form.lengthscale, x, z, v)


def log_sums_block_fused(x: np.ndarray, z: np.ndarray, t: np.ndarray | None, *,
                         kernel: Kernel | None, scale: float = 1.0) -> np.ndarray | None:
    """``[m, s₀, s₁ … s_T]`` of the Gaussian weights ``k(x/scale, z/scale)`` per row of x,
    as :func:`dkern.backends.smoothing.weighted_log_sums_block`, or None when the fused
    loop does not apply (not exactly a Gaussian, too many features, not built).

    Parameters
    ----------
    x : ndarray of shape (n, d)
    z : ndarray of shape (m, d)
    t : ndarray of shape (m, T), optional
    kernel : Kernel
    scale : float, default=1.0

    Returns
    -------
    ndarray of shape (n, 2 + T), float64, or None
    """
    run = _load()[0]
    if run is None or type(kernel) is not Gaussian or x.shape[1] > MAX_FEATURES:
        return None
    ones = np.ones((len(z), 1))
    values = ones if t is None else np.hstack([ones, np.asarray(t, dtype=np.float64)])
    ell = np.asarray(kernel.lengthscale, dtype=np.float64) * scale  # _operands checks it
    sums = _matvec(run, 1.0, ell, x, z, values)
    out = np.column_stack([np.zeros(len(x)), sums])
    far = sums[:, 0] < SHIFT_ZERO_MIN_SUM  # NaN rows (unchecked input) stay NaN either way
    if far.any():
        out[far] = _log_sums(run, ell, x[far], z, values)
    return out


def _matvec(run: _Functions, c: float, ell: Any, x: np.ndarray, z: np.ndarray,
            v: np.ndarray) -> np.ndarray:
    """``c · Gaussian(ell)(x, z) @ v`` by ``run``; shape (n, t), float64."""
    x64, zP, vT, w, factor = _operands(x, z, v, ell)
    out = np.zeros((len(x), v.shape[1]))
    if out.size and len(z):
        run.matvec(x64.ctypes.data, zP.ctypes.data, vT.ctypes.data,
                   None if w is None else w.ctypes.data, len(x), len(z), vT.shape[1],
                   x.shape[1], v.shape[1], -0.5 * factor, c, out.ctypes.data)
    return out


def _log_sums(run: _Functions, ell: np.ndarray, x: np.ndarray, z: np.ndarray,
              values: np.ndarray) -> np.ndarray:
    """``[m, Σ e^{L − m} values]`` per row, ``L = log Gaussian(ell)(x, z)``; shape
    (n, 1 + T), float64."""
    x64, zP, vT, w, factor = _operands(x, z, values, ell)
    out = np.zeros((len(x), 1 + values.shape[1]))
    out[:, 0] = -np.inf  # the empty sum, which the fused loop then grows
    if len(x) and len(z):
        run.log_sums(x64.ctypes.data, zP.ctypes.data, vT.ctypes.data,
                     None if w is None else w.ctypes.data, len(x), len(z), vT.shape[1],
                     x.shape[1], values.shape[1], -0.5 * factor, out.ctypes.data)
    return out


def _operands(x: np.ndarray, z: np.ndarray, v: np.ndarray, ell: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, float]:
    """x (n, d), z packed in blocks of :data:`PAD` rows (each block's (d, PAD) transpose
    contiguous) and vᵀ (t, ld), C-contiguous float64, z and v padded with zeros to ``ld``
    rows, a multiple of :data:`PAD`; the per-feature weights
    ``1/l`` (None for a scalar l, or one entry per feature all equal, unless ``1/l²``
    overflows) and the factor ``1/l²`` such an l folds into c."""
    x64 = np.ascontiguousarray(x, dtype=np.float64)
    (m, d), ld = z.shape, -(-len(z) // PAD) * PAD
    zP, vT = np.zeros((ld, d)), np.zeros((v.shape[1], ld))
    zP[:m], vT[:, :m] = z, v.T
    zP = np.ascontiguousarray(zP.reshape(ld // PAD, PAD, d).transpose(0, 2, 1))
    ell = np.asarray(ell, dtype=np.float64)
    if ell.ndim and ell.shape != (x.shape[1],):
        raise ValueError(f"Gaussian: lengthscale has {ell.shape[0]} entries but the data has "
                         f"{x.shape[1]} features; give one per feature or a scalar.")
    ell = np.broadcast_to(ell, (x.shape[1],))
    first = ell[0] if ell.size else 1.0
    with np.errstate(over="ignore", divide="ignore"):  # l² underflows to 0 below 1e-162
        factor = 1.0 / first**2  # inf for l < 1e-154: then (x - z) / l, as the tiles do
    if np.all(ell == first) and np.isfinite(factor):  # one multiply an entry, not one a feature
        return x64, zP, vT, None, float(factor)
    return x64, zP, vT, np.ascontiguousarray(1.0 / ell), 1.0


def _check(run: _Functions) -> tuple[bool, str]:
    """Whether a fresh build matches dense numpy products and log-sums (a few strips and
    panels, rows past a multiple of the vector width, scalar and ARD lengthscales)."""
    rng = np.random.default_rng(0)
    # d = 8: panels of 4,096 columns in fused_gaussian.c, so z spans two
    x, z = rng.normal(size=(11, 8)), rng.normal(size=(4096 + 77, 8))
    v = rng.normal(size=(len(z), 3))
    worst = 0.0
    for ell in (np.asarray(1.3), np.linspace(0.7, 2.0, 8)):
        K = np.exp(-0.5 * (((x[:, None, :] - z[None, :, :]) / ell) ** 2).sum(-1))
        got = _matvec(run, 2.5, ell, x, z, v)
        worst = max(worst, float(np.max(np.abs(got - 2.5 * K @ v) / (2.5 * K @ np.abs(v)))))
        sums = _log_sums(run, ell, x, z, np.hstack([np.ones((len(z), 1)), v]))
        dense = np.exp(sums[:, :1]) * sums[:, 1:]  # Σ k [1, v], unscaled
        want = K @ np.hstack([np.ones((len(z), 1)), v])
        scale = K @ np.hstack([np.ones((len(z), 1)), np.abs(v)])
        worst = max(worst, float(np.max(np.abs(dense - want) / scale)))
    if not worst <= CHECK_RTOL:  # NaN fails too
        return False, f"the build differs from the dense numpy products by {worst:.1e}"
    return True, f"within {worst:.1e} of the dense numpy products"


def status() -> str:
    """One line for ``dkern info``: whether the fused Gaussian loop runs, and why not."""
    message = _load()[1]
    if _load()[0] is None:
        return message
    return (f"{message}; runs c * Gaussian products and Gaussian smoothing sums on at most "
            f"{MAX_FEATURES} features, BLAS tiles the rest")


class _Functions:
    """The library's two entry points with their ctypes signatures."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.matvec = library.dkern_gaussian_matvec
        self.matvec.argtypes = [_P, _P, _P, _P, _N, _N, _N, _N, _N, _D, _D, _P]
        self.log_sums = library.dkern_gaussian_log_sums
        self.log_sums.argtypes = [_P, _P, _P, _P, _N, _N, _N, _N, _N, _D, _P]
        self.matvec.restype = self.log_sums.restype = None


@functools.lru_cache(maxsize=1)
def _load() -> tuple[_Functions | None, str]:
    """This machine's checked library and a status line, or None and the reason (logged)."""
    return _native.load(LIBRARY, _Functions, _check)
