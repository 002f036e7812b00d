"""Zarr <-> dask: row-chunked operands, versioned checksummed stores, synthetic data.

The only dkern package that imports zarr. Data flow::

    numpy / dask / zarr / (url, path)  --as_rows-->  dask array chunked by rows
    {name: array}  --write_arrays-->  store  --open_array-->  verified dask array
    store  --check_store / clean_store-->  damage report / leftovers reclaimed
"""

from dkern.io._store import check_not_zarr_v2, filesystem
from dkern.io.maintenance import StoreReport, check_store, clean_store, remove_store
from dkern.io.read import group_exists, list_arrays, open_array, read_attrs, read_manifest
from dkern.io.rows import (
    Rows,
    StoreRef,
    as_rows,
    checked_values,
    default_row_chunk,
    is_lazy,
    is_store_ref,
    path_within,
    store_location,
)
from dkern.io.synthetic import make_regression_store
from dkern.io.write import is_array_name, write_array, write_arrays

__all__ = [
    "Rows",
    "StoreRef",
    "StoreReport",
    "as_rows",
    "checked_values",
    "check_not_zarr_v2",
    "check_store",
    "clean_store",
    "default_row_chunk",
    "filesystem",
    "group_exists",
    "is_array_name",
    "is_lazy",
    "is_store_ref",
    "path_within",
    "store_location",
    "list_arrays",
    "make_regression_store",
    "open_array",
    "read_attrs",
    "read_manifest",
    "remove_store",
    "write_array",
    "write_arrays",
]
