"""Versioned, checksummed writes published all at once by one pointer update.

A write of arrays ``{name: x}`` to a group goes in four steps:

1. validate names, dtypes, attributes and the overwrite rule (nothing on disk
   changes if this fails);
2. create every array at ``.dkern/v{k}/<name>`` (``k`` = the published version
   plus one) with codecs ``bytes -> zstd -> crc32c`` and write it chunk by chunk
   from dask;
3. publish: rewrite the group's ``zarr.json`` attributes with the new pointer
   table (one file, written atomically by the store), so readers see either the
   old version or the complete new one;
4. delete the arrays the new version superseded (best effort, failures logged).

Arrays not named in a write keep their current version. One writer at a time:
two concurrent writers to one group can lose each other's pointer update.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

from dkern._version import __version__
from dkern.errors import StoreError
from dkern.io._store import (
    FORMAT,
    POINTER_KEY,
    VERSIONS_DIR,
    Url,
    find_group,
    missing_part,
    open_group,
    plain_members,
    read_pointer,
    remove_created,
    where,
)
from dkern.io.rows import default_row_chunk

__all__ = ["write_array", "write_arrays"]

logger = logging.getLogger(__name__)


def write_arrays(
    url: Url,
    arrays: Mapping[str, Any],
    *,
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    chunk_rows: int | None = None,
    group: str = "",
) -> None:
    """Write named arrays and attributes as one new version, published atomically.

    Parameters
    ----------
    url : str or os.PathLike
        The store: a local path or any fsspec URL. Created if missing.
    arrays : mapping of str to numpy.ndarray or dask.array.Array
        Arrays of shape (n_rows, ...) with integer, float or bool dtype. Dask
        arrays are written chunk by chunk and never gathered on the client.
    attrs : mapping, optional
        JSON-serialisable attributes, merged into the current ones (keys given
        replace, others are kept); read back with :func:`read_attrs`.
    overwrite : bool, default False
        Replace arrays that already exist. Without it an existing name is refused.
    chunk_rows : int, optional
        Rows per stored chunk (every other axis is one chunk). Default: a
        regularly chunked dask array keeps its row chunks, anything else uses
        :func:`~dkern.io.default_row_chunk`.
    group : str, default ""
        The group inside the store, e.g. ``"models/krr"``.

    Raises
    ------
    StoreError
        A name already exists and ``overwrite`` is False.
    ValueError, TypeError
        A bad name, shape, dtype, ``chunk_rows`` or attribute. Nothing is written.

    Notes
    -----
    Layout: array ``name`` of version ``k`` is the Zarr array ``.dkern/v{k}/<name>``
    of the group; the group attribute ``"dkern"`` maps each name to its path,
    shape, dtype, chunks and chunk count (see :mod:`dkern.io._store`). Only the
    pointer update publishes, so a write that dies midway leaves the previous
    version visible and complete. One writer per group at a time.
    """
    url = os.fspath(url)
    group = group.strip("/")
    sources = {name: _as_source(name, x, chunk_rows) for name, x in _checked_items(arrays)}
    new_attrs = _checked_attrs(attrs)
    current = find_group(url, group)
    pointer = read_pointer(current, url, group) if current is not None else {}
    present = set(plain_members(current)) if current is not None else set()
    clashes = sorted(n for n in sources if n in pointer.get("arrays", {}) or n in present)
    if clashes and not overwrite:
        raise StoreError(
            f"{where(url, group)} already has arrays {clashes}; pass overwrite=True to "
            "replace them (the old ones stay readable until the new ones are complete)."
        )
    created = missing_part(url, group) if current is None else None
    root = open_group(url, group, mode="a")
    version = int(pointer.get("version", 0)) + 1
    try:
        entries = _write_version(root, version, sources)
    except BaseException:
        if created is not None:  # a failed call leaves no new store or group behind
            remove_created(url, created)
        raise
    new_pointer: dict[str, Any] = {
        "format": FORMAT,
        "dkern_version": __version__,
        "version": version,
        "arrays": {**pointer.get("arrays", {}), **entries},
        "attrs": {**pointer.get("attrs", {}), **new_attrs},
    }
    root.update_attributes({POINTER_KEY: new_pointer})  # the publish: one zarr.json write
    logger.info("published version %d of %s: %s", version, where(url, group), sorted(entries))
    stale = [pointer["arrays"][n]["path"] for n in clashes if n in pointer.get("arrays", {})]
    in_use = {entry["path"].rpartition("/")[0] for entry in new_pointer["arrays"].values()}
    _delete_superseded(root, stale + [n for n in clashes if n in present], in_use)


def write_array(
    x: Any, url: Url, path: str, *, overwrite: bool = False, chunk_rows: int | None = None
) -> None:
    """Write one array; ``path`` is ``"name"`` or ``"group/name"``.

    The same as ``write_arrays(url, {name: x}, group=group, ...)``.
    """
    group, _, name = path.strip("/").rpartition("/")
    write_arrays(url, {name: x}, overwrite=overwrite, chunk_rows=chunk_rows, group=group)


def _checked_items(arrays: Mapping[str, Any]) -> list[tuple[str, Any]]:
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError(
            f"arrays must be a non-empty mapping of name to array; got {arrays!r:.80}. "
            "Pass e.g. {'X': X}."
        )
    for name in arrays:
        if not isinstance(name, str) or not name or "/" in name or name.startswith((".", "__")):
            raise ValueError(
                f"array names must be non-empty strings without '/' that start with neither "
                f"'.' nor '__'; got {name!r}. Rename the array, or pass group= for nesting."
            )
    return list(arrays.items())


def _checked_attrs(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    if attrs is None:
        return {}
    try:
        return dict(json.loads(json.dumps(dict(attrs))))
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"attrs must be a JSON-serialisable mapping; {err}. Convert numpy values "
            "with .item() or .tolist()."
        ) from None


def _as_source(name: str, x: Any, chunk_rows: int | None) -> da.Array:
    """``x`` as a dask array chunked by a regular number of rows, other axes whole."""
    if not isinstance(x, da.Array):
        x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise TypeError(
            f"{name} must have a bool, integer or floating-point dtype; got {x.dtype}. "
            f"Convert it first, e.g. {name}.astype(numpy.float64)."
        )
    if x.ndim == 0:
        raise ValueError(f"{name} is 0-D; store scalars in attrs, or pass {name}.reshape(1).")
    if math.isnan(x.shape[0]):
        raise ValueError(f"{name} has unknown chunk sizes; call {name}.compute_chunk_sizes().")
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows must be a positive int; got {chunk_rows!r}.")
    rows = max(1, min(chunk_rows or _natural_rows(x), x.shape[0]))
    whole = {ax: -1 for ax in range(1, x.ndim)}
    if isinstance(x, np.ndarray):
        return da.from_array(x, chunks=(rows, *x.shape[1:]), name=False)
    return x.rechunk({0: rows, **whole})


def _natural_rows(x: np.ndarray | da.Array) -> int:
    """A dask array's row chunk if regular (zarr's grid is), else the default."""
    if isinstance(x, da.Array):
        first, *rest = x.chunks[0]
        if all(c == first for c in rest[:-1]) and (not rest or rest[-1] <= first):
            return first
    return default_row_chunk(x.shape[0], math.prod(x.shape[1:]), x.dtype.itemsize)


def _write_version(root: zarr.Group, version: int, sources: dict[str, da.Array]) -> dict:
    """Create and fill ``.dkern/v{version}/<name>`` for each source; its manifest entries."""
    vdir = f"{VERSIONS_DIR}/v{version}"
    if vdir in root:  # left by a write that died before publishing: never visible
        del root[vdir]
    targets = {
        name: root.create_array(
            f"{vdir}/{name}",
            shape=x.shape,
            dtype=x.dtype,
            chunks=tuple(max(1, c[0]) for c in x.chunks),
            serializer=BytesCodec(),
            compressors=(ZstdCodec(), Crc32cCodec()),
            fill_value=0,
            chunk_key_encoding={"name": "default", "separator": "/"},
            config={"write_empty_chunks": True},  # every chunk exists, so absence is damage
        )
        for name, x in sources.items()
    }
    try:
        da.store(list(sources.values()), list[Any](targets.values()), lock=False)
    except BaseException:
        _delete_quietly(root, vdir)
        raise
    uid = uuid.uuid4().hex
    return {
        name: {
            "path": f"{vdir}/{name}",
            "shape": list(z.shape),
            "dtype": str(z.dtype),
            "chunks": list(z.chunks),
            "n_chunks": z.nchunks,
            "uid": uid,
        }
        for name, z in targets.items()
    }


def _delete_superseded(root: zarr.Group, paths: list[str], in_use: set[str]) -> None:
    """Delete superseded arrays, then the version folders no array in use lives in."""
    for path in paths:
        _delete_quietly(root, path)
    for vdir in sorted({p.rpartition("/")[0] for p in paths} - in_use - {""}):
        _delete_quietly(root, vdir)


def _delete_quietly(root: zarr.Group, path: str) -> None:
    # Best effort: the new version is already published (or the write already
    # failed), so a leftover costs only space and must not turn into an error.
    try:
        del root[path]
    except Exception:
        logger.warning("could not delete %r from %s", path, root.store_path, exc_info=True)
