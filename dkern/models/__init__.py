"""scikit-learn estimators over dkern's solvers, and model files.

``KernelRidge`` fits with dense Cholesky, preconditioned CG on the lazy Gram
operator, or Nyström/Falkon.
"""

from __future__ import annotations

from .kernel_ridge import KernelRidge

__all__ = ["KernelRidge"]
