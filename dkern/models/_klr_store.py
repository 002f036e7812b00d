"""The ``KernelLogisticRegression``'s part of a model file (see :mod:`dkern.models.persist`).

Arrays: ``dual_coef`` (β, (n,) or (n, n_classes)), ``X_fit`` (the training rows; lazy
ones are written chunk by chunk) and ``residuals``. "fitted" holds ``classes_`` as a
JSON list with its numpy dtype (``classes_dtype``), so string, integer, float and
boolean labels load as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da

from .kernel_logistic import SOLVERS as _GIVEN_SOLVERS
from .kernel_logistic import KernelLogisticRegression
from .labels import decode_classes, encode_classes

__all__ = ["FITTED_NAMES", "SHAPES", "SOLVERS", "arrays", "decode_classes", "encode_classes",
           "fitted", "restore", "shapes"]  # the label codecs, for the other models' files

#: What :func:`fitted` writes and ``load`` accepts in the "fitted" attribute.
FITTED_NAMES = frozenset({
    "solver_", "n_iter_", "converged_", "n_features_in_", "feature_names_in_", "classes_",
    "classes_dtype", "dual_coef_lazy", "X_fit_lazy"})
#: The fitted ``solver_`` values ``load`` knows.
SOLVERS = _GIVEN_SOLVERS
#: The arrays by dimension: ``n`` training rows, ``d`` features, ``p`` binary problems
#: (1 for two classes: ``dual_coef`` is then 1-D), ``r`` = n_iter_ + 1 residual rows.
SHAPES = {"dual_coef": ("n", "p?"), "X_fit": ("n", "d"), "residuals": ("r", "p")}


def arrays(model: KernelLogisticRegression) -> dict[str, Any]:
    """The arrays of the model file."""
    return {"dual_coef": model.dual_coef_, "X_fit": model.X_fit_, "residuals": model.residuals_}


def fitted(model: KernelLogisticRegression) -> dict[str, Any]:
    """The fitted scalars (JSON), ``classes_`` among them.

    Raises
    ------
    DkernError
        The labels are not numbers, booleans or strings (they could not be restored).
    """
    out = {"solver_": model.solver_, "n_iter_": int(model.n_iter_),
           "converged_": bool(model.converged_), "n_features_in_": int(model.n_features_in_),
           **encode_classes(model.classes_, "KernelLogisticRegression"),
           "dual_coef_lazy": isinstance(model.dual_coef_, da.Array),
           "X_fit_lazy": isinstance(model.X_fit_, da.Array)}
    if hasattr(model, "feature_names_in_"):
        out["feature_names_in_"] = [str(name) for name in model.feature_names_in_]
    return out


def restore(model: KernelLogisticRegression, fitted: dict[str, Any],
            read: Callable[[str, bool], Any]) -> None:
    """Set the fitted arrays and ``classes_``; pop their entries from ``fitted``.

    ``read(name, lazy)`` opens an array of the store (dask if ``lazy``, else numpy).
    """
    model.dual_coef_ = read("dual_coef", fitted.pop("dual_coef_lazy"))
    model.X_fit_ = read("X_fit", fitted.pop("X_fit_lazy"))
    model.residuals_ = read("residuals", False)
    model.classes_ = decode_classes(fitted)


def shapes(fitted: dict[str, Any]) -> tuple[dict[str, tuple[str, ...]],
                                             dict[str, tuple[int, str]]]:
    """:data:`SHAPES` and the dimensions the attributes fix (``p`` and ``r``)."""
    c, r = len(fitted["classes_"]), fitted["n_iter_"] + 1
    return SHAPES, {"p": (1 if c == 2 else c, f"{c} classes_"), "r": (r, f"n_iter_ + 1 = {r}")}
