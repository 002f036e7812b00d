"""Local-disk locks that make concurrent writers to one store group safe.

Both are ``flock`` locks on folders, so the kernel releases them when a process dies
and a killed writer never leaves a stale lock behind:

* the publish lock, exclusive on the group's ``.dkern`` folder: held while a writer
  re-reads the pointer, merges its entries onto it and writes it back, and while
  orphaned version folders are collected, so no two of these interleave;
* a lease, shared on one version folder: held by the writer filling that folder until
  its publish is done, so a cleaner never deletes a folder that is still being written.

Stores at fsspec URLs (object stores) have neither; the README says what that means.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from dkern.errors import StoreError
from dkern.io._store import VERSIONS_DIR, local_dir, where

#: Seconds a writer waits for another process's publish before giving up.
LOCK_TIMEOUT_S = 120.0


@contextlib.contextmanager
def publish_lock(url: str, group: str) -> Iterator[None]:
    """Hold the group's publish lock (local disk; a no-op for fsspec URLs).

    Raises
    ------
    StoreError
        Another process held it for :data:`LOCK_TIMEOUT_S` seconds.
    """
    folder = local_dir(url, group)
    if folder is None:
        yield
        return
    path = os.path.join(folder, VERSIONS_DIR)
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while not _try_flock(fd, fcntl.LOCK_EX):
            if time.monotonic() > deadline:
                raise StoreError(
                    f"{where(url, group)}: could not take the publish lock on {path!r} within "
                    f"{LOCK_TIMEOUT_S:g} s; another process kept it (a dkern write or "
                    "clean_store on this group). Retry when that process is done."
                )
            time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def lease(url: str, group: str, folder: str) -> Iterator[None]:
    """Hold a lease on the version folder ``folder`` (``".dkern/<name>"``) of ``group``,
    creating it; a no-op for fsspec URLs."""
    base = local_dir(url, group)
    if base is None:
        yield
        return
    path = os.path.join(base, folder)
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a cleaner inspects the folder
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def unleased(url: str, group: str, folder: str) -> Iterator[bool]:
    """Whether no writer holds a lease on ``folder``; while True, none can take one.

    Always True for fsspec URLs, where there are no leases.
    """
    base = local_dir(url, group)
    if base is None:
        yield True
        return
    try:
        fd = os.open(os.path.join(base, folder), os.O_RDONLY)
    except FileNotFoundError:  # removed meanwhile
        yield False
        return
    try:
        yield _try_flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)


def _try_flock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
