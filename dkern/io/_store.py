"""Store plumbing shared by the reader and the writer.

A dkern store is a Zarr v3 group. Its ``zarr.json`` attributes hold one pointer
table under the key ``"dkern"``::

    {"dkern": {"format": 2, "dkern_version": "0.1.0", "version": 3,
               "arrays": {"X": {"path": ".dkern/20260101T120000Z-3fa2c81d9e0b/X",
                                "shape": [n, d], "dtype": "float64", "chunks": [c, d],
                                "n_chunks": 7, "uid": "<hex>",
                                "meta": "sha256:<hex of the array's zarr.json>"}},
               "attrs": {...},
               "checksum": "sha256:<hex of the canonical JSON of all the above>"}}

The arrays themselves live in hidden version folders ``.dkern/<UTC time>-<random>/``,
one per write, named without looking at the pointer so that concurrent writers never
share one. Readers only follow the pointer, so the pointer update is the publish. Each
array's own ``zarr.json`` lists the crc32c every chunk file ends with (``CHUNK_CRCS``),
recorded as the chunks were written; with that file's digest in the pointer, a chunk is
bound to its array, its grid position and its version (:class:`StrictChunkStore`).

What the checksums protect against: accidents (a flipped bit, a truncated or
half-copied file, an edit by hand or by another tool), which become errors naming the
store instead of a silently different model. Not an attacker who can edit the files:
a plain sha256 is recomputed as easily as it is checked. Against such a store, what
keeps dkern safe is that it trusts no path the pointer names: every entry must be
``.dkern/<version folder>/<its own name>`` inside the group, with no symbolic link on
the way (:func:`check_entries`), before anything is read from or deleted at it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import zarr
import zarr.errors
from crc32c import crc32c
from dask.base import tokenize
from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore, WrapperStore

if TYPE_CHECKING:
    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, BufferPrototype

from dkern.errors import StoreError

logger = logging.getLogger(__name__)

POINTER_KEY = "dkern"
#: 2: version folders named by time and uuid, and a checksummed pointer.
FORMAT = 2
VERSIONS_DIR = ".dkern"
#: The copy of a group's last published pointer in its version tree (:func:`read_pointer`);
#: named ``zarr.*`` so that leftover collection, of this version and earlier ones, skips it.
POINTER_COPY = "zarr.pointer.json"
#: The name of a version folder dkern creates (:func:`dkern.io.maintenance.new_folder`).
FOLDER_NAME = re.compile(r"(\d{8}T\d{6}Z)-[0-9a-f]{16}")
#: The attribute of a dkern array's own metadata listing the crc32c each chunk file ends
#: with, in C order over the chunk grid: what binds a chunk to its array and position.
CHUNK_CRCS = "dkern_chunk_crc32c"
#: What a pointer entry must hold, and of which type: anything else is a damaged pointer.
ENTRY_FIELDS = {"path": str, "shape": list, "dtype": str, "chunks": list, "n_chunks": int,
                "uid": str, "meta": str}

Url = str | os.PathLike[str]


def make_store(url: str, *, read_only: bool) -> Store:
    """A Zarr store for a local path, a ``file://`` URL or any fsspec URL."""
    if "://" in url and not url.startswith("file://"):
        return FsspecStore.from_url(url, read_only=read_only)
    return LocalStore(url.removeprefix("file://"), read_only=read_only)


def where(url: str, group: str) -> str:
    """How messages name a group: ``'memory://s'`` or ``'memory://s' (group 'a/b')``."""
    return repr(url) if not group else f"{url!r} (group {group!r})"


def open_group(url: str, group: str, *, mode: Literal["r", "a"]) -> zarr.Group:
    """Open the group ``group`` of the store at ``url``; ``mode="a"`` creates it.

    Raises
    ------
    StoreError
        No group there (``mode="r"``), or an array sits where the group should.
    """
    root = find_group(url, group) if mode == "r" else _open(url, group, mode)
    if root is None:
        raise StoreError(
            f"no Zarr group at {where(url, group)}; expected a store written by "
            "dkern.io.write_arrays or a Zarr v3 group. Check the URL and group path."
        )
    return root


def find_group(url: str, group: str) -> zarr.Group | None:
    """The group opened read-only, or None when the store or group does not exist."""
    try:
        return _open(url, group, "r")
    except FileNotFoundError:
        return None


def check_not_zarr_v2(url: str, group: str) -> None:
    """StoreError when the group's place, or a group above it, holds a Zarr v2 group or
    array (``.zgroup``, ``.zarray``) and no v3 one: dkern's ``zarr.json`` there would hide
    it from zarr and xarray, which read v3 first."""
    try:
        found = _zarr_v2_node(make_store(url, read_only=True), group)
    except FileNotFoundError:  # no store yet
        return
    if found is not None:
        path, name = found
        raise StoreError(
            f"{where(url, path)} holds a Zarr v2 {'group' if name == '.zgroup' else 'array'} "
            f"({name}); dkern writes Zarr v3, whose zarr.json there would hide it from zarr "
            "and xarray. Write to another path, or convert the store to Zarr v3 first "
            "(xarray: xr.open_zarr(old).to_zarr(new, zarr_format=3)).")


def _zarr_v2_node(store: Store, group: str) -> tuple[str, str] | None:
    """``(path, metadata file)`` of the first Zarr v2 node without a v3 one at the group
    or above it; None if there is none."""
    parts = group.split("/") if group else []
    for depth in range(len(parts) + 1):
        path = "/".join(parts[:depth])
        prefix = f"{path}/" if path else ""
        if read_file(store, f"{prefix}zarr.json") is not None:
            continue
        for name in (".zgroup", ".zarray"):
            if read_file(store, prefix + name) is not None:
                return path, name
    return None


def _open(url: str, group: str, mode: Literal["r", "a"]) -> zarr.Group:
    up = [part for part in group.split("/") if part in (".", "..")]
    if up:  # zarr's path check would be reported below as damaged metadata
        raise ValueError(f"group {group!r} has a {up[0]!r} component: a group path names a "
                         "group inside the store, never one above it. Pass the other store's "
                         "own URL instead.")
    store = make_store(url, read_only=mode == "r")
    try:
        return zarr.open_group(store=store, path=group, mode=mode, zarr_format=3)
    except zarr.errors.ContainsGroupError:  # another writer created it just now
        return zarr.open_group(store=store, path=group, mode="r+", zarr_format=3)
    except zarr.errors.ContainsArrayError:
        raise StoreError(
            f"{where(url, group)} is a Zarr array, expected a group holding arrays. "
            "Pass the URL of the enclosing group and the array's name as the path."
        ) from None
    except FileNotFoundError:  # zarr's NodeNotFoundError is one (and a ValueError)
        raise
    except (ValueError, TypeError, KeyError) as err:  # zarr.json is not valid JSON or metadata
        raise StoreError(
            f"{where(url, group)}: its metadata file {metadata_file(url, group)!r} is "
            f"damaged ({type(err).__name__}: {err}). Restore the file from a backup, or "
            "rewrite the store from its sources."
        ) from err


def metadata_file(url: str, group: str) -> str:
    """The path of a group's ``zarr.json``, for messages."""
    return "/".join(p for p in (url.rstrip("/"), group, "zarr.json") if p)


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The file system and path of a store's location, as :func:`make_store` reads it: a
    plain path is taken literally (``~`` is a folder named ``~``, ``a::b`` a folder name,
    as zarr's LocalStore takes them, where fsspec would expand or split them), any URL
    with ``://`` by fsspec."""
    if "://" in url and not url.startswith("file://"):
        return url_to_fs(url)
    return LocalFileSystem(), os.path.abspath(url.removeprefix("file://"))


def missing_part(url: str, group: str) -> tuple[list[str], str | None] | None:
    """What writing to ``group`` would create: None if the group exists, else the group
    paths that are not groups yet (``""``: the store's root group), shallowest first, and
    the shallowest of them whose folder does not exist either (None: every folder exists,
    only the groups' metadata would be new)."""
    parts = group.split("/") if group else []
    paths = ["/".join(parts[:depth]) for depth in range(len(parts) + 1)]
    missing = [path for path in paths if find_group(url, path) is None]
    if not missing:
        return None
    fs, location = filesystem(url)
    new = next((path for path in missing
                if not fs.exists("/".join(p for p in (location, path) if p))), None)
    return missing, new


def remove_created(url: str, group: str, created: tuple[list[str], str | None]) -> None:
    """Undo what a failed write to ``group`` created (see :func:`missing_part`), leaving
    whatever was there before untouched, deepest folder first: each loses dkern's
    ``zarr.json`` and ``.dkern``, and a folder that did not exist before goes once empty.
    An ancestor holding another group (one another writer published meanwhile) is left
    whole, and so is everything above it. Call it holding the
    group's publish lock; it keeps everything once another writer has published or is
    writing to ``group``."""
    missing, new = created
    root = find_group(url, group)
    try:
        if root is not None and (read_pointer(root, url, group) or _other_folders(root)):
            return
    except StoreError:  # a pointer that cannot be trusted, or lost: keep everything
        return
    fs, location = filesystem(url)
    for path in reversed(missing):
        folder = "/".join(p for p in (location, path) if p)
        if not fs.exists(folder):
            continue
        own = [p for p in (f"{folder}/zarr.json", f"{folder}/{VERSIONS_DIR}")
               if fs.exists(p) and not os.path.islink(p)]  # a link is the user's
        others = {name.rstrip("/").rpartition("/")[2] for name in fs.ls(folder, detail=False)}
        others -= {p.rpartition("/")[2] for p in own}
        if path != group and any(fs.exists(f"{folder}/{name}/zarr.json") for name in others):
            return  # another writer's group below: the metadata above it stays
        if own:
            fs.rm(own, recursive=True)
        if not others and new is not None and (
                new == "" or path == new or path.startswith(f"{new}/")):
            fs.rm(folder, recursive=True)  # created by this write, and empty now


def _other_folders(root: zarr.Group) -> bool:
    """Whether the group's version tree holds any folder (the failed write removed its own)."""
    prefix = "/".join(p for p in (root.path, VERSIONS_DIR) if p)
    names = sync(_collect(root.store.list_dir(prefix)))
    return any(not name.startswith("zarr.") for name in names)


def read_pointer(root: zarr.Group, url: str, group: str) -> dict[str, Any]:
    """The group's dkern pointer table, or ``{}`` for a group dkern never wrote.

    When ``zarr.json`` has lost it (another tool rewrote the group's attributes: xarray's
    ``to_zarr(mode="a")`` replaces them), the copy each publish leaves in ``.dkern``
    (:data:`POINTER_COPY`) stands in, with the same checks and every array it names
    present, and the next publish puts it back (:func:`pointer_restored`): otherwise every
    published version would look unreferenced, and be collected. With neither, a group
    whose published versions show (:func:`_check_not_lost`) is refused.
    """
    pointer, source = root.attrs.get(POINTER_KEY), metadata_file(url, group)
    if pointer is None:
        pointer, source = _pointer_copy(root, url, group), copy_file(url, group)
    if pointer is None:
        _check_not_lost(url, group)
        return {}
    if not isinstance(pointer, dict) or pointer.get("format") != FORMAT:
        found = pointer.get("format") if isinstance(pointer, dict) else type(pointer).__name__
        raise StoreError(
            f"{where(url, group)} has a dkern pointer of format {found!r}; this dkern "
            f"reads format {FORMAT}. Rewrite the store with this dkern (or read it with the "
            "dkern that wrote it)."
        )
    if pointer.get("checksum") != checksum(pointer):
        raise StoreError(
            f"{where(url, group)}: the dkern pointer in {source!r} fails "
            "its checksum: the file was edited or damaged after dkern wrote it (a model's "
            "kernel and parameters are stored there, so it cannot be trusted). Restore the "
            "file from a backup, or rewrite the store (dkern.save the model again)."
        )
    check_entries(pointer.get("arrays"), url, group)
    if POINTER_KEY not in root.attrs:
        _check_copy_current(root, url, group, pointer)
    return pointer


def _check_not_lost(url: str, group: str) -> None:
    """Raise when a group with neither a pointer nor its copy has published versions: no
    write, clean or read then goes by its pointer-less state.

    A dkern older than the pointer's copy left only ``zarr.json``'s pointer; another tool
    rewriting the group's attributes (xarray's ``to_zarr(mode="a")``) then removes it. The
    group then looks as if dkern never wrote it, and its published versions as leftovers:
    a write would publish a pointer without them and its collection (or a later one)
    delete them. What tells a published version from a killed write's folder (complete
    arrays, never published) is the link dkern places at ``<group>/<name>`` after each
    publish (:mod:`dkern.io._visible`). Object stores have no links, and stores from
    before the links none either: there the state cannot be told, and is not checked.

    Raises
    ------
    StoreError
        There is no pointer, no copy, and links show published versions in ``.dkern``.
    """
    base = local_dir(url, group)
    if base is None:
        return
    with os.scandir(base) as entries:
        linked = sorted({os.readlink(e.path).rpartition("/")[0] for e in entries
                         if is_own_link(e.path, e.name)})
    found = [folder for folder in linked if os.path.isdir(os.path.join(base, folder))]
    # a writer publishes the pointer, then its copy, then the links: links seen after a
    # look that found no pointer may be a concurrent first publish's, so look again
    if found and not _has_pointer(url, group):
        raise StoreError(
            f"{where(url, group)}: zarr.json has no dkern pointer and no copy of it, yet "
            f"{VERSIONS_DIR} holds published versions {found}: a dkern older than the copy "
            "wrote this group, and another tool (xarray's to_zarr(mode='a')) has since "
            "replaced the group's attributes. A write or clean now would leave those arrays "
            "unreferenced and delete them, so dkern does neither. Restore zarr.json from a "
            "backup; or read the arrays with zarr (at <version>/<name>) and write them "
            f"anew; or, if they are not needed, delete {VERSIONS_DIR}."
        )


def _has_pointer(url: str, group: str) -> bool:
    """Whether the group has, read afresh, a pointer in ``zarr.json`` or its copy."""
    root = open_group(url, group, mode="r")
    return POINTER_KEY in root.attrs or read_file(root.store, "/".join(
        p for p in (root.path, VERSIONS_DIR, POINTER_COPY) if p)) is not None


def pointer_restored(root: zarr.Group) -> bool:
    """Whether the group's pointer is read from its copy (``zarr.json`` lost it): a
    publish then restores it, and nothing is collected on its word (a copy may be older
    than the version it stood for, if its write failed)."""
    return POINTER_KEY not in root.attrs


def copy_file(url: str, group: str) -> str:
    """The path of a group's pointer copy, for messages."""
    return "/".join(p for p in (url.rstrip("/"), group, VERSIONS_DIR, POINTER_COPY) if p)


def _pointer_copy(root: zarr.Group, url: str, group: str) -> Any:
    """The pointer copied into ``.dkern`` by the last publish (parsed, not yet checked), or
    None when there is none. Read as a file; what it names is checked before use."""
    raw = read_file(root.store, "/".join(p for p in (root.path, VERSIONS_DIR, POINTER_COPY)
                                         if p))
    if raw is None:
        return None
    try:
        pointer = json.loads(raw)
    except ValueError:
        raise StoreError(f"{where(url, group)}: zarr.json has no dkern pointer and its copy "
                         f"{copy_file(url, group)!r} is not JSON. Restore the store from a "
                         "backup, or rewrite it from its sources.") from None
    logger.warning("%s: zarr.json has lost its dkern pointer (another tool rewrote the "
                   "group's attributes, as xarray's to_zarr(mode='a') does); reading version "
                   "%s from its copy %r, which the next dkern write restores",
                   where(url, group), pointer.get("version") if isinstance(pointer, dict)
                   else "?", copy_file(url, group))
    return pointer


def _check_copy_current(root: zarr.Group, url: str, group: str,
                        pointer: dict[str, Any]) -> None:
    """Refuse a pointer copy naming arrays that are gone: it is older than the version
    zarr.json lost (its own write failed), so what it lists is not what was published."""
    prefix = f"{root.path}/" if root.path else ""
    gone = sorted(name for name, entry in pointer["arrays"].items()
                  if not sync(root.store.exists(f"{prefix}{entry['path']}/zarr.json")))
    if gone:
        raise StoreError(
            f"{where(url, group)}: zarr.json has lost its dkern pointer and its copy "
            f"{copy_file(url, group)!r} names arrays that are gone ({gone}): the copy is older "
            "than the version that was published. dkern reads and deletes nothing on its "
            "word. Rewrite the group from its sources (the arrays present are readable with "
            "zarr under .dkern/)."
        )


def publish_pointer(root: zarr.Group, pointer: dict[str, Any], url: str, group: str) -> None:
    """Publish a sealed pointer: write it into the group's ``zarr.json`` (the one step that
    makes a version visible), then copy it to ``.dkern`` (:func:`read_pointer`). Call it
    under the publish lock. Once the first write returns the publish has happened; the
    copy is best effort (a failure is logged, and an older copy removed rather than left
    to stand for a version it does not describe)."""
    root.update_attributes({POINTER_KEY: pointer})
    _write_pointer_copy(root, pointer, url, group)


def _write_pointer_copy(root: zarr.Group, pointer: dict[str, Any], url: str,
                        group: str) -> None:
    key = "/".join(p for p in (root.path, VERSIONS_DIR, POINTER_COPY) if p)
    data = json.dumps(pointer, sort_keys=True).encode()
    try:
        sync(root.store.set(key, default_buffer_prototype().buffer.from_bytes(data)))
    except Exception:
        logger.warning("%s: could not write the pointer's copy %r (the publish stands)",
                       where(url, group), copy_file(url, group), exc_info=True)
        with contextlib.suppress(Exception):
            sync(root.store.delete(key))


def check_entries(arrays: Any, url: str, group: str) -> None:
    """Refuse a pointer table whose entries dkern could not have written.

    Every entry must name ``.dkern/<version folder>/<its own name>``, with the fields
    dkern writes; on local disk no component of that path below the group's folder may
    be a symbolic link (which could lead a read or a delete out of the store).

    Raises
    ------
    StoreError
        Naming the entry, what it holds and what was expected.
    """
    if not isinstance(arrays, dict):
        _refuse(url, group, f"its 'arrays' table is a {type(arrays).__name__}, not a mapping")
    base = local_dir(url, "")
    if base is not None:
        check_no_links(url, group, base, group.split("/") if group else [])
    for name, entry in arrays.items():
        if not isinstance(name, str) or not name or "/" in name or reserved_name(name):
            _refuse(url, group, f"it lists an array named {name!r}, a name dkern never writes")
        if not isinstance(entry, dict) or any(
                not isinstance(entry.get(key), kind) or isinstance(entry.get(key), bool)
                for key, kind in ENTRY_FIELDS.items()):
            _refuse(url, group, f"entry {name!r} is {entry!r:.200}; expected the fields "
                                f"{sorted(ENTRY_FIELDS)} with their types")
        folder, _, leaf = entry["path"].rpartition("/")
        top, _, version = folder.partition("/")
        if top != VERSIONS_DIR or FOLDER_NAME.fullmatch(version) is None or leaf != name:
            _refuse(url, group, f"entry {name!r} names the path {entry['path']!r}; dkern only "
                                f"writes '{VERSIONS_DIR}/<UTC time>-<16 hex digits>/{name}'")
        if base is not None:
            check_no_links(url, group, local_dir(url, group) or base,
                           [VERSIONS_DIR, version, name])


def checked_group(group: str) -> str:
    """``group`` without outer slashes; ValueError for a component that is empty, ``..``,
    or starts with ``'.'`` or ``'__'`` (dkern's hidden version tree and zarr's own names)."""
    if not isinstance(group, str):
        raise TypeError(f"group must be a str such as 'models/krr'; got {type(group).__name__}.")
    parts = group.strip("/").split("/") if group.strip("/") else []
    bad = [p for p in parts if not p or reserved_name(p)]
    if bad:
        raise ValueError(
            f"group path components must be non-empty, hold no '\\', start with neither '.', "
            f"'__' nor 'zarr.' and not end in '.partial'; got {group!r} (component "
            f"{bad[0]!r}). Choose "
            "another name: names starting with '.' are dkern's hidden version folders, "
            "'zarr.json' is a group's metadata file, '*.partial' a killed write's leftover."
        )
    return "/".join(parts)


def reserved_name(name: str) -> bool:
    """Whether a name clashes with zarr's or dkern's own files in a group's folder, or
    holds a backslash (zarr reads it as a path separator: the array would be written
    somewhere other than its name)."""
    return name.startswith((".", "__", "zarr.")) or name.endswith(".partial") or "\\" in name


#: The temporary files zarr (and dkern's link swaps) write and rename into place:
#: ``<name>.<32 hex digits>.partial``. Only these are a killed write's leftovers to collect;
#: any other ``*.partial`` (a browser's download) is the user's.
LEFTOVER = re.compile(r"[^/]*\.[0-9a-f]{32}\.partial")


def check_no_links(url: str, group: str, base: str, parts: list[str]) -> None:
    """Refuse (StoreError) a symbolic link at any of ``base/parts[0]``,
    ``base/parts[0]/parts[1]``, …: a group folder, version folder or array folder that is
    a link would lead reads, writes and deletes out of the store."""
    path = base
    for part in parts:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise StoreError(
                f"{where(url, group)}: {path!r} is a symbolic link (to {os.readlink(path)!r}). "
                "dkern never writes links, and reads, writes and deletes nothing through one "
                "(it could lead outside the store). Replace the link by the folder it points "
                "to, after checking what that holds."
            )


def _refuse(url: str, group: str, problem: str) -> None:
    raise StoreError(
        f"{where(url, group)}: the dkern pointer in {metadata_file(url, group)!r} cannot be "
        f"trusted: {problem}. dkern reads and deletes nothing it names. Restore the store "
        "from a backup or rewrite it from its sources (for a model: dkern.save it to a new "
        "path; delete this store yourself once you have checked what it holds)."
    )


def local_dir(url: str, group: str) -> str | None:
    """The group's folder when the store is on local disk (a path, or any fsspec URL of
    the local file system: ``file://``, ``local://``); None for other fsspec URLs."""
    if "://" in url:  # as make_store: a plain path is a local folder, '::' or not
        fs, path = url_to_fs(url)
        if not isinstance(fs, LocalFileSystem):
            return None
        url = path
    return os.path.join(url, group)


def checksum(pointer: dict[str, Any]) -> str:
    """``"sha256:<hex>"`` of the pointer's canonical JSON, without its checksum."""
    body = {key: value for key, value in pointer.items() if key != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def file_digest(store: Store, key: str) -> str | None:
    """``"sha256:<hex>"`` of the file ``key`` (an array's ``zarr.json``); None if absent."""
    value = read_file(store, key)
    return None if value is None else "sha256:" + hashlib.sha256(value).hexdigest()


def read_file(store: Store, key: str) -> bytes | None:
    """The bytes of the file ``key``; None if absent."""
    value = sync(store.get(key, prototype=default_buffer_prototype()))
    return None if value is None else value.to_bytes()


def sealed(pointer: dict[str, Any]) -> dict[str, Any]:
    """The pointer with its checksum added, ready to publish."""
    return {**pointer, "checksum": checksum(pointer)}


def read_name(url: str, group: str, name: str, entry: dict[str, Any]) -> str:
    """The dask name :func:`dkern.io.open_array` gives a stored array: the same for every
    opening of one published array (however a local path is spelled), a different one
    after any rewrite of it and in any copy of the store."""
    if "://" not in url or url.startswith("file://"):
        url = os.path.abspath(url.removeprefix("file://"))
    label = "/".join(p for p in (group, name) if p)
    return f"dk-read-{label}-{tokenize(url.rstrip('/'), entry['path'], entry['uid'])}"


def plain_members(root: zarr.Group) -> list[str]:
    """Names of the group's direct child nodes, without dkern's hidden version tree and
    the links showing its arrays.

    Listed from the store rather than with ``root.members()``, which warns about every
    stray file (a ``*.partial`` left by a killed write) in the group's folder.
    """
    store, prefix = root.store, f"{root.path}/" if root.path else ""
    names = sync(_collect(store.list_dir(root.path)))
    # dkern's own links show its arrays to plain readers (dkern.io._visible); they are
    # the pointer's arrays, not members of their own.
    folder = os.path.join(str(store.root), root.path) if isinstance(store, LocalStore) else None
    return sorted(n for n in names
                  if not n.startswith(".") and sync(store.exists(f"{prefix}{n}/zarr.json"))
                  and not (folder is not None and is_own_link(os.path.join(folder, n), n)))


def is_own_link(path: str, name: str) -> bool:
    """Whether ``path`` is a link dkern places: to ``.dkern/<version folder>/<name>``."""
    if not os.path.islink(path):
        return False
    top, _, rest = os.readlink(path).partition("/")
    folder, _, leaf = rest.partition("/")
    return top == VERSIONS_DIR and FOLDER_NAME.fullmatch(folder) is not None and leaf == name


async def _collect(items: Any) -> list[str]:
    return [item async for item in items]


class MissingChunk(KeyError):
    """A chunk key the array's grid needs is absent from the store."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class MisplacedChunk(KeyError):
    """A chunk file whose crc32c is not the one recorded for its position at publish."""

    def __init__(self, key: str, found: int, index: tuple[int, ...] | None) -> None:
        super().__init__(key)
        self.key, self.found, self.index = key, found, index


class StrictChunkStore(WrapperStore[Store]):
    """A read-only store view that checks every chunk of one array against its manifest.

    zarr reads an absent chunk as the fill value; for arrays dkern wrote every chunk
    exists, so an absence is damage and must not pass silently (:class:`MissingChunk`).
    The crc32c each chunk file ends with (its codec's checksum of the payload) must be
    the one recorded for that grid position when the array was published: a chunk moved
    from another position, array, version or store, each intact in itself, is then
    reported (:class:`MisplacedChunk`) instead of read as this one.

    Parameters
    ----------
    store : zarr Store
        The store to wrap.
    chunk_prefix : str
        Keys starting with this (``"<array path>/c/"``) are chunk keys.
    crcs : ndarray of uint32, shape (chunk grid)
        The crc32c recorded for each chunk.
    """

    def __init__(self, store: Store, chunk_prefix: str, crcs: np.ndarray) -> None:
        super().__init__(store)
        self.chunk_prefix = chunk_prefix
        self.crcs = crcs

    def _with_store(self, store: Store) -> StrictChunkStore:
        return type(self)(store, self.chunk_prefix, self.crcs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._store, self.chunk_prefix, self.crcs))

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        if not key.startswith(self.chunk_prefix):
            return value
        if value is None:
            raise MissingChunk(key)
        if byte_range is None and len(value) >= 4:
            index = tuple(int(i) for i in key.removeprefix(self.chunk_prefix).split("/"))
            found = int.from_bytes(value[len(value) - 4:].to_bytes(), "little")
            # A chunk damaged in itself fails its codec's check, which says so; only an
            # intact chunk recorded for another place is misplaced.
            if found != self.crcs[index] and crc32c(value[:len(value) - 4].to_bytes()) == found:
                owner = np.argwhere(self.crcs == found)
                raise MisplacedChunk(key, found, tuple(map(int, owner[0])) if len(owner) else None)
        return value
