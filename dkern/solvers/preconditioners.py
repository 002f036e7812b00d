"""Preconditioners: Jacobi and randomized Nyström for ``K + alpha I``, and Falkon's.

Jacobi and Nyström have ``apply(R)``, a lazy map of dask (n, t) residuals to dask
(n, t); Falkon's maps numpy (M, t) to (M, t) for the M-dimensional normal equations.
"""

from __future__ import annotations

import logging
from numbers import Integral
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla

from ..backends import resolve_backend
from ..errors import NotPositiveDefiniteError
from ..io import is_lazy
from ..kernels import Kernel
from ..operators import data_rows, gram, pairwise_map
from ..operators.memory import check_persisted, check_row_chunks
from ._checks import integer, positive_number
from .sampling import chunk_sums, gather_rows, sample_distinct_rows_of

logger = logging.getLogger(__name__)

#: Eigenvalues of the Nyström factor below this fraction of the largest are dropped
#: (their directions are left to CG): FᵀF squares the condition number.
EIG_CUTOFF = 1e-10
#: float64 values per row and pivot that building the Nyström factor holds in the task of
#: a row chunk: the kernel columns, the factor, and QR's copy and workspace; the measured
#: peak over a one-chunk X is in tests/test_memory_limits.py.
FACTOR_VALUES_PER_PIVOT = 4
#: RPCholesky steps of a large rank (block size rank / this): each step costs a pass over X
#: and a few cluster round trips, so 16 pivots per step took 94 steps at rank 1,500.
RPCHOLESKY_STEPS = 25
#: Largest n whose rank-n factor is K itself, from one n × n eigendecomposition on the client
#: (milliseconds at n = 300, the default rank) instead of RPCholesky steps of several cluster
#: round trips each (about 10 s at n = 300). The bound keeps the n × n matrix, and the
#: factor's n² floats that go to the cluster in one graph, small (8 MB at 1,000).
FULL_FACTOR_MAX_N = 1_000


class JacobiPreconditioner:
    """``M = diag(A)⁻¹``, from the operator's ``diag()``.

    Parameters
    ----------
    A : Operator with ``diag()``
        E.g. ``dkern.gram(kernel, X) + alpha``; the diagonal is persisted (one n-vector).
    """

    def __init__(self, A: Any) -> None:
        if not hasattr(A, "diag"):
            raise TypeError(f"JacobiPreconditioner needs an operator with diag(), such as "
                            f"gram(kernel, X) + alpha; got {type(A).__name__}.")
        (d,) = dask.persist(A.diag())
        (smallest,) = dask.compute(d.min())
        if not smallest > 0:
            raise NotPositiveDefiniteError(
                f"the diagonal of A has an entry {smallest:.3e} <= 0, so A is not positive "
                "definite; check the kernel and use a larger alpha.")
        self.inv_diag = (1.0 / d).astype(A.dtype)

    def apply(self, R: da.Array) -> da.Array:
        """``R / diag(A)``; shape (n, t)."""
        return R * self.inv_diag.rechunk((R.chunks[0],))[:, None]


class NystromPreconditioner:
    """Randomized Nyström preconditioner for ``K + alpha I`` (Frangella, Tropp & Udell 2023).

    A rank-r factor ``K ≈ F Fᵀ`` (F of shape (n, r), persisted on the cluster) with
    thin SVD ``F = U Λ^{1/2} Vᵀ`` gives, applied through Woodbury (FTU 2023, eq. 5.3),

    .. math:: P^{-1} = (\\lambda_r + \\alpha) U (\\Lambda + \\alpha I)^{-1} U^\\top + I - U U^\\top

    computed as ``R + F (C (Fᵀ R))`` with an r × r matrix C on the client.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
        The same points as the operator's (chunks are matched on apply).
    alpha : float
        The diagonal shift of ``K + alpha I`` (scikit-learn's ``KernelRidge`` alpha); > 0.
    rank : int
        Number of pivots r (1 <= r <= n).
    pivots : {"uniform", "rpcholesky"}, default="uniform"
        Uniform Nyström columns, or randomly pivoted Cholesky (Chen, Epperly, Tropp &
        Webber 2023), which samples pivots ∝ the residual diagonal.
    random_state : int or numpy.random.Generator, optional
    block_size : int, optional
        Pivots drawn per RPCholesky step (one dask pass over X and a few cluster round
        trips per step). Default: ``rank / RPCHOLESKY_STEPS``, at least 16, so that a
        large rank costs ``RPCHOLESKY_STEPS`` steps rather than ``rank / 16``.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the factor's kernel columns ``K(X, X_S)`` and (RPCholesky) the diagonal are
        computed (:func:`kernel_columns`).

    Raises
    ------
    MemoryLimitError
        Before anything runs, when the factor's block of X's largest row chunk
        (``FACTOR_VALUES_PER_PIVOT · rank`` float64 values per row) cannot fit in a
        task on the current cluster's workers (:func:`dkern.operators.memory.check_row_chunks`).
    """

    def __init__(self, kernel: Kernel, X: Any, alpha: float, rank: int, *,
                 pivots: str = "uniform", random_state: Any = None,
                 block_size: int | None = None, backend: str = "auto") -> None:
        # in-memory rows are split as far as a task with the factor's block needs (lazy
        # rows keep their chunks; a rank that is not valid is refused below)
        factor_rank = 0
        if not is_lazy(X) and isinstance(rank, Integral) and rank > 0:
            factor_rank = min(int(rank), len(X))
        Xd = data_rows(X, per_row=FACTOR_VALUES_PER_PIVOT * factor_rank)
        backend = resolve_backend(backend)
        n = Xd.shape[0]
        alpha = positive_number(alpha, "alpha", " (the diagonal shift)")
        rank = integer(rank, "rank", high=n, hint=" The rank is at most n, the number of rows.")
        block_size = (max(16, -(-rank // RPCHOLESKY_STEPS)) if block_size is None
                      else integer(block_size, "block_size"))
        if pivots not in ("uniform", "rpcholesky"):
            raise ValueError(f"pivots must be 'uniform' or 'rpcholesky'; got {pivots!r}.")
        # The factor is kept on the workers, chunked like X's rows: refuse, before anything
        # is submitted, a factor they cannot keep, or row chunks whose block cannot fit in
        # a task, as data_rows does for X.
        check_persisted(8 * n * rank, f"The Nyström preconditioner's factor, {n:,} x {rank} "
                        "float64,", "or use solver='nystrom', whose M centres need no factor "
                        "of n rows (GaussianProcessRegressor also takes a lower "
                        "preconditioner_rank; KernelRidge's is fixed).")
        check_row_chunks(Xd, "X", per_row=FACTOR_VALUES_PER_PIVOT * rank)
        rng = np.random.default_rng(random_state)
        self.alpha = float(alpha)
        if rank == n and n <= FULL_FACTOR_MAX_N:
            # every row is a pivot: both pivot rules would end at K itself (up to the
            # eigenvalue cutoff), which one eigendecomposition of K gives directly
            pivots = "all rows (K itself)"
            self.factor, self.core, self.rank, self.scale = _full_factor(kernel, Xd, self.alpha)
        else:
            if pivots == "uniform":
                G, W = _uniform_factor(kernel, Xd, rank, rng, backend)
            else:
                G, W = _rpcholesky_factor(kernel, Xd, rank, rng, block_size, backend)
            self.factor, self.core, self.rank, self.scale = _woodbury(G, W, self.alpha)
        # sent to the cluster once: every apply's graph then names it instead of carrying
        # its r² floats (a large graph per CG iteration at ranks in the thousands)
        (self._core_blocks,) = dask.persist(da.from_array(self.core, chunks=self.core.shape))
        logger.info("Nyström preconditioner: %s pivots, rank %d, %s blocks", pivots, self.rank,
                    backend)

    def apply(self, R: da.Array) -> da.Array:
        """``P⁻¹ R = R + F (C (Fᵀ R))``; shape (n, t)."""
        G = self.factor.rechunk((R.chunks[0], -1))
        small = da.dot(G.T, R.astype(np.float64))  # shape: (r, t), tree-summed over chunks
        return R + da.dot(G, self._core_blocks @ small).astype(R.dtype)

    def logdet(self) -> float:
        """``log det P``, exactly (n rows): P is I but on the factor's span, where its
        eigenvalues are ``1 / (1 + c)`` for the eigenvalues c of C (in (-1, 0])."""
        return float(-np.log1p(np.linalg.eigvalsh(self.core)).sum())

    def sqrt_apply(self, G: da.Array) -> da.Array:
        """``P^{1/2} G``; shape (n, t). ``√scale · P^{1/2} G`` for standard normal G are
        samples of N(0, scale · P), a Gaussian close to N(0, K + alpha I)."""
        c, V = np.linalg.eigh(self.core)
        root = (V * (1.0 / np.sqrt(1.0 + c) - 1.0)) @ V.T  # P^{1/2} = I + Q root Qᵀ
        Q = self.factor.rechunk((G.chunks[0], -1))
        return G + da.dot(Q, da.from_array(root) @ da.dot(Q.T, G))


def kernel_columns(kernel: Kernel, X: Any, Z: Any, *, backend: str) -> da.Array:
    """``K(X, Z)`` in float64 as a lazy (n, b) dask array over X's row chunks.

    For a few columns b (preconditioner pivots, a batch of test points): each task
    computes its (n_i, b) block with the backend's ``kernel_columns`` (numpy: a dense
    kernel block; KeOps: Sum reductions against columns of the identity).

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
    Z : array-like of shape (b, d)
    backend : {"auto", "numpy", "keops", "triton"}

    Returns
    -------
    dask.array.Array of shape (n, b), float64
    """
    op = gram(kernel, X, Z, backend=backend, dtype=np.float64)
    return pairwise_map(op.blocks.kernel_columns, op.X, op.Z, dtype=np.float64,
                        name="dk-kblocks", labels=op.labels, kernel=op.kernel)


def _psd_inverse_sqrt(H: np.ndarray) -> np.ndarray:
    """``W`` with ``W Wᵀ = H⁺`` on the well-conditioned part of the PSD matrix H; shape (b, k)."""
    theta, Q = np.linalg.eigh((H + H.T) / 2)
    keep = theta > EIG_CUTOFF * max(theta.max(), 0.0)
    return Q[:, keep] / np.sqrt(theta[keep])


def _uniform_factor(kernel: Kernel, Xd: da.Array, rank: int, rng: np.random.Generator,
                    backend: str) -> tuple[da.Array, np.ndarray]:
    """``G = K(X, X_S)`` (persisted) and W with ``F = G W``, ``F Fᵀ = K_nS K_SS⁺ K_Sn``."""
    S = np.sort(rng.choice(Xd.shape[0], size=rank, replace=False))
    Z = gather_rows(Xd, S)
    (G,) = dask.persist(kernel_columns(kernel, Xd, Z, backend=backend))
    return G, _psd_inverse_sqrt(np.asarray(kernel(Z, Z), dtype=np.float64))


def _rpcholesky_factor(kernel: Kernel, Xd: da.Array, rank: int, rng: np.random.Generator,
                       block_size: int, backend: str) -> tuple[da.Array, np.ndarray]:
    """Block randomly pivoted Cholesky: F (persisted, (n, k)) with ``K ≈ F Fᵀ``; and W = I.

    Chen, Epperly, Tropp & Webber (2023), Alg. 3 (block RPCholesky): sample pivots
    ∝ the residual diagonal d, form ``G = K(:, S) − F F[S]ᵀ``, factor ``G[S]``, append.
    """
    (d,) = dask.persist(gram(kernel, Xd, backend=backend, dtype=np.float64).diag())
    sums = chunk_sums(d)
    initial = sums.sum()
    F = da.zeros((Xd.shape[0], 0), chunks=(Xd.chunks[0], 0))
    while F.shape[1] < rank:
        # Alg. 3 line 3; the pivots' rows of X and F come back in the same round trip
        S, (Z, FS) = sample_distinct_rows_of(d, min(block_size, rank - F.shape[1]), rng,
                                             [Xd, F], sums)
        G = kernel_columns(kernel, Xd, Z, backend=backend)  # line 4: G = K(:, S) - F F[S]ᵀ
        if F.shape[1]:
            G = G - da.dot(F, da.from_array(FS.T))
        (G,) = dask.persist(G)
        # G[S] = K(S, S) − F[S] F[S]ᵀ from the pivots' rows already here: no round trip
        H = np.asarray(kernel(Z, Z), dtype=np.float64) - FS @ FS.T
        Fnew = da.dot(G, da.from_array(_psd_inverse_sqrt(H)))  # line 5: G chol(G[S])⁻ᵀ
        F = da.concatenate([F, Fnew], axis=1).rechunk((Xd.chunks[0], -1))
        d = da.maximum(d - (Fnew**2).sum(axis=1), 0.0)  # line 6: residual diagonal
        F, d = dask.persist(F, d)
        sums = chunk_sums(d)  # also the next step's sampling weights per chunk
        if sums.sum() <= 1e-12 * initial:  # K is captured: stop early
            break
    return F, np.eye(F.shape[1])


def _full_factor(kernel: Kernel, Xd: da.Array, alpha: float
                 ) -> tuple[da.Array, np.ndarray, int, float]:
    """What :func:`_woodbury` returns, for the factor ``F Fᵀ = K`` of every row (n small).

    K (n × n) is formed on the client from the gathered rows and ``K = U Λ Uᵀ``: U's
    columns of the eigenvalues above the cutoff are already orthonormal, so they are the
    factor Q, and V = I in ``P⁻¹ = I + Q C Qᵀ``. The columns go largest eigenvalue first,
    as RPCholesky's go in pivot order: a caller that keeps the first r columns (the
    Lanczos posterior) keeps the r that matter most.
    """
    (Xn,) = dask.compute(Xd.astype(np.float64))
    # k(X, Z) with Z = X: the blocks' values, which hold no White noise (k(X) would add it)
    lam, U = np.linalg.eigh(np.asarray(kernel(Xn, Xn), dtype=np.float64))
    lam, U = lam[::-1], U[:, ::-1]
    keep = lam > EIG_CUTOFF * max(lam[0], 0.0)
    (Q,) = dask.persist(da.from_array(np.ascontiguousarray(U[:, keep]),
                                      chunks=(Xd.chunks[0], -1)))
    core, scale = _core(lam[keep], np.eye(int(keep.sum())), alpha)
    return Q, core, int(keep.sum()), scale


def _core(lam: np.ndarray, V: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """C (k, k) with ``P⁻¹ = I + (Q V) diag(shrink) (Q V)ᵀ`` for the kept eigenvalues lam
    of ``F Fᵀ`` (eigenvectors Q V), and the scale ``λ_min + alpha``."""
    scale = (lam.min() if len(lam) else 0.0) + alpha
    shrink = scale / (lam + alpha) - 1.0  # in (-1, 0]: P⁻¹ on U
    return (V * shrink) @ V.T, float(scale)


def _woodbury(G: da.Array, W: np.ndarray, alpha: float
              ) -> tuple[da.Array, np.ndarray, int, float]:
    """Q (n, k; persisted, orthonormal), C (k, k) with ``P⁻¹ = I + Q C Qᵀ`` (FTU eq. 5.3),
    the rank kept, and the scale ``λ_min + alpha`` (``K + alpha I ≈ scale · P``).

    F = G W is orthonormalised by a tall-skinny QR on the cluster, F = Q R, and
    ``F Fᵀ = Q (R Rᵀ) Qᵀ = (Q V) Λ (Q V)ᵀ``: U = Q V is orthonormal to working
    precision. (Forming U = F V Λ^{-1/2} instead is not: when the eigenvalues span
    many orders of magnitude, up to n/alpha, P⁻¹ can come out indefinite.)
    """
    F = da.dot(G, da.from_array(W)).rechunk({1: -1})
    Q, R = da.linalg.tsqr(F)
    Q, R = dask.persist(Q, R)
    R = np.asarray(R.compute() if isinstance(R, da.Array) else R)
    lam, V = np.linalg.eigh(R @ R.T)  # F Fᵀ = Q V Λ Vᵀ Qᵀ
    keep = lam > EIG_CUTOFF * max(lam.max(), 0.0)
    core, scale = _core(lam[keep], V[:, keep], alpha)
    return Q, core, int(keep.sum()), scale


class FalkonPreconditioner:
    """Falkon's preconditioner ``B = T⁻¹ A⁻¹ / √n`` for the M-dimensional normal equations.

    CG runs on ``Bᵀ (K_nmᵀ K_nm + alpha K_mm) B u = Bᵀ K_nmᵀ y`` and ``β = B u``;
    ``(B Bᵀ)⁻¹`` approximates the system matrix (see :func:`dkern.solvers.falkon.falkon_factors`).
    Unlike the n-dimensional preconditioners above it acts on numpy arrays, on the
    client, where the M × M factors live.

    Parameters
    ----------
    T : ndarray of shape (q, M)
        ``Tᵀ T = K_mm``: the upper Cholesky factor (q = M), or, when K_mm is singular,
        ``Λ^{1/2} Vᵀ`` over its numerical range (q < M eigenpairs).
    A : ndarray of shape (q, q)
        Upper Cholesky factor of ``T Tᵀ / M + (alpha / n) I`` or its sketched form.
    n : int
        Number of training points.
    basis : ndarray of shape (M, q), optional
        ``V Λ^{-1/2}``, T's pseudo-inverse, when T is not triangular.
    """

    def __init__(self, T: np.ndarray, A: np.ndarray, n: int,
                 basis: np.ndarray | None = None) -> None:
        self.T, self.A, self.basis = T, A, basis
        self.sqrt_n = np.sqrt(n)

    def apply(self, v: np.ndarray) -> np.ndarray:
        """``B v = T⁻¹ A⁻¹ v / √n`` for v of shape (q, t); shape (M, t)."""
        w = sla.solve_triangular(self.A, v)
        if self.basis is not None:
            return self.basis @ w / self.sqrt_n
        return sla.solve_triangular(self.T, w, check_finite=False) / self.sqrt_n

    def apply_t(self, v: np.ndarray) -> np.ndarray:
        """``Bᵀ v = A⁻ᵀ T⁻ᵀ v / √n`` for v of shape (M, t); shape (q, t)."""
        w = factor_solve_t(self.T, self.basis, v)
        return sla.solve_triangular(self.A, w, trans="T", check_finite=False) / self.sqrt_n

    def kmm_matvec(self, b: np.ndarray) -> np.ndarray:
        """``K_mm b = Tᵀ (T b)`` for b of shape (M, t); shape (M, t)."""
        return self.T.T @ (self.T @ b)


def factor_solve_t(T: np.ndarray, basis: np.ndarray | None, v: np.ndarray) -> np.ndarray:
    """``T⁻ᵀ v`` for a factor ``Tᵀ T = K_mm`` (see FalkonPreconditioner); shape (q, t)."""
    if basis is not None:
        return basis.T @ v
    return sla.solve_triangular(T, v, trans="T", check_finite=False)
