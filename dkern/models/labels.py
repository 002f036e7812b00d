"""Class labels of the classifiers: one-vs-rest 0/1 targets, and ``classes_`` in model files.

Used by :class:`~dkern.models.KernelLogisticRegression`,
:class:`~dkern.models.GaussianProcessClassifier` and the model files of every
classifier (:mod:`dkern.models.persist`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DkernError

#: Label dtypes whose values survive a JSON round trip exactly (by ``dtype.kind``).
_JSON_KINDS = "biufU"


def one_vs_rest_targets(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """0/1 targets of each binary problem, shape (n, p), float64.

    ``codes`` (n,) are the labels as indices into ``classes_``. Two classes make one
    problem (``classes_[1]`` against ``classes_[0]``, p = 1); more make one per class,
    each against the rest (p = n_classes), as scikit-learn's one-vs-rest does.
    """
    ks = [1] if n_classes == 2 else range(n_classes)
    return np.column_stack([(codes == k).astype(np.float64) for k in ks])


def encode_classes(classes: np.ndarray, owner: str) -> dict[str, Any]:
    """``classes_`` as JSON: ``{"classes_": [...], "classes_dtype": "<i8"}``.

    Raises
    ------
    DkernError
        The labels are not numbers, booleans or strings (they could not be restored).
    """
    values = classes.tolist()
    if not (classes.dtype.kind in _JSON_KINDS
            or (classes.dtype.kind == "O" and all(isinstance(v, str) for v in values))):
        raise DkernError(f"cannot save a {owner} whose classes_ have dtype {classes.dtype} "
                         f"({values[:3]!r}...): a model file stores the labels as JSON, which "
                         "keeps numbers, booleans and strings only. Encode the labels as "
                         "strings or integers and refit.")
    return {"classes_": values, "classes_dtype": classes.dtype.str}


def decode_classes(fitted: dict[str, Any]) -> np.ndarray:
    """The labels :func:`encode_classes` wrote; pops their entries from ``fitted``."""
    return np.asarray(fitted.pop("classes_"), dtype=np.dtype(fitted.pop("classes_dtype")))
