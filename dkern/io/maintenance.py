"""Checking a store, and reclaiming what no pointer uses.

Every write fills a version folder ``.dkern/<UTC time>-<random>`` of its own, then
publishes it. What no pointer lists is garbage once no writer is filling it: folders of
writes that were killed or refused, arrays a publish superseded whose deletion failed,
and the ``<name>.<32 hex>.partial`` temporary files zarr leaves when a process dies
mid-file (a user's other ``*.partial`` files are left alone).
Each publish collects these on local disk (under the publish lock, skipping folders a
live writer leases); :func:`clean_store` does it on demand, for fsspec stores too.
"""

from __future__ import annotations

import calendar
import contextlib
import itertools
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.core.sync import sync

from dkern.errors import StoreError
from dkern.io import _store
from dkern.io._lock import publish_lock, unleased
from dkern.io._store import (
    FOLDER_NAME,
    LEFTOVER,
    VERSIONS_DIR,
    Url,
    check_no_links,
    checked_group,
    local_dir,
    open_group,
    plain_members,
    pointer_restored,
    read_pointer,
    where,
)
from dkern.io._visible import show_published
from dkern.io.read import open_array

__all__ = ["StoreReport", "check_store", "clean_store", "remove_store"]

logger = logging.getLogger(__name__)

#: Minimum age (s) of an unreferenced folder or ``*.partial`` file before a publish on
#: local disk collects it: leases protect live writers, this covers the instant between
#: a writer creating its folder and leasing it.
LOCAL_GRACE_S = 10.0
#: :func:`clean_store`'s default minimum age on fsspec stores, which have no leases.
REMOTE_GRACE_S = 86_400.0


def new_folder() -> str:
    """A fresh version folder path, unique without reading the pointer."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{VERSIONS_DIR}/{stamp}-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class StoreReport:
    """What :func:`check_store` found.

    Attributes
    ----------
    url : str
    arrays : dict of str to tuple of int
        Every array a pointer lists (``"group/name"``) whose every chunk read back and
        passed its checksum, with its shape.
    damage : list of str
        One message per problem: a pointer failing its checksum, an array or chunk
        missing or failing its checksum. Empty for a sound store.
    plain : dict of str to str
        For each Zarr array dkern did not write (no manifest, no checksums): what could
        be checked of it (a chunk present for every grid position) and what could not.
    orphans : list of str
        Store paths (from the store's root, as :func:`clean_store` returns them) no
        pointer uses, whatever their age (what :func:`clean_store` removes once they are
        older than its ``min_age`` and no live writer leases them).
    """

    url: str
    arrays: dict[str, tuple[int, ...]] = field(default_factory=dict)
    damage: list[str] = field(default_factory=list)
    plain: dict[str, str] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is damaged (orphans are not damage)."""
        return not self.damage


def check_store(url: Url, group: str = "") -> StoreReport:
    """Verify every array of a store: all chunks read back and pass their checksums.

    Parameters
    ----------
    url : str or os.PathLike
        A local path or fsspec URL.
    group : str, default ""
        Check this group and the groups below it.

    Returns
    -------
    StoreReport
        ``report.ok`` is False when anything is damaged; ``report.damage`` says what.

    Raises
    ------
    StoreError
        No Zarr group at ``url`` / ``group``.
    """
    url = os.fspath(url)
    report = StoreReport(url)
    for path in _groups(url, checked_group(group)):
        try:
            root = open_group(url, path, mode="r")
            pointer = read_pointer(root, url, path)
            orphans = _orphans(url, path, pointer, min_age=0.0)
        except StoreError as err:
            report.damage.append(str(err))
            continue
        for name, entry in sorted(pointer.get("arrays", {}).items()):
            label = "/".join(p for p in (path, name) if p)
            try:
                x = open_array(url, label)
                da.map_blocks(_read_ok, x, dtype=bool, chunks=(1,) * x.ndim).compute()
            except StoreError as err:
                report.damage.append(str(err))
            else:
                report.arrays[label] = tuple(entry["shape"])
        for name in sorted(set(plain_members(root)) - set(pointer.get("arrays", {}))):
            _check_plain(root, name, path, report)
        report.orphans.extend("/".join(p for p in (path, orphan) if p) for orphan in orphans)
    return report


def _check_plain(root: zarr.Group, name: str, group: str, report: StoreReport) -> None:
    """What can be checked of a Zarr array dkern did not write: a chunk for every grid
    position. Its contents have no checksums dkern knows of, so they cannot be checked."""
    try:
        z = root.get(name)
    except (ValueError, TypeError, KeyError):  # reported by the walk, which tries it as a group
        return
    if not isinstance(z, zarr.Array):
        return
    label = "/".join(p for p in (group, name) if p)
    present = set(sync(_keys(z.store.list_prefix(f"{z.path}/"))))
    missing = [index for index in itertools.product(*map(range, z.cdata_shape))
               if f"{z.path}/{z.metadata.encode_chunk_key(index)}" not in present]
    note = (f"{label}: a plain Zarr array (not written by dkern): its contents have no "
            "checksums dkern can verify; only the presence of its chunks was checked")
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        note += (f". {len(missing)} of {z.nchunks} chunks are absent ({shown}): they read as "
                 f"the fill value {z.fill_value!r}. A deleted chunk and one zarr skipped for "
                 "equalling the fill value cannot be told apart; rewrite the array with "
                 "dkern.io.write_array to have every chunk checked")
    report.plain[label] = note + "."


def clean_store(
    url: Url, group: str = "", *, min_age: float | None = None, dry_run: bool = False
) -> list[str]:
    """Delete what no pointer uses: unpublished version folders and zarr's temporary files
    (``<name>.<32 hex>.partial``) a killed write left; a user's other files stay.

    Published arrays are never touched: only paths no group's pointer lists are removed,
    read under the group's publish lock so no write publishes one meanwhile.

    Parameters
    ----------
    url : str or os.PathLike
    group : str, default ""
        Clean this group and the groups below it.
    min_age : float, optional
        Seconds: younger leftovers are kept, as they may belong to a write still running.
        Default: 10 s on local disk, where a running writer's folder is also protected by
        its lease whatever its age; one day on fsspec stores, which have no leases (pass
        0 there only when no writer is running).
    dry_run : bool, default False
        Remove nothing; return what would be removed now (the same age and lease rules).

    Returns
    -------
    list of str
        The store paths removed (with ``dry_run``: that would be removed).

    Raises
    ------
    StoreError
        A group's pointer is damaged (nothing in that group is removed, as what it uses
        is unknown) or there is no group at ``url``.
    """
    url = os.fspath(url)
    removed: list[str] = []
    refused: list[str] = []
    for path in _groups(url, checked_group(group)):
        age = min_age if min_age is not None else (
            LOCAL_GRACE_S if local_dir(url, path) is not None else REMOTE_GRACE_S)
        # A dry run takes no publish lock: taking it creates the group's .dkern folder.
        with contextlib.nullcontext() if dry_run else publish_lock(url, path):
            root = open_group(url, path, mode="r")
            try:
                pointer = read_pointer(root, url, path)
            except StoreError as err:  # the other groups are still cleaned
                refused.append(str(err))
                continue
            if pointer and pointer_restored(root):  # its copy's word: delete nothing by it
                logger.warning("%s: not cleaned while its pointer is read from its copy; a "
                               "dkern write to it restores the pointer", where(url, path))
                continue
            if not dry_run:  # what a publish could not link (dkern.io._visible)
                show_published(url, path, pointer, new_folder())
            removed += collect_orphans(url, path, pointer, min_age=age, deep=True,
                                       dry_run=dry_run)
    if refused:
        raise StoreError(" ".join(refused) + f" (the other groups were cleaned: removed "
                                             f"{removed})")
    return removed


def collect_orphans(
    url: str, group: str, pointer: dict[str, Any], *, min_age: float, deep: bool = False,
    dry_run: bool = False
) -> list[str]:
    """Delete the group's unreferenced, unleased leftovers older than ``min_age``.

    Call it holding the publish lock, with the pointer read under it, so no write can
    publish a folder between the reading and the deleting. ``deep`` also looks for zarr's
    temporary files inside arrays (a full listing of the group). ``dry_run`` deletes
    nothing and returns what would be deleted.
    """
    store = _store.make_store(url, read_only=False)
    removed = []
    for path in _orphans(url, group, pointer, min_age=min_age, deep=deep):
        key = "/".join(p for p in (group, path) if p)
        with unleased(url, group, path) as free:
            if free and dry_run:
                removed.append(key)
            elif free:
                _remove(store, url, group, path)
                removed.append(key)
    if removed and not dry_run:
        logger.info("removed from %s what no pointer uses: %s", where(url, group), removed)
    return removed


def remove_store(url: Url) -> None:
    """Delete the dkern store at ``url``: its pointer, versions and the links to its arrays.
    Anything else in its folder (a user's files, folders or links, at an array's name too;
    another store) is kept, and then so is the folder.

    Parameters
    ----------
    url : str or os.PathLike
        The store: a local path or any fsspec URL.
    """
    url = os.fspath(url)
    fs, path = _store.filesystem(url)
    entries = {entry.rstrip("/").rpartition("/")[2]: entry for entry in fs.ls(path, detail=False)}
    base = local_dir(url, "")
    links = [] if base is None else [name for name in entries
                                     if _store.is_own_link(os.path.join(base, name), name)]
    own = [name for name in ("zarr.json", VERSIONS_DIR) if name in entries]  # unpublish first
    others = sorted(set(entries) - set(own) - set(links))
    if not others:
        fs.rm(path, recursive=True)
        return
    for name in links:
        os.unlink(os.path.join(base, name))  # a link, never followed
    for name in own:
        fs.rm(entries[name], recursive=True)
    logger.warning("removed the dkern store %r but kept its folder, which holds %s too",
                   url, others)


def _remove(store: Store, url: str, group: str, path: str) -> None:
    """Delete one leftover; a symbolic link is unlinked, never followed (what it points to
    is no part of the store)."""
    key = "/".join(p for p in (group, path) if p)
    base = local_dir(url, group)
    if base is not None and os.path.islink(os.path.join(base, path)):
        os.unlink(os.path.join(base, path))
    elif _is_leftover(path):
        sync(store.delete(key))
    else:
        sync(store.delete_dir(key))


def _orphans(
    url: str, group: str, pointer: dict[str, Any], *, min_age: float, deep: bool = True
) -> list[str]:
    """Paths (relative to the group) of unreferenced folders and partial files.

    Raises
    ------
    StoreError
        The group's version folder is a symbolic link: listing it would list (and a clean
        would delete) another folder's contents.
    """
    root = local_dir(url, "")
    if root is not None:  # a group folder or version folder that is a link leads elsewhere
        check_no_links(url, group, root, [*(group.split("/") if group else []), VERSIONS_DIR])
    store = _store.make_store(url, read_only=True)
    prefix = f"{group}/" if group else ""
    in_use = {entry["path"].rpartition("/")[0] for entry in pointer.get("arrays", {}).values()}
    listed = [f"{VERSIONS_DIR}/{n}" for n in _list_dir(store, f"{prefix}{VERSIONS_DIR}")]
    # only folders named as dkern names them: a user's copy (``<folder>.bak``) is theirs
    unused = [p for p in listed if FOLDER_NAME.fullmatch(p.rpartition("/")[2])
              and p not in in_use]
    partials = [p for p in listed if _is_leftover(p)]
    partials += [n for n in _list_dir(store, group) if _is_leftover(n)]
    if deep:  # inside unused folders they go with the folder, once its lease is free
        partials += [key for key in _own_files(url, group, store)
                     if _is_leftover(key) and not key.startswith(tuple(f"{p}/" for p in unused))]
    return sorted({p for p in unused if _folder_age(p) >= min_age}
                  | {p for p in partials if _file_age(url, group, p) >= min_age})


def _is_leftover(path: str) -> bool:
    """Whether the file is a temporary file zarr or dkern left (:data:`LEFTOVER`)."""
    return LEFTOVER.fullmatch(path.rpartition("/")[2]) is not None


def _own_files(url: str, group: str, store: Store) -> list[str]:
    """Paths (relative to the group) of every file in the group's folder and its arrays',
    not in its sub-groups' (each group is checked in its own turn: listing them here too
    would list a store nested n deep n times). Walked without recursion."""
    subgroups = {name for name in _list_dir(store, group) if _is_group_dir(store, group, name)}
    base = local_dir(url, group)
    if base is None:
        prefix = f"{group}/" if group else ""
        keys = [key.removeprefix(prefix) for key in sync(_keys(store.list_prefix(prefix)))]
        return [key for key in keys if key.partition("/")[0] not in subgroups]
    found, pending = [], [""]
    while pending:
        folder = pending.pop()
        with os.scandir(os.path.join(base, folder)) as entries:
            for item in entries:
                path = f"{folder}/{item.name}" if folder else item.name
                if item.is_dir(follow_symlinks=False):
                    if path not in subgroups:
                        pending.append(path)
                else:
                    found.append(path)
    return found


def _is_group_dir(store: Store, group: str, name: str) -> bool:
    meta = _store.read_file(store, "/".join(p for p in (group, name, "zarr.json") if p))
    return meta is not None and b'"group"' in meta


def _folder_age(path: str) -> float:
    """Seconds since the version folder's write began (from its name)."""
    match = FOLDER_NAME.fullmatch(path.rpartition("/")[2])
    return time.time() - calendar.timegm(time.strptime(match.group(1), "%Y%m%dT%H%M%SZ"))


def _file_age(url: str, group: str, path: str) -> float:
    base = local_dir(url, group)
    try:
        return float("inf") if base is None else time.time() - os.lstat(
            os.path.join(base, path)).st_mtime  # a link's own age, not its target's
    except FileNotFoundError:
        return -1.0  # already gone: nothing to collect


def _groups(url: str, group: str) -> list[str]:
    """``group`` and every group below it (dkern's hidden folders excluded), walked without
    recursion so that however deep a store nests, listing it cannot overflow the stack."""
    found, pending = [], [group]
    while pending:
        path = pending.pop()
        found.append(path)
        try:
            root = open_group(url, path, mode="r")
        except StoreError:  # damaged metadata: reported when the group is opened to check
            if path == group:  # no store at all
                raise
            continue
        below = []
        for name in plain_members(root):
            try:
                is_group = isinstance(root.get(name), zarr.Group)
            except (ValueError, TypeError, KeyError):  # damaged: reported when opened
                is_group = True
            if is_group:
                below.append("/".join(p for p in (path, name) if p))
        pending.extend(reversed(below))
    return found


def _list_dir(store: Store, prefix: str) -> list[str]:
    return sync(_keys(store.list_dir(prefix)))


async def _keys(items: Any) -> list[str]:
    return [item async for item in items]


def _read_ok(block: np.ndarray) -> np.ndarray:
    """Reading the block checked it; what is returned is one flag per block."""
    return np.ones((1,) * block.ndim, dtype=bool)
