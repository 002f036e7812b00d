"""Verified reads: Zarr arrays as lazy dask arrays, one task per Zarr chunk."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import zarr
from dask.array.core import normalize_chunks
from dask.base import tokenize
from zarr.core.sync import sync

from dkern.errors import CorruptChunkError, StoreError
from dkern.io._store import (
    CHUNK_CRCS,
    MisplacedChunk,
    MissingChunk,
    StrictChunkStore,
    Url,
    check_no_links,
    find_group,
    is_own_link,
    local_dir,
    make_store,
    open_group,
    plain_members,
    read_file,
    read_name,
    read_pointer,
    where,
)

__all__ = ["GroupVersion", "group_exists", "list_arrays", "open_array", "read_attrs",
           "read_manifest", "read_version"]


def open_array(url: Url, path: str, *, verify: bool = True) -> da.Array:
    """Open a stored array as a lazy dask array, one task per Zarr chunk.

    Parameters
    ----------
    url : str or os.PathLike
        The store: a local path or any fsspec URL (``"memory://s"``, ``"s3://b/s"``).
    path : str
        The array's name, or ``"group/name"`` for an array in a sub-group.
        A name in dkern's pointer table resolves to its latest published version;
        any other name opens the plain Zarr array ``group[path]`` as it is.
    verify : bool, default True
        For arrays dkern wrote: check now the array's metadata file against its
        digest, its shape, dtype and chunks against the pointer table, and that the
        chunk files present back the chunk count it claims; when each chunk is read,
        that it exists (zarr alone would read a missing chunk as the fill value) and
        is the chunk published at that position (its crc32c as recorded at publish).
        Each chunk's own crc32c is checked on every read either way.

    Returns
    -------
    dask.array.Array of the stored shape and dtype
        Keys ``dk-read-{path}-{token}``; a chunk that is missing or fails its
        crc32c checksum raises :class:`~dkern.errors.CorruptChunkError` when computed.

    Raises
    ------
    StoreError
        No store at ``url``, or no array at ``path`` (the message lists those present).
    """
    url = os.fspath(url)
    path = path.strip("/")
    group, _, name = path.rpartition("/")
    root = _open_parent(url, group, path)
    entry = read_pointer(root, url, group).get("arrays", {}).get(name)
    if entry is None:
        z = _plain_array(root, url, group, name)
        dask_name = f"dk-read-{path}-{tokenize(url, path, z.shape, str(z.dtype), z.chunks)}"
        return zarr_to_dask(z, url=url, label=path, name=dask_name)
    return _published(url, group, name, entry, verify=verify)


def _published(url: str, group: str, name: str, entry: dict[str, Any], *,
               verify: bool) -> da.Array:
    """The array a pointer entry publishes, as :func:`open_array` returns it."""
    z = _dkern_array(url, group, name, entry, verify=verify)
    label = "/".join(p for p in (group, name) if p)
    # write_arrays recognises a stored array by this name
    return zarr_to_dask(z, url=url, label=label, name=read_name(url, group, name, entry))


def group_exists(url: Url, group: str = "") -> bool:
    """Whether the store at ``url`` has a Zarr group at ``group`` (its pointer unread).

    Tells "nothing there yet" from a store that is there but damaged, which
    :func:`read_attrs` and :func:`list_arrays` both report as ``StoreError``.
    """
    return find_group(os.fspath(url), group.strip("/")) is not None


def read_attrs(url: Url, group: str = "") -> dict[str, Any]:
    """The user attributes of the latest version written with ``write_arrays``.

    Returns ``{}`` for a Zarr group dkern never wrote.
    """
    url = os.fspath(url)
    group = group.strip("/")
    root = open_group(url, group, mode="r")
    return dict(read_pointer(root, url, group).get("attrs", {}))


#: The fields of a manifest entry that :func:`read_manifest` returns.
_MANIFEST_FIELDS = ("shape", "dtype", "chunks", "n_chunks")


def read_manifest(url: Url, group: str = "") -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The user attributes and array manifest of the latest version ``write_arrays`` wrote.

    Both come from one read of the group's pointer table, whose checksum is verified, so
    they describe the same version; no array is opened. Callers can check what the
    arrays claim (a model file's shapes, the memory they need) before reading any.

    Parameters
    ----------
    url : str or os.PathLike
        The store: a local path or any fsspec URL.
    group : str, default ""
        The group's path in the store (``""``: its top-level group).

    Returns
    -------
    attrs : dict
        The user attributes (``{}`` for a Zarr group dkern never wrote).
    manifest : dict of str to dict
        For each array dkern published in the group, copies of its ``"shape"`` and
        ``"chunks"`` (lists), ``"dtype"`` (str) and ``"n_chunks"`` (int) as recorded at
        publish; plain Zarr arrays are not listed.

    Raises
    ------
    StoreError
        No store or group at ``url``; a pointer of another format, one that fails its
        checksum (edited or damaged), or with entries dkern could not have written.
    """
    version = read_version(url, group)
    return version.attrs, version.manifest


def read_version(url: Url, group: str = "") -> GroupVersion:
    """The latest version ``write_arrays`` published in a group, from one read of its
    pointer table: its attributes, its manifest, and its arrays to open.

    Arrays opened from it are those of this version even after a later write publishes
    another, so what is read from them always belongs with its attributes (a model's
    kernel with its coefficients). Such a write deletes this version's arrays once it is
    published: opening or reading them then raises ``StoreError`` and
    :meth:`GroupVersion.is_latest` is false.

    Parameters
    ----------
    url : str or os.PathLike
        The store: a local path or any fsspec URL.
    group : str, default ""
        The group's path in the store (``""``: its top-level group).

    Returns
    -------
    GroupVersion

    Raises
    ------
    StoreError
        As :func:`read_manifest`.
    """
    url = os.fspath(url)
    group = group.strip("/")
    return GroupVersion(url, group, read_pointer(open_group(url, group, mode="r"), url, group))


@dataclass(frozen=True)
class GroupVersion:
    """One published version of a group, as :func:`read_version` read it."""

    url: str
    group: str
    pointer: dict[str, Any] = field(repr=False)

    @property
    def attrs(self) -> dict[str, Any]:
        """A copy of the user attributes (``{}`` for a group dkern never wrote)."""
        return copy.deepcopy(self.pointer.get("attrs", {}))

    @property
    def manifest(self) -> dict[str, dict[str, Any]]:
        """Copies of each published array's manifest fields, as :func:`read_manifest`."""
        return {name: {key: copy.deepcopy(entry[key]) for key in _MANIFEST_FIELDS}
                for name, entry in self.pointer.get("arrays", {}).items()}

    def open_array(self, name: str, *, verify: bool = True) -> da.Array:
        """The array ``name`` of this version, as :func:`open_array` opens a published one.

        Raises
        ------
        StoreError
            This version has no array ``name``, or its files are gone or damaged (when
            :meth:`is_latest` is false, a later write deleted them).
        """
        entry = self.pointer.get("arrays", {}).get(name)
        if entry is None:
            raise StoreError(f"{where(self.url, self.group)}: the version read has no array "
                             f"{name!r}; it has {sorted(self.pointer.get('arrays', {}))}.")
        return _published(self.url, self.group, name, entry, verify=verify)

    def is_latest(self) -> bool:
        """Whether the group's pointer still publishes this version (false as well when
        the group is gone or its pointer cannot be read)."""
        try:
            root = open_group(self.url, self.group, mode="r")
            now = read_pointer(root, self.url, self.group)
        except StoreError:
            return False
        return now.get("checksum") == self.pointer.get("checksum")


def list_arrays(url: Url, group: str = "") -> list[str]:
    """Sorted names ``open_array`` resolves in ``group``: dkern's and plain Zarr arrays."""
    url = os.fspath(url)
    group = group.strip("/")
    root = open_group(url, group, mode="r")
    return _names(root, url, group)


def zarr_to_dask(z: zarr.Array, *, url: str, label: str, name: str) -> da.Array:
    """A dask array with one block per chunk of ``z``, read by :func:`_read_block`."""
    chunks = normalize_chunks(z.chunks, z.shape)
    return da.map_blocks(
        _read_block,
        z,
        url,
        label,
        chunks=chunks,
        dtype=z.dtype,
        meta=np.empty((0,) * z.ndim, dtype=z.dtype),
        name=name,
    )


def _read_block(z: zarr.Array, url: str, label: str, *, block_info: dict[Any, Any]) -> np.ndarray:
    """Read the Zarr chunk ``block_info`` locates; damage becomes CorruptChunkError."""
    region = tuple(slice(lo, hi) for lo, hi in block_info[None]["array-location"])
    index = tuple(block_info[None]["chunk-location"])
    try:
        return np.asarray(z[region])
    except MisplacedChunk as err:
        where_from = (f"it holds chunk {err.index} of this array (were chunks swapped?)"
                      if err.index is not None else
                      "it is no chunk of this array's version (copied from another array, "
                      "version or store?)")
        raise CorruptChunkError(
            f"store {url!r}, array {label!r}: chunk {index} (key {err.key!r}) is intact but "
            f"is not the chunk published at this position: its crc32c {err.found:#010x} is "
            f"not the one recorded; {where_from}. Check the whole store with `dkern fsck "
            f"{url}` and rewrite the array from its source."
        ) from None
    except MissingChunk as err:
        raise CorruptChunkError(
            f"store {url!r}, array {label!r}: chunk {index} (key {err.key!r}) is missing. "
            "Either a later write replaced this array after it was opened (open it again "
            "with open_array; for a model loaded from this store, dkern.load it again), or "
            f"the store is damaged: check it with `dkern fsck {url}` and rewrite the array "
            "from its source."
        ) from None
    except ValueError as err:  # the crc32c codec raises ValueError on a mismatch
        key = "/".join(p for p in (z.path, z.metadata.encode_chunk_key(index)) if p)
        raise CorruptChunkError(
            f"store {url!r}, array {label!r}: chunk {index} (key {key!r}) failed its "
            f"checksum ({err}). The chunk's bytes changed on disk; check the whole store "
            f"with `dkern fsck {url}` and rewrite the array from its source."
        ) from err


def _open_parent(url: str, group: str, path: str) -> zarr.Group:
    """The group holding ``path``; StoreError naming what the store has instead."""
    if not path:
        raise StoreError(f"open_array needs an array name; got path {path!r} for {url!r}.")
    try:
        return open_group(url, group, mode="r")
    except StoreError:
        if not group:
            raise
    root = open_group(url, "", mode="r")
    raise StoreError(
        f"{where(url, '')} has no group {group!r}, so no array {path!r}; arrays at the "
        f"top: {_names(root, url, '')}. Check the path."
    )


def _names(root: zarr.Group, url: str, group: str) -> list[str]:
    listed = set(read_pointer(root, url, group).get("arrays", {}))
    plain = {name for name in plain_members(root) if isinstance(root[name], zarr.Array)}
    return sorted(listed | plain)


def _plain_array(root: zarr.Group, url: str, group: str, name: str) -> zarr.Array:
    base = local_dir(url, group)
    # a link dkern placed for an array its pointer no longer lists (a crash between the
    # publish and the unlinking): that array was dropped
    node = None if base is not None and is_own_link(os.path.join(base, name), name) \
        else root.get(name)
    if not isinstance(node, zarr.Array):
        found = "a group" if node is not None else "nothing"
        raise StoreError(
            f"{where(url, group)} has no array {name!r} ({found} there); arrays present: "
            f"{_names(root, url, group)}. Check the name, or write it with dkern.io.write_array."
        )
    return node


def _dkern_array(
    url: str, group: str, name: str, entry: dict[str, Any], *, verify: bool
) -> zarr.Array:
    full = "/".join(p for p in (group, entry["path"]) if p)
    store = make_store(url, read_only=True)
    raw = read_file(store, f"{full}/zarr.json")
    if raw is None:
        raise StoreError(
            f"{where(url, group)}: the pointer table lists array {name!r} at {entry['path']!r} "
            "but no array is there; the store is damaged. Rewrite the array."
        )
    if verify and "sha256:" + hashlib.sha256(raw).hexdigest() != entry["meta"]:
        raise StoreError(
            f"{where(url, group)}: the metadata of array {name!r} ({full}/zarr.json) fails "
            "its checksum: it was edited or damaged after dkern wrote it (its codecs say "
            "how the stored bytes are read). Rewrite the array from its source."
        )
    z = _opened(store, url, group, name, full)
    if not verify:
        return z
    found = {"shape": list(z.shape), "dtype": str(z.dtype), "chunks": list(z.chunks),
             "n_chunks": z.nchunks}
    expected = {key: entry[key] for key in found}
    if found != expected:
        raise StoreError(
            f"{where(url, group)}: array {name!r} does not match its manifest: "
            f"expected {expected}, found {found}. The store is damaged; rewrite the array."
        )
    _check_chunk_shape(z, url, group, name)
    crcs = _chunk_crcs(raw, z, url, group, name, full)
    _check_chunks_present(store, z, url, "/".join(p for p in (group, name) if p))
    return _opened(StrictChunkStore(store, chunk_prefix=f"{full}/c/", crcs=crcs),
                   url, group, name, full)


def _check_chunk_shape(z: zarr.Array, url: str, group: str, name: str) -> None:
    """StoreError for a chunk larger than its array along some axis: dkern never writes
    one, and reading it would allocate what the chunk claims (a small file claiming
    chunks of 10⁹ rows is a memory bomb), not what the array holds."""
    if any(c > max(1, s) for c, s in zip(z.chunks, z.shape, strict=True)):
        raise StoreError(
            f"{where(url, group)}: array {name!r} of shape {z.shape} claims chunks of "
            f"{z.chunks}, larger than the array; dkern writes no such chunk, so the store "
            "is damaged or forged. Nothing was read; rewrite the array from its source."
        )


def _opened(store: Any, url: str, group: str, name: str, full: str) -> zarr.Array:
    try:
        return zarr.open_array(store=store, path=full, mode="r", zarr_format=3)
    except (ValueError, TypeError, KeyError) as err:  # its zarr.json is damaged
        raise StoreError(
            f"{where(url, group)}: the metadata of array {name!r} ({full}/zarr.json) is "
            f"damaged ({type(err).__name__}: {err}). Rewrite the array from its source."
        ) from err


def _chunk_crcs(raw: bytes, z: zarr.Array, url: str, group: str, name: str,
                full: str) -> np.ndarray:
    """The crc32c recorded at publish for each chunk, shape (chunk grid)."""
    try:
        crcs = np.asarray(json.loads(raw)["attributes"][CHUNK_CRCS], dtype=np.uint32)
    except (KeyError, TypeError, ValueError, OverflowError):
        crcs = None
    if crcs is None or crcs.shape != (z.nchunks,):
        raise StoreError(
            f"{where(url, group)}: array {name!r} ({full}) lacks a valid list of the "
            f"checksums of its {z.nchunks} chunks (written by an earlier dkern, or damaged). "
            "Rewrite the array with this dkern."
        )
    return crcs.reshape(z.cdata_shape)


def _check_chunks_present(store: Any, z: zarr.Array, url: str, label: str) -> None:
    """CorruptChunkError naming the first missing chunks, unless a file exists for every
    chunk. Checked before any task is built: a small file claiming millions of chunks
    (each a dask task) is refused for what it lacks, not once the graph fills memory;
    the listing costs what the files present cost, whatever the claim."""
    present = _chunk_keys(store, url, z.path)
    if len(present) >= z.nchunks:
        return
    missing = []
    for index in itertools.product(*map(range, z.cdata_shape)):
        key = f"{z.path}/{z.metadata.encode_chunk_key(index)}"
        if key not in present:
            missing.append((index, key))
            if len(missing) == 4:
                break
    (index, key), more = missing[0], z.nchunks - len(present) - 1
    others = f", and {more:,} more of its {z.nchunks:,} chunks" if more else ""
    listed = f" (first: {', '.join(str(i) for i, _ in missing[1:])})" if more else ""
    raise CorruptChunkError(
        f"store {url!r}, array {label!r}: chunk {index} (key {key!r}) is missing{others}"
        f"{listed}; {len(present):,} chunk files are present for the {z.nchunks:,} its "
        f"metadata claims. Nothing was read. The store is damaged (or was forged): check "
        f"it with `dkern fsck {url}` and rewrite the array from its source."
    )


def _chunk_keys(store: Any, url: str, path: str) -> set[str]:
    """The keys of the chunk files present under ``<path>/c/``. On local disk, listed
    without following links, and StoreError for a link among them or at the array's
    metadata: dkern never writes one, and reads nothing through one."""
    base = local_dir(url, "")
    if base is None:
        return set(sync(_keys(store.list_prefix(f"{path}/c/"))))
    check_no_links(url, "", base, [*path.split("/"), "zarr.json"])
    check_no_links(url, "", base, [*path.split("/"), "c"])  # scandir would follow it
    keys, pending = set(), [f"{path}/c"]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(os.path.join(base, folder)))
        except FileNotFoundError:  # no chunk written yet
            continue
        for entry in entries:
            key = f"{folder}/{entry.name}"
            if entry.is_symlink():
                check_no_links(url, "", base, key.split("/"))
            elif entry.is_dir():
                pending.append(key)
            else:
                keys.add(key)
    return keys


async def _keys(items: Any) -> list[str]:
    return [item async for item in items]
