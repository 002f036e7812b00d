"""The block functions a backend provides: all an operator computes on one chunk pair.

An operator (:mod:`dkern.operators`) walks the (row chunk × column chunk) grid
and combines partial results; what happens inside one pair is a method of a
backend object, so operators never know which backend they hold:

================================  ==================================  ================
method                             computes (x: n_i × d, z: m_j × d)   shape
================================  ==================================  ================
``kernel_matvec(x, z, v)``         ``k(x, z) @ v``                     (n_i, t)
``normal_matvec(x, c, v)``         ``k(x, c)ᵀ (k(x, c) @ v)``          (M, t)
``kernel_block(x, z)``             ``k(x, z)``, dense (small m only)   (n_i, m_j)
``kernel_diag(x)``                 ``k(x_i, x_i)``                     (n_i,)
``weighted_log_sums(x, z, t)``     log-scaled ``Σ k``, ``Σ k t``       (n_i, 2 + T)
``nearest(x, z, limit, index)``    k nearest (distance², index)        2 × (n_i, k)
``whitened_cross(x, z, W)``        ``A = k(x, z) L⁻ᵀ``                 (n_i, M)
``whitened_residual_diag(…)``      ``k(x, x) − ‖A_i‖²``                (n_i,)
``leverage``, ``sgpr_*``,          built on A, and ``∂k/∂θ @ v``       see
``kernel_columns``,                                                    :mod:`.projections`
``kernel_grad_matvec``
================================  ==================================  ================

:class:`BlockBackend` is the Protocol every backend implements; :class:`NumpyBlocks`
(cache-sized BLAS tiles, and a fused C loop for a Gaussian's products and smoothing sums:
:mod:`.fused_cpu`), :class:`KeopsBlocks` (KeOps ``Sum``,
``Max_SumShiftExpWeight`` and ``KMin_ArgKMin`` reductions) and :class:`TritonBlocks`
(fused Triton products) do; the projection methods come
from :mod:`.projections`' mixins. Data blocks are
positional and the kernel a keyword, as
:func:`~dkern.operators.pairwise.pairwise_reduce` calls block functions.
Reductions come back in float64 whatever the input precision (neighbour indices
in int64); dense blocks and diagonals keep x's dtype. Every method runs BLAS
single-threaded: dask runs tasks side by side, one per core. Kernels refuse values
that overflow (:func:`dkern.kernels.base.finite_values`); the products here are
checked too (a pass over their small output), as a sum of finite kernel values may
still overflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from ..kernels import Kernel
from ..kernels.base import finite_values
from .keops_backend import (
    keops_log_form_missing,
    log_fallback_once,
    log_sums_block_keops,
    matvec_block_keops,
    nearest_block_keops,
)
from .neighbors import nearest_block
from .numpy_backend import matvec_block_numpy, single_threaded_blas
from .nystrom_normal import normal_matvec_block_keops, normal_matvec_block_numpy
from .projections import Factor, FusedProjections, KeopsProjections, ProjectionBlocks
from .smoothing import weighted_log_sums_block
from .triton_backend import (
    NoTritonSource,
    grad_matvec_block_triton,
    log_sums_block_triton,
    matvec_block_triton,
    nearest_block_triton,
    pair_weighted_grads_triton,
    sgpr_predict_triton,
    sgpr_statistics_triton,
)

__all__ = ["BlockBackend", "KeopsBlocks", "NumpyBlocks", "TritonBlocks", "block_backend"]


@runtime_checkable
class BlockBackend(Protocol):
    """The block functions of one backend: all an operator computes on one chunk pair."""

    name: str

    def kernel_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        """``kernel(x, z) @ v`` for x (n, d), z (m, d), v (m, t); shape (n, t), float64."""
        ...

    def normal_matvec(self, x: np.ndarray, c: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        """``kernel(x, c)ᵀ (kernel(x, c) @ v)`` for x (n, d), c (M, d), v (M, t); shape
        (M, t), float64."""
        ...

    def kernel_block(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """The dense block ``kernel(x, z)`` for x (n, d), z (m, d); shape (n, m), x's dtype."""
        ...

    def kernel_diag(self, x: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """``kernel(x_i, x_i)`` for x (n, d); shape (n,), x's dtype."""
        ...

    def weighted_log_sums(self, x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                          kernel: Kernel | None = None, box_width: float | None = None,
                          scale: float = 1.0) -> np.ndarray:
        """``[m, s₀, s₁ … s_T]`` per row of x (n, d) over z (m, d) and t (m, T):
        ``Σ k = e^m s₀``, ``Σ k tⱼ = e^m sⱼ``; shape (n, 2 + T), float64
        (:func:`dkern.backends.smoothing.weighted_log_sums_block`)."""
        ...

    def nearest(self, x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray, *,
                k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest rows of z (m, d) to each row of x (n, d) within ``limit`` (n, 1),
        as (squared distances (n, k) float64, indices ``index[j]`` (n, k) int64); ties
        to the lower index (:func:`dkern.backends.neighbors.nearest_block`)."""
        ...

    def kernel_columns(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """``k(x, z)`` as a dense float64 block for x (n, d), z (m, d); shape (n, m)."""
        ...

    def whitened_cross(self, x: np.ndarray, z: np.ndarray, W: np.ndarray, *, kernel: Kernel,
                       factor: Factor = "cholesky") -> np.ndarray:
        """``A = k(x, z) L⁻ᵀ`` (W = L, lower) or ``k(x, z) Wᵀ``; shape (n, M), float64."""
        ...

    def whitened_residual_diag(self, x: np.ndarray, z: np.ndarray, W: np.ndarray, *,
                               kernel: Kernel, factor: Factor = "cholesky",
                               tile: int | None = None) -> np.ndarray:
        """``k(xᵢ, xᵢ) − ‖Aᵢ‖²`` for x (n, d); shape (n,), float64."""
        ...

    def leverage(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel, Linv: np.ndarray,
                 alpha: float, tile: int | None = None) -> np.ndarray:
        """Ridge leverage estimates of x's rows against the dictionary z; shape (n, 1)."""
        ...

    def sgpr_statistics(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, L: np.ndarray, *,
                        kernel: Kernel, tile: int) -> np.ndarray:
        """``[AᵀA (lower), Aᵀy]`` for x (n, d), y (n, t); shape (M, M + t), float64."""
        ...

    def sgpr_predict(self, x: np.ndarray, z: np.ndarray, L: np.ndarray, LB: np.ndarray,
                     c: np.ndarray, *, kernel: Kernel, tile: int) -> np.ndarray:
        """SGPR ``[mean, latent variance]`` at x (n, d); shape (n, t + 1), float64."""
        ...

    def sgpr_gradient(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, knu: np.ndarray,
                      ky: np.ndarray, *, kernel: Kernel, gradient: Callable[..., np.ndarray],
                      p: int, tile: int) -> np.ndarray:
        """``Σᵢ G[i, m] ∂k(xᵢ, z_m)/∂θ`` per centre m, ``G = k(x, z) knu + y kyᵀ``; shape
        (M, p), float64."""
        ...

    def kernel_grad_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                           kernel: Kernel, tile: int | None = None) -> np.ndarray:
        """``∂k(x, z)/∂θ_p @ v`` for x (n, d), z (m, d), v (m, t); shape (n, t, p)."""
        ...


class NumpyBlocks(ProjectionBlocks):
    """Cache-sized tiles of kernel values, each folded into the result by one BLAS call;
    a ``c * Gaussian``'s products and a Gaussian's smoothing sums on few features by the
    fused C loop instead, where it is built (:mod:`.fused_cpu`, ``dkern info``)."""

    name = "numpy"

    def kernel_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        """``kernel(x, z) @ v``; shape (n_i, t), float64."""
        return finite_values(matvec_block_numpy(kernel, x, z, v), kernel, x, z, v)

    def normal_matvec(self, x: np.ndarray, c: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        """``kernel(x, c)ᵀ (kernel(x, c) @ v)``; shape (M, t), float64."""
        return finite_values(normal_matvec_block_numpy(kernel, x, c, v), kernel, x, c, v)

    def kernel_block(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """The dense block ``kernel(x, z)``; shape (n_i, m_j), x's dtype."""
        with single_threaded_blas():
            return np.asarray(kernel(x, z), dtype=x.dtype)

    def kernel_diag(self, x: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """``kernel(x_i, x_i)`` for each row; shape (n_i,), x's dtype."""
        return np.asarray(kernel.diag(x), dtype=x.dtype)

    def weighted_log_sums(self, x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                          kernel: Kernel | None = None, box_width: float | None = None,
                          scale: float = 1.0) -> np.ndarray:
        """Log-scaled kernel sums by tiles of log weights; shape (n, 2 + T), float64."""
        return weighted_log_sums_block(x, z, t, kernel=kernel, box_width=box_width,
                                       scale=scale)

    def nearest(self, x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray, *,
                k: int) -> tuple[np.ndarray, np.ndarray]:
        """k nearest by candidate tiles, then exact distances; 2 × (n, k)."""
        return nearest_block(x, z, limit, index, k=k)


class KeopsBlocks(KeopsProjections, NumpyBlocks):
    """KeOps reductions for the products, smoothing sums, neighbours and the whitened
    projections; dense blocks and diagonals as numpy's.

    KeOps streams kernel values through registers and never stores a block, so
    what must be stored (a dense block, a diagonal) is the numpy backend's work.
    Smoothing sums of a kernel without a KeOps log form (the box, non-Gaussian
    kernels: :func:`~dkern.backends.keops_backend.keops_log_form_missing`) are
    numpy's too, logged once per process.
    """

    name = "keops"

    def kernel_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        return finite_values(matvec_block_keops(kernel, x, z, v), kernel, x, z, v)

    def normal_matvec(self, x: np.ndarray, c: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        return finite_values(normal_matvec_block_keops(kernel, x, c, v), kernel, x, c, v)

    def weighted_log_sums(self, x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                          kernel: Kernel | None = None, box_width: float | None = None,
                          scale: float = 1.0) -> np.ndarray:
        reason = keops_log_form_missing(kernel, box_width)
        if reason is None:
            return log_sums_block_keops(x, z, t, kernel=kernel, scale=scale)
        log_fallback_once("kernel smoothing sums (KernelDensity, NadarayaWatson)", reason)
        return super().weighted_log_sums(x, z, t, kernel=kernel, box_width=box_width,
                                         scale=scale)

    def nearest(self, x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray, *,
                k: int) -> tuple[np.ndarray, np.ndarray]:
        return nearest_block_keops(x, z, limit, index, k=k)

class TritonBlocks(FusedProjections, NumpyBlocks):
    """Fused Triton kernels for the kernel products (Gram and Nyström normal matvecs), the
    kernel derivative products ``∂K/∂θ V`` of GP learning, a Gaussian's smoothing sums (an
    online log-sum-exp), the k nearest neighbours (a running top-k in registers), and the
    whitened cross blocks of the sparse GP and leverage scores (as products with
    ``L⁻ᵀ``, :class:`~dkern.backends.projections.FusedProjections`; the sparse GP's sums and
    predictions keep them on the device for their M × M work) and the SGPR bound's
    gradient. A kernel Triton cannot express (:mod:`.triton_source`) and a smoothing
    kernel without a log form run numpy's blocks, logged once per process; dense blocks
    and diagonals are numpy's by design, as under KeOps.
    """

    name = "triton"

    def kernel_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        try:
            out = matvec_block_triton(kernel, x, z, v)
        except NoTritonSource as why:
            log_fallback_once("kernel products", str(why), backend="triton")
            return super().kernel_matvec(x, z, v, kernel=kernel)
        return finite_values(out, kernel, x, z, v, computed_in=np.result_type(x, z))

    def normal_matvec(self, x: np.ndarray, c: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        # k(c, x) = k(x, c)ᵀ: the kernels are symmetric, so two fused products make it
        inner = self.kernel_matvec(x, c, v, kernel=kernel)
        return self.kernel_matvec(c, x, inner, kernel=kernel)

    def weighted_log_sums(self, x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                          kernel: Kernel | None = None, box_width: float | None = None,
                          scale: float = 1.0) -> np.ndarray:
        reason = keops_log_form_missing(kernel, box_width)  # the same one form: a Gaussian
        if reason is None:
            return log_sums_block_triton(x, z, t, kernel=kernel, scale=scale)
        log_fallback_once("kernel smoothing sums (KernelDensity, NadarayaWatson)",
                          reason.replace("KeOps", "fused"), backend="triton")
        return super().weighted_log_sums(x, z, t, kernel=kernel, box_width=box_width,
                                         scale=scale)

    def nearest(self, x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray, *,
                k: int) -> tuple[np.ndarray, np.ndarray]:
        return nearest_block_triton(x, z, limit, index, k=k)

    def sgpr_statistics(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, L: np.ndarray, *,
                        kernel: Kernel, tile: int) -> np.ndarray:
        """``[AᵀA, Aᵀy]`` of one row chunk with A and its sums on the device
        (:func:`~dkern.backends.triton_backend.sgpr_statistics_triton`); ``tile``, sized for
        the host's BLAS, is used only where a kernel Triton cannot express takes the
        fused-product path on the host."""
        try:
            out = sgpr_statistics_triton(kernel, x, z, y, L)
        except NoTritonSource as why:
            log_fallback_once("sparse GP statistics", str(why), backend="triton")
            return super().sgpr_statistics(x, z, y, L, kernel=kernel, tile=tile)
        return finite_values(out, kernel, x, z, y, computed_in=np.result_type(x, z))

    def sgpr_predict(self, x: np.ndarray, z: np.ndarray, L: np.ndarray, LB: np.ndarray,
                     c: np.ndarray, *, kernel: Kernel, tile: int) -> np.ndarray:
        """SGPR ``[mean, latent variance]`` of one test chunk, on the device
        (:func:`~dkern.backends.triton_backend.sgpr_predict_triton`); ``tile`` as in
        :meth:`sgpr_statistics`."""
        try:
            out = sgpr_predict_triton(kernel, x, z, L, LB, c, self.kernel_diag(x, kernel=kernel))
        except NoTritonSource as why:
            log_fallback_once("sparse GP predictions", str(why), backend="triton")
            return super().sgpr_predict(x, z, L, LB, c, kernel=kernel, tile=tile)
        return finite_values(out, kernel, x, z, computed_in=np.result_type(x, z))

    def sgpr_gradient(self, x: np.ndarray, z: np.ndarray, y: np.ndarray, knu: np.ndarray,
                      ky: np.ndarray, *, kernel: Kernel, gradient: Callable[..., np.ndarray],
                      p: int, tile: int) -> np.ndarray:
        """``Σᵢ G[i, m] ∂k(xᵢ, z_m)/∂θ`` with ``G = k(x, z) knu + y kyᵀ`` (fused products),
        ``tile`` rows at a time; shape (M, p). ``gradient`` must be ``kernel.gradient``
        (what the solver passes); a kernel Triton cannot express takes numpy's block."""
        out = np.zeros((len(z), p))
        try:
            for i0 in range(0, len(x), tile):
                x_t = x[i0:i0 + tile]
                G = self.kernel_matvec(x_t, z, knu, kernel=kernel) + y[i0:i0 + tile] @ ky.T
                out += pair_weighted_grads_triton(kernel, z, x_t, G)
        except NoTritonSource as why:
            log_fallback_once("sparse GP bound gradients", str(why), backend="triton")
            return super().sgpr_gradient(x, z, y, knu, ky, kernel=kernel, gradient=gradient,
                                         p=p, tile=tile)
        return finite_values(out, kernel, x, z, computed_in=np.result_type(x, z))

    def kernel_grad_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                           kernel: Kernel, tile: int | None = None) -> np.ndarray:
        try:
            out = grad_matvec_block_triton(kernel, x, z, v)
        except NoTritonSource as why:
            log_fallback_once("kernel derivative products", str(why), backend="triton")
            return super().kernel_grad_matvec(x, z, v, kernel=kernel, tile=tile)
        return finite_values(out, kernel, x, z, v, computed_in=np.result_type(x, z))


_BLOCKS: dict[str, BlockBackend] = {"numpy": NumpyBlocks(), "keops": KeopsBlocks(),
                                    "triton": TritonBlocks()}


def block_backend(name: str) -> BlockBackend:
    """The block functions of a concrete backend (``"numpy"``, ``"keops"`` or
    ``"triton"``), as returned by :func:`~dkern.backends.resolve_backend`."""
    try:
        return _BLOCKS[name]
    except KeyError:
        raise ValueError(f"block_backend takes a concrete backend, {sorted(_BLOCKS)}; got "
                         f"{name!r}. Resolve 'auto' with resolve_backend first.") from None
