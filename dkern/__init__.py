"""dkern: kernel methods on data larger than memory.

Zarr store -> dask row chunks -> lazy Gram blocks (numpy/BLAS or KeOps) ->
operator matvec -> solvers -> models, on an embedded LocalCluster or any Dask
scheduler. No process ever holds an n×n kernel matrix.
"""

from __future__ import annotations

from . import io, kernels
from ._version import __version__
from .models import (
    GaussianProcessClassifier,
    GaussianProcessRegressor,
    KernelDensity,
    KernelLogisticRegression,
    KernelRidge,
    KNeighborsClassifier,
    KNeighborsRegressor,
    NadarayaWatson,
    RadiusNeighborsClassifier,
    RadiusNeighborsRegressor,
    load,
    save,
)
from .operators import gram
from .runtime import connect

__all__ = [
    "GaussianProcessClassifier", "GaussianProcessRegressor", "KNeighborsClassifier",
    "KNeighborsRegressor", "KernelDensity", "KernelLogisticRegression", "KernelRidge",
    "NadarayaWatson", "RadiusNeighborsClassifier", "RadiusNeighborsRegressor", "__version__",
    "connect", "gram", "io", "kernels", "load", "save",
]
