"""The logistic likelihood with a Gaussian prior in function space, and its Newton mode.

Shared by :class:`~dkern.models.KernelLogisticRegression` (the mode with the prior
covariance ``K / (nα)``) and :class:`~dkern.models.GaussianProcessClassifier` (the mode
with ``K``, then the Laplace evidence and predictive): one objective, one Newton loop
(:func:`newton_mode`), three ways to compute a step (:mod:`.steps`), one ``I + D K D``
operator (:class:`dkern.operators.IdentityPlusScaled`).
"""

from __future__ import annotations

from .newton import NewtonFit, newton_mode, objective_settled, sigmoid, stationary
from .steps import alg31_point, dense_alg31_point, dense_factor, forced_step

__all__ = ["NewtonFit", "alg31_point", "dense_alg31_point", "dense_factor", "forced_step",
           "newton_mode", "objective_settled", "sigmoid", "stationary"]
