"""Argument checks shared by the solvers, with messages that name the argument."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


def positive_number(value: Any, name: str, hint: str) -> float:
    """``value`` as a float if it is a finite real number > 0, else a ``ValueError``.

    ``hint`` follows "> 0" in the message, e.g. ``", e.g. 1e-6"`` or ``" (the ridge penalty)"``.
    """
    number = float(value) if isinstance(value, Real) else math.nan
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0{hint}; got {value!r}.")
    return number


def integer(value: Any, name: str, *, low: int = 1, high: int | None = None,
            hint: str = "") -> int:
    """``value`` as an int if it is an integer in ``[low, high]``, else a ``ValueError``.

    Booleans are refused (``True`` is an int to Python, never a count to a user);
    ``hint`` ends the message, e.g. ``" Use n_centers <= 400."``.
    """
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    if not (ok and low <= value and (high is None or value <= high)):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bounds}; got {value!r}.{hint}")
    return int(value)


def square_operator(A: Any, shift: str) -> int:
    """n for a square operator ``A`` (shape (n, n), dtype, matvec), else a clear error.

    ``shift`` names the diagonal term in the suggested fix (``"alpha"``, ``"sigma2"``).
    """
    for attr in ("shape", "dtype", "matvec"):
        if not hasattr(A, attr):
            raise TypeError(f"A must be a dkern operator (e.g. dkern.gram(kernel, X) + {shift}) or "
                            f"have shape, dtype and matvec; {type(A).__name__} has no {attr!r}.")
    if len(A.shape) != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be square (n, n); got shape {A.shape}. Use "
                         f"gram(kernel, X) + {shift}, not gram(kernel, X, Z).")
    return int(A.shape[0])
