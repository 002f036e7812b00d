"""The Laplace log marginal likelihood of binary GP classification and its gradient in theta.

Dense (n <= ``dkern.solvers.EXACT_MAX_N``), for hyperparameter learning. With the mode
f̂ of Alg. 3.1, ``π = σ(f̂)``, ``g = t − π``, ``s = W^{1/2}``, ``B = I + S K S = L Lᵀ`` and
``R = S B⁻¹ S = (W⁻¹ + K)⁻¹`` (Rasmussen & Williams 2006, Alg. 5.1)::

    log q(t | θ)  = Ψ(f̂) − Σ log L_ii
    ∂/∂θ_j        = ½ gᵀ ∂K_j g − ½ tr(R ∂K_j)          explicit (f̂ held fixed)
                    + s2ᵀ (I − K R) ∂K_j g               implicit, through f̂ (lines 9-15)

where ``s2 = −½ diag((K⁻¹ + W)⁻¹) ∂W/∂f̂`` and ``∂W/∂f = π(1 − π)(1 − 2π)``. As K and R
are symmetric the implicit term is ``uᵀ ∂K_j g`` with ``u = s2 − R K s2``, so the whole
gradient is one contraction of a symmetric n × n matrix with ∂K/∂θ, summed over row
tiles (:func:`dkern.models.posteriors.exact.log_marginal_likelihood` does the same for the
regressor): never an (n, n, p) array.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla

from ..backends.projections import residual_diag
from ..kernels import Kernel
from . import _laplace
from ._gp_optimize import optimize
from .posteriors.exact import lower_contraction


def learn(kernel: Kernel, X: np.ndarray, targets: list[np.ndarray], *, max_iter: int,
          optimizer: Any, n_restarts: int, rng: np.random.RandomState) -> list[Kernel]:
    """The kernel maximising :func:`log_evidence` for each 0/1 target vector (n,) of X (n, d).

    Each problem is learned on its own, as scikit-learn's one-vs-rest does, from
    ``kernel.theta`` and ``n_restarts`` random starts (:func:`._gp_optimize.optimize`:
    a start outside the bounds is refused, a run that does not converge warns).
    """
    learned = []
    for t in targets:
        def lml(k: Kernel, eval_gradient: bool, t: np.ndarray = t) -> tuple[float, np.ndarray]:
            return log_evidence(k, X, t, max_iter, eval_gradient)

        theta, _ = optimize(kernel, lml, optimizer, n_restarts, rng)
        learned.append(kernel.with_theta(theta))
    return learned


def log_evidence(kernel: Kernel, X: np.ndarray, t: np.ndarray, max_iter: int,
                 eval_gradient: bool) -> tuple[float, np.ndarray]:
    """``log q(t | X, θ)`` of ``kernel`` and (if asked) its gradient; shape (p,).

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d)
    t : ndarray of shape (n,)
        0/1 targets of the binary problem.
    max_iter : int
        Newton steps at most (``max_iter_predict``).
    eval_gradient : bool

    Returns
    -------
    value : float
        ``-inf`` (with a zero gradient) where ``B`` has no Cholesky factor (a kernel matrix
        far from positive semi-definite), so an optimizer steps away from such θ.
    gradient : ndarray of shape (p,)
        Zero when not ``eval_gradient``.
    """
    p = len(kernel.theta)
    K = np.asarray(kernel(X), dtype=np.float64)
    try:
        mode = _laplace.solve_dense(K, t, max_iter)
        assert mode.chol is not None  # solve_dense factors B at the mode
        value = _laplace.log_evidence(mode.psi, mode.chol)
        if not eval_gradient:
            return value, np.zeros(p)
        return value, _gradient(kernel, X, K, t, mode)
    except np.linalg.LinAlgError:
        return -np.inf, np.zeros(p)


def _gradient(kernel: Kernel, X: np.ndarray, K: np.ndarray, t: np.ndarray,
              mode: _laplace.Mode) -> np.ndarray:
    """Alg. 5.1 lines 7-15 at the mode: ``Σ_ij M_ij ∂K_ij/∂θ`` for the symmetric M below."""
    pi, L = mode.pi, mode.chol
    s, g = np.sqrt(pi * (1 - pi)), t - pi
    # lines 8-9: diag(K) − diag(CᵀC) with C = L⁻¹ S K; its n × n temporaries are freed
    # on return, before M is built
    s2 = -0.5 * residual_diag(np.diag(K), (s[:, None] * K).T, L) * pi * (1 - pi) * (1 - 2 * pi)
    u = s2 - s * sla.cho_solve((L, True), s * (K @ s2), check_finite=False)  # (I - R K) s2
    M, info = sla.lapack.dpotri(L, lower=1)  # lower triangle of B⁻¹ (line 7), a new array
    if info != 0:
        raise np.linalg.LinAlgError(f"dpotri failed (info={info})")
    M *= s[:, None]
    M *= -0.5 * s[None, :]  # -½ R
    # ½ g gᵀ + ½ (u gᵀ + g uᵀ), symmetric, written as ½ (g + u)(g + u)ᵀ − ½ u uᵀ
    M += 0.5 * np.outer(g + u, g + u)
    M -= 0.5 * np.outer(u, u)
    return lower_contraction(kernel, X, M, len(kernel.theta))
