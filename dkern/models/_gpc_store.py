"""The ``GaussianProcessClassifier``'s part of a model file (see :mod:`dkern.models.persist`).

Arrays: ``X_fit`` (the training rows; lazy ones are written chunk by chunk), ``y_train``
(labels as indices into ``classes_``) and ``pi`` (σ(f̂) of each binary problem). What
``predict`` needs follows from them and the kernels: ``t − π̂`` and ``W^{1/2} =
√(π̂(1 − π̂))``; the n × n Cholesky factors of B are never stored, the exact solver
rebuilds them from ``pi_`` on first use. The attribute ``fitted_kernel`` is
``repr(kernel_)``, a list of them for one-vs-rest; "fitted" holds ``classes_`` as a JSON
list with its numpy dtype (``classes_dtype``, :mod:`dkern.models.labels`), so string,
integer, float and boolean labels load as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from ..errors import StoreError
from .gp_classifier import SOLVERS as _GIVEN_SOLVERS
from .gp_classifier import GaussianProcessClassifier
from .labels import decode_classes, encode_classes

#: What :func:`fitted` writes and ``load`` accepts in the "fitted" attribute.
FITTED_NAMES = frozenset({
    "solver_", "n_iter_", "n_features_in_", "feature_names_in_", "n_classes_",
    "log_marginal_likelihood_value_", "classes_", "classes_dtype", "X_fit_lazy", "pi_lazy"})
#: The fitted ``solver_`` (``"auto"`` resolves to one of these).
SOLVERS = tuple(s for s in _GIVEN_SOLVERS if s != "auto")
#: "fitted" kinds that differ from other models': one iteration count per binary problem.
FITTED_KINDS = {"n_iter_": "counts"}
#: The arrays by dimension: ``n`` training rows, ``d`` features, ``p`` binary problems
#: (1 for two classes: ``pi`` is then 1-D).
SHAPES = {"X_fit": ("n", "d"), "y_train": ("n",), "pi": ("n", "p?")}


def arrays(model: GaussianProcessClassifier) -> dict[str, Any]:
    """The arrays of the model file."""
    return {"X_fit": model.X_fit_, "y_train": model.y_train_, "pi": model.pi_}


def fitted(model: GaussianProcessClassifier) -> dict[str, Any]:
    """The fitted scalars (JSON), ``classes_`` among them.

    Raises
    ------
    DkernError
        The labels are not numbers, booleans or strings (they could not be restored).
    """
    lml = float(model.log_marginal_likelihood_value_)
    out = {"solver_": model.solver_, "n_iter_": [int(i) for i in model.n_iter_],
           "n_features_in_": int(model.n_features_in_), "n_classes_": int(model.n_classes_),
           "log_marginal_likelihood_value_": lml if np.isfinite(lml) else None,
           **encode_classes(model.classes_, "GaussianProcessClassifier"),
           "X_fit_lazy": isinstance(model.X_fit_, da.Array),
           "pi_lazy": isinstance(model.pi_, da.Array)}
    if hasattr(model, "feature_names_in_"):
        out["feature_names_in_"] = [str(name) for name in model.feature_names_in_]
    return out


def shapes(fitted: dict[str, Any]) -> tuple[dict[str, tuple[str, ...]],
                                             dict[str, tuple[int, str]]]:
    """:data:`SHAPES` and the dimension the attributes fix (``p``, from the classes)."""
    c = fitted["n_classes_"]
    if c != len(fitted["classes_"]):
        raise StoreError(f"the GaussianProcessClassifier's n_classes_ = {c} but it lists "
                         f"{len(fitted['classes_'])} classes_; they must match. The file was "
                         "edited or damaged; save the model again.")
    return SHAPES, {"p": (1 if c == 2 else c, f"n_classes_ = {c}")}


def restore(model: GaussianProcessClassifier, fitted: dict[str, Any],
            read: Callable[[str, bool], Any]) -> None:
    """Set the fitted arrays and ``classes_``; pop their entries from ``fitted``.

    ``read(name, lazy)`` opens an array of the store (dask if ``lazy``, else numpy).
    """
    model.X_fit_ = read("X_fit", fitted.pop("X_fit_lazy"))
    model.pi_ = read("pi", fitted.pop("pi_lazy"))
    model.y_train_ = read("y_train", False)
    model.classes_ = decode_classes(fitted)
    fitted["n_iter_"] = np.asarray(fitted["n_iter_"], dtype=np.int64)
    lml = fitted["log_marginal_likelihood_value_"]
    fitted["log_marginal_likelihood_value_"] = float("nan") if lml is None else float(lml)
