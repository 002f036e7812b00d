"""Published arrays under their own names, for plain zarr and xarray readers.

dkern's readers follow the pointer table to ``.dkern/<version>/<name>``; zarr and
xarray know nothing of it. On local disk each publish therefore also places, at
``<group>/<name>``, a relative symbolic link to the array's current version folder,
swapped atomically (a new link renamed over the old one): a reader opening ``name``
gets the old complete array or the new complete one, never a mix. Links dkern placed
are recognised by their target, ``.dkern/<version folder>/<name>``; any other link or
file at a name is the user's, and stays. dkern reads and deletes nothing through a link
(only its own links are ever removed). On other fsspec stores (object stores have no links)
arrays stay behind the pointer, readable by dkern only.

Consolidated metadata (xarray's ``to_zarr`` writes it) of the group and the groups above
it is rebuilt after each publish, or xarray's default open would not see new arrays.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from typing import Any

import zarr

from dkern.io._lock import publish_lock
from dkern.io._store import VERSIONS_DIR, is_own_link, local_dir, make_store, where

__all__ = ["show_published"]

logger = logging.getLogger(__name__)


def show_published(url: str, group: str, pointer: dict[str, Any], aside: str,
                   replacing: frozenset[str] = frozenset()) -> list[str]:
    """Link ``<group>/<name>`` to each array ``pointer`` lists, and remove dkern's links
    to names it no longer lists. Call it under the publish lock, right after publishing.

    A plain Zarr array at a name in ``replacing`` (one a write's overwrite check counted
    and allowed) is moved into the version folder ``aside`` (relative to the group) to
    make room; whatever else stands at a name and is not a link (a file, a folder zarr
    does not read) is left alone, and the name not linked (logged).

    Returns
    -------
    list of str
        The folders (relative to the group) holding what was moved aside, to delete.
    """
    base = local_dir(url, group)
    if base is None:
        return []
    arrays = pointer.get("arrays", {})
    moved = False
    for name, entry in arrays.items():
        path = os.path.join(base, name)
        if os.path.islink(path) and os.readlink(path) == entry["path"]:
            continue
        if os.path.lexists(path) and not is_own_link(path, name):
            # a user's file, folder or link; only a plain array the overwrite check allowed
            # makes room (a link is never followed, and never replaced)
            if name not in replacing or os.path.islink(path):
                logger.warning("%s: %r is not linked to the array dkern published under that "
                               "name: something else is there (plain readers see it, dkern "
                               "reads its own)", where(url, group), path)
                continue
            os.makedirs(os.path.join(base, aside), exist_ok=True)
            os.rename(path, os.path.join(base, aside, name))
            moved = True
        _swap_link(path, entry["path"])
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if name not in arrays and is_own_link(path, name):
            os.unlink(path)
    _refresh_consolidated(url, group)
    return [aside] if moved else []


def _swap_link(path: str, target: str) -> None:
    """Make ``path`` a link to ``target`` in one rename (atomic on POSIX)."""
    temporary = f"{path}.{uuid.uuid4().hex}.partial"  # collected like zarr's own leftovers
    os.symlink(target, temporary)
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _refresh_consolidated(url: str, group: str) -> None:
    """Rebuild the consolidated metadata of the group and of each group above it that has
    any (xarray's ``to_zarr`` writes it at the root; ``xr.open_zarr`` then sees only what
    it lists, the groups below included), without dkern's hidden version trees. The
    group's own publish lock is held; an ancestor's is taken for its rebuild, so two
    writers cannot each drop the other's."""
    store = make_store(url, read_only=False)
    parts = group.split("/") if group else []
    for depth in range(len(parts) + 1):
        path = "/".join(parts[:depth])
        node = zarr.open_group(store=store, path=path, mode="r", zarr_format=3)
        if node.metadata.consolidated_metadata is None:
            continue
        with contextlib.nullcontext() if path == group else publish_lock(url, path):
            zarr.consolidate_metadata(store, path=path or None, zarr_format=3)
            _drop_hidden(os.path.join(local_dir(url, path) or "", "zarr.json"))


def _drop_hidden(meta_file: str) -> None:
    """Remove the entries of ``.dkern`` trees from a consolidated ``zarr.json`` (zarr lists
    every folder with metadata; dkern's version folders are no one else's business, and a
    superseded one would stay listed after its deletion). Replaced in one rename."""
    with open(meta_file, encoding="utf-8") as f:
        meta = json.load(f)
    listed = meta["consolidated_metadata"]["metadata"]
    hidden = [key for key in listed if VERSIONS_DIR in key.split("/")]
    if not hidden:
        return
    for key in hidden:
        del listed[key]
    temporary = f"{meta_file}.{uuid.uuid4().hex}.partial"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    os.replace(temporary, meta_file)
