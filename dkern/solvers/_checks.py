"""Argument checks shared by the solvers, with messages that name the argument."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def positive_number(value: Any, name: str, hint: str) -> float:
    """``value`` as a float if it is a finite real number > 0, else a ``ValueError``.

    ``hint`` follows "> 0" in the message, e.g. ``", e.g. 1e-6"`` or ``" (the ridge penalty)"``.
    """
    number = float(value) if isinstance(value, Real) else math.nan
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0{hint}; got {value!r}.")
    return number
