"""Operand normalisation: any array-like becomes a dask array chunked by rows only."""

from __future__ import annotations

import math
import os
from typing import Any, TypeAlias

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize
from numpy.typing import ArrayLike

from dkern.io.read import open_array, zarr_to_dask

__all__ = ["TARGET_CHUNK_BYTES", "Rows", "StoreRef", "as_rows", "default_row_chunk", "is_lazy",
           "is_store_ref", "path_within", "store_location"]

#: A reference to an array of a Zarr store: ``(url, path)``, e.g. ``("data.zarr", "X")``.
StoreRef: TypeAlias = tuple[str | os.PathLike[str], str]
#: What the estimators take as rows (and targets): an in-memory array-like (numpy, a
#: list, a DataFrame), a dask array, a ``zarr.Array`` or a :data:`StoreRef`; lazy ones
#: are read chunk by chunk (:func:`as_rows`).
Rows: TypeAlias = ArrayLike | da.Array | zarr.Array | StoreRef

#: Bytes per row chunk that ``default_row_chunk`` aims for.
TARGET_CHUNK_BYTES = 16 * 2**20

_SHAPES = {1: "(n_samples,)", 2: "(n_samples, n_features)"}


def is_store_ref(X: Any) -> bool:
    """True for ``(url, path)``: a str or path-like store and a str array path.

    Any other tuple is an ordinary array-like, e.g. ``((1.0, 2.0), (3.0, 4.0))``.
    """
    return (isinstance(X, tuple) and len(X) == 2 and isinstance(X[0], str | os.PathLike)
            and isinstance(X[1], str))


def store_location(url: str | os.PathLike[str]) -> str:
    """``url`` in one spelling per store, to tell whether two references name the same one:
    a local path resolved (symlinks, ``..``), also when spelt as a URL of the local file
    system (``file://``, ``local://``, which dkern writes to the same folder); another URL
    without its trailing slashes."""
    text = os.fspath(url)
    protocol, _, path = text.rpartition("://")
    if not protocol:
        return os.path.realpath(text)
    return os.path.realpath(path) if protocol in _LOCAL_PROTOCOLS else text.rstrip("/")


#: fsspec's protocols of the local file system (``make_store`` writes them to that folder).
_LOCAL_PROTOCOLS = ("file", "local")


def path_within(path: str, container: str) -> bool:
    """Whether the slash-separated ``path`` is ``container`` or lies inside it (both spelt
    alike: :func:`store_location`, or array paths with their outer slashes stripped)."""
    return path == container or path.startswith(f"{container.rstrip('/')}/")


def is_lazy(X: Any) -> bool:
    """True for operands read chunk by chunk: dask, Zarr, or a ``(url, path)`` reference."""
    return isinstance(X, da.Array | zarr.Array) or is_store_ref(X)


def default_row_chunk(n: int, n_cols: int, itemsize: int) -> int:
    """Rows per chunk: about 16 MiB, at least two chunks once ``n >= 2048``.

    Parameters
    ----------
    n : int
        Number of rows.
    n_cols : int
        Number of values per row (the product of the non-row axes).
    itemsize : int
        Bytes per value.

    Returns
    -------
    int
        Between 1 and ``max(n, 1)``; at most ``ceil(n / 2)`` when ``n >= 2048`` so
        that two workers both get work.
    """
    rows = TARGET_CHUNK_BYTES // max(1, n_cols * itemsize)
    if n >= 2048:
        rows = min(rows, math.ceil(n / 2))
    return max(1, min(rows, n))


def as_rows(
    X: Any,
    *,
    name: str,
    ndim: int | tuple[int, ...] = 2,
    row_chunks: int | None = None,
    check_finite: bool = True,
    dtype: Any = None,
) -> da.Array:
    """Normalise an operand to a float dask array chunked along rows only.

    Parameters
    ----------
    X : array-like, dask.array.Array, zarr.Array or tuple (url, path)
        The operand, of shape (n_samples, ...). A tuple names an array in a
        store and is opened with :func:`dkern.io.open_array`.
    name : str
        How messages and task keys name the operand (``"X"``, ``"y"``).
    ndim : int or tuple of int, default 2
        The number of dimensions required, or the allowed numbers.
    row_chunks : int, optional
        Rows per chunk. Default: dask input keeps its row chunks; numpy input
        uses :func:`default_row_chunk`; stored input uses the smallest whole
        number of Zarr chunks (at least one) not above that.
    check_finite : bool, default True
        Reject NaN and infinity: numpy input now, dask and stored input when
        each chunk is computed (no extra pass over the data).
    dtype : {None, numpy.float32, numpy.float64}
        Cast to this dtype. Default: floats keep theirs, integers become float64.

    Returns
    -------
    dask.array.Array of shape X.shape
        Axis 0 chunked, every other axis a single chunk.

    Raises
    ------
    ValueError
        Wrong ``ndim``, zero rows, non-row axes split into chunks (dask input),
        or non-finite values.
    TypeError
        A dtype that is not integer or floating point.
    """
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    target = _target_dtype(dtype)
    if row_chunks is not None and (not isinstance(row_chunks, int) or row_chunks < 1):
        raise ValueError(f"row_chunks must be a positive int; got {row_chunks!r}.")
    if isinstance(X, da.Array):
        out = _dask_rows(X, name, allowed, row_chunks)
    elif isinstance(X, zarr.Array) or is_store_ref(X):
        out = _stored_rows(X, name, allowed, row_chunks)
    else:
        return _numpy_rows(X, name, allowed, row_chunks, check_finite, target)
    out = out.astype(_float_dtype(name, out.dtype, target), copy=False)
    if check_finite:
        out = checked_values(out, name)
    return out


def _target_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    target = np.dtype(dtype)
    if target not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be None, numpy.float32 or numpy.float64; got {dtype!r}.")
    return target


def _float_dtype(name: str, dtype: np.dtype, target: np.dtype | None) -> np.dtype:
    """The dtype to compute in; TypeError for anything but integers and floats."""
    if dtype.kind not in "iuf":
        raise TypeError(
            f"{name} must hold integers or floating-point numbers; got dtype {dtype}. "
            f"Convert it first, e.g. {name}.astype(numpy.float64)."
        )
    if target is not None:
        return target
    return np.dtype(np.float64) if dtype.kind in "iu" else dtype


def _check_shape(name: str, shape: tuple[float, ...], allowed: tuple[int, ...]) -> None:
    if len(shape) not in allowed:
        want = " or ".join(f"{k}-D {_SHAPES.get(k, '')}".rstrip() for k in allowed)
        raise ValueError(f"{name} must be {want}; got shape {shape}.{_ndim_fix(name, shape)}")
    if shape[0] == 0:
        raise ValueError(f"{name} has zero rows (shape {shape}); pass at least one sample.")
    if math.isnan(shape[0]):
        raise ValueError(
            f"{name} has unknown chunk sizes (shape {shape}); "
            f"call {name}.compute_chunk_sizes() first."
        )


def _ndim_fix(name: str, shape: tuple[float, ...]) -> str:
    if len(shape) == 1:
        return f" Use {name}.reshape(-1, 1) for a single feature."
    if len(shape) == 2 and shape[1] == 1:
        return f" Use {name}.ravel() for a single column."
    return ""


def _numpy_rows(
    X: Any,
    name: str,
    allowed: tuple[int, ...],
    row_chunks: int | None,
    check_finite: bool,
    target: np.dtype | None,
) -> da.Array:
    x = np.asarray(X)
    _check_shape(name, x.shape, allowed)
    x = x.astype(_float_dtype(name, x.dtype, target), copy=False)
    if check_finite:
        bad = ~np.isfinite(x).reshape(len(x), _row_size(x)).all(axis=1)
        if bad.any():
            raise ValueError(
                f"{name} contains NaN or infinity in {int(bad.sum())} rows, the first at "
                f"row {int(np.argmax(bad))}. Drop or impute those rows."
            )
    rows = row_chunks or default_row_chunk(len(x), math.prod(x.shape[1:]), x.itemsize)
    return da.from_array(x, chunks=(rows, *x.shape[1:]), name=f"dk-{name}-{tokenize(x)}")


def _dask_rows(
    X: da.Array, name: str, allowed: tuple[int, ...], row_chunks: int | None
) -> da.Array:
    _check_shape(name, X.shape, allowed)
    split = [ax for ax in range(1, X.ndim) if len(X.chunks[ax]) > 1]
    if split:
        fix = "{" + ", ".join(f"{ax}: -1" for ax in range(1, X.ndim)) + "}"
        raise ValueError(
            f"{name} must be chunked along rows only; axes {split} have "
            f"{[len(X.chunks[ax]) for ax in split]} chunks. Use {name}.rechunk({fix})."
        )
    if row_chunks is not None:
        return X.rechunk({0: row_chunks})
    if 0 in X.chunks[0]:  # empty chunks hold nothing; some block reductions fail on them
        return X.rechunk({0: tuple(c for c in X.chunks[0] if c)})
    return X


def _stored_rows(
    X: zarr.Array | tuple[Any, str], name: str, allowed: tuple[int, ...], row_chunks: int | None
) -> da.Array:
    """Stored input: row chunks span whole Zarr chunks, other axes are merged."""
    if isinstance(X, zarr.Array):
        where = str(X.store_path)
        token = tokenize(where, X.shape, str(X.dtype), X.chunks)
        x = zarr_to_dask(X, url=where, label=name, name=f"dk-read-{name}-{token}")
    else:
        x = open_array(*X)
    _check_shape(name, x.shape, allowed)
    if row_chunks is None:
        stored = x.chunks[0][0]
        wanted = default_row_chunk(x.shape[0], math.prod(x.shape[1:]), x.dtype.itemsize)
        row_chunks = stored * max(1, wanted // stored)
    return x.rechunk({0: row_chunks, **{ax: -1 for ax in range(1, x.ndim)}})


def checked_values(x: da.Array, name: str, max_abs: float | None = None) -> da.Array:
    """``x`` whose chunks, as they are computed, raise ValueError naming the first row that
    holds NaN or infinity or, with ``max_abs``, a larger value in magnitude (no extra pass
    over the data: the check rides on the read)."""
    return da.map_blocks(
        _finite_block,
        x,
        name,
        max_abs,
        dtype=x.dtype,
        meta=x._meta,
        name=f"dk-check-{name}-{tokenize(x.name, name, max_abs)}",
    )


def _row_size(a: np.ndarray) -> int:
    """Values per row of ``a`` (1 for a vector); reshape's ``-1`` cannot infer it for 0 rows."""
    return int(np.prod(a.shape[1:], dtype=np.int64))


def _finite_block(block: np.ndarray, label: str, max_abs: float | None, *,
                  block_info: dict[Any, Any]) -> np.ndarray:
    """Pass ``block`` through; ValueError naming its global rows if any value is not finite
    (or, with ``max_abs``, larger in magnitude)."""
    rows = block.reshape(len(block), _row_size(block))  # an empty chunk too
    start, stop = block_info[0]["array-location"][0]
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{label} contains NaN or infinity in rows [{start}, {stop}) "
            f"(first at row {start + int(np.argmax(bad))}). Drop or impute those rows."
        )
    # a float64 bound: cast to a float32 block's dtype it would overflow to inf (and warn)
    if max_abs is not None and (big := np.abs(rows) > np.float64(max_abs)).any():
        row, col = np.unravel_index(int(np.argmax(big)), rows.shape)
        at = f"{start + int(row)}, {int(col)}" if block.ndim > 1 else f"{start + int(row)}"
        raise ValueError(
            f"{label}[{at}] = {rows[row, col]:.6g} is too large: dkern sums squares and "
            f"products of {label}'s values, which overflow float64 for |values| above "
            f"{max_abs:.3g} ({int(big.sum())} such entries in rows [{start}, {stop})). "
            f"Rescale {label} (e.g. by a power of 10) and fit again."
        )
    return block
