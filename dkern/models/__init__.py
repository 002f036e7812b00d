"""scikit-learn estimators over dkern's solvers, and model files.

``KernelRidge`` fits with dense Cholesky, preconditioned CG on the lazy Gram
operator, or Nyström/Falkon; ``GaussianProcessRegressor`` adds posterior variances,
the marginal likelihood and hyperparameter learning; ``GaussianProcessClassifier``
is binary (and one-vs-rest) Laplace GP classification; ``KernelLogisticRegression``
is penalised kernel logistic regression by Newton-CG or gradient descent; ``save`` and
``load`` store a fitted model as one atomically published Zarr group (arrays plus JSON
attributes, never pickle).
"""

from __future__ import annotations

from .gaussian_process import GaussianProcessRegressor
from .gp_classifier import GaussianProcessClassifier
from .kernel_logistic import KernelLogisticRegression
from .kernel_ridge import KernelRidge
from .persist import load, save

__all__ = ["GaussianProcessClassifier", "GaussianProcessRegressor", "KernelLogisticRegression",
           "KernelRidge", "load", "save"]
