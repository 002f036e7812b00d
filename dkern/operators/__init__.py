"""Lazy operators over dask row chunks (the Gram operator, ``K + alpha I``, ``I + D K D``,
Nyström's ``K_nm``), all built on one mechanism: :func:`pairwise_reduce`."""

from __future__ import annotations

from .base import Operator, data_rows
from .gram import GramOperator, gram
from .memory import persist_budget
from .pairwise import pairwise_map, pairwise_reduce, pairwise_rows
from .scaled import IdentityPlusRowScaled, IdentityPlusScaled, flat_rows, rows_times, unflat_rows
from .shifted import ShiftedOperator

__all__ = [
    "GramOperator", "IdentityPlusRowScaled", "IdentityPlusScaled", "Operator", "ShiftedOperator",
    "data_rows", "gram", "pairwise_map", "pairwise_reduce", "pairwise_rows", "persist_budget",
    "flat_rows", "rows_times", "unflat_rows",
]
