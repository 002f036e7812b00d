"""Kept for :mod:`._laplace_evidence`, which imports the tiled gradient contraction from here;
the dense GP algebra lives in :mod:`.posteriors.exact` (this goes when the classifier moves)."""

from __future__ import annotations

from .posteriors.exact import lower_contraction as _lower_contraction

__all__ = ["_lower_contraction"]
