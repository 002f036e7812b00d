"""Lazy operators over dask row chunks: the Gram operator and ``K + alpha I``."""

from __future__ import annotations

from .base import Operator
from .gram import GramOperator, gram
from .shifted import ShiftedOperator

__all__ = ["GramOperator", "Operator", "ShiftedOperator", "gram"]
