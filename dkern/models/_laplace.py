"""The Laplace approximation of binary GP classification (logistic link), dense and by CG.

Rasmussen & Williams (2006), *Gaussian Processes for Machine Learning*, Algorithms
3.1 (the posterior mode by Newton's method) and 3.2 (predictions), in the stable
form with ``B = I + W^{1/2} K W^{1/2}``. Targets ``t`` are 0/1; ``π = σ(f)``;
``W = π(1 − π)``. ``solve_dense`` holds K and B as n × n matrices (n up to
``dkern.solvers.EXACT_MAX_N``); ``solve_cg`` never does: B is the lazy
:class:`ScaledGram` and its systems are solved by block CG.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla
from scipy.special import erf, expit

from ..errors import ConvergenceWarning
from ..kernels import Kernel
from ..operators import GramOperator, Operator
from ..solvers import cg

#: Newton stops when the objective ``Ψ(f) = log p(t|f) − ½ fᵀK⁻¹f`` (Alg. 3.1 line 10 without
#: the log-determinant, which CG does not compute) rises by less than this; scikit-learn
#: applies the same threshold to its Laplace evidence.
NEWTON_TOL = 1e-10

# σ(x) ≈ Σᵢ cᵢ (1 + erf(λᵢ x)) / 2 (Williams & Barber 1998, appendix A): the λᵢ are theirs;
# the cᵢ are the least-squares fit at the points below, derived here as scikit-learn documents
# its own constants, which they reproduce to 3e-10 relative.
_ERF_SCALES = np.array([0.41, 0.4, 0.37, 0.44, 0.39])
_FIT_AT = np.array([0.0, 0.6, 2.0, 3.5, 4.5, np.inf])
_ERF_WEIGHTS = np.linalg.lstsq((1 + erf(np.outer(_FIT_AT, _ERF_SCALES))) / 2, expit(_FIT_AT),
                               rcond=None)[0]


def proba_erf(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``E[σ(f)]`` for ``f ~ N(mean, var)`` by the erf-sum approximation of σ (scikit-learn's).

    Each ``erf(λ f)`` integrates exactly: ``E[erf(λ f)] = erf(λ μ / √(1 + 2 λ² v))``.
    Arrays of shape (m,); returns (m,).
    """
    scaled = np.outer(mean, _ERF_SCALES) / np.sqrt(1 + 2 * np.outer(var, _ERF_SCALES ** 2))
    return erf(scaled) @ _ERF_WEIGHTS / 2 + _ERF_WEIGHTS.sum() / 2


def proba_probit(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``σ(κ(v) μ)`` with ``κ(v) = (1 + π v / 8)^{-1/2}`` (MacKay's probit approximation)."""
    return expit(mean / np.sqrt(1 + np.pi * var / 8))


def log_likelihood(t: Any, f: Any) -> Any:
    """``Σ log σ((2t − 1) f)``, summed without overflow (numpy or dask)."""
    return -(da if isinstance(f, da.Array) else np).logaddexp(0, -(2 * t - 1) * f).sum()


@dataclass
class Mode:
    """The Laplace posterior of one binary problem.

    ``pi``: σ(f̂) at the mode, (n,), numpy (dense) or persisted dask (CG); ``psi``: Ψ(f̂);
    ``n_iter``: Newton steps; ``chol``: the lower Cholesky factor of B at the mode (dense
    solver only, else None).
    """

    pi: Any
    psi: float
    n_iter: int
    chol: np.ndarray | None = None


def _newton_done(psi_new: float, psi: float, step: int, max_iter: int) -> bool:
    if psi_new - psi < NEWTON_TOL:
        return True
    if step == max_iter:
        # after the first step there is no earlier objective to compare with (psi = -inf)
        rising = f"still rising by {psi_new - psi:.2e}" if np.isfinite(psi) else \
            "not yet checked for convergence (one step)"
        warnings.warn(f"Laplace: Newton stopped at max_iter_predict={max_iter} with the objective "
                      f"{rising}; raise max_iter_predict.", ConvergenceWarning, stacklevel=4)
    return False


def solve_dense(K: np.ndarray, t: np.ndarray, max_iter: int) -> Mode:
    """The mode by Alg. 3.1 with dense K (n, n) and 0/1 targets t (n,)."""
    f, psi = np.zeros_like(t), -np.inf
    for step in range(1, max_iter + 1):
        pi = expit(f)
        s, L = dense_factor(K, pi)
        b = s * s * f + (t - pi)  # line 6
        a = b - s * sla.cho_solve((L, True), s * (K @ b), check_finite=False)  # line 7
        f = K @ a  # line 8
        psi_new = float(-0.5 * a @ f + log_likelihood(t, f))
        done = _newton_done(psi_new, psi, step, max_iter)
        psi = psi_new
        if done:
            break
    pi = expit(f)
    _, L = dense_factor(K, pi)  # W at the mode, for the evidence and the variances
    return Mode(pi, psi, step, L)


def dense_factor(K: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``s = W^{1/2}`` for ``π`` (n,) and the lower Cholesky factor of ``B = I + S K S``."""
    s = np.sqrt(pi * (1 - pi))
    B = s[:, None] * K * s[None, :]
    B[np.diag_indices_from(B)] += 1
    return s, sla.cholesky(B, lower=True, overwrite_a=True, check_finite=False)


class ScaledGram(Operator):
    """``B = I + S K S`` with ``S = diag(s)``, lazily: ``B V = V + s ⊙ K (s ⊙ V)``.

    Its eigenvalues lie in ``[1, 1 + λ_max(K) / 4]`` (``W ≤ 1/4``), so CG on it needs no
    preconditioner for kernels of moderate scale.
    """

    def __init__(self, K: GramOperator, s: da.Array) -> None:
        self.K, self.s = K, s.rechunk((K.col_chunks,))
        self.shape, self.dtype, self.col_chunks = K.shape, K.dtype, K.col_chunks

    @property
    def is_square(self) -> bool:
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        s = self.s[:, None]  # shape: (n, 1), chunked like V's rows
        return V + s * self.K._matvec(s * V)


def solve_cg(K: GramOperator, t: da.Array, max_iter: int, tol: float,
             cg_max_iter: int | None) -> Mode:
    """The mode by Alg. 3.1 with the lazy K (n, n), each ``B`` system solved by CG to ``tol``.

    ``t`` (n,) is chunked like K's rows; the n-vectors stay on the cluster (persisted).
    """
    f, psi, z = da.zeros_like(t), -np.inf, None
    for step in range(1, max_iter + 1):
        pi = 1 / (1 + da.exp(-f))
        s = da.sqrt(pi * (1 - pi))
        s, b = dask.persist(s, s * s * f + (t - pi))  # line 6; s is read by every CG matvec
        # Line 7, started from the last step's solution: the systems change less and less as
        # the mode nears, so the later steps need fewer CG iterations.
        z = cg(ScaledGram(K, s), s * (K @ b), x0=z, tol=tol, max_iter=cg_max_iter).x
        (a,) = dask.persist(b - s * z.rechunk(b.chunks))
        (f,) = dask.persist(K @ a)  # line 8
        psi_new = float(dask.compute(-0.5 * (a * f).sum() + log_likelihood(t, f))[0])
        done = _newton_done(psi_new, psi, step, max_iter)
        psi = psi_new
        if done:
            break
    (pi,) = dask.persist(1 / (1 + da.exp(-f)))
    return Mode(pi, psi, step)


def log_evidence(psi: float, chol: np.ndarray) -> float:
    """The Laplace log marginal likelihood ``Ψ(f̂) − ½ log det B`` (Alg. 3.1 line 10)."""
    return psi - float(np.log(np.diag(chol)).sum())


def dense_latent(K_star: np.ndarray, k_diag: np.ndarray, t: np.ndarray, pi: np.ndarray,
                 chol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latent mean ``k*ᵀ(t − π)`` and variance ``k** − vᵀv``, ``v = L⁻¹ W^{1/2} k*`` (Alg. 3.2).

    ``K_star`` (n, m) holds ``k(x_i, x*_j)``, ``chol`` is L of B at the mode; returns two
    arrays of shape (m,).
    """
    s = np.sqrt(pi * (1 - pi))
    v = sla.solve_triangular(chol, s[:, None] * K_star, lower=True, check_finite=False)
    return K_star.T @ (t - pi), k_diag - np.einsum("ij,ij->j", v, v)


def cg_latent(K: GramOperator, K_star: GramOperator, k_diag: np.ndarray, t: da.Array,
              pi: da.Array, tol: float, cg_max_iter: int | None) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`dense_latent`, with ``vᵀv = k*ᵀ S B⁻¹ S k*`` solved by block CG.

    ``K_star`` is the lazy ``K(X, X*)`` (n, m); its m columns are the right-hand sides.
    """
    s = da.sqrt(pi * (1 - pi)).rechunk((K.col_chunks,))
    rhs = s[:, None] * K_star.kernel_blocks().rechunk((K.col_chunks, -1))  # shape: (n, m)
    (rhs,) = dask.persist(rhs)
    z = cg(ScaledGram(K, s), rhs, tol=tol, max_iter=cg_max_iter).x
    mean, quad = dask.compute(K_star.T @ (t - pi), (rhs * z.rechunk(rhs.chunks)).sum(axis=0))
    return mean, k_diag - quad


def shared(kernels: list[Kernel], compute: Callable[[Kernel], Any]) -> Iterator[Any]:
    """``compute(k)`` for each kernel, reused along a run of equal kernels: one-vs-rest
    without learning shares one kernel, whose blocks are then computed once."""
    last, value = None, None
    for k in kernels:
        if last is None or k != last:
            last, value = k, compute(k)
        yield value


def dense_grams(kernels: list[Kernel], X: np.ndarray) -> Iterator[np.ndarray]:
    """``K(X, X)`` (n, n) of each problem's kernel, one at a time unless shared."""
    return shared(kernels, lambda k: np.asarray(k(X, X), dtype=np.float64))


def lazy_vector(a: Any, K: Any) -> da.Array:
    """An n-vector as a dask array chunked like the operator K's columns."""
    return a.rechunk((K.col_chunks,)) if isinstance(a, da.Array) else \
        da.from_array(a, chunks=(K.col_chunks,))
