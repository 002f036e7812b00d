"""Published versions whose pointer is gone, told from a killed write's leftovers.

dkern's readers and collectors go by the pointer in a group's ``zarr.json``, and by its
copy in ``.dkern`` (:data:`~dkern.io._store.POINTER_COPY`) when another tool rewrote the
attributes. A group written by a dkern older than that copy has no such fallback: once
its pointer is gone, everything in ``.dkern`` would look unreferenced. This module
recognises that state so that nothing is written, cleaned or read on its word.
"""

from __future__ import annotations

import os

import zarr
from zarr.core.sync import sync

from dkern.errors import StoreError
from dkern.io import _store
from dkern.io._store import POINTER_COPY, POINTER_KEY, VERSIONS_DIR, is_own_link, local_dir, where

__all__ = ["check_pointer_not_lost"]


def check_pointer_not_lost(url: str, group: str, root: zarr.Group) -> None:
    """Raise when a group's published versions have lost their pointer and its copy: no
    write, clean or read then goes by the group's pointer-less state.

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
    if base is None or _has_pointer(url, group, root):
        return
    with os.scandir(base) as entries:
        linked = sorted({os.readlink(e.path).rpartition("/")[0] for e in entries
                         if is_own_link(e.path, e.name)})
    found = [folder for folder in linked if os.path.isdir(os.path.join(base, folder))]
    # a writer publishes the pointer, then its copy, then the links: links seen after a
    # look that found no pointer may be a concurrent first publish's, so look again
    if found and not _has_pointer(url, group, _store.open_group(url, group, mode="r")):
        raise StoreError(
            f"{where(url, group)}: zarr.json has no dkern pointer and no copy of it, yet "
            f"{VERSIONS_DIR} holds published versions {found}: a dkern older than the copy "
            "wrote this group, and another tool (xarray's to_zarr(mode='a')) has since "
            "replaced the group's attributes. A write or clean now would leave those arrays "
            "unreferenced and delete them, so dkern does neither. Restore zarr.json from a "
            "backup; or read the arrays with zarr (at <version>/<name>) and write them "
            f"anew; or, if they are not needed, delete {VERSIONS_DIR}."
        )


def _has_pointer(url: str, group: str, root: zarr.Group) -> bool:
    """Whether the group has a pointer in ``zarr.json`` or its copy in ``.dkern``."""
    if POINTER_KEY in root.attrs:
        return True
    prefix = f"{group}/" if group else ""
    return bool(sync(_store.make_store(url, read_only=True).exists(
        f"{prefix}{VERSIONS_DIR}/{POINTER_COPY}")))
