"""``dkern store check|clean`` and ``dkern fsck``: verify every array of a store (its
pointers, metadata, every chunk and checksum), and list or remove the leftovers no
pointer uses. ``fsck`` does both in one run."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import nonnegative_float


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    """Both subcommands, ``store`` then ``fsck``; neither starts a cluster."""
    store = sub.add_parser("store", parents=[common],
                           help="check a store (every chunk and checksum) or clean it "
                                "(delete what no pointer uses); `dkern fsck` does both")
    store.add_argument("action", choices=["check", "clean"],
                       help="check: read every chunk, exit 1 naming any damage; clean: delete "
                            "leftovers no pointer uses")
    store.add_argument("url", help="store path or fsspec URL")
    store.add_argument("--group", default="", help="only this group (and those below it)")
    store.add_argument("--min-age", type=nonnegative_float, default=None,
                       help="clean: keep leftovers younger than this many seconds (default: "
                            "10 on local disk, where live writers are also protected by a "
                            "lease; 86400 on fsspec stores)")
    store.set_defaults(run=run_store)
    fsck = sub.add_parser("fsck", parents=[common],
                          help="verify every array of a store (pointers, metadata, every chunk "
                               "and its checksum) and list leftovers; --clean removes them")
    fsck.add_argument("url", help="store path or fsspec URL")
    fsck.add_argument("--group", default="", help="only this group (and those below it)")
    fsck.add_argument("--clean", action="store_true",
                      help="remove the leftovers listed as would_remove (never published "
                           "data; nothing when damage is found)")
    fsck.add_argument("--min-age", type=nonnegative_float, default=None,
                      help="keep leftovers younger than this many seconds (default: 10 on "
                           "local disk, where live writers are also protected by a lease; "
                           "86400 on fsspec stores)")
    fsck.set_defaults(run=run_fsck)


def run_store(args: argparse.Namespace) -> dict[str, Any]:
    """``dkern store check|clean URL``: verify every array, or reclaim leftovers."""
    from ..errors import StoreError
    from ..io import check_store, clean_store

    if args.action == "clean":
        removed = clean_store(args.url, args.group, min_age=args.min_age)
        return {"store": args.url, "removed": removed}
    report = check_store(args.url, args.group)
    if not report.ok:
        raise StoreError(f"{args.url!r} is damaged: " + "; ".join(report.damage)
                         + " (`dkern store clean` never repairs damage: rewrite what is named.)")
    return {"store": args.url, "arrays": {k: list(v) for k, v in report.arrays.items()},
            "orphans": report.orphans}


def run_fsck(args: argparse.Namespace) -> dict[str, Any]:
    """``dkern fsck STORE``: verify every array, then list (``--clean``: remove) leftovers.

    Leftovers are what no pointer uses (folders of killed or refused writes, ``*.partial``
    files); published arrays are never removed, and nothing at all from a damaged store,
    whose pointers may be what is damaged. No lock can be stale: dkern's are ``flock``
    locks, which the kernel releases when their process dies.
    """
    from ..io import check_store, clean_store

    report = check_store(args.url, args.group)
    found = [] if not report.ok else clean_store(args.url, args.group, min_age=args.min_age,
                                                 dry_run=not args.clean)
    return {"store": args.url, "ok": report.ok, "damage": report.damage,
            "arrays": {k: list(v) for k, v in report.arrays.items()},
            "plain": report.plain,
            "removed" if args.clean else "would_remove": sorted(found),
            # too young (maybe a write still running), leased by a live writer, or damage
            "kept": sorted(set(report.orphans) - set(found))}
