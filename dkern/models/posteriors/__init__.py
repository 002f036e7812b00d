"""Posteriors: one object per way of solving ``(K + alpha I) a = y`` and answering questions
about it (means; for the GP also variances, covariances and the evidence).

===================  ==========================================  ==========================
object               how ``C a = y`` is solved                   reference
===================  ==========================================  ==========================
ExactPosterior       dense Cholesky ``C = L Lᵀ``                 Rasmussen & Williams, 2.1
CGPosterior          block CG on the lazy operator, Nyström      Frangella et al. (2023)
                     preconditioner
LanczosPosterior     CG's mean; variances from a Lanczos         Pleiss et al. (2018), LOVE
                     decomposition of ``C⁻¹``
SparsePosterior      SGPR statistics on M centres                Titsias (2009)
===================  ==========================================  ==========================

Each has ``mean``, ``variance``, ``covariance``, ``state()`` and ``from_state()`` (model
files, and re-binding to a new dask client). :class:`~dkern.models.KernelRidge` asks them
for means; :class:`~dkern.models.GaussianProcessRegressor` for variances and evidence too.
:func:`choose_solver` is the one ``solver="auto"`` policy.
"""

from __future__ import annotations

from .cg import CGPosterior
from .exact import ExactPosterior
from .expansion import KernelExpansion
from .lanczos import LanczosPosterior
from .policy import check_solver_fits, choose_solver, variance_posterior
from .prior import PriorPosterior
from .sparse import SparsePosterior

__all__ = ["CGPosterior", "ExactPosterior", "KernelExpansion", "LanczosPosterior",
           "PriorPosterior", "SparsePosterior", "check_solver_fits", "choose_solver",
           "variance_posterior"]
