"""Choosing Nyström centres: uniform rows, or rows drawn by approximate ridge leverage.

The ridge leverage score of row i, with our ``alpha`` convention, is

.. math:: \\ell_\\alpha(i) = [K (K + \\alpha I)^{-1}]_{ii}

and sampling centres ∝ ℓ covers sparse regions that uniform sampling leaves empty.
Scores are estimated BLESS-style (Rudi, Calandriello, Carratino & Rosasco 2018,
"On fast leverage score sampling and optimal learning", Alg. 1): a sequence of
small weighted dictionaries J_h at shrinking regularisation α_h, each drawn
from uniform candidates ∝ the scores the previous dictionary gives them, and
(their Eq. 5, with λn → α)

.. math:: \\tilde\\ell(i) = \\alpha^{-1}\\,(k_{ii} - K_{iJ} (K_{JJ} + \\alpha A)^{-1} K_{Ji})

with ``A = diag(m p_j / c_j)`` for m draws with probability p_j and multiplicity c_j.
The final scores of all n rows are a dask graph over X's row chunks (the dictionary
and its ``L⁻¹`` are broadcast to every task, sent once), and the centres are sampled
from them chunk-then-row, so no n-vector reaches the client.
Each score is the whitened residual diagonal ``k_ii − ‖L⁻¹ K_Ji‖²`` of the backend's
``leverage`` block (:mod:`dkern.backends.projections`).
The levels before it score at most ``POOL_MAX`` candidates against at most
``DICT_MAX`` dictionary rows (4,000 × 2,000 kernel entries, whatever n is): that
work is of the size of the M × M factors and runs where they live, on the client.

Passes over X: the level schedule α_0 > α_1 > … > alpha is fixed once the first
row is drawn, and each level's candidates are a uniform draw independent of the
scores, so the candidates of all levels are drawn up front and gathered in one
pass. The whole selection reads X's chunks at most: one chunk (the first row),
one pass (all candidates), one pass (the final scores), and the chunks holding
the M chosen rows.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ..backends import BlockBackend, block_backend, resolve_backend
from ..kernels import Kernel
from ..operators import data_rows, pairwise_rows
from ._checks import integer, positive_number
from .sampling import gather_rows, sample_distinct

logger = logging.getLogger(__name__)

#: Cap of the default ``n_centers = round(√n)`` (the M × M factors live on the client).
MAX_DEFAULT_CENTERS = 10_000
#: BLESS schedule: α shrinks by this factor per level; dictionaries hold ≈ OVERSAMPLE · d_eff rows.
SHRINK, OVERSAMPLE = 4.0, 4.0
#: Largest dictionary and candidate pool (client-side, small).
DICT_MAX, POOL_MAX = 2_000, 4_000


def select_centers(X: Any, n_centers: int | None = None, *, method: str = "uniform",
                   kernel: Kernel | None = None, alpha: float | None = None,
                   random_state: Any = None, backend: str = "auto") -> np.ndarray:
    """Pick M distinct rows of X as Nyström centres.

    Parameters
    ----------
    X : array-like of shape (n, d)
        numpy, dask or Zarr; only the chosen rows are read (for leverage also: one row,
        the candidate rows of every level in one pass, and one pass for the scores).
    n_centers : int, optional
        M, 1 <= M <= n. Default ``round(√n)``, at most ``MAX_DEFAULT_CENTERS`` (10 000).
    method : {"uniform", "leverage"}, default="uniform"
        Uniform without replacement, or ∝ approximate ridge leverage scores (BLESS).
    kernel : Kernel, optional
        Required for ``method="leverage"``.
    alpha : float, optional
        The ridge penalty of the problem (> 0); required for ``method="leverage"``.
    random_state : int or numpy.random.Generator, optional
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the leverage scores' whitened blocks ``k(x, J) L⁻ᵀ`` are computed
        (:meth:`~dkern.backends.projections.ProjectionBlocks.leverage`), on the
        dictionary levels and in the pass over X.

    Returns
    -------
    ndarray of shape (M, d)
    """
    Xd = data_rows(X)
    n = Xd.shape[0]
    M = min(max(1, round(math.sqrt(n))), MAX_DEFAULT_CENTERS) if n_centers is None else integer(
        n_centers, "n_centers", high=n,
        hint=f" Centres are distinct rows of X: use n_centers <= n = {n}.")
    if method not in ("uniform", "leverage"):
        raise ValueError(f"method must be 'uniform' or 'leverage'; got {method!r}.")
    blocks = block_backend(resolve_backend(backend))
    rng = np.random.default_rng(random_state)
    if method == "uniform":
        return gather_rows(Xd, np.sort(rng.choice(n, size=M, replace=False)))
    if not isinstance(kernel, Kernel):
        raise ValueError(f"method='leverage' needs kernel=, a dkern kernel; got {kernel!r}.")
    if alpha is None:
        raise ValueError("method='leverage' needs alpha > 0, the ridge penalty of the problem "
                         "the centres are for; got None.")
    alpha = positive_number(alpha, "alpha", " (the ridge penalty of the problem)")
    Z, Linv = _bless_dictionary(kernel, Xd, alpha, rng, blocks)
    (scores,) = dask.persist(pairwise_rows(
        blocks.leverage, Xd.astype(np.float64), width=1, dtype=np.float64,
        name="dk-leverage", broadcast={"z": Z.astype(np.float64), "Linv": Linv}, kernel=kernel,
        alpha=alpha)[:, 0])
    return gather_rows(Xd, np.sort(sample_distinct(scores, M, rng)))


def _dictionary_factor(kernel: Kernel, Z: np.ndarray, weights: np.ndarray,
                       alpha: float) -> np.ndarray:
    """``L⁻¹`` for ``L Lᵀ = K_JJ + α A`` (BLESS Eq. 5); shape (|J|, |J|)."""
    L = sla.cholesky(np.asarray(kernel(Z, Z), dtype=np.float64) + alpha * np.diag(weights),
                     lower=True)
    return sla.solve_triangular(L, np.eye(len(Z)), lower=True)


def _bless_dictionary(kernel: Kernel, Xd: da.Array, alpha: float, rng: np.random.Generator,
                      blocks: BlockBackend) -> tuple[np.ndarray, np.ndarray]:
    """The last BLESS dictionary's rows and ``L⁻¹``, at regularisation ``alpha``; each
    level's candidate scores by ``blocks.leverage`` on the client."""
    n = Xd.shape[0]
    pool = min(n, POOL_MAX)
    Z = gather_rows(Xd, rng.choice(n, size=1))
    weights = np.array([1.0 / n])  # one uniform draw: m p_j / c_j = 1 · (1/n) / 1
    levels = _schedule(n * float(np.mean(kernel.diag(Z))), alpha)  # Alg. 1 lines 1, 3
    # line 4 of every level: uniform candidates, independent of the scores, so drawn up
    # front and read in one pass over X
    draws = [rng.choice(n, size=pool, replace=False) for _ in levels]
    rows, where = np.unique(np.concatenate(draws), return_inverse=True)
    gathered = gather_rows(Xd, rows)
    for h, level in enumerate(levels):
        cand = gathered[where[h * pool:(h + 1) * pool]]
        scores = blocks.leverage(cand, Z, kernel=kernel,
                                 Linv=_dictionary_factor(kernel, Z, weights, level),
                                 alpha=level)[:, 0]
        d_eff = n * scores.mean()  # line 5: Σ_i ℓ(i) estimated from uniform candidates
        m = int(min(DICT_MAX, pool, max(1, math.ceil(OVERSAMPLE * d_eff))))
        picks = rng.choice(pool, size=m, p=scores / scores.sum())  # line 6: resample ∝ ℓ̃
        picked, counts = np.unique(picks, return_counts=True)
        Z, weights = cand[picked], m * (scores[picked] / d_eff) / counts
        logger.debug("BLESS level alpha=%.3e: d_eff≈%.1f, dictionary of %d rows", level, d_eff,
                     len(Z))
    return Z, _dictionary_factor(kernel, Z, weights, alpha)


def _schedule(start: float, alpha: float) -> list[float]:
    """The levels ``α_h = max(alpha, start / SHRINK^h)``, h >= 1, down to alpha."""
    levels = [max(alpha, start / SHRINK)]
    while levels[-1] > alpha:
        levels.append(max(alpha, levels[-1] / SHRINK))
    return levels
