"""xarray in and out of the estimators' methods.

``fit`` takes a ``DataArray`` or ``Dataset`` as rows along its sample dimension (y's
dimension when y is a DataArray, else X's first or a Dataset's shared one) and records
it as ``sample_dim_``; the prediction methods take X the same way and return DataArrays
along that dimension, with X's sample coordinates. A dask-backed operand stays lazy
(:mod:`dkern.io.labelled`); a numpy-backed one goes to the method as a DataFrame when it
has feature names, so scikit-learn records and checks them as it does for pandas.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ..io.labelled import (
    LabelledRows,
    as_data_array,
    check_same_samples,
    is_labelled,
    labelled_rows,
)

__all__ = ["labelled_fit", "labelled_output", "labelled_score", "written_dims"]

#: The xarray rows a prediction method was called with while it writes to ``out``: the
#: writer names the stored array's dimensions after them (:func:`written_dims`).
_WRITING_FOR: contextvars.ContextVar[LabelledRows | None] = contextvars.ContextVar(
    "dkern_writing_for", default=None)


def written_dims(ndim: int) -> tuple[str, ...] | None:
    """Dimension names for a prediction of ``ndim`` axes written to ``out``: X's sample
    dimension (then ``"output"``) when X was xarray, so that xarray aligns the stored
    prediction with X's coordinates; None (dkern's default names) otherwise."""
    rows = _WRITING_FOR.get()
    if rows is None:
        return None
    return (rows.dim, "output")[:ndim]


def labelled_fit(fit: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fit(self, X, y=None, ...)`` to take xarray X and y."""

    @functools.wraps(fit)
    def wrapper(self: Any, X: Any, y: Any = None, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.pop("sample_dim_", None)
        if not (is_labelled(X) or is_labelled(y)):
            return fit(self, X, y, *args, **kwargs)
        rows, target = _paired(X, y, lambda X, along: labelled_rows(X, name="X",
                                                                    sample_dim=along))
        fitted = fit(self, _method_operand(rows) if rows else X,
                     target.data if target is not None else y, *args, **kwargs)
        if rows is not None:
            self.sample_dim_ = rows.dim
            if rows.features is not None and not hasattr(self, "feature_names_in_"):
                self.feature_names_in_ = np.asarray(rows.features, dtype=object)
        return fitted

    return wrapper


def labelled_score(score: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``score(self, X, y=None, ...)`` (scikit-learn's mixins' or the estimator's) to
    take xarray X and y, refusing a y that labels other samples than X."""

    @functools.wraps(score)
    def wrapper(self: Any, X: Any, y: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not (is_labelled(X) or is_labelled(y)):
            return score(self, X, y, *args, **kwargs)
        rows, target = _paired(X, y, functools.partial(_predict_rows, self))
        return score(self, _method_operand(rows) if rows else X,
                     target.data if target is not None else y, *args, **kwargs)

    return wrapper


def labelled_output(*names: str, column_dim: str = "output",
                    columns: str | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Wrap a method of X to take xarray X and return DataArrays along its samples.

    Parameters
    ----------
    *names : str
        The name of each array the method returns (one, or one per tuple element).
    column_dim : str, default "output"
        The second dimension of a 2-D result.
    columns : str, optional
        The estimator attribute holding the coordinates along ``column_dim`` (``classes_``).
    """

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            X = args[0] if args else kwargs.get("X")
            if not is_labelled(X):
                return method(self, *args, **kwargs)
            rows = _predict_rows(self, X)
            plain = _method_operand(rows)
            args, kwargs = ((plain, *args[1:]), kwargs) if args else (args, {**kwargs, "X": plain})
            if _writes(method, args, kwargs):
                token = _WRITING_FOR.set(rows)
                try:
                    return method(self, *args, **kwargs)  # out, as without xarray
                finally:
                    _WRITING_FOR.reset(token)
            result = method(self, *args, **kwargs)
            labels = getattr(self, columns) if columns else None
            if isinstance(result, tuple):
                return tuple(_labelled(r, rows, names[min(i, len(names) - 1)], column_dim,
                                       labels, after_first=i > 0)
                             for i, r in enumerate(result))
            return _labelled(result, rows, names[-1], column_dim, labels)  # kneighbors: index

        return wrapper

    return decorate


def _writes(method: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether the call passes ``out`` (by keyword, or as the second positional)."""
    if kwargs.get("out") is not None:
        return True
    names = list(inspect.signature(method).parameters)[1:]  # without self
    return "out" in names and len(args) > names.index("out") and \
        args[names.index("out")] is not None


def _paired(X: Any, y: Any, read_rows: Callable[[Any, str | None], LabelledRows]
            ) -> tuple[LabelledRows | None, LabelledRows | None]:
    """X's rows (None unless xarray), read by ``read_rows(X, along)`` along y's dimension
    when X has it, and y's (None unless xarray), refused if they label other samples."""
    target = _target_rows(y)
    rows = None
    if is_labelled(X):
        along = target.dim if target is not None and target.dim in X.dims else None
        rows = read_rows(X, along)
        if target is not None:
            check_same_samples(rows, target)
    return rows, target


def _target_rows(y: Any) -> LabelledRows | None:
    if not is_labelled(y):
        return None
    if type(y).__name__ == "Dataset":
        raise ValueError("y is a Dataset; pass the target variable as a DataArray, e.g. "
                         "ds['y'].")
    return labelled_rows(y, name="y")


def _predict_rows(model: Any, X: Any, along: str | None = None) -> LabelledRows:
    """X's rows along ``along``, else the dimension the model was fitted along if X has
    it, else X's default; a Dataset's variables taken by the fitted feature names."""
    dim = along or getattr(model, "sample_dim_", None)
    names = getattr(model, "feature_names_in_", None)
    rows = labelled_rows(X, name="X", sample_dim=dim if dim in X.dims else None,
                         features=None if names is None else [str(n) for n in names])
    if names is not None and rows.features is not None and list(names) != rows.features:
        raise ValueError(f"X's feature names {rows.features} differ from those the model was "
                         f"fitted on, {list(names)}; pass the same features in the same order.")
    return rows


def _method_operand(rows: LabelledRows) -> Any:
    """The operand the estimator's method takes: dask as it is; numpy with feature names as
    a DataFrame (scikit-learn's name checks), else as it is."""
    if isinstance(rows.data, np.ndarray) and rows.features is not None and rows.data.ndim == 2:
        import pandas as pd  # a dependency of xarray, present with it

        return pd.DataFrame(rows.data, columns=rows.features)
    return rows.data


def _labelled(result: Any, rows: LabelledRows, name: str, column_dim: str,
              columns: Any, *, after_first: bool = False) -> Any:
    """``result`` as a DataArray when it has one entry per row. An (m, m) array after the
    first (a GP's covariance, which would need two sample dimensions) stays an array."""
    shape = getattr(result, "shape", ())
    if len(shape) not in (1, 2) or shape[0] != rows.n_rows \
            or (after_first and shape == (rows.n_rows, rows.n_rows)):
        return result
    return as_data_array(result, rows, name=name, column_dim=column_dim, columns=columns)
