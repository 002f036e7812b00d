"""``∂K/∂θ · V`` for every hyperparameter at once, as one product with K where that is exact.

For ``K = c · Gaussian(ℓ)`` (ARD or not; plus White terms, whose blocks are zero)::

    ∂K/∂log c = K,        ∂K/∂log ℓ_d = K ∘ D_d,     D_d[i, j] = (x_id − x_jd)² / ℓ_d²,

and ``(K ∘ D_d) V = (x_d² ∘ K V − 2 x_d ∘ K (x_d ∘ V) + K (x_d² ∘ V)) / ℓ_d²``: every
derivative product is a product with K itself, so one product with ``(2d + 1) t`` columns
gives all of them: BLAS on K's cached blocks, or on its tiles computed once more, instead of
a (tile × m × p) derivative block per tile (at n = 100,000 with 10 hyperparameters that
pass did not finish in 11 minutes, benchmarks/RESULTS.md). The expansion cancels when
``|x_d|`` dwarfs ℓ_d, so X is centred first and
the expansion is used only while ``(max |x_d| / ℓ_d)²`` stays below ``EXPANSION_LIMIT``;
any other kernel or data goes through the backend's ``kernel_grad_matvec`` blocks
(:meth:`~dkern.operators.gram.GramOperator.gradient_matvec`).
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np

from ..kernels import Kernel
from ..kernels.forms import GaussianForm, gaussian_form
from .gram import GramOperator, gram

#: Largest ``(|x_d| / ℓ_d)²`` of the centred data for which the expanded products are used:
#: their rounding error is this times the float64 epsilon relative to ``|K V|`` (< 1e-12).
EXPANSION_LIMIT = 1e4


def gram_gradient_products(kernel: Kernel, X: Any, V: da.Array, *, backend: str,
                           cached: GramOperator | None = None) -> da.Array:
    """``∂K/∂θ_p V`` for every log-hyperparameter p of ``kernel``; shape (n, t, p), lazy.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
    V : dask.array.Array of shape (n, t)
    backend : {"auto", "numpy", "keops", "triton"}
    cached : GramOperator, optional
        ``gram(kernel.without_white(), X)`` with its blocks cached: the expanded products
        (module docstring) use it when the kernel is ``c · Gaussian`` (+ White); without
        it they compute K's tiles once more.
    """
    form = gaussian_form(kernel, X.shape[1])
    if form is not None:
        K = cached if cached is not None and cached.cached is not None else gram(
            kernel.without_white(), X, backend=backend, dtype=np.float64)
        Xc = K.X - K.X.mean(axis=0)
        (reach,) = dask.compute((abs(Xc).max(axis=0) / form.lengthscale) ** 2)
        if reach.max() <= EXPANSION_LIMIT:
            return _expanded_products(K, Xc, V, form, len(kernel.theta))
    return gram(kernel, X, backend=backend, dtype=np.float64).gradient_matvec(V)


def _expanded_products(K: GramOperator, Xc: da.Array, V: da.Array, form: GaussianForm,
                       p: int) -> da.Array:
    """The module docstring's expansion: one cached product with ``(2d + 1) t`` columns."""
    n, t = V.shape
    V = V.rechunk((K.col_chunks, -1))
    Xc = Xc.rechunk((K.col_chunks, -1))
    d = Xc.shape[1]
    columns = [V] + [Xc[:, k:k + 1] * V for k in range(d)] + [Xc[:, k:k + 1] ** 2 * V
                                                             for k in range(d)]
    KW = K @ da.concatenate(columns, axis=1)  # shape: (n, (2d + 1) t)
    KV = KW[:, :t]
    per_feature = [(Xc[:, k:k + 1] ** 2 * KV - 2 * Xc[:, k:k + 1] * KW[:, t * (1 + k):t * (2 + k)]
                    + KW[:, t * (1 + d + k):t * (2 + d + k)]) / form.lengthscale[k] ** 2
                   for k in range(d)]  # (K ∘ D_k) V, each (n, t)
    out = [da.zeros((n, t), chunks=KV.chunks)] * p
    if form.constant_index is not None:
        out[form.constant_index] = KV
    if len(form.lengthscale_index) == 1:  # one ℓ shared by every feature
        out[form.lengthscale_index[0]] = sum(per_feature[1:], per_feature[0])
    elif form.lengthscale_index:
        for index, term in zip(form.lengthscale_index, per_feature, strict=True):
            out[index] = term
    return da.stack(out, axis=2)
