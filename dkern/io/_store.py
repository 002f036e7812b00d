"""Store plumbing shared by the reader and the writer.

A dkern store is a Zarr v3 group. Its ``zarr.json`` attributes hold one pointer
table under the key ``"dkern"``::

    {"dkern": {"format": 1, "dkern_version": "0.1.0", "version": 3,
               "arrays": {"X": {"path": ".dkern/v3/X", "shape": [n, d],
                                "dtype": "float64", "chunks": [c, d],
                                "n_chunks": 7, "uid": "<hex>"}},
               "attrs": {...}}}

The arrays themselves live at hidden versioned paths ``.dkern/v{k}/<name>``;
readers only follow the pointer, so the pointer update is the publish.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

import zarr
import zarr.errors
from fsspec.core import url_to_fs
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore, WrapperStore

if TYPE_CHECKING:
    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, BufferPrototype

from dkern.errors import StoreError

POINTER_KEY = "dkern"
FORMAT = 1
VERSIONS_DIR = ".dkern"

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


def _open(url: str, group: str, mode: Literal["r", "a"]) -> zarr.Group:
    store = make_store(url, read_only=mode == "r")
    try:
        return zarr.open_group(store=store, path=group, mode=mode, zarr_format=3)
    except zarr.errors.ContainsArrayError:
        raise StoreError(
            f"{where(url, group)} is a Zarr array, expected a group holding arrays. "
            "Pass the URL of the enclosing group and the array's name as the path."
        ) from None


def missing_part(url: str, group: str) -> tuple[str, bool] | None:
    """What writing to ``group`` would create: None if the group exists, else the
    shallowest missing group path (``""``: the store's root group) and whether the
    store's location itself is new (nothing there at all)."""
    parts = group.split("/") if group else []
    for depth in range(len(parts) + 1):
        path = "/".join(parts[:depth])
        if find_group(url, path) is None:
            fs, location = url_to_fs(url)
            return path, path == "" and not fs.exists(location)
    return None


def remove_created(url: str, created: tuple[str, bool]) -> None:
    """Undo what a failed write created (see :func:`missing_part`), leaving whatever
    was there before untouched."""
    path, new_location = created
    fs, root = url_to_fs(url)
    if new_location:
        fs.rm(root, recursive=True)
    elif path == "":  # an existing folder that was not a store: only dkern's own files
        fs.rm([p for p in (f"{root}/zarr.json", f"{root}/{VERSIONS_DIR}") if fs.exists(p)],
              recursive=True)
    else:
        parent, _, name = path.rpartition("/")
        del _open(url, parent, "a")[name]


def read_pointer(root: zarr.Group, url: str, group: str) -> dict[str, Any]:
    """The group's dkern pointer table, or ``{}`` for a group dkern never wrote."""
    pointer = root.attrs.get(POINTER_KEY)
    if pointer is None:
        return {}
    if not isinstance(pointer, dict) or pointer.get("format") != FORMAT:
        found = pointer.get("format") if isinstance(pointer, dict) else type(pointer).__name__
        raise StoreError(
            f"{where(url, group)} has a dkern pointer of format {found!r}; this dkern "
            f"reads format {FORMAT}. Upgrade dkern, or rewrite the store."
        )
    return pointer


def plain_members(root: zarr.Group) -> list[str]:
    """Names of the group's direct children, without dkern's hidden version tree."""
    return sorted(name for name, _ in root.members() if not name.startswith("."))


class MissingChunk(KeyError):
    """A chunk key the array's grid needs is absent from the store."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class StrictChunkStore(WrapperStore[Store]):
    """A read-only store view that raises :class:`MissingChunk` for absent chunks.

    zarr reads an absent chunk as the fill value; for arrays dkern wrote every
    chunk exists, so an absence is damage and must not pass silently.

    Parameters
    ----------
    store : zarr Store
        The store to wrap.
    chunk_prefix : str
        Keys starting with this (``"<array path>/c/"``) are chunk keys.
    """

    def __init__(self, store: Store, chunk_prefix: str) -> None:
        super().__init__(store)
        self.chunk_prefix = chunk_prefix

    def _with_store(self, store: Store) -> StrictChunkStore:
        return type(self)(store, self.chunk_prefix)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._store, self.chunk_prefix))

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        if value is None and key.startswith(self.chunk_prefix):
            raise MissingChunk(key)
        return value
