"""Projection passes: the block functions built on the whitened cross block ``k(x, Z) W``.

The sparse GP, leverage scores and the preconditioners' kernel columns all read a row
chunk ``x`` (n_i × d) against M points ``Z`` and project the kernel values on an M × M
matrix. With ``W = L⁻¹`` for a lower Cholesky factor ``L`` (or an explicit inverse given
by the caller), the one shared quantity is the whitened cross block

.. math:: A = k(x, Z)\\, W^\\top \\quad (n_i \\times M),

and every pass is a sum or a row-wise function of it:

===============================  ======================================  ============
method                            computes                                shape
===============================  ======================================  ============
``kernel_columns(x, z)``          ``k(x, z)``, dense, float64             (n_i, m)
``whitened_cross(x, z, W)``       ``A = k(x, z) W⁻ᵀ`` (Cholesky) or       (n_i, M)
                                  ``k(x, z) Wᵀ`` (inverse)
``whitened_residual_diag``        ``k(x, x) − ‖A_i‖²``                    (n_i,)
``leverage(x, z)``                ``(k(x, x) − ‖A_i‖²) / α``              (n_i, 1)
``sgpr_statistics(x, z, y, L)``   ``[AᵀA (lower), Aᵀy]``                  (M, M + t)
``sgpr_predict(x, z, …)``         SGPR mean and latent variance           (n_i, t + 1)
``sgpr_gradient(x, z, y, …)``     ``Σᵢ G[i, m] ∂k(xᵢ, z_m)/∂θ``           (M, p)
``kernel_grad_matvec(x, z, v)``   ``∂k(x, z)/∂θ_p @ v`` for every p       (n_i, t, p)
===============================  ======================================  ============

The numpy backend forms A as today's dense tile and a triangular solve (BLAS trsm); the
KeOps backend as one Sum reduction ``kernel_matvec(x, z, L⁻ᵀ)`` (the M columns of
``L⁻ᵀ`` are the right-hand side), so the kernel values are never stored. Everything after
A (sums of outer products by BLAS syrk, row norms) is shared. Passes without a KeOps form
(the θ-gradient: dkern's kernels give no KeOps formula of ∂k/∂θ) run numpy's blocks and
say so once per process (:func:`log_fallback`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import numpy as np
import scipy.linalg as sla
import scipy.linalg.blas as blas

from ..kernels import Kernel
from .numpy_backend import TILE_BYTES, single_threaded_blas

__all__ = ["FusedProjections", "KeopsProjections", "ProjectionBlocks", "log_fallback",
           "residual_diag"]

logger = logging.getLogger(__name__)

Factor = Literal["cholesky", "inverse"]
Whitener = Callable[[np.ndarray], np.ndarray]

#: Columns of the identity that one KeOps reduction turns into kernel columns: each kernel
#: value is computed once and multiplied into this many outputs, and every call has the
#: same width, so one formula serves all column counts.
KEOPS_COLUMN_TILE = 16

_logged: set[str] = set()


def log_fallback(pass_name: str, why: str) -> None:
    """Log once per process that ``pass_name`` runs numpy's blocks under another backend."""
    if pass_name in _logged:
        return
    _logged.add(pass_name)
    logger.info("backend='keops': %s runs numpy's blocks: %s", pass_name, why)


def residual_diag(prior: np.ndarray, cross: np.ndarray, L: np.ndarray | None = None
                  ) -> np.ndarray:
    """``k(x, x) − ‖L⁻¹ k(Z, x)‖²`` for each row x: the one whitened residual diagonal.

    The SGPR Nyström gap, the leverage scores, and the exact and LOVE posterior
    variances are all this, for their own ``cross`` and ``L``.

    Parameters
    ----------
    prior : ndarray of shape (n,)
        ``k(x_i, x_i)``.
    cross : ndarray of shape (n, M)
        Row i is ``k(x_i, Z)``; already whitened (``k(x_i, Z) L⁻ᵀ``) when L is None.
    L : ndarray of shape (M, M), optional
        Lower-triangular factor to whiten ``cross`` with.

    Returns
    -------
    ndarray of shape (n,), float64
        Not clipped: rounding can leave small negative values, which callers clip their way.
    """
    A = cross if L is None else sla.solve_triangular(L, cross.T, lower=True,
                                                     check_finite=False).T
    return prior - np.einsum("ij,ij->i", A, A)


def default_rows(M: int) -> int:
    """Rows of x per tile: ``TILE_BYTES`` (4 MiB) of float64 values of width M."""
    return max(1, TILE_BYTES // (8 * max(1, M)))


class ProjectionBlocks:
    """The projection passes of a backend, from its ``kernel_block`` / ``kernel_diag``.

    Mixed into :class:`~dkern.backends.NumpyBlocks`; :class:`KeopsProjections` changes only
    how the whitened cross block and dense columns are formed.
    """

    # -- how A is formed (the only backend-specific part) ---------------------
    def kernel_columns(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """``k(x, z)`` as a dense float64 block; shape (n_i, m)."""
        return np.asarray(self.kernel_block(x, z, kernel=kernel),  # type: ignore[attr-defined]
                          dtype=np.float64)

    def whitener(self, z: np.ndarray, W: np.ndarray, *, kernel: Kernel,
                 factor: Factor) -> Whitener:
        """``x ↦ A = k(x, z) L⁻ᵀ`` (``factor="cholesky"``, W = L lower) or ``k(x, z) Wᵀ``
        (``"inverse"``), for x of shape (n, d); A of shape (n, M), float64.

        The numpy form: a dense tile, then BLAS trsm (or gemm) with W.
        """
        if factor == "cholesky":
            Lf = np.asfortranarray(W)

            def whiten(x: np.ndarray) -> np.ndarray:
                kzx = np.asarray(kernel(x, z), dtype=np.float64).T  # shape: (M, n)
                return sla.solve_triangular(Lf, kzx, lower=True, check_finite=False,
                                            overwrite_b=True).T
            return whiten
        return lambda x: self.kernel_block(x, z, kernel=kernel) @ W.T  # type: ignore[attr-defined]

    # -- passes built on A ------------------------------------------------------
    def whitened_cross(self, x: np.ndarray, z: np.ndarray, W: np.ndarray, *, kernel: Kernel,
                       factor: Factor = "cholesky") -> np.ndarray:
        """The whitened cross block A of one chunk (see :meth:`whitener`); shape (n_i, M)."""
        with single_threaded_blas():
            return self.whitener(z, W, kernel=kernel, factor=factor)(x)

    def whitened_residual_diag(self, x: np.ndarray, z: np.ndarray, W: np.ndarray, *,
                               kernel: Kernel, factor: Factor = "cholesky",
                               tile: int | None = None) -> np.ndarray:
        """``k(xᵢ, xᵢ) − ‖Aᵢ‖²`` tile by tile (not clipped); shape (n_i,), float64."""
        rows = tile or default_rows(len(z))
        whiten = self.whitener(z, W, kernel=kernel, factor=factor)
        out = np.empty(len(x))
        with single_threaded_blas():
            for i0 in range(0, len(x), rows):
                xt = x[i0:i0 + rows].astype(np.float64, copy=False)
                prior = self.kernel_diag(xt, kernel=kernel)  # type: ignore[attr-defined]
                out[i0:i0 + rows] = residual_diag(prior, whiten(xt))
        return out

    def leverage(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel, Linv: np.ndarray,
                 alpha: float, tile: int | None = None) -> np.ndarray:
        """Ridge leverage estimates ``(k_ii − ‖L⁻¹ k(Z, x_i)‖²) / α`` (BLESS Eq. 5) for the
        rows of x against the dictionary z, given ``Linv = L⁻¹``; shape (n_i, 1), >= 1e-12."""
        out = self.whitened_residual_diag(x, z, Linv, kernel=kernel, factor="inverse",
                                          tile=tile)
        return np.maximum(out / alpha, 1e-12)[:, None]  # rounding can leave tiny negatives

    def sgpr_statistics(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, L: np.ndarray, *,
                        kernel: Kernel, tile: int) -> np.ndarray:
        """One row chunk: ``[AᵀA, Aᵀy]`` with ``A = k(x, z) L⁻ᵀ``; shape (M, M + t).

        Only the lower triangle of ``AᵀA`` is summed (BLAS syrk, in place: half the flops
        of a product, no M × M temporary per tile); the caller mirrors it.
        """
        M = len(z)
        gram = np.zeros((M, M), order="F")
        Ay = np.zeros((M, y.shape[1]))
        whiten = self.whitener(z, L, kernel=kernel, factor="cholesky")
        with single_threaded_blas():
            for i0 in range(0, len(x), tile):
                A = whiten(x[i0:i0 + tile]).T  # shape: (M, tile)
                gram = blas.dsyrk(1.0, A, beta=1.0, c=gram, lower=1, overwrite_c=1)
                Ay += A @ y[i0:i0 + tile]
        return np.hstack([gram, Ay])

    def sgpr_predict(self, x: np.ndarray, z: np.ndarray, L: np.ndarray, LB: np.ndarray,
                     c: np.ndarray, *, kernel: Kernel, tile: int) -> np.ndarray:
        """One test chunk: SGPR ``[mean, latent variance]`` from the factors L and L_B
        (M × M) and c (M × t); shape (n_i, t + 1). See :mod:`dkern.solvers.sgpr`."""
        whiten = self.whitener(z, L, kernel=kernel, factor="cholesky")
        out = np.empty((len(x), c.shape[1] + 1))
        with single_threaded_blas():
            for i0 in range(0, len(x), tile):
                xt = x[i0:i0 + tile]
                a = whiten(xt)  # shape: (tile, M)
                aB = sla.solve_triangular(LB, a.T, lower=True, check_finite=False)
                prior = self.kernel_diag(xt, kernel=kernel)  # type: ignore[attr-defined]
                nystrom_gap = np.maximum(residual_diag(prior, a), 0.0)
                out[i0:i0 + tile, :-1] = aB.T @ c
                out[i0:i0 + tile, -1] = np.minimum(
                    nystrom_gap + np.einsum("ij,ij->j", aB, aB), prior)
        return out

    def sgpr_gradient(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, knu: np.ndarray,
                      ky: np.ndarray, *, kernel: Kernel, gradient: Callable[..., np.ndarray],
                      p: int, tile: int) -> np.ndarray:
        """One row chunk: ``Σᵢ G[i, m] ∂k(xᵢ, z_m)/∂θ`` per centre m, ``tile`` rows at a time,
        with ``G = k(x, z) knu + y kyᵀ`` (knu (M, M), ky (M, t)); shape (M, p)."""
        out = np.zeros((len(z), p))
        with single_threaded_blas():
            for i0 in range(0, len(x), tile):
                x_t, y_t = x[i0:i0 + tile], y[i0:i0 + tile]
                G = kernel(x_t, z) @ knu + y_t @ ky.T  # shape: (tile, M)
                out += np.einsum("nm,nmp->mp", G, gradient(x_t, z))
        return out

    def kernel_grad_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                           kernel: Kernel, tile: int | None = None) -> np.ndarray:
        """``∂k(x, z)/∂θ_p @ v`` for every log-hyperparameter p (``kernel.theta``'s order).

        Parameters
        ----------
        x : ndarray of shape (n_i, d)
        z : ndarray of shape (m, d)
        v : ndarray of shape (m, t)
        tile : int, optional
            Rows per tile of the (tile × m × p) derivative block; default about 4 MiB.

        Returns
        -------
        ndarray of shape (n_i, t, p), float64
        """
        p = len(kernel.theta)
        rows = tile or max(1, TILE_BYTES // (8 * max(1, len(z)) * max(1, p)))
        out = np.empty((len(x), v.shape[1], p))
        with single_threaded_blas():
            for i0 in range(0, len(x), rows):
                dK = kernel.gradient(x[i0:i0 + rows], z)  # shape: (tile, m, p)
                out[i0:i0 + rows] = np.einsum("nmp,mt->ntp", dK, v)
        return out


class FusedProjections(ProjectionBlocks):
    """The whitened cross block and the dense kernel columns from the backend's fused
    ``kernel_matvec`` (KeOps' Sum reduction, Triton's fused product): kernel values are
    never stored.

    ``A = k(x, z) L⁻ᵀ`` is ``kernel_matvec(x, z, L⁻ᵀ)``: the right-hand side is the M
    columns of ``L⁻ᵀ`` (``L⁻¹`` formed once per task, O(M³) beside the task's O(n_i M²)),
    padded with zero columns to a power of two so that few kernels are compiled.
    """

    def kernel_columns(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """``k(x, z)`` by reductions against ``KEOPS_COLUMN_TILE`` columns of the identity at
        a time: each kernel value is computed once; shape (n_i, m), float64."""
        b = KEOPS_COLUMN_TILE
        out = np.empty((len(x), len(z)))
        for j0 in range(0, len(z), b):
            zt = z[j0:j0 + b]
            ident = np.eye(len(zt), b)  # zero columns pad the last tile to width b
            out[:, j0:j0 + len(zt)] = self.kernel_matvec(  # type: ignore[attr-defined]
                x, zt, ident, kernel=kernel)[:, :len(zt)]
        return out

    def whitener(self, z: np.ndarray, W: np.ndarray, *, kernel: Kernel,
                 factor: Factor) -> Whitener:
        M = len(z)
        inverse = (sla.solve_triangular(W, np.eye(M), lower=True) if factor == "cholesky"
                   else W)
        V = np.zeros((M, _padded_width(M)))
        V[:, :M] = inverse.T
        return lambda x: self.kernel_matvec(x, z, V, kernel=kernel)[:, :M]  # type: ignore


class KeopsProjections(FusedProjections):
    """:class:`FusedProjections` by KeOps; the θ-derivative passes are numpy's, logged."""

    def sgpr_gradient(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, knu: np.ndarray,
                      ky: np.ndarray, *, kernel: Kernel, gradient: Callable[..., np.ndarray],
                      p: int, tile: int) -> np.ndarray:
        log_fallback("the SGPR bound gradient", _NO_GRADIENT_FORMULA)
        return super().sgpr_gradient(x, z, y, knu, ky, kernel=kernel, gradient=gradient, p=p,
                                     tile=tile)

    def kernel_grad_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                           kernel: Kernel, tile: int | None = None) -> np.ndarray:
        log_fallback("kernel_grad_matvec (∂K/∂θ · V)", _NO_GRADIENT_FORMULA)
        return super().kernel_grad_matvec(x, z, v, kernel=kernel, tile=tile)


_NO_GRADIENT_FORMULA = ("dkern's kernels give no KeOps formula of ∂k/∂θ (Kernel.keops_formula "
                        "is k only)")


def _padded_width(M: int) -> int:
    """The smallest power of two >= max(M, 16): the width of KeOps' right-hand sides."""
    return max(16, 1 << (int(M) - 1).bit_length())
