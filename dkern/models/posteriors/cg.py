"""The CG posterior: ``C = K + alpha I`` as a lazy operator, solved by preconditioned block CG.

The fit solves ``C a = y`` with a rank-r Nyström preconditioner (randomly pivoted
Cholesky; Frangella, Tropp & Udell 2023) and never holds an n × n matrix. Variances
solve once more per batch of test points: the columns ``B = K(X, X*)`` are the
right-hand sides of one block-CG solve ``C V = B`` (the same preconditioner), and

    var(x*_j) = k(x*_j, x*_j) - B[:, j]ᵀ V[:, j],     cov = K(X*, X*) - K(X*, X) V,

exact to ``tol`` (Rasmussen & Williams 2006, eqs. 2.25-2.26, with C⁻¹ applied by CG).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np

from ...kernels import Kernel
from ...operators import gram
from ...solvers import CHECKPOINT_EVERY, NystromPreconditioner, cg
from ...solvers.cg import CGResult
from ...solvers.preconditioners import kernel_columns
from .._validation import as_generator, check_alpha
from .expansion import KernelExpansion, clip_variance

#: Bytes of the block-CG vectors (about six (n, b) float64 arrays) of one batch of test points.
CG_VARIANCE_BYTES = 2**30


class CGPosterior(KernelExpansion):
    """Mean, variance and covariance of ``C a = y`` by block CG on the lazy operator.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray or dask.array.Array of shape (n, d), float64
    weights : ndarray or dask.array.Array of shape (n,) or (n, t), or None before the fit
    alpha : float
        Added to K's diagonal.
    rank : int
        Columns r of the Nyström preconditioner (at most n).
    pivot_seed : int, Generator, RandomState or None
        Seeds the preconditioner's pivots; an int rebuilds the same preconditioner
        after a model file is loaded or under another dask client.
    tol : float
        Relative residual at which every CG solve (fit and variances) stops.
    backend : str
        How kernel blocks are computed.
    """

    def __init__(self, kernel: Kernel, X: Any, weights: Any, *, alpha: float, rank: int,
                 pivot_seed: Any, tol: float, backend: str = "auto") -> None:
        super().__init__(kernel, X, weights, backend=backend)
        self.alpha, self.rank, self.pivot_seed, self.tol = alpha, rank, pivot_seed, tol
        self._preconditioner: NystromPreconditioner | None = None

    @classmethod
    def fit(cls, kernel: Kernel, X: Any, y: Any, *, alpha: float, rank: int, pivot_seed: Any,
            tol: float, backend: str = "auto", max_iter: int | None = None,
            progress: bool = False, callback: Callable[[int, np.ndarray], None] | None = None,
            checkpoint: Any = None, checkpoint_every: int = CHECKPOINT_EVERY
            ) -> tuple[CGPosterior, CGResult]:
        """Solve ``C a = y`` (y (n,) or (n, t)); the posterior and CG's result (iterations,
        residuals). The weights are numpy for numpy X, a persisted dask array otherwise:
        the only n-vector that leaves the cluster is the fitted one, once."""
        posterior = cls(kernel, X, None, alpha=alpha, rank=rank, pivot_seed=pivot_seed,
                        tol=tol, backend=backend)
        result = cg(posterior.operator(), y, preconditioner=posterior.preconditioner(),
                    tol=tol, max_iter=max_iter, callback=callback, progress=progress,
                    checkpoint=checkpoint, checkpoint_every=checkpoint_every)
        posterior.weights = (np.ascontiguousarray(result.x.compute())
                             if isinstance(X, np.ndarray) else result.x)
        return posterior, result

    def operator(self) -> Any:
        """The lazy ``C = K(X, X) + (alpha + noise) I``, (n, n), with the noise of the
        kernel's White terms (its blocks ``k(x, z)`` hold none); alpha must be > 0 (a GP
        fitted by ``solver="exact"`` with alpha = 0 has no CG variances)."""
        check_alpha(self.alpha, "cg", role="the value added to K's diagonal", example="1e-6")
        return gram(self.signal_kernel, self.X, backend=self.backend,
                    dtype=np.float64) + self.shift

    @property
    def signal_kernel(self) -> Kernel:
        """The kernel without its White terms: the blocks of C (and of its preconditioner)."""
        signal = self.kernel.without_white()
        if signal is None:
            raise ValueError(f"the kernel {self.kernel!r} is White noise only, so C is a "
                             "multiple of I: use solver='exact', or add a signal term.")
        return signal

    @property
    def shift(self) -> float:
        """C's diagonal shift: alpha plus the White terms' noise."""
        return self.alpha + self.kernel.white_noise()

    def preconditioner(self) -> NystromPreconditioner:
        """The Nyström preconditioner of ``C``, built on first use (persisted on the
        cluster that builds it: :meth:`rebound` forgets it)."""
        if self._preconditioner is None:
            # the noise-free kernel: its diagonal must be the blocks' (RPCholesky's pivots)
            self._preconditioner = NystromPreconditioner(
                self.signal_kernel, self.X, self.shift, min(self.X.shape[0], self.rank),
                pivots="rpcholesky", random_state=as_generator(self.pivot_seed),
                backend=self.backend)
        return self._preconditioner

    def variance(self, Xt: Any) -> Any:
        """Latent variance at Xt (m, d), one CG solve per batch of at most
        ``CG_VARIANCE_BYTES / (48 n)`` test points; numpy (m,), dask for dask Xt.

        A dask Xt is read batch by batch on the cluster, as the mean reads it: its rows
        never come to the client, only each batch's variances (the solves run now, since
        CG needs the client between iterations)."""
        n, m = self.X.shape[0], Xt.shape[0]
        cols = max(1, min(m, CG_VARIANCE_BYTES // (6 * 8 * n)))
        A, P = self.operator(), self.preconditioner()
        var = clip_variance(np.concatenate(
            [np.empty(0), *(self._batch_variance(A, P, Xt[j0:j0 + cols])
                            for j0 in range(0, m, cols))]))
        return da.from_array(var, chunks=(Xt.chunks[0],)) if isinstance(Xt, da.Array) else var

    def _batch_variance(self, A: Any, P: NystromPreconditioner, Xb: Any) -> np.ndarray:
        """``k(x*_j, x*_j) - B[:, j]ᵀ V[:, j]`` for the batch Xb (b, d), numpy or dask
        (one chunk then: its columns are one block-CG right-hand side); shape (b,)."""
        if isinstance(Xb, da.Array):
            Xb = Xb.rechunk({0: -1})
        B = kernel_columns(self.kernel, self.X, Xb, backend=self.backend)  # shape: (n, b)
        V = cg(A, B, preconditioner=P, tol=self.tol).x.rechunk(B.chunks)
        if not isinstance(Xb, da.Array):
            (quad,) = dask.compute((B * V).sum(axis=0))
            return self.kernel.diag(Xb) - quad
        diag = Xb.map_blocks(self.kernel.diag, drop_axis=1, dtype=np.float64)
        diag, quad = dask.compute(diag, (B * V).sum(axis=0))  # one pass, b values each
        return diag - quad

    def covariance(self, Xt: np.ndarray) -> np.ndarray:
        """Latent covariance at Xt (m, d); shape (m, m), symmetrised (CG's two sides agree
        to ``tol`` only)."""
        B = kernel_columns(self.kernel, self.X, Xt, backend=self.backend)  # shape: (n, m)
        V = cg(self.operator(), B, preconditioner=self.preconditioner(), tol=self.tol).x
        quad = (gram(self.kernel, Xt, self.X, backend=self.backend, dtype=np.float64)
                @ V).compute()
        cov = np.asarray(self.kernel(Xt), dtype=np.float64) - quad
        return (cov + cov.T) / 2

    def state(self) -> dict[str, Any]:
        """Everything :meth:`from_state` needs (the preconditioner is rebuilt from the seed)."""
        return {"kernel": self.kernel, "X": self.X, "weights": self.weights,
                "alpha": self.alpha, "rank": self.rank, "pivot_seed": self.pivot_seed,
                "tol": self.tol, "backend": self.backend}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CGPosterior:
        return cls(state["kernel"], state["X"], state["weights"], alpha=state["alpha"],
                   rank=state["rank"], pivot_seed=state["pivot_seed"], tol=state["tol"],
                   backend=state["backend"])

    def rebound(self) -> CGPosterior:
        """The same posterior without what is persisted on the cluster (for a new client)."""
        return self.from_state(self.state())



def computing_client_id() -> str | None:
    """The id of the distributed client dask computes with now; None for a local scheduler.
    A CG posterior's preconditioner lives on that client's cluster (see ``rebound``)."""
    return getattr(getattr(dask.base.get_scheduler(), "__self__", None), "id", None)
