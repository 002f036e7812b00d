"""Lazy operators over dask row chunks: the Gram operator and ``K + alpha I``."""

from __future__ import annotations

from .base import Operator, data_rows
from .gram import GramOperator, gram
from .shifted import ShiftedOperator

__all__ = ["GramOperator", "Operator", "ShiftedOperator", "data_rows", "gram"]
