"""The sparse posterior of Titsias (2009, "SGPR") on M centres, over the solver layer.

The fit reads X in passes of :func:`dkern.solvers.sgpr.sgpr_statistics` (one pass:
M-sized sums) and, per optimizer step, :func:`~dkern.solvers.sgpr.sgpr_bound_gradient`
(one more pass). X is made a persisted dask array once per fit, so numpy input is
sent to the cluster once rather than with every evaluation; dask and Zarr input is
read from where it lives on each pass. Everything kept after the fit is M-sized.

With ``L = chol(K_uu)``, ``L_B = chol(I + P/s)`` and ``c = L_B⁻¹ b / s`` (the
statistics' notation), the predictive of one test block ``A = L⁻¹ K_u*`` is

    mean = K_*u w,  w = L⁻ᵀ L_B⁻ᵀ c,       cov = K_** − AᵀA + (L_B⁻¹A)ᵀ(L_B⁻¹A),

the SGPR posterior q(f*), positive semi-definite (the naive Nyström covariance is not).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import dask
import dask.array as da
import numpy as np
import scipy.linalg as sla
from scipy.spatial.distance import pdist

from ...errors import NotPositiveDefiniteError
from ...io import as_rows
from ...kernels import Kernel, Scaled, Sum
from ...kernels.stationary import Stationary
from ...operators import data_rows
from ...solvers import select_centers
from ...solvers.sgpr import (
    SGPRStatistics,
    sgpr_bound,
    sgpr_bound_gradient,
    sgpr_effective_dof,
    sgpr_noise_bound,
    sgpr_predict,
    sgpr_statistics,
    total_noise,
)

logger = logging.getLogger(__name__)

#: Jitters added to K_uu's diagonal (relative to the mean prior variance k(z, z)), tried in
#: turn: the smallest with which K_uu factors is used. A jitter ε shrinks Q_nn's
#: eigenvalues λ below ε to about λ²/ε: with all 300 rows of tests/test_gp_sparse.py's data
#: as centres, ε = 1e-6 moves the mean by 5e-4 (relative) from the exact GP's, 1e-10 by 1e-7.
SGPR_JITTERS = (1e-10, 1e-8, 1e-6, 1e-4)
#: Centres (evenly spaced among Z's rows) whose pairwise distances set the data-scaled start.
START_SAMPLE = 1_000


def jitter_to_noise(stats: SGPRStatistics, alpha: float) -> float:
    """K_uu's absolute jitter j in ``stats`` over the noise variance s. A jitter raises the
    bound's trace term tr(K - Q) / (2s) by up to about j / (2s) per row, and moves the
    posterior as much as noise of that size would: with scikit-learn's default alpha (1e-10)
    and j = 1e-10 k(z, z) the bound drops by k(z, z) / 2 per row, and a kernel learned on it
    is the jitter's, not the data's. Jitters much below 1e-10 k(z, z) are no way out: K_uu
    then factors with condition numbers at which the bound is rounding noise."""
    prior = float(np.mean(stats.kernel.diag(stats.centers))) - stats.kernel.white_noise()
    return stats.jitter * max(prior, 0.0) / total_noise(stats.kernel, alpha)


class SparsePosterior:
    """Mean, variance, covariance and bound of the SGPR posterior from its M-sized statistics.

    Parameters
    ----------
    stats : SGPRStatistics
        The sums of one pass over X (:func:`dkern.solvers.sgpr.sgpr_statistics`).
    alpha : float
        The noise variance s > 0.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the prediction passes' whitened blocks ``k(x*, Z) L⁻ᵀ`` are computed; not part
        of :meth:`state` (the estimator that holds the posterior sets it).
    """

    def __init__(self, stats: SGPRStatistics, alpha: float, backend: str = "auto") -> None:
        self.stats, self.alpha, self.backend = stats, alpha, backend
        #: the bound's noise s: alpha plus the kernel's White noise (dkern.solvers.sgpr)
        self.noise = total_noise(stats.kernel, alpha)
        LB, c = _noise_factor(stats, self.noise)
        inner = sla.solve_triangular(LB, c, lower=True, trans="T")
        #: ``w = L⁻ᵀ L_B⁻ᵀ c`` with ``mean(x*) = k(x*, Z) w``; shape (M, t)
        self.weights = sla.solve_triangular(stats.L, inner, lower=True, trans="T")

    @classmethod
    def fit(cls, kernel: Kernel, X: Any, y: Any, centers: np.ndarray,
            alpha: float, backend: str = "auto") -> SparsePosterior:
        """The posterior of ``kernel`` on ``centers`` (M, d) from one pass over X (n, d) and
        y (n,) or (n, t) (the smallest jitter of ``SGPR_JITTERS`` with which K_uu factors)."""
        Xd, Yd = training_data(X, y)
        bound = SparseBound(Xd, Yd, centers, alpha, backend=backend)
        return cls(bound.statistics(kernel), alpha, backend)

    @property
    def centers(self) -> np.ndarray:
        return self.stats.centers

    def log_marginal_likelihood(self) -> float:
        """The bound F ≤ ``ln p(y)`` (equal when every training row is a centre)."""
        return sgpr_bound(self.stats, self.alpha)

    def mean(self, Xt: Any) -> da.Array:
        """The latent mean, lazy; (m,) for one target column, (m, t) otherwise."""
        return sgpr_predict(self.stats, self.alpha, Xt, backend=self.backend)[0]

    def mean_and_variance(self, Xt: Any) -> tuple[da.Array, da.Array]:
        """Mean and latent variance (in ``[0, k(x*, x*)]``) from one pass over Xt, lazy."""
        return sgpr_predict(self.stats, self.alpha, Xt, backend=self.backend)

    def variance(self, Xt: Any) -> da.Array:
        return sgpr_predict(self.stats, self.alpha, Xt, backend=self.backend)[1]

    def covariance(self, Xt: np.ndarray) -> np.ndarray:
        """Latent SGPR posterior covariance at Xt (m, d); shape (m, m), symmetric PSD."""
        stats = self.stats
        LB, _ = _noise_factor(stats, self.noise)
        A = sla.solve_triangular(stats.L, np.asarray(stats.kernel(stats.centers, Xt),
                                                     dtype=np.float64), lower=True)
        AB = sla.solve_triangular(LB, A, lower=True)
        cov = np.asarray(stats.kernel(Xt), dtype=np.float64) - A.T @ A + AB.T @ AB
        return (cov + cov.T) / 2

    def state(self) -> dict[str, Any]:
        """The statistics' arrays (centers, L, P, b, yty) and scalars, and alpha."""
        s = self.stats
        return {"kernel": s.kernel, "centers": s.centers, "L": s.L, "P": s.P, "b": s.b,
                "yty": s.yty, "trace": s.trace, "n": s.n, "jitter": s.jitter,
                "alpha": self.alpha}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SparsePosterior:
        stats = SGPRStatistics(state["kernel"], state["centers"], state["L"], state["P"],
                               state["b"], state["yty"], float(state["trace"]),
                               int(state["n"]), float(state["jitter"]))
        return cls(stats, state["alpha"])

    def rebound(self) -> SparsePosterior:
        return self  # M-sized numpy arrays only: nothing lives on a cluster


def _noise_factor(stats: SGPRStatistics, s: float) -> tuple[np.ndarray, np.ndarray]:
    """``L_B = chol(I + P/s)`` (M, M) and ``c = L_B⁻¹ b / s`` (M, t)."""
    LB = np.linalg.cholesky(np.eye(len(stats.P)) + stats.P / s)
    return LB, sla.solve_triangular(LB, stats.b, lower=True) / s


def training_data(X: Any, y: Any) -> tuple[da.Array, da.Array]:
    """X (float64 rows) and y (n, t) as dask arrays with X's row chunks; numpy input
    persisted once, so every pass of the fit names its chunks instead of resending them."""
    Xd = data_rows(X, dtype=np.float64)
    Yd = as_rows(y, name="y", ndim=(1, 2), dtype=np.float64)
    Yd = Yd.reshape(Yd.shape[0], -1).rechunk((Xd.chunks[0], -1))
    if not isinstance(y, da.Array):
        (Yd,) = dask.persist(Yd)
    return Xd, Yd


def centers(X: da.Array, n_centers: int | None, rng: np.random.Generator) -> np.ndarray:
    """M distinct rows of X drawn uniformly (default M = round(√n), at most 10,000)."""
    return np.ascontiguousarray(select_centers(X, n_centers, random_state=rng))


class BoundFit(NamedTuple):
    """What a kernel's SGPR fit explains (:meth:`SparseBound.fit_of`)."""

    #: the bound F
    value: float
    #: F of the model that takes all of y as noise (:func:`~dkern.solvers.sgpr.sgpr_noise_bound`)
    noise_value: float
    #: effective degrees of freedom γ (:func:`~dkern.solvers.sgpr.sgpr_effective_dof`)
    dof: float
    #: the noise variance s: alpha plus the kernel's White noise
    noise: float
    #: ``yᵀy / (n t)``, the targets' mean square
    y_moment: float


class SparseBound:
    """``(kernel, eval_gradient) -> (F, ∂F/∂θ)``: the SGPR bound of a kernel on fixed centres.

    Each call costs one pass over X (two with the gradient), its blocks computed by
    ``backend``. The statistics of the latest call are kept, so the fit does not read X
    again for the θ it ends at.
    """

    def __init__(self, X: da.Array, y: da.Array, Z: np.ndarray, alpha: float, *,
                 backend: str = "auto") -> None:
        self.X, self.y, self.Z, self.alpha, self.backend = X, y, Z, alpha, backend
        self._last: SGPRStatistics | None = None

    def statistics(self, kernel: Kernel) -> SGPRStatistics:
        """The statistics of ``kernel`` (reused from the latest call when it was the same)."""
        if self._last is not None and self._last.kernel == kernel:
            return self._last
        for jitter in SGPR_JITTERS[:-1]:
            try:  # K_uu is factored before X is read: a failed jitter costs no pass
                self._last = sgpr_statistics(kernel, self.X, self.y, self.Z, jitter=jitter,
                                             backend=self.backend)
                return self._last
            except NotPositiveDefiniteError:
                logger.debug("SGPR: K_uu does not factor with jitter %g; trying more", jitter)
        try:
            self._last = sgpr_statistics(kernel, self.X, self.y, self.Z,
                                         jitter=SGPR_JITTERS[-1], backend=self.backend)
        except NotPositiveDefiniteError:
            raise NotPositiveDefiniteError(
                f"k(Z, Z) of {kernel!r} on the {len(self.Z)} centres does not factor even "
                f"with a jitter of {SGPR_JITTERS[-1]:g} × k(z, z): the kernel is not "
                "positive semi-definite there. Use a positive semi-definite kernel, or "
                "solver='exact' or 'cg'.") from None
        return self._last

    def __call__(self, kernel: Kernel, eval_gradient: bool) -> tuple[float, np.ndarray]:
        """The bound and (if asked) ``∂F/∂θ`` of ``kernel`` (σ² fixed); -inf where K_uu
        is not positive definite, so an optimizer steps away from such θ."""
        p = len(kernel.theta)
        try:
            stats = self.statistics(kernel)
            if not eval_gradient:
                return sgpr_bound(stats, self.alpha), np.zeros(p)
            value, grad = sgpr_bound_gradient(stats, self.X, self.y, self.alpha,
                                              backend=self.backend)
        except (NotPositiveDefiniteError, np.linalg.LinAlgError):
            return -np.inf, np.zeros(p)
        return value, grad[:p]  # the last entry, ∂F/∂log σ², is for a learnable noise

    def fit_of(self, kernel: Kernel) -> BoundFit:
        """The bound of ``kernel``, the all-noise bound and the fit's degrees of freedom (no
        pass over X when ``kernel`` was the latest evaluated)."""
        stats = self.statistics(kernel)
        return BoundFit(sgpr_bound(stats, self.alpha), sgpr_noise_bound(stats, self.alpha),
                        sgpr_effective_dof(stats, self.alpha), total_noise(kernel, self.alpha),
                        float(stats.yty.sum()) / (stats.n * stats.b.shape[1]))

    def data_start(self, kernel: Kernel) -> Kernel:
        """``kernel`` with its scales set from the centres and y (:func:`data_scaled_theta`);
        y's mean square is read off the latest statistics (a pass over y without them)."""
        if self._last is not None:
            moment = float(self._last.yty.sum()) / (self._last.n * self._last.b.shape[1])
        else:
            moment = float(da.mean(self.y * self.y).compute())
        return kernel.with_theta(data_scaled_theta(kernel, self.Z, moment))


def data_scaled_theta(kernel: Kernel, Z: np.ndarray, y_moment: float) -> np.ndarray:
    """``kernel``'s ``theta`` with the scales set from the data: a start for the optimizer.

    The lengthscales of the stationary kernels (Gaussian, Laplacian, Matérn, rational
    quadratic) become the median distance between the centres (the median heuristic):
    for one lengthscale ``median ‖zᵢ - zⱼ‖``; for one per feature (ARD) the median
    distance of the centres with each feature divided by its standard deviation σ_k,
    times σ_k. The constant ``c`` of each ``c * k`` summand of the kernel (the kernel
    itself, or a term of its top-level sum) becomes ``y_moment`` shared among them, so
    the prior variance covers y's second moment. Every other entry keeps its value; all
    are clipped into the bounds.

    Parameters
    ----------
    kernel : Kernel
    Z : ndarray of shape (M, d)
        The centres; at most ``START_SAMPLE`` of them, evenly spaced, are used.
    y_moment : float
        ``yᵀy / (n t)``, the targets' mean square (their variance when normalised).

    Returns
    -------
    ndarray of shape (p,)
        Log-hyperparameters in the order of ``kernel.hyperparameter_names``.
    """
    theta, bounds = kernel.theta.copy(), kernel.bounds
    params = kernel.get_params(deep=True)
    sample = Z[np.unique(np.linspace(0, len(Z) - 1, min(len(Z), START_SAMPLE)).astype(int))]
    one, per_feature = _median_lengthscales(sample)
    owners = [_owner(kernel, params, name) for name in kernel.hyperparameter_names]
    summands = sum(1 for path, node, leaf in owners
                   if leaf == "constant" and isinstance(node, Scaled)
                   and _in_top_sum(kernel, params, path))
    for k, (path, node, leaf) in enumerate(owners):
        if leaf.startswith("lengthscale") and isinstance(node, Stationary) and one > 0:
            ard = leaf.endswith("]")
            theta[k] = np.log(per_feature[int(leaf[leaf.index("[") + 1:-1])] if ard else one)
        elif (leaf == "constant" and isinstance(node, Scaled) and y_moment > 0
              and _in_top_sum(kernel, params, path)):
            theta[k] = np.log(y_moment / summands)
    return np.clip(theta, bounds[:, 0], bounds[:, 1])


def _median_lengthscales(Z: np.ndarray) -> tuple[float, np.ndarray]:
    """The median distance between Z's rows (0 for fewer than two distinct rows), and
    per feature that of the standardised rows times the feature's σ (the median
    distance where a feature does not vary); shape (d,)."""
    if len(Z) < 2:
        return 0.0, np.zeros(Z.shape[1])
    one = float(np.median(pdist(Z)))
    sigma = Z.std(axis=0)
    varies = sigma > 0
    scaled = float(np.median(pdist(Z[:, varies] / sigma[varies]))) if varies.any() else 0.0
    return one, np.where(varies, scaled * sigma, one)


def _owner(kernel: Kernel, params: dict[str, Any], name: str) -> tuple[str, Kernel, str]:
    """The path, the (sub)kernel and the parameter of one entry of ``hyperparameter_names``
    (``"k1__kernel__lengthscale[2]"``: ``("k1__kernel", that kernel, "lengthscale[2]")``)."""
    path, _, leaf = name.rpartition("__")
    return path, params[path] if path else kernel, leaf


def _in_top_sum(kernel: Kernel, params: dict[str, Any], path: str) -> bool:
    """Whether the subkernel at ``path`` is the kernel or a term of its top-level sum."""
    parts = path.split("__") if path else []
    return all(isinstance(params["__".join(parts[:i])] if i else kernel, Sum)
               for i in range(len(parts)))
