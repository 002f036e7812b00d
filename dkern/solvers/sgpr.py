"""Sparse GP regression: Titsias' (2009) collapsed variational bound, its gradient and predictive.

M inducing points ``Z`` (the centres) and noise variance ``s = σ²``. With
``K_uu = k(Z, Z) + εI`` (ε: a small jitter), ``Q_nn = K_nu K_uu⁻¹ K_un``, the
bound on the log marginal likelihood is

.. math:: F = \\log \\mathcal N(y \\mid 0, Q_{nn} + s I)
              - \\frac{1}{2s} \\operatorname{tr}(K_{nn} - Q_{nn}) \\le \\log p(y),

equal to ``log p(y)`` when Z is all of X. Everything F needs of the n rows is
four sums, gathered in ONE pass over X's row chunks (:func:`sgpr_statistics`)
and whitened by ``L = chol(K_uu)`` per tile as GPflow's ``SGPR`` does (forming
``K_un K_nu`` first would square K_uu's condition number):

.. math:: P = L^{-1} K_{un} K_{nu} L^{-\\top}, \\quad b = L^{-1} K_{un} y, \\quad
          y^\\top y, \\quad \\textstyle\\sum_i k(x_i, x_i).

Only M-sized results reach the client, and none depends on s. The per-chunk work of
every pass (statistics, gradient, prediction) is a method of the block backend
(:mod:`dkern.backends.projections`): numpy forms ``L⁻¹ K_un`` by tiles and a triangular
solve, KeOps by one Sum reduction against ``L⁻ᵀ``. Then, with
``B = I + P/s = L_B L_Bᵀ`` and ``c = L_B⁻¹ b / s``:

.. math:: F = -\\tfrac{n}{2}\\log 2\\pi s - \\textstyle\\sum \\log \\mathrm{diag}\\, L_B
              - \\frac{y^\\top y}{2s} + \\frac{\\|c\\|^2}{2}
              - \\frac{\\sum_i k(x_i, x_i) - \\operatorname{tr} P}{2s}.

The predictive is the SGPR (Titsias) posterior ``q(f*)``, not the naive
Nyström covariance: with ``a = L⁻¹ k_u(x*)`` and ``a_B = L_B⁻¹ a``,

.. math:: m(x_*) = a_B^\\top c, \\qquad
          v(x_*) = \\underbrace{k(x_*, x_*) - \\|a\\|^2}_{\\ge 0} + \\|a_B\\|^2,

a latent variance in ``[0, k(x*, x*)]`` (``‖a_B‖ <= ‖a‖`` since B ≽ I); both
terms are clipped for rounding. With Z = X both equal the exact GP's.
Several targets (y of shape (n, t)) share the kernel: F is the sum over columns,
as scikit-learn sums its log marginal likelihood.

A kernel with :class:`~dkern.kernels.White` terms (scikit-learn's ``WhiteKernel``) puts
its noise in s: ``s = sigma2 + kernel.white_noise()`` (:func:`total_noise`), while
``K_uu``, ``K_nu`` and the trace ``Σ k(xᵢ, xᵢ)`` are those of the noise-free kernel.
The gradient in θ then includes ``∂F/∂s · ∂s/∂θ``, so the bound learns the noise; the
predictive variance includes it, as scikit-learn's ``kernel_.diag(X*)`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla
from dask.base import tokenize

from ..backends import block_backend, resolve_backend
from ..backends.numpy_backend import TILE_BYTES
from ..errors import NotPositiveDefiniteError
from ..io import as_rows
from ..kernels import Kernel, check_n_features
from ..operators import GramOperator, data_rows, pairwise_reduce, pairwise_rows
from ._checks import positive_number

logger = logging.getLogger(__name__)

#: Bytes of one tile of ``L⁻¹ k(Z, x)`` in the statistics and prediction passes.
WHITENING_TILE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class SGPRStatistics:
    """The M-sized sums of one pass over the data (:func:`sgpr_statistics`).

    Attributes
    ----------
    kernel : Kernel
    centers : ndarray of shape (M, d)
        The inducing points Z.
    L : ndarray of shape (M, M)
        Lower Cholesky factor of ``k(Z, Z) + jitter·I``.
    P : ndarray of shape (M, M)
        ``L⁻¹ K_un K_nu L⁻ᵀ``.
    b : ndarray of shape (M, t)
        ``L⁻¹ K_un y``.
    yty : ndarray of shape (t,)
        ``yᵀy`` per target column.
    trace : float
        ``Σᵢ k(xᵢ, xᵢ)``, White noise excluded.
    n : int
        Training rows.
    jitter : float
        The relative jitter: ``jitter · mean(k(z, z))`` was added to K_uu's diagonal.
    """

    kernel: Kernel
    centers: np.ndarray
    L: np.ndarray
    P: np.ndarray
    b: np.ndarray
    yty: np.ndarray
    trace: float
    n: int
    jitter: float


def sgpr_statistics(kernel: Kernel, X: Any, y: Any, centers: Any, *,
                    jitter: float = 1e-6, backend: str = "auto") -> SGPRStatistics:
    """One pass over X's row chunks: the sums the SGPR bound and predictive need.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
        numpy, dask, Zarr or ``(url, path)``; read once.
    y : array-like of shape (n,) or (n, t)
        Targets, chunked like X's rows (rechunked otherwise).
    centers : ndarray of shape (M, d)
        The inducing points Z, e.g. from :func:`dkern.solvers.select_centers`.
    jitter : float, default=1e-6
        Added to K_uu's diagonal, relative to the mean of ``k(z, z)``, so its
        Cholesky factor exists when centres nearly coincide.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the whitened blocks ``k(x, Z) L⁻ᵀ`` are computed
        (:meth:`~dkern.backends.projections.ProjectionBlocks.sgpr_statistics`).

    Returns
    -------
    SGPRStatistics
    """
    Xd, Yd, Z = _inputs(kernel, X, y, centers)
    concrete = resolve_backend(backend)
    jitter = positive_number(jitter, "jitter", ", e.g. 1e-6 (relative to k(z, z))")
    L = _kuu_factor(kernel, Z, jitter)
    M, t = len(Z), Yd.shape[1]
    sums = pairwise_reduce(block_backend(concrete).sgpr_statistics, Xd, _centres(Z),
                           [(Yd, "rows")], over="rows", width=M + t, broadcast={"L": L},
                           name="dk-sgpr", kernel=kernel, tile=whitening_rows(M))
    trace = GramOperator(kernel, Xd, None, concrete).diag().sum(dtype=np.float64)
    sums, trace, yty = dask.compute(sums, trace, (Yd * Yd).sum(axis=0))
    trace -= Xd.shape[0] * kernel.white_noise()  # tr K_nn of the noise-free kernel
    logger.info("SGPR statistics: %d rows, %d centres, %d target column(s)", Xd.shape[0], M, t)
    return SGPRStatistics(kernel, Z, L, _mirrored(sums[:, :M]), sums[:, M:], np.asarray(yty),
                          float(trace), int(Xd.shape[0]), jitter)


def _centres(Z: np.ndarray) -> da.Array:
    """The centres as the column side of a pass summed over X's rows (its result is
    indexed by them): one chunk, named by its content as NystromOperator's centres are.
    Everything else a block needs whole (L, the predictive's factors, the gradient's
    weights) is a broadcast operand of the pass."""
    return da.from_array(Z, chunks=Z.shape, name=f"dk-centers-{tokenize(Z)}")


def whitening_rows(M: int) -> int:
    """Rows per tile of the whitening solve and the M × M update: the per-row cost is
    the same at any tile, but BLAS runs near its peak only with a few thousand
    right-hand sides (the 4 MiB kernel tiles give a few hundred at M = 2,000)."""
    return max(256, WHITENING_TILE_BYTES // (8 * M))


def _mirrored(lower: np.ndarray) -> np.ndarray:
    """The symmetric matrix whose lower triangle is ``lower``'s (exactly symmetric)."""
    tril = np.tril(lower)
    return tril + np.tril(tril, -1).T


def total_noise(kernel: Kernel, sigma2: float) -> float:
    """The noise variance ``s = sigma2 + kernel.white_noise()`` of the bound (module
    docstring); ``sigma2`` must be > 0."""
    return positive_number(sigma2, "sigma2", " (the noise variance)") + kernel.white_noise()


def sgpr_bound(stats: SGPRStatistics, sigma2: float) -> float:
    """Titsias' collapsed bound ``F <= log p(y)`` (summed over target columns), from the sums.

    Parameters
    ----------
    stats : SGPRStatistics
    sigma2 : float
        Noise variance > 0 (scikit-learn's ``alpha``), added to the kernel's White noise.

    Returns
    -------
    float
    """
    s = total_noise(stats.kernel, sigma2)
    LB, c = _noise_factor(stats, s)
    n, t = stats.n, stats.b.shape[1]
    return float(-0.5 * n * t * np.log(2 * np.pi * s) - t * np.log(np.diag(LB)).sum()
                 - 0.5 * stats.yty.sum() / s + 0.5 * (c * c).sum()
                 - 0.5 * t * (stats.trace - np.trace(stats.P)) / s)


def sgpr_noise_bound(stats: SGPRStatistics, sigma2: float) -> float:
    """The bound of the model that takes all of y as noise, the limit of F as the
    kernel's signal vanishes: ``-nt/2 · log 2πs - yᵀy / (2s)``.

    Parameters
    ----------
    stats : SGPRStatistics
    sigma2 : float
        Noise variance > 0, added to the kernel's White noise.

    Returns
    -------
    float
    """
    s = total_noise(stats.kernel, sigma2)
    n, t = stats.n, stats.b.shape[1]
    return float(-0.5 * n * t * np.log(2 * np.pi * s) - 0.5 * stats.yty.sum() / s)


def sgpr_effective_dof(stats: SGPRStatistics, sigma2: float) -> float:
    """The fit's effective degrees of freedom (MacKay's γ): how many directions of y the
    posterior mean at the training rows, ``Q_nn (Q_nn + sI)⁻¹ y``, fits rather than takes
    as noise,

    .. math:: \\gamma = \\operatorname{tr} Q_{nn} (Q_{nn} + sI)^{-1}
              = \\textstyle\\sum_i \\lambda_i / (\\lambda_i + s),

    λ the eigenvalues of P (Q_nn's nonzero ones). 0 for a kernel that explains nothing,
    about 1 for one that fits a constant, at most M.

    Parameters
    ----------
    stats : SGPRStatistics
    sigma2 : float
        Noise variance > 0, added to the kernel's White noise.

    Returns
    -------
    float
    """
    s = total_noise(stats.kernel, sigma2)
    lam = np.clip(np.linalg.eigvalsh(stats.P), 0.0, None)
    return float(np.sum(lam / (lam + s)))


def sgpr_predict(stats: SGPRStatistics, sigma2: float, X_test: Any, *,
                 backend: str = "auto") -> tuple[da.Array, da.Array]:
    """The SGPR (Titsias) predictive mean and latent variance, lazily per test chunk.

    Parameters
    ----------
    stats : SGPRStatistics
    sigma2 : float
        Noise variance > 0, added to the kernel's White noise.
    X_test : array-like of shape (n*, d)
        numpy, dask, Zarr or ``(url, path)``.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the whitened blocks ``k(x*, Z) L⁻ᵀ`` are computed.

    Returns
    -------
    mean : dask.array.Array of shape (n*,) or (n*, t), float64
        Shaped like the targets' columns.
    variance : dask.array.Array of shape (n*,), float64
        Latent (sigma2 not included), in ``[0, k(x*, x*)]``; ``k(x*, x*)`` holds the
        kernel's White noise, as scikit-learn's predictive variance does.
    """
    s = total_noise(stats.kernel, sigma2)
    LB, c = _noise_factor(stats, s)
    Xt = data_rows(X_test, name="X_test")
    Z = stats.centers
    if Xt.shape[1] != Z.shape[1]:
        raise ValueError(f"X_test must have {Z.shape[1]} features like the training data; got "
                         f"shape {Xt.shape}.")
    blocks = block_backend(resolve_backend(backend))
    t = c.shape[1]
    out = pairwise_rows(blocks.sgpr_predict, Xt.astype(np.float64), width=t + 1,
                        dtype=np.float64, name="dk-sgpr-pred", label="X_test",
                        broadcast={"z": Z, "L": stats.L, "LB": LB, "c": c},
                        kernel=stats.kernel, tile=whitening_rows(len(Z)))
    return out[:, 0] if t == 1 else out[:, :t], out[:, t]


def _noise_factor(stats: SGPRStatistics, s: float) -> tuple[np.ndarray, np.ndarray]:
    """``L_B = chol(I + P/s)`` and ``c = L_B⁻¹ b / s``."""
    LB = np.linalg.cholesky(np.eye(len(stats.P)) + stats.P / s)
    return LB, sla.solve_triangular(LB, stats.b, lower=True) / s


def _kuu_factor(kernel: Kernel, Z: np.ndarray, jitter: float) -> np.ndarray:
    """Lower Cholesky factor of ``k(Z, Z) + jitter · mean(k(z, z)) · I`` (White noise
    excluded from both: its blocks are zero, and k(z, z) is taken without it)."""
    Kuu = kernel(Z, Z).astype(np.float64)
    Kuu[np.diag_indices_from(Kuu)] += jitter * (float(np.mean(kernel.diag(Z)))
                                                - kernel.white_noise())
    try:
        return np.linalg.cholesky(Kuu)
    except np.linalg.LinAlgError:
        raise NotPositiveDefiniteError(
            f"k(Z, Z) + jitter·I is not positive definite with jitter={jitter:g} (relative to "
            "k(z, z)): the kernel is not PSD or centres nearly coincide. Raise jitter, or drop "
            "duplicate centres.") from None


def _inputs(kernel: Kernel, X: Any, y: Any, centers: Any) -> tuple[da.Array, da.Array, np.ndarray]:
    """X (float64 row chunks), y as (n, t) chunked like X, and the centres as float64 numpy."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a dkern kernel such as dkern.kernels.Gaussian(1.0); "
                        f"got {type(kernel).__name__}.")
    Xd = data_rows(X, dtype=np.float64)
    check_n_features(kernel, Xd.shape[1])
    Yd = as_rows(y, name="y", ndim=(1, 2), dtype=np.float64)
    if Yd.shape[0] != Xd.shape[0]:
        raise ValueError(f"y must have {Xd.shape[0]} rows, one per row of X; got shape "
                         f"{Yd.shape}.")
    Yd = Yd.reshape(Yd.shape[0], -1).rechunk((Xd.chunks[0], -1))
    Z = np.asarray(centers, dtype=np.float64)
    if Z.ndim != 2 or Z.shape[1] != Xd.shape[1] or len(Z) == 0 or not np.all(np.isfinite(Z)):
        raise ValueError(f"centers must be a finite array of shape (M, {Xd.shape[1]}) with "
                         f"M >= 1, to match X of shape {Xd.shape}; got shape {Z.shape}.")
    return Xd, Yd, Z


def sgpr_bound_gradient(stats: SGPRStatistics, X: Any, y: Any, sigma2: float, *,
                        backend: str = "auto") -> tuple[float, np.ndarray]:
    """The bound and its gradient in ``(θ, log σ²)``: one more pass over the data.

    ``∂F/∂θ = Σ_chunks Σ (∂F/∂K_nu) ∘ ∂K_nu/∂θ + (∂F/∂K_uu) : ∂K_uu/∂θ
    − t/(2s) Σᵢ ∂k(xᵢ, xᵢ)/∂θ``, with (Φ = K_un K_nu, α = Σ⁻¹ K_un y, Σ = K_uu + Φ/s)

    .. math:: \\frac{\\partial F}{\\partial K_{nu}} = 2 K_{nu}\\Big(\\frac{t}{2s}(K_{uu}^{-1}
              - \\Sigma^{-1}) - \\frac{\\alpha\\alpha^\\top}{2s^3}\\Big)
              + \\frac{y\\,\\alpha^\\top}{s^2}

    The row chunks' contractions with the kernel's ``gradient(x, Z)`` (∂k/∂θ in log
    space, :attr:`Kernel.theta`'s order) run on the cluster, tile by tile, and are
    summed there: nothing n × M reaches the client.

    Parameters
    ----------
    stats : SGPRStatistics
        From ``sgpr_statistics(kernel, X, y, centers)`` (the first pass).
    X, y : array-like of shape (n, d) and (n,) or (n, t)
        The same data the statistics were computed from. In an optimiser loop pass X
        as a persisted dask array: numpy input is sent to the cluster on every call.
    sigma2 : float
        Noise variance > 0, added to the kernel's White noise.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        Whose ``sgpr_gradient`` blocks run (KeOps has no ∂k/∂θ form: numpy's, logged).

    Returns
    -------
    value : float
        The bound F, as :func:`sgpr_bound`.
    grad : ndarray of shape (p + 1,)
        ``∂F/∂θ`` (p kernel log-hyperparameters, White's noise through s included) then
        ``∂F/∂ log s``.
    """
    kernel = stats.kernel
    gradient, diag_gradient = kernel.gradient, kernel.diag_gradient
    s = total_noise(kernel, sigma2)
    Xd, Yd, Z = _inputs(stats.kernel, X, y, stats.centers)
    d = _derivatives(stats, s)
    p = np.shape(diag_gradient(Z[:1]))[1]
    blocks = block_backend(resolve_backend(backend))
    per_centre = pairwise_reduce(blocks.sgpr_gradient, Xd, _centres(Z), [(Yd, "rows")],
                                 over="rows", width=p, name="dk-sgpr-gr",
                                 broadcast={"knu": d["knu"], "ky": d["ky"]}, kernel=stats.kernel,
                                 gradient=gradient, p=p, tile=_tile_rows(len(Z), p))
    diag = da.map_blocks(_diag_gradient_block, Xd, chunks=(Xd.chunks[0], (p,)),
                         dtype=np.float64, meta=np.empty((0, 0)), diag_gradient=diag_gradient)
    per_centre, diag = dask.compute(per_centre, diag.sum(axis=0))
    noise_gradient = kernel.white_noise_gradient()  # ∂s/∂θ; zeros without White
    diag -= Xd.shape[0] * noise_gradient  # the trace is the noise-free kernel's
    grad = per_centre.sum(axis=0) - d["t"] / (2 * s) * diag + _kuu_term(stats, d["kuu"],
                                                                         gradient, diag_gradient)
    if kernel.has_white:
        grad += d["log_s"] / s * noise_gradient  # ∂F/∂s · ∂s/∂θ
    return sgpr_bound(stats, sigma2), np.append(grad, d["log_s"])


def _tile_rows(M: int, p: int) -> int:
    """Rows whose derivative block (rows × M × p values) takes about TILE_BYTES."""
    return max(1, TILE_BYTES // (8 * M * max(p, 1)))


def _diag_gradient_block(x: np.ndarray, *, diag_gradient: Callable[..., np.ndarray]) -> np.ndarray:
    return np.asarray(diag_gradient(x), dtype=np.float64)


def _derivatives(stats: SGPRStatistics, s: float) -> dict[str, Any]:
    """∂F/∂K_nu's two factors, ∂F/∂K_uu and ∂F/∂log s, from the M-sized sums (module docstring)."""
    M, t = len(stats.P), stats.b.shape[1]
    LB, _ = _noise_factor(stats, s)
    Binv = sla.cho_solve((LB, True), np.eye(M))
    Linv = sla.solve_triangular(stats.L, np.eye(M), lower=True)
    Bb = Binv @ stats.b  # B⁻¹ b (whitened); α = L⁻ᵀ B⁻¹ b
    alpha = Linv.T @ Bb
    outer = alpha @ alpha.T
    inner = Linv.T @ ((np.eye(M) - Binv) @ Linv)  # K_uu⁻¹ − Σ⁻¹
    g_phi = t / (2 * s) * inner - outer / (2 * s ** 3)
    kuu = Linv.T @ ((0.5 * t * (np.eye(M) - Binv) - t / (2 * s) * stats.P) @ Linv) \
        - outer / (2 * s * s)
    dF_ds = (t / (2 * s * s) * np.trace(Binv @ stats.P) - stats.n * t / (2 * s)
             + stats.yty.sum() / (2 * s * s) - (stats.b * Bb).sum() / s ** 3
             + (Bb * (stats.P @ Bb)).sum() / (2 * s ** 4)
             + t * (stats.trace - np.trace(stats.P)) / (2 * s * s))
    return {"knu": 2 * g_phi, "ky": alpha / (s * s), "kuu": kuu, "log_s": s * dF_ds, "t": t}


def _kuu_term(stats: SGPRStatistics, dF_dkuu: np.ndarray, gradient: Any,
              diag_gradient: Any) -> np.ndarray:
    """``(∂F/∂K_uu) : ∂K_uu/∂θ`` on the client, Z's rows in tiles, with the jitter's share."""
    Z = stats.centers
    p = np.shape(diag_gradient(Z[:1]))[1]
    rows = _tile_rows(len(Z), p)
    total = np.zeros(p)
    for i0 in range(0, len(Z), rows):
        total += np.einsum("nm,nmp->p", dF_dkuu[i0:i0 + rows], gradient(Z[i0:i0 + rows], Z))
    jitter_share = stats.jitter * (np.asarray(diag_gradient(Z)).mean(axis=0)
                                   - stats.kernel.white_noise_gradient())
    return total + np.trace(dF_dkuu) * jitter_share
