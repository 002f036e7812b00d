"""Versioned, checksummed writes published all at once by one pointer update.

A write of arrays ``{name: x}`` to a group goes in five steps:

1. validate names, dtypes, attributes and the overwrite rule (nothing on disk
   changes if this fails);
2. create every array in a version folder of its own, ``.dkern/<UTC time>-<random>``
   (never one another writer could pick), with codecs ``bytes -> zstd -> crc32c``, and
   write it chunk by chunk from dask; on local disk the writer leases the folder so
   cleaners leave it alone;
3. publish, under the group's publish lock (local disk): re-read the pointer, refuse
   if another writer replaced one of this write's arrays meanwhile, merge this write's
   entries and attributes onto the pointer as it is now, seal it with its checksum and
   write it back (one ``zarr.json``, replaced atomically), so readers see either the
   old version or the complete new one;
4. collect leftovers no pointer uses (local disk, under the same lock);
5. delete the arrays this publish superseded (best effort, failures logged).

Arrays not named in a write keep their current version. An array passed as the very
array the store holds under that name (``open_array`` of it) is kept, not copied.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask.array as da
import numpy as np
import zarr
from zarr.abc.store import SuffixByteRequest
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from dkern._failures import worker_failures
from dkern._version import __version__
from dkern.errors import StoreError
from dkern.io import _store
from dkern.io._lock import lease, publish_lock
from dkern.io._store import (
    CHUNK_CRCS,
    FORMAT,
    VERSIONS_DIR,
    Url,
    check_no_links,
    check_not_zarr_v2,
    checked_group,
    file_digest,
    find_group,
    local_dir,
    missing_part,
    open_group,
    plain_members,
    pointer_restored,
    publish_pointer,
    read_name,
    read_pointer,
    remove_created,
    reserved_name,
    sealed,
    where,
)
from dkern.io._visible import show_published
from dkern.io.maintenance import LOCAL_GRACE_S, collect_orphans, new_folder
from dkern.io.rows import default_row_chunk

__all__ = ["is_array_name", "write_array", "write_arrays"]

logger = logging.getLogger(__name__)


def write_arrays(
    url: Url,
    arrays: Mapping[str, Any],
    *,
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    chunk_rows: int | None = None,
    group: str = "",
    replace_all: bool = False,
    dims: Mapping[str, Sequence[str]] | None = None,
    coordinates: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Write named arrays and attributes as one new version, published atomically.

    Parameters
    ----------
    url : str or os.PathLike
        The store: a local path or any fsspec URL. Created if missing.
    arrays : mapping of str to numpy.ndarray or dask.array.Array
        Arrays of shape (n_rows, ...) with integer, float, bool or datetime64 /
        timedelta64 dtype (Zarr's own time types, which xarray reads as times). Dask
        arrays are written chunk by chunk and never gathered on the client; one
        that is the array stored under the same name (as ``open_array`` returned
        it) is kept as it is.
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
    replace_all : bool, default False
        Publish exactly ``arrays`` and ``attrs``: the group's other dkern arrays and
        attributes are dropped and their storage reclaimed (needs ``overwrite=True``
        when the group holds any array).
    dims : mapping of str to sequence of str, optional
        Dimension names of some arrays, one per axis (Zarr's ``dimension_names``, which
        xarray reads), e.g. ``{"X": ("sample", "feature"), "y": ("sample",)}``; the
        others get ``<name>_dim_0``, ``<name>_dim_1``, ...
    coordinates : mapping of str to sequence of str, optional
        For some arrays written, the names of the group's arrays xarray reads as their
        coordinates (the CF ``coordinates`` attribute), e.g. ``{"pred": ("lat", "lon")}``
        where ``lat`` and ``lon`` lie along ``pred``'s dimensions.

    Raises
    ------
    StoreError
        A name already exists and ``overwrite`` is False, or is a group (never replaced);
        the group, a folder above it or its ``.dkern`` is a symbolic link (on local disk);
        another writer published one of these names while this write ran (nothing of this
        write is published); the publish lock stayed taken too long.
    ValueError, TypeError
        A bad name, shape, dtype, ``chunk_rows`` or attribute. Nothing is written.

    Notes
    -----
    Layout: see :mod:`dkern.io._store`. Only the pointer update publishes, so a
    write that dies at any moment leaves the previous version visible and complete,
    and later writes unaffected. Concurrent writers of different names to one group
    all succeed on local disk; on fsspec stores, see the README. On local disk each
    array also appears to plain zarr and xarray readers under its name
    (:mod:`dkern.io._visible`).
    """
    url = os.fspath(url)
    group = checked_group(group)
    items = _checked_items(arrays)
    base = local_dir(url, "")
    if base is not None:  # a group or version folder that is a link would lead elsewhere
        check_no_links(url, group, base, [*(group.split("/") if group else []), VERSIONS_DIR])
    new_attrs = _checked_attrs(attrs)
    names = _checked_dims(dims, items)
    array_attrs = {name: {"coordinates": " ".join(value)}
                   for name, value in _checked_coordinates(coordinates, items).items()}
    current = find_group(url, group)
    check_not_zarr_v2(url, group)  # the group, or one above it (a v3 group in a v2 root)
    listed = read_pointer(current, url, group).get("arrays", {}) if current is not None else {}
    kept = {name: listed[name] for name, x in items
            if _is_stored(url, group, name, x, listed, chunk_rows)}
    sources = {name: _as_source(name, x, chunk_rows) for name, x in items if name not in kept}
    for name, x in sources.items():
        if name in names and len(names[name]) != x.ndim:
            raise ValueError(f"dims[{name!r}] names {len(names[name])} dimensions, "
                             f"{list(names[name])}, but {name} has {x.ndim} (shape "
                             f"{x.shape}); name one per axis.")
    present = set(plain_members(current)) if current is not None else set()
    _check_not_groups(url, group, current, [n for n, _ in items if n in present])
    _check_overwrite(url, group, [n for n, _ in items], set(listed), present,
                     overwrite=overwrite, replace_all=replace_all)
    created = missing_part(url, group) if current is None else None
    with publish_lock(url, group):  # so no writer creating the group too can clobber it
        open_group(url, group, mode="a")
    seen = {name: listed.get(name, {}).get("path") for name, _ in items}
    try:
        # only plain arrays the overwrite check counted may make room for a link
        replacing = frozenset(n for n, _ in items if n in present)
        before, after, aside = _write_and_publish(url, group, sources, names, array_attrs,
                                                  kept, seen, new_attrs, replacing,
                                                  replace_all=replace_all)
    except BaseException:
        if created is not None:  # a failed call leaves no new store or group behind
            with publish_lock(url, group):
                remove_created(url, group, created)
        raise
    logger.info("published version %d of %s: %s", after["version"], where(url, group),
                sorted(sources))
    # On local disk replaced plain arrays were moved aside to make room for the links.
    plain = aside if local_dir(url, group) is not None else [n for n, _ in items
                                                              if n in present]
    _delete_superseded(url, group, before, after, plain)


def write_array(
    x: Any, url: Url, path: str, *, overwrite: bool = False, chunk_rows: int | None = None,
    dims: Sequence[str] | None = None,
) -> None:
    """Write one array; ``path`` is ``"name"`` or ``"group/name"``.

    The same as ``write_arrays(url, {name: x}, group=group, dims={name: dims}, ...)``.
    """
    group, _, name = path.strip("/").rpartition("/")
    write_arrays(url, {name: x}, overwrite=overwrite, chunk_rows=chunk_rows, group=group,
                 dims=None if dims is None else {name: dims})


def is_array_name(name: Any) -> bool:
    """Whether ``write_arrays`` takes ``name`` as an array's name."""
    return _name_problem(name) is None


def _name_problem(name: Any) -> str | None:
    """Why ``write_arrays`` refuses ``name`` as an array's name; None if it takes it."""
    if not isinstance(name, str) or not name or "/" in name or reserved_name(name):
        return (f"array names must be non-empty strings without '/' or '\\' that start with "
                f"neither '.', '__' nor 'zarr.' and do not end in '.partial' (names zarr and "
                f"dkern use for their own files; zarr reads '\\' as '/'); got {name!r}. Rename "
                "the array, or pass group= for nesting.")
    if len(name.encode()) > MAX_NAME_BYTES:
        return (f"array names must be at most {MAX_NAME_BYTES} bytes (UTF-8), so that the "
                f"temporary '<name>.<32 hex>.partial' beside each fits a file system's 255; "
                f"got {len(name.encode())} bytes ({name[:40]!r}…). Use a shorter name.")
    return None


def _checked_items(arrays: Mapping[str, Any]) -> list[tuple[str, Any]]:
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError(
            f"arrays must be a non-empty mapping of name to array; got {arrays!r:.80}. "
            "Pass e.g. {'X': X}."
        )
    for name in arrays:
        if (problem := _name_problem(name)) is not None:
            raise ValueError(problem)
    return list(arrays.items())


#: The longest array name (UTF-8 bytes): the link placed for plain readers is made under
#: ``<name>.<32 hex>.partial`` first (41 bytes more), and file names stop at 255 bytes.
MAX_NAME_BYTES = 255 - len(".0123456789abcdef0123456789abcdef.partial")


def _checked_dims(dims: Mapping[str, Sequence[str]] | None,
                  items: list[tuple[str, Any]]) -> dict[str, tuple[str, ...]]:
    """``dims`` as tuples of names, for arrays of this write only."""
    return _names_per_array(dims, items, "dims", "their dimension names",
                            lambda names: len(set(names)) == len(names),
                            "distinct non-empty strings, one per axis")


def _checked_coordinates(coordinates: Mapping[str, Sequence[str]] | None,
                         items: list[tuple[str, Any]]) -> dict[str, tuple[str, ...]]:
    """``coordinates`` as tuples of names, for arrays of this write only."""
    return _names_per_array(coordinates, items, "coordinates",
                            "the names of their coordinate arrays",
                            lambda names: not any(ch.isspace() for n in names for ch in n),
                            "array names without spaces (xarray reads them space-separated)")


def _names_per_array(mapping: Mapping[str, Sequence[str]] | None, items: list[tuple[str, Any]],
                     option: str, meaning: str, valid: Callable[[tuple[str, ...]], bool],
                     rule: str) -> dict[str, tuple[str, ...]]:
    """``mapping`` (the option ``option``) of arrays of this write to tuples of non-empty
    names that pass ``valid``; ValueError naming ``meaning`` or ``rule`` otherwise."""
    if mapping is None:
        return {}
    written = {name for name, _ in items}
    if not isinstance(mapping, Mapping) or not set(mapping) <= written:
        extra = sorted(set(mapping) - written) if isinstance(mapping, Mapping) else mapping
        raise ValueError(f"{option} must map names of the arrays written ({sorted(written)}) "
                         f"to {meaning}; got {extra!r:.80}.")
    checked = {}
    for name, value in mapping.items():
        names = (value,) if isinstance(value, str) else tuple(value)
        if not (all(isinstance(n, str) and n for n in names) and valid(names)):
            raise ValueError(f"{option}[{name!r}] must be {rule}; got {value!r}.")
        checked[name] = names
    return checked


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
    if x.dtype.kind not in "biufmM":
        raise TypeError(
            f"{name} must have a bool, integer or floating-point dtype (or datetime64, "
            f"timedelta64); got {x.dtype}. "
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
        # a random name: hashing the data for a token would cost a pass over it
        return da.from_array(x, chunks=(rows, *x.shape[1:]),
                             name=f"dk-write-{name}-{uuid.uuid4().hex}")
    return x.rechunk({0: rows, **whole})


def _natural_rows(x: np.ndarray | da.Array) -> int:
    """A dask array's row chunk if regular (zarr's grid is), else the default."""
    if isinstance(x, da.Array):
        first, *rest = x.chunks[0]
        if all(c == first for c in rest[:-1]) and (not rest or rest[-1] <= first):
            return first
    return default_row_chunk(x.shape[0], math.prod(x.shape[1:]), x.dtype.itemsize)


def _is_stored(url: str, group: str, name: str, x: Any, listed: dict,
               chunk_rows: int | None) -> bool:
    """Whether ``x`` is the array the group already holds as ``name`` (copying it would
    read the very chunks the publish then deletes)."""
    entry = listed.get(name)
    return (entry is not None and isinstance(x, da.Array)
            and x.name == read_name(url, group, name, entry)
            and chunk_rows in (None, entry["chunks"][0]))


def _check_not_groups(url: str, group: str, current: zarr.Group | None,
                      names: list[str]) -> None:
    """Refuse to write an array where a group is (overwrite replaces arrays, never a group
    with what it holds)."""
    groups = [n for n in names if _is_group(current, n)]
    if groups:
        raise StoreError(
            f"{where(url, group)} has groups named {groups}, where this write would put "
            "arrays; overwrite=True replaces arrays only, never a group and what it holds. "
            "Write the arrays under other names, or delete the groups yourself first."
        )


def _is_group(root: zarr.Group | None, name: str) -> bool:
    try:
        return isinstance(root.get(name), zarr.Group)
    except (ValueError, TypeError, KeyError):  # damaged metadata: not provably an array
        return True


def _check_overwrite(url: str, group: str, names: list[str], listed: set[str],
                     present: set[str], *, overwrite: bool, replace_all: bool) -> None:
    replaced = listed if replace_all else listed & set(names)
    clashes = sorted(replaced | (present & set(names)))
    if clashes and not overwrite:
        scope = " (all of them: this write replaces the whole group)" if replace_all else ""
        raise StoreError(
            f"{where(url, group)} already has arrays {clashes}; pass overwrite=True to "
            f"replace them{scope} (the old ones stay readable until the new ones are complete)."
        )


def _write_and_publish(
    url: str, group: str, sources: dict[str, da.Array], dims: dict[str, tuple[str, ...]],
    array_attrs: dict[str, dict[str, str]], kept: dict[str, dict],
    seen: dict[str, str | None], new_attrs: dict[str, Any],
    replacing: frozenset[str], *, replace_all: bool
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Fill a fresh version folder, then publish it; the pointers before and after, and
    the folders holding plain arrays moved aside for this write's names (to delete)."""
    folder = new_folder()
    published = False
    with lease(url, group, folder) if sources else contextlib.nullcontext():
        try:
            entries = _write_version(url, group, folder, sources, dims, array_attrs) \
                if sources else {}
            with publish_lock(url, group):
                root = open_group(url, group, mode="a")
                before = read_pointer(root, url, group)
                restoring = bool(before) and pointer_restored(root)
                _check_unchanged(url, group, before.get("arrays", {}), seen)
                after = sealed(_merged(before, {**kept, **entries}, new_attrs, replace_all))
                publish_pointer(root, after, url, group)
                published = True
                aside = _show_quietly(url, group, after, replacing)
                if not restoring:  # a restored copy's word is not enough to delete by
                    _collect_quietly(url, group, after)
        finally:
            if sources and not published:
                _delete_quietly(url, group, folder)
    return before, after, aside


def _check_unchanged(url: str, group: str, now: dict, seen: dict[str, str | None]) -> None:
    """Refuse when another writer published one of this write's names meanwhile."""
    changed = sorted(n for n, path in seen.items() if now.get(n, {}).get("path") != path)
    if changed:
        raise StoreError(
            f"{where(url, group)}: arrays {changed} were written by another writer while "
            "this write ran, so this write was not published (the store holds the other "
            "writer's arrays, intact). Write again to replace them, with overwrite=True."
        )


def _merged(before: dict[str, Any], entries: dict[str, dict], new_attrs: dict[str, Any],
            replace_all: bool) -> dict[str, Any]:
    """The pointer to publish: this write's entries and attributes onto ``before``."""
    arrays = {} if replace_all else dict(before.get("arrays", {}))
    attrs = {} if replace_all else dict(before.get("attrs", {}))
    return {
        "format": FORMAT,
        "dkern_version": __version__,
        "version": int(before.get("version", 0)) + 1,
        "arrays": {**arrays, **entries},
        "attrs": {**attrs, **new_attrs},
    }


def _write_version(url: str, group: str, folder: str, sources: dict[str, da.Array],
                   dims: dict[str, tuple[str, ...]],
                   array_attrs: dict[str, dict[str, str]]) -> dict:
    """Create and fill ``<folder>/<name>`` for each source, with its dimension names and
    attributes; its manifest entries."""
    store = _store.make_store(url, read_only=False)
    prefix = f"{group}/" if group else ""
    targets = {
        name: zarr.create_array(
            store,
            name=f"{prefix}{folder}/{name}",
            shape=x.shape,
            dtype=x.dtype,
            chunks=tuple(max(1, c[0]) for c in x.chunks),
            serializer=BytesCodec(),
            compressors=(ZstdCodec(), Crc32cCodec()),
            # Every chunk is written, so the fill value is only what a reader that does not
            # check (plain zarr, xarray) would see for a chunk gone missing: NaN, not 0.
            fill_value=np.nan if x.dtype.kind == "f" else 0,
            dimension_names=dims.get(name, tuple(f"{name}_dim_{i}" for i in range(x.ndim))),
            attributes=array_attrs.get(name),
            chunk_key_encoding={"name": "default", "separator": "/"},
            config={"write_empty_chunks": True},  # every chunk exists, so absence is damage
        )
        for name, x in sources.items()
    }
    filled = [name for name, x in sources.items() if x.size]  # an empty array has no chunk
    with worker_failures():
        written = dict(zip(filled, da.compute(*[_chunks_written(sources[name], targets[name])
                                                 for name in filled]), strict=True))
    for name, z in targets.items():
        crc = written.get(name, np.zeros(0, np.uint32))
        # Recorded in the array's own metadata, whose digest the pointer holds: a chunk is
        # then bound to its array, its position and this version (see read.py).
        z.update_attributes({CHUNK_CRCS: crc.reshape(-1).tolist()})
    uid = uuid.uuid4().hex
    return {
        name: {
            "path": f"{folder}/{name}",
            "shape": list(z.shape),
            "dtype": str(z.dtype),
            "chunks": list(z.chunks),
            "n_chunks": z.nchunks,
            "uid": uid,
            # the codecs (byte order included) decide what the checksummed bytes mean
            "meta": file_digest(store, f"{prefix}{folder}/{name}/zarr.json"),
        }
        for name, z in targets.items()
    }


def _chunks_written(x: da.Array, z: zarr.Array) -> da.Array:
    """Write ``x`` into ``z`` block by block (each block one Zarr chunk); per block, the
    crc32c its chunk file ends with, shape (n_blocks_0, 1, ...)."""
    return da.map_blocks(_write_block, x, z, chunks=tuple((1,) * len(c) for c in x.chunks),
                         dtype=np.uint32, meta=np.empty((0,) * x.ndim, dtype=np.uint32))


def _write_block(block: np.ndarray, z: zarr.Array, block_info: dict[Any, Any]) -> np.ndarray:
    """Write one chunk; return the crc32c the codec appended to its bytes (it covers the
    compressed payload, so it identifies the chunk's contents at no extra hashing cost)."""
    location = block_info[0]
    # dask raises a failed write's first error while its other tasks still run; the
    # clean-up then removes the version folder, which a late chunk would create again
    # (a new store left behind with chunks and no metadata): a chunk whose array's metadata
    # is gone is not written
    if not sync(z.store.exists(f"{z.path}/zarr.json")):
        raise StoreError(f"the array {z.path!r} was removed before its chunk "
                         f"{tuple(location['chunk-location'])} was written: this write had "
                         "failed and was cleaned up, or the store was cleaned with min_age=0")
    z[tuple(slice(lo, hi) for lo, hi in location["array-location"])] = block
    key = f"{z.path}/{z.metadata.encode_chunk_key(tuple(location['chunk-location']))}"
    tail = sync(z.store.get(key, prototype=default_buffer_prototype(),
                            byte_range=SuffixByteRequest(4)))
    if tail is None:  # another process removed the version folder while this one wrote it
        raise StoreError(f"chunk {key!r} vanished right after it was written; was the store "
                         "cleaned with min_age=0 while this write ran?")
    return np.full((1,) * block.ndim, int.from_bytes(tail.to_bytes(), "little"), np.uint32)


def _show_quietly(url: str, group: str, pointer: dict[str, Any],
                  replacing: frozenset[str]) -> list[str]:
    # The publish happened: dkern reads the new arrays whatever follows. A failure here
    # leaves plain readers an older version (or none) under the name; `dkern fsck --clean`
    # places the links again.
    try:
        return show_published(url, group, pointer, new_folder(), replacing)
    except Exception:
        logger.warning("could not show the arrays of %s under their names to plain zarr "
                       "readers; run `dkern fsck --clean` on it (dkern.io.clean_store)",
                       where(url, group), exc_info=True)
        return []


def _collect_quietly(url: str, group: str, pointer: dict[str, Any]) -> None:
    # Only on local disk, where leases tell live writers' folders apart; a failure here
    # costs space, never the publish that just happened.
    if local_dir(url, group) is None:
        return
    try:
        collect_orphans(url, group, pointer, min_age=LOCAL_GRACE_S)
    except Exception:
        logger.warning("could not collect leftovers in %s", where(url, group), exc_info=True)


def _delete_superseded(url: str, group: str, before: dict[str, Any], after: dict[str, Any],
                       plain: list[str]) -> None:
    """Delete the arrays the publish superseded, then the folders none in use lives in.

    Safe beside other writers: none can publish a superseded path again (the publish
    refuses names changed meanwhile), and unpublished folders are never superseded.
    """
    now = after["arrays"]
    stale = [e["path"] for n, e in before.get("arrays", {}).items()
             if now.get(n, {}).get("path") != e["path"]]
    in_use = {entry["path"].rpartition("/")[0] for entry in now.values()}
    for path in stale + plain:
        _delete_quietly(url, group, path)
    for folder in sorted({p.rpartition("/")[0] for p in stale} - in_use - {""}):
        _delete_quietly(url, group, folder)


def _delete_quietly(url: str, group: str, path: str) -> None:
    # Best effort: the new version is already published (or the write already
    # failed), so a leftover costs only space and must not turn into an error.
    key = "/".join(p for p in (group, path) if p)
    try:
        sync(_store.make_store(url, read_only=False).delete_dir(key))
    except Exception:
        logger.warning("could not delete %r from %s", key, where(url, group), exc_info=True)
