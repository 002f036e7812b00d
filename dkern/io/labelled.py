"""xarray operands: a ``DataArray`` or ``Dataset`` as rows along a sample dimension.

A dask-backed xarray object (``xr.open_zarr``) stays lazy: its dask array is taken as
it is, with the sample dimension first and every other axis in one chunk, so nothing is
loaded; a numpy-backed one becomes an in-memory array. xarray itself is not imported
here: dkern works without it, and an object is recognised by its class.

Data flow::

    DataArray (sample, feature) / (feature, sample) / (sample,)  --labelled_rows-->  rows
    Dataset {variable: (sample,)}, one feature each              --labelled_rows-->  rows
    rows' result (numpy or dask)                                 --as_data_array-->  DataArray
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

__all__ = ["LabelledRows", "as_data_array", "check_same_samples", "is_labelled",
           "labelled_rows"]


def is_labelled(X: Any) -> bool:
    """True for an xarray ``DataArray`` or ``Dataset``."""
    cls = type(X)
    return cls.__module__.split(".")[0] == "xarray" and cls.__name__ in ("DataArray", "Dataset")


@dataclass(frozen=True)
class LabelledRows:
    """An xarray operand as rows.

    Attributes
    ----------
    data : ndarray or dask.array.Array, shape (n,) or (n, d)
        The values, the sample dimension first; dask data keeps its row chunks and has
        every other axis in one chunk.
    dim : str
        The sample dimension's name.
    coords : dict of str to DataArray
        The coordinates along the sample dimension alone (its index and any others),
        given to the results.
    features : list of str or None
        The feature names: a Dataset's variables, or a DataArray's string coordinate along
        its feature dimension; None when there are none.
    """

    data: np.ndarray | da.Array
    dim: str
    coords: dict[str, Any]
    features: list[str] | None

    @property
    def n_rows(self) -> int:
        return int(self.data.shape[0])


def labelled_rows(X: Any, *, name: str, sample_dim: str | None = None,
                  features: Sequence[str] | None = None) -> LabelledRows:
    """``X`` (a DataArray or Dataset) as rows along its sample dimension.

    Parameters
    ----------
    X : xarray.DataArray or xarray.Dataset
        A DataArray of one or two dimensions, or a Dataset whose data variables are
        one feature each, all along one shared dimension ``(sample,)``.
    name : str
        How messages name the operand (``"X"``, ``"y"``).
    sample_dim : str, optional
        The sample dimension. Default: a Dataset's one shared dimension; a DataArray's
        first dimension.
    features : sequence of str, optional
        For a Dataset, the variables to take, in this order (the names a model was
        fitted on); default: all of its data variables, in their order.

    Returns
    -------
    LabelledRows

    Raises
    ------
    ValueError
        ``sample_dim`` is not a dimension of X; a Dataset lacks one of ``features``, has
        no data variables, or variables along different dimensions; a DataArray has
        more than two dimensions.
    """
    if type(X).__name__ == "Dataset":
        return _dataset_rows(X, name, sample_dim, features)
    return _data_array_rows(X, name, sample_dim)


def as_data_array(values: Any, like: LabelledRows, *, name: str,
                  column_dim: str = "output", columns: Any = None) -> Any:
    """A result over ``like``'s rows as a DataArray with their sample coordinates.

    Parameters
    ----------
    values : ndarray or dask.array.Array, shape (n,) or (n, k)
        One value (or row of values) per row of ``like``; dask stays lazy.
    like : LabelledRows
        The rows the values were computed for.
    name : str
        The DataArray's name, e.g. ``"prediction"``.
    column_dim : str, default "output"
        The name of a 2-D result's second dimension.
    columns : array-like of length k, optional
        Coordinates along ``column_dim`` (a classifier's classes).

    Returns
    -------
    xarray.DataArray with dims ``(like.dim,)`` or ``(like.dim, column_dim)``
    """
    import xarray as xr  # present: ``like`` came from an xarray object

    if column_dim == like.dim:  # a sample dimension named "class" or "output"
        column_dim = f"{column_dim}_"
    dims = (like.dim,) if values.ndim == 1 else (like.dim, column_dim)
    coords = dict(like.coords)
    if columns is not None and values.ndim == 2:
        coords[column_dim] = np.asarray(columns)
    return xr.DataArray(values, dims=dims, coords=coords, name=name)


def check_same_samples(X: LabelledRows, y: LabelledRows) -> None:
    """Refuse ``y`` labelling other samples than ``X`` (xarray would align them; a fit
    pairing rows by position must not silently pair different samples).

    Raises
    ------
    ValueError
        Both carry an index along the sample dimension and the indexes differ.
    """
    if X.dim != y.dim or X.dim not in X.coords or y.dim not in y.coords:
        return
    a, b = X.coords[X.dim].values, y.coords[y.dim].values
    if a.shape != b.shape or not np.array_equal(a, b):
        raise ValueError(f"X and y label different samples along {X.dim!r}; align them "
                         f"first, e.g. X, y = xarray.align(X, y, join='inner').")


def _data_array_rows(X: Any, name: str, sample_dim: str | None) -> LabelledRows:
    if X.ndim not in (1, 2):
        raise ValueError(f"{name} is a DataArray with dims {X.dims}; dkern takes one or two "
                         f"dimensions: (sample,) or (sample, feature). Select or stack the "
                         f"others first, e.g. {name}.stack(feature=[...]).")
    dim = X.dims[0] if sample_dim is None else _checked_dim(X, name, sample_dim)
    X = X.transpose(dim, ...)
    features = None
    if X.ndim == 2:
        feature_dim = X.dims[1]
        if feature_dim in X.coords and X[feature_dim].dtype.kind in "UO":
            features = [str(v) for v in X[feature_dim].values]
    return LabelledRows(_rows_data(X.data), dim, _sample_coords(X, dim), features)


def _dataset_rows(ds: Any, name: str, sample_dim: str | None,
                  features: Sequence[str] | None) -> LabelledRows:
    names = list(ds.data_vars) if features is None else list(features)
    missing = [v for v in names if v not in ds.data_vars]
    if missing:
        raise ValueError(f"{name} is a Dataset without the variables {missing} the model was "
                         f"fitted on; it has {list(ds.data_vars)}.")
    if not names:
        raise ValueError(f"{name} is a Dataset with no data variables; pass one with a "
                         "variable per feature.")
    dim = _shared_dim(ds, names, name) if sample_dim is None else _checked_dim(ds, name,
                                                                              sample_dim)
    columns = []
    for v in names:
        var = ds[v]
        if var.dims != (dim,):
            raise ValueError(f"{name}'s variable {v!r} has dims {var.dims}; each variable of "
                             f"a Dataset is one feature, of dims ({dim!r},). Pass a variable "
                             f"of several columns as a DataArray, or split it "
                             f"(ds[{v!r}].to_dataset(dim=...)).")
        columns.append(var.data[:, None])
    lazy = any(isinstance(c, da.Array) for c in columns)
    data = da.concatenate(columns, axis=1) if lazy else np.concatenate(columns, axis=1)
    return LabelledRows(_rows_data(data), dim, _sample_coords(ds, dim), names)


def _shared_dim(ds: Any, names: list[str], name: str) -> str:
    shared = set(ds[names[0]].dims).intersection(*(ds[v].dims for v in names[1:]))
    if len(shared) == 1:
        return shared.pop()
    dims = {v: ds[v].dims for v in names}
    raise ValueError(f"{name} is a Dataset whose variables share "
                     f"{'no dimension' if not shared else f'the dimensions {sorted(shared)}'}"
                     f" ({dims}); dkern needs one sample dimension. Select the variables "
                     "that lie along it.")


def _checked_dim(X: Any, name: str, dim: str) -> str:
    if dim not in X.dims:
        raise ValueError(f"{name} has no sample dimension {dim!r}; its dims are "
                         f"{tuple(X.dims)}. Rename yours: {name}.rename({{'<yours>': {dim!r}}}).")
    return dim


def _rows_data(data: Any) -> np.ndarray | da.Array:
    """Dask data with every non-row axis in one chunk (dkern's row chunking)."""
    if isinstance(data, da.Array):
        return data.rechunk({i: -1 for i in range(1, data.ndim)}) if data.ndim > 1 else data
    return np.asarray(data)


def _sample_coords(X: Any, dim: str) -> dict[str, Any]:
    return {k: c.variable for k, c in X.coords.items() if c.dims == (dim,)}
