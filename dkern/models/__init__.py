"""scikit-learn estimators over dkern's solvers, and model files.

``KernelRidge`` fits with dense Cholesky, preconditioned CG on the lazy Gram
operator, or Nyström/Falkon; ``GaussianProcessRegressor`` adds posterior variances,
the marginal likelihood and hyperparameter learning (both hold the posterior objects of
:mod:`.posteriors`, one per way of solving ``(K + alpha I) a = y``); ``GaussianProcessClassifier``
is binary (and one-vs-rest) Laplace GP classification; ``KernelLogisticRegression``
is penalised kernel logistic regression by Newton-CG or gradient descent;
``KernelDensity``, ``NadarayaWatson``, ``KNeighbors*`` and ``RadiusNeighbors*`` are the
classic toolbox's memory-based estimators, each one reduction over the training rows; ``save`` and
``load`` store a fitted model as one atomically published Zarr group (arrays plus JSON
attributes, never pickle).
"""

from __future__ import annotations

from .density import KernelDensity
from .gaussian_process import GaussianProcessRegressor
from .gp_classifier import GaussianProcessClassifier
from .kernel_logistic import KernelLogisticRegression
from .kernel_ridge import KernelRidge
from .nadaraya_watson import NadarayaWatson
from .neighbors import KNeighborsClassifier, KNeighborsRegressor
from .persist import load, save
from .radius_neighbors import RadiusNeighborsClassifier, RadiusNeighborsRegressor

__all__ = ["GaussianProcessClassifier", "GaussianProcessRegressor", "KNeighborsClassifier",
           "KNeighborsRegressor", "KernelDensity", "KernelLogisticRegression", "KernelRidge",
           "NadarayaWatson", "RadiusNeighborsClassifier", "RadiusNeighborsRegressor", "load",
           "save"]
