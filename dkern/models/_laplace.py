"""The Laplace approximation of binary GP classification (logistic link), dense and by CG.

Rasmussen & Williams (2006), *Gaussian Processes for Machine Learning*, Algorithms
3.1 (the posterior mode by Newton's method) and 3.2 (predictions), in the stable
form with ``B = I + W^{1/2} K W^{1/2}``. Targets ``t`` are 0/1; ``π = σ(f)``;
``W = π(1 − π)``. The mode is :func:`dkern.models.logistic.newton_mode` with ``c = 1``
and Alg. 3.1's own steps: ``solve_dense`` holds K and B as n × n matrices (n up to
``dkern.solvers.EXACT_MAX_N``); ``solve_cg`` never does: B is the lazy
:class:`~dkern.operators.IdentityPlusScaled` and its systems are solved by block CG.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from scipy.special import erf, expit

from ..backends.projections import residual_diag
from ..errors import ConvergenceWarning, DkernError
from ..kernels import Kernel
from ..operators import GramOperator, IdentityPlusScaled
from ..solvers import cg
from .logistic import (
    NewtonFit,
    alg31_point,
    dense_alg31_point,
    dense_factor,
    newton_mode,
    objective_settled,
    sigmoid,
)
from .logistic.newton import StepFunction

logger = logging.getLogger(__name__)

#: Newton stops when the objective ``Ψ(f) = log p(t|f) − ½ fᵀK⁻¹f`` (Alg. 3.1 line 10 without
#: the log-determinant, which CG does not compute) rises by less than this; scikit-learn
#: applies the same threshold to its Laplace evidence.
NEWTON_TOL = 1e-10

# σ(x) ≈ Σᵢ cᵢ (1 + erf(λᵢ x)) / 2 (Williams & Barber 1998, appendix A): the λᵢ are theirs;
# the cᵢ are the least-squares fit at the points below, derived here as scikit-learn documents
# its own constants, which they reproduce to 3e-10 relative.
#: The largest error bound of a CG latent variance ``k** − k*ᵀ S B⁻¹ S k*`` accepted: the
#: sigmoid's probabilities move by a few per cent at a variance error of this size
#: (1 + 2 λ² v with λ ≈ 0.4), and are NaN once a variance is below about −3.
VARIANCE_ERROR = 0.1

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


def _mode(T: Any, step: StepFunction, max_iter: int) -> NewtonFit:
    """The mode of one problem (T of shape (n, 1)); warns when stopped at ``max_iter``."""
    fit = newton_mode(T, 1.0, step, active_while=objective_settled(NEWTON_TOL),
                      max_iter=max_iter, name="Laplace")
    if not fit.converged[0]:
        warnings.warn(f"Laplace: Newton stopped at max_iter_predict={max_iter} with the "
                      f"objective still rising by {fit.decrease[0]:.2e}; raise "
                      "max_iter_predict.", ConvergenceWarning, stacklevel=4)
    return fit


def solve_dense(K: np.ndarray, t: np.ndarray, max_iter: int) -> Mode:
    """The mode by Alg. 3.1 with dense K (n, n) and 0/1 targets t (n,)."""
    fit = _mode(t[:, None], dense_alg31_point(K), max_iter)
    pi = sigmoid(fit.latent[:, 0])
    _, L = dense_factor(K, pi)  # W at the mode, for the evidence and the variances
    return Mode(pi, -float(fit.objective[0]), fit.n_iter, L)


def amplitude_tol(K: GramOperator, tol: float) -> float:
    """``tol`` divided by the kernel's largest prior variance ``k(x, x)`` over K's rows when
    that is above 1 (one pass over the rows).

    A B solve's error reaches the latent mean ``k*ᵀ(t − π)`` multiplied by the kernel's
    amplitude (through π = σ(Kβ), then through k*): with a learned amplitude in the
    hundreds, CG to 1e-8 left probabilities 3e-3 from the exact ones on real data.
    """
    top = float(K.diag().max().compute())
    if top <= 1:
        return tol
    # said, since CG's warnings then name this tol, not the one the user passed
    logger.info("the kernel's prior variance reaches %.3g: the CG solves run to tol / %.3g "
                "= %.1e", top, top, tol / top)
    return tol / top


def solve_cg(K: GramOperator, t: da.Array, max_iter: int, tol: float,
             cg_max_iter: int | None) -> Mode:
    """The mode by Alg. 3.1 with the lazy K (n, n), each ``B`` system solved by CG to
    :func:`amplitude_tol` of ``tol``.

    ``t`` (n,) is chunked like K's rows; the n-vectors stay on the cluster (persisted).
    """
    step = alg31_point(K, tol=amplitude_tol(K, tol), cg_max_iter=cg_max_iter)
    fit = _mode(t[:, None].rechunk((K.col_chunks, -1)), step, max_iter)
    (pi,) = dask.persist(sigmoid(fit.latent[:, 0]))
    return Mode(pi, -float(fit.objective[0]), fit.n_iter)


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
    return K_star.T @ (t - pi), residual_diag(k_diag, (s[:, None] * K_star).T, chol)


def cg_latent(K: GramOperator, K_star: GramOperator, k_diag: np.ndarray, t: da.Array,
              pi: da.Array, tol: float, cg_max_iter: int | None) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`dense_latent`, with ``vᵀv = k*ᵀ S B⁻¹ S k*`` solved by block CG to ``tol``
    (the caller scales it: :func:`amplitude_tol`).

    ``K_star`` is the lazy ``K(X, X*)`` (n, m); its m columns are the right-hand sides.
    """
    s = da.sqrt(pi * (1 - pi)).rechunk((K.col_chunks,))
    rhs = s[:, None] * K_star.kernel_blocks().rechunk((K.col_chunks, -1))  # shape: (n, m)
    (rhs,) = dask.persist(rhs)
    solved = cg(IdentityPlusScaled(K, s), rhs, tol=tol, max_iter=cg_max_iter)
    z = solved.x.rechunk(rhs.chunks)
    mean, quad, z_norm, rhs_norm = dask.compute(
        K_star.T @ (t - pi), (rhs * z).sum(axis=0), da.linalg.norm(z, axis=0),
        da.linalg.norm(rhs, axis=0))
    # quad's error is zᵀr for the residual r = rhs − B z (B symmetric): at most
    # ‖z‖ ‖r‖, with ‖r‖ the true relative residual times ‖rhs‖
    error = z_norm * solved.residuals[-1] * rhs_norm
    if len(error) and error.max() > VARIANCE_ERROR:
        raise DkernError(
            f"GaussianProcessClassifier(solver='cg'): the latent variances are uncertain by up "
            f"to {error.max():.3g} (k(x*, x*) up to {k_diag.max():.3g}): CG stopped at a "
            f"relative residual of {solved.residuals[-1].max():.1e} (tol {tol:.1e}), too "
            "coarse for a kernel of this amplitude, so its probabilities would be wrong (or "
            "NaN). Use solver='exact' (it factorises B), or a kernel of smaller amplitude."
        )
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
