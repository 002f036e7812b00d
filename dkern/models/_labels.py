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
import logging
import warnings
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np

from ..io import group_exists, is_array_name, list_arrays, open_array
from ..io.labelled import (
    LabelledRows,
    as_data_array,
    check_same_samples,
    is_labelled,
    labelled_rows,
)

__all__ = ["labelled_fit", "labelled_output", "labelled_score", "written_arrays"]

logger = logging.getLogger(__name__)

#: The xarray rows a prediction method was called with while it writes to ``out``: the
#: writer names the stored arrays' dimensions after them (:func:`written_arrays`).
_WRITING_FOR: contextvars.ContextVar[LabelledRows | None] = contextvars.ContextVar(
    "dkern_writing_for", default=None)

#: Coordinate dtypes a store holds as they are (``write_arrays`` takes numbers, bools and
#: times).
_STORABLE_KINDS = "biufmM"


def written_arrays(url: Any, group: str, arrays: dict[str, Any], base: str
                   ) -> tuple[dict[str, Any], dict[str, tuple[str, ...]],
                              dict[str, tuple[str, ...]]]:
    """The arrays a prediction method writes to the group ``group`` of ``url`` for ``out``,
    their dimension names, and the coordinates xarray is to read with them.

    When X was not xarray: ``arrays`` as they are, and no names (dkern's defaults). When
    it was, with rows along ``D``, the arrays lie along the dimension xarray pairs them by:

    - ``D`` itself when the group (as ``xr.open_zarr`` reads it, the arrays being replaced
      left out) has no ``D``, and then X's coordinates along ``D`` are written beside them;
    - ``D`` when the group's rows along ``D`` are X's rows: the same coordinate values in
      the same order (or, X having no coordinate there, as many rows, paired by position
      as xarray pairs unlabelled rows);
    - otherwise (a subset or a reordering of the group's rows) a dimension of their own,
      ``<base>_<D>``, with X's coordinate under that name: reusing ``D`` would pair each
      prediction with another row's label, or make the group unopenable for its sizes.

    X's other coordinates along ``D`` are written with its index under their own names, or
    ``<base>_<name>`` where the group has that name already (nothing of the group is
    replaced), and marked as the arrays' coordinates. Coordinates of a dtype a store does
    not hold (strings, objects) are left out, with a warning.

    A second axis is ``"output"``, or ``<base>_output`` where the group's ``"output"`` has
    another length.

    Parameters
    ----------
    url : str or os.PathLike
        The store.
    group : str
        The group the arrays are written to.
    arrays : dict of str to array, shape (m,) or (m, k)
        The predictions by name, one row per row of X.
    base : str
        The prefix of dimension names of their own, e.g. the array's name ``"pred"``.

    Returns
    -------
    arrays : dict of str to array
        ``arrays``, plus X's coordinates when they are written.
    dims : dict of str to tuple of str
        The dimension names of each array.
    coordinates : dict of str to tuple of str
        For each of ``arrays``, the names of the non-index coordinates written with it.
    """
    rows = _WRITING_FOR.get()
    if rows is None:
        return dict(arrays), {}, {}
    exists = group_exists(url, group)
    present = _group_dataset(url, group, exists, leaving_out=set(arrays))
    hidden = _hidden_arrays(url, group, exists, present, leaving_out=set(arrays))
    ndim = max(a.ndim for a in arrays.values())
    row_dim, with_coordinate = _row_dim(rows, present, base, hidden)
    names = (row_dim, _column_dim(arrays, present, base, row_dim, hidden))[:ndim]
    dims = {name: names[:a.ndim] for name, a in arrays.items()}
    if not with_coordinate:  # the group's rows: its coordinates of X's label them too
        kept = _group_coordinates(url, group, rows, row_dim, present)
        return dict(arrays), dims, {name: kept for name in arrays} if kept else {}
    written = dict(arrays)
    taken = set(arrays).union(*dims.values())  # the columns' dimension too
    for name, stored in _coordinate_names(rows, row_dim, present, hidden, taken,
                                          base).items():
        coordinate = rows.coords[name].data  # dask stays lazy: written chunk by chunk
        nameable = is_array_name(stored) and not any(ch.isspace() for ch in stored)
        if coordinate.dtype.kind not in _STORABLE_KINDS or not nameable:
            why = (f"its dtype {coordinate.dtype} is not one a dkern store holds (numbers, "
                   "bools and times)" if coordinate.dtype.kind not in _STORABLE_KINDS else
                   f"{stored[:60]!r} is not a name a dkern store takes, or has spaces "
                   "(xarray reads coordinate names space-separated)")
            logger.warning("the predictions written to %s lie along %r, without X's %r "
                           "coordinate: %s. Attach it after reading, e.g. "
                           "pred.assign_coords({%r: (%r, X[%r].values)}).", group or "/",
                           row_dim, name[:60], why, name[:60], row_dim, name[:60])
            continue
        written[stored], dims[stored] = coordinate, (row_dim,)
    others = tuple(n for n in written if n not in arrays and n != row_dim)
    return written, dims, {name: others for name in arrays} if others else {}


def _group_coordinates(url: Any, group: str, rows: LabelledRows, row_dim: str,
                       present: Any) -> tuple[str, ...]:
    """X's non-index coordinates that the group holds along ``row_dim`` with X's values
    (compared chunk by chunk: a dask-backed coordinate is not loaded whole)."""
    if present is None:
        return ()
    checks = {}
    for name, c in rows.coords.items():
        if name == rows.dim or name not in present.variables or present[name].dims != (row_dim,):
            continue
        try:
            stored = open_array(url, f"{group}/{name}" if group else name)
            if stored.shape == c.shape:
                checks[name] = da.all(stored == da.asarray(c.data))
        except (ValueError, TypeError):  # not an array dkern reads (strings), or not alike
            continue
    same = dask.compute(checks)[0]  # one graph for all of them
    return tuple(name for name, equal in same.items() if equal)


def _coordinate_names(rows: LabelledRows, row_dim: str, present: Any, hidden: set[str],
                      taken: set[str], base: str) -> dict[str, str]:
    """X's coordinates along its sample dimension and the names they are stored under: the
    index as ``row_dim``; each other under its own name, or ``<base>_<name>`` (numbered if
    need be) where that names anything of the group, of this write or a dimension."""
    stored = {rows.dim: row_dim} if rows.dim in rows.coords else {}
    used = set(taken) | hidden | {row_dim}

    def clashes(name: str) -> bool:
        return name in used or (present is not None and (
            name in present.variables or name in present.sizes))

    others = sorted(set(rows.coords) - {rows.dim})
    # names free as they are first, so a renamed one never takes another's own name
    for name in sorted(others, key=clashes):
        candidate, number = name, 0
        while clashes(candidate):
            number += 1
            candidate = f"{base}_{name}" if number == 1 else f"{base}_{name}_{number - 1}"
        stored[name] = candidate
        used.add(candidate)
    return stored


def _group_dataset(url: Any, group: str, exists: bool, leaving_out: set[str]) -> Any:
    """The group as ``xr.open_zarr`` reads it, without the variables in ``leaving_out``
    (the arrays a write replaces): an empty Dataset for a group not there yet (``exists``
    False), None for one xarray cannot open."""
    import xarray as xr  # present: X was an xarray object

    if not exists:
        return xr.Dataset()
    try:
        with warnings.catch_warnings():  # a group without consolidated metadata
            warnings.simplefilter("ignore", RuntimeWarning)
            ds = xr.open_zarr(url, group=group or None, chunks=None)
    except Exception as err:  # noqa: BLE001 - any reason leaves the same choice
        logger.info("xarray cannot open %s (%s): the predictions get dimensions of their "
                    "own", group or "/", err)
        return None
    return ds.drop_vars([v for v in leaving_out if v in ds.variables])


def _hidden_arrays(url: Any, group: str, exists: bool, present: Any,
                   leaving_out: set[str]) -> set[str]:
    """Names of the group's dkern arrays xarray does not see (on a store without links,
    such as an object store, none of them): a coordinate written under one of them would
    replace it, or be refused as taken."""
    if not exists:
        return set()
    seen = set(present.variables) if present is not None else set()
    return set(list_arrays(url, group)) - seen - leaving_out


def _row_dim(rows: LabelledRows, present: Any, base: str,
             hidden: set[str]) -> tuple[str, bool]:
    """The rows' dimension name in the group ``present``, and whether X's coordinate is
    written with it (not when the group's own labels the same rows)."""
    if present is not None and rows.dim not in present.sizes \
            and rows.dim not in present.variables and rows.dim not in hidden:
        return rows.dim, True
    if present is not None and _same_rows(rows, present):
        return rows.dim, False
    own = _free_name(present, f"{base}_{rows.dim}", hidden)
    logger.info("X's rows along %r are not the store's rows along it: the predictions lie "
                "along %r", rows.dim, own)
    return own, True


def _same_rows(rows: LabelledRows, present: Any) -> bool:
    """Whether the group's rows along X's sample dimension are X's rows, in X's order."""
    dim = rows.dim
    if present.sizes.get(dim) != rows.n_rows:
        return False
    ours = rows.coords[dim].values if dim in rows.coords else None
    theirs = present[dim].values if dim in present.coords else None
    if ours is None or theirs is None:  # unlabelled rows pair by position, as in xarray
        return ours is None
    # times are the same instants in any unit (pandas makes µs, xarray reads back ns)
    alike = ours.dtype == theirs.dtype or (ours.dtype.kind == theirs.dtype.kind
                                           and ours.dtype.kind in "mM")
    return bool(alike and np.array_equal(ours, theirs))


def _column_dim(arrays: dict[str, Any], present: Any, base: str, row_dim: str,
                hidden: set[str]) -> str:
    """A 2-D prediction's second dimension: ``"output"`` unless the group's has another
    length (or the group cannot be read), or the rows are along ``"output"``."""
    width = next((a.shape[1] for a in arrays.values() if a.ndim == 2), None)
    if width is None or (row_dim != "output" and present is not None
                         and present.sizes.get("output", width) == width):
        return "output"
    return _free_name(present, f"{base}_output", hidden, besides=row_dim)


def _free_name(present: Any, name: str, hidden: set[str], besides: str | None = None) -> str:
    """``name``, or ``name`` with a number, along which nothing of the group lies but a
    coordinate of that name (one an earlier write of the same predictions left), no array
    xarray does not see (``hidden``), and other than ``besides`` (the rows' dimension, for
    the columns')."""
    candidate, number = name, 0
    while candidate == besides or candidate in hidden or (
            present is not None and _taken(present, candidate)):
        number += 1
        candidate = f"{name}_{number}"
    return candidate


def _taken(present: Any, name: str) -> bool:
    if name not in present.variables:
        return name in present.sizes
    return present[name].dims != (name,) or name in present.drop_vars([name]).sizes


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
