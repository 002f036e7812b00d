"""What the subcommands share: option types and parent parsers, the cluster a
command runs on, the stores it compares, and how a run ends (report, error, exit code).

Usage errors go through ``args.usage_error`` (the subcommand parser's ``error``:
exit 2); failures dkern diagnosed are exceptions that :func:`run_command` turns
into one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import dask
from distributed import KilledWorker
from distributed.client import FutureCancelledError

from ..backends import BACKENDS
from ..errors import DkernError
from ..operators.base import LARGE_GRAPH_KEY
from ..runtime import ClusterVersionError

# --- options ---------------------------------------------------------------------------


class DefaultsHelp(argparse.HelpFormatter):
    """Help that ends each option's line with its default, when it has one to show
    (not None, a flag's False, or one the help already states)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS)
        if shown and action.option_strings and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def nonnegative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text}")
    return value


def _integer(text: str) -> int:
    """An integer written as one (``1000000``) or in exponent form (``1e6``, as row counts
    are often written); anything else is a usage error saying what was expected."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value.is_integer():  # NaN, inf and fractions too
        raise argparse.ArgumentTypeError(f"expected an integer such as 1000 or 1e6; got {text!r}")
    return int(value)


def nonnegative_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text}")
    return value


def parent_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The options every subcommand takes (output, logging), and those of the commands
    that run on a cluster (where it is, how many workers)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object")
    common.add_argument("--quiet", action="store_true", help="print nothing but errors")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="log at INFO level, and show the embedded cluster's worker logs")
    cluster = argparse.ArgumentParser(add_help=False)
    cluster.add_argument("--scheduler", default=None,
                         help="Dask scheduler address (default: $DKERN_SCHEDULER_ADDRESS, "
                              "else an embedded LocalCluster)")
    cluster.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                         help="worker processes of the embedded LocalCluster")
    return common, cluster


def solver_arguments(parser: argparse.ArgumentParser, *, tol: float,
                     alpha_help: str = "ridge penalty, (K + alpha I)") -> None:
    """--alpha, --tol and --backend, added to each command that solves. Each parser gets
    its own actions: with a shared parent parser, one command's default changed the
    other's (demo's tol=1e-3 became fit's)."""
    parser.add_argument("--alpha", type=nonnegative_float, default=1e-3, help=alpha_help)
    parser.add_argument("--tol", type=positive_float, default=tol,
                        help="relative residual to reach")
    parser.add_argument("--backend", choices=list(BACKENDS), default="auto")


# --- the cluster -----------------------------------------------------------------------


#: distributed warns of graphs over 10 MB and advises scattering the data. dkern sends its
#: own large arrays (in-memory rows, a pass's broadcast factors) to the cluster before the
#: graphs that use them, on purpose not scattered (recomputable after a lost worker); a
#: command's user can do nothing about a graph of dkern's, so only larger graphs are reported.
LARGE_GRAPH_WARNING = "1GB"


@contextlib.contextmanager
def cluster_client(args: argparse.Namespace) -> Iterator[Any]:
    """``dkern.connect`` for the run, closed (with its embedded cluster) after."""
    from ..runtime import connect

    kwargs = {} if args.scheduler else {
        "n_workers": args.workers,
        # Worker logs would repeat a task's error as a traceback before the message
        # run_command() prints; -v shows them.
        "silence_logs": logging.WARNING if args.verbose else logging.CRITICAL}
    if not args.verbose:  # a Ctrl-C'd gather logs "Task exception was never retrieved"
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    with _ctrl_c_ignored_by_new_processes():
        client = connect(args.scheduler, **kwargs)
    try:
        with dask.config.set({LARGE_GRAPH_KEY: LARGE_GRAPH_WARNING}):
            yield client
    finally:
        client.close()  # and the embedded cluster connect() started, if any


@contextlib.contextmanager
def _ctrl_c_ignored_by_new_processes() -> Iterator[None]:
    """Ignore SIGINT while the embedded cluster starts, so its worker processes ignore it.

    Ctrl-C in a terminal signals the whole process group, and each worker would print
    a KeyboardInterrupt traceback; they stop when the command closes the cluster. An
    ignored signal stays ignored across ``exec``, and Python then installs no handler.
    The cost: a Ctrl-C during the cluster's start (seconds) is lost, and a worker that
    the nanny restarts later does not inherit this.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# --- stores ----------------------------------------------------------------------------


def overlapping(a: str, b: str) -> bool:
    """Whether two store paths or URLs name the same store or one lies inside the other."""
    from ..io import path_within, store_location

    a, b = store_location(a), store_location(b)
    return path_within(a, b) or path_within(b, a)


def check_creatable(flag: str, url: str, usage_error: Callable[[str], Any]) -> None:
    """``usage_error`` naming ``flag`` when the local path ``url`` is a file, or lies under
    one: no store can be created there, and writing would fail only after the work (a
    whole fit) with a bare "Not a directory". fsspec URLs are left to their file system."""
    if "://" in url:  # a plain path is a local folder, '::' or not (dkern.io.filesystem)
        return
    path = node = os.path.abspath(url)
    while not os.path.lexists(node):  # the nearest part of the path that exists
        node = os.path.dirname(node)
    if os.path.isdir(node):
        return
    what = "a link to nothing" if os.path.islink(node) else "a file"
    where_ = "is" if node == path else f"lies under {node!r}, which is"
    usage_error(f"{flag} {url!r} {where_} {what}, not a folder, so no Zarr store can be "
                f"created there; pass a new path in a folder, e.g. in "
                f"{os.path.dirname(node)!r}")


def absolute_store_paths(args: argparse.Namespace) -> None:
    """Make the local store paths a cluster command reads or writes absolute, here on the
    client: workers resolve a relative path against their own folder, which a remote
    scheduler's workers do not share (the chunks of a sound store then looked missing).
    The options are named by the parser default ``store_paths``; URLs are kept."""
    for dest in getattr(args, "store_paths", ()):
        value = getattr(args, dest)
        if value is not None and "://" not in str(value):
            setattr(args, dest, os.path.abspath(value))


def rmse(store: str, pred: str, truth: str) -> float:
    """Root mean squared error of two stored arrays, computed chunk by chunk."""
    import dask.array as da

    from ..io import open_array

    predicted, true = open_array(store, pred), open_array(store, truth)
    if predicted.shape != true.shape:  # never let them broadcast into an m x m difference
        raise ValueError(f"--y {truth!r} has shape {true.shape}, the predictions {pred!r} "
                         f"{predicted.shape}; pass the true values for the rows of --x.")
    return float(da.sqrt(((predicted - true) ** 2).mean()).compute())


# --- how a run ends --------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed subcommand (``args.run``) and print its report; the exit code."""
    run: Callable[[argparse.Namespace], dict[str, Any]] = args.run
    absolute_store_paths(args)
    try:
        report = run(args)
    except (DkernError, ValueError, TypeError, OSError) as err:  # OSError: paths, network
        # The library names its keyword argument; here it is a flag.
        message = str(err).replace("overwrite=True", "--overwrite")
        print(f"dkern {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C
    except ClusterVersionError as err:  # the library's fix names connect()'s keyword
        message = str(err).replace(", or pass check_versions=False to dkern.connect to go on "
                                   "at your own risk", "")
        print(f"dkern {args.command}: error: {message}", file=sys.stderr)
        return 1
    except FutureCancelledError as err:
        resume = (", which resumes from its last checkpoint"
                  if getattr(args, "checkpoint", None) is not None else
                  " (with --checkpoint, a rerun resumes where a lost one stopped)")
        print(f"dkern {args.command}: error: the Dask cluster cancelled the work ({err}): the "
              "scheduler stopped or the connection to it was lost. Check that the scheduler "
              f"is running and reachable, then run the same command again{resume}.",
              file=sys.stderr)
        return 1
    except KilledWorker as err:
        print(f"dkern {args.command}: error: a Dask worker died while running a task ({err}); "
              "the usual cause is a worker out of memory. Give the workers more memory "
              "(their memory_limit), or use smaller row chunks.", file=sys.stderr)
        return 1
    _print_report(report, args)
    if report.get("damage"):  # `dkern fsck` found damage: the report says what
        print(f"dkern {args.command}: error: {args.url!r} is damaged (see damage) and nothing "
              "was removed; rewrite what is named from its source, then run it again.",
              file=sys.stderr)
        return 1
    return 0


def _print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
    elif not args.quiet:
        for key, value in report.items():
            print(f"{key:>16}: {json.dumps(value) if isinstance(value, dict | list) else value}")


def _interrupted(args: argparse.Namespace) -> str:
    """The one line printed after a Ctrl-C: what state the written store is in.

    A command that writes a store names the attribute of its flag as the parser
    default ``written_store``."""
    message = f"dkern {args.command}: interrupted"
    store = getattr(args, getattr(args, "written_store", ""), None)
    if store is None:  # demo without --store: its temporary folder was removed
        return message
    message += (f"; writes are published atomically, so {store!r} holds no half-written "
                f"array (`dkern fsck {store} --clean` removes the interrupted write's "
                "leftovers)")
    if getattr(args, "checkpoint", None) is not None:
        message += "; run the same command again to resume from its last checkpoint"
    return message
