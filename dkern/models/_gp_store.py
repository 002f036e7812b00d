"""A :class:`~dkern.models.GaussianProcessRegressor`'s part of a model file (see
:mod:`dkern.models.persist`): its arrays and fitted scalars by the file's names, read from
and given back through the estimator's declared state (``_state`` / ``_set_state``).

Exact and CG models store ``alpha`` (``alpha_``), ``X_train``, ``y_train``, the exact
solver's Cholesky factor ``L`` and the preconditioner's ``pivot_seed``; sparse models only
M-sized arrays: ``alpha``, ``centers`` and the SGPR statistics ``L``, ``P``, ``b``, ``yty``
(their scalars ``sgpr_trace``, ``sgpr_n``, ``sgpr_jitter``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from ._file_checks import GP_SPARSE
from ._validation import fixed_seed
from .gaussian_process import GaussianProcessRegressor

#: The SGPR statistics' arrays, stored under their own names.
SPARSE_ARRAYS = ("centers", "L", "P", "b", "yty")


def arrays(model: GaussianProcessRegressor) -> dict[str, Any]:
    """The arrays of ``model``'s file, by name."""
    state = model._state()
    if model.solver_ == "nystrom":
        return {"alpha": model.alpha_, **{name: state[name] for name in SPARSE_ARRAYS}}
    out = {"alpha": model.alpha_, "X_train": model.X_train_, "y_train": model.y_train_}
    if model.solver_ == "exact":
        out["L"] = model.L_
    return out


def fitted(model: GaussianProcessRegressor) -> dict[str, Any]:
    """The GP's fitted scalars of the file (beside the estimators' common ones)."""
    state = model._state()
    lml = float(model.log_marginal_likelihood_value_)
    out: dict[str, Any] = {
        "variance_": model.variance_,
        "log_marginal_likelihood_value_": lml if np.isfinite(lml) else None,
        "y_train_mean": state["y_train_mean"].tolist(),
        "y_train_std": state["y_train_std"].tolist(),
        "alpha_lazy": isinstance(model.alpha_, da.Array)}
    if model.solver_ == "nystrom":
        out.update({"sgpr_trace": state["trace"], "sgpr_n": state["n"],
                    "sgpr_jitter": state["jitter"]})
    else:
        out.update({f"{name}_lazy": isinstance(getattr(model, f"{name}_"), da.Array)
                    for name in ("X_train", "y_train")})
        out["pivot_seed"] = state["pivot_seed"]
    return out


def restore(model: GaussianProcessRegressor, fitted: dict[str, Any],
            read: Callable[[str, bool], Any]) -> None:
    """Give ``model`` its fitted state from the file; pop the GP's entries from ``fitted``."""
    state: dict[str, Any] = {"alpha_": read("alpha", fitted.pop("alpha_lazy"))}
    if fitted["solver_"] == "nystrom":
        state.update({name: read(name, False) for name in SPARSE_ARRAYS})
        state.update({name[len("sgpr_"):]: fitted.pop(name) for name in sorted(GP_SPARSE)})
    else:
        state["X_train_"] = read("X_train", fitted.pop("X_train_lazy"))
        state["y_train_"] = read("y_train", fitted.pop("y_train_lazy"))
        # files written before the seed was stored: the pivots random_state gives
        seed = fitted.pop("pivot_seed", None)
        state["pivot_seed"] = fixed_seed(model.random_state) if seed is None else int(seed)
    if fitted["solver_"] == "exact":
        state["L_"] = read("L", False)
    state["y_train_mean"] = np.asarray(fitted.pop("y_train_mean"), dtype=np.float64)
    state["y_train_std"] = np.asarray(fitted.pop("y_train_std"), dtype=np.float64)
    lml = fitted["log_marginal_likelihood_value_"]
    fitted["log_marginal_likelihood_value_"] = float("nan") if lml is None else float(lml)
    model._set_state(fitted["solver_"], fitted["variance_"], state)
