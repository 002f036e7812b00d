"""The ``dkern`` command: ``info``, ``make-data``, ``fit``, ``predict``, ``plan``, ``demo``, ...

The command line is the one place that writes to the terminal; the library
itself only logs. ``--json`` prints one JSON object for scripts, ``--quiet``
prints nothing but errors. Exit codes: 0 done, 1 a failure dkern diagnosed
(the message says what to change), 2 bad command-line usage.

``plan`` runs nothing: it predicts a ``fit``'s or ``predict``'s time and per-worker
memory from this machine's calibrated rates (:mod:`dkern.planner`).

One module per subcommand (``store`` holds ``store`` and ``fsck``): each adds its
own subparser (``add_parser``) and runs it (``run``, returning the report).
:mod:`._common` holds what they share: options, the cluster, how a run ends.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Sequence

from .. import __version__
from . import demo, fit, info, make_data, plan, predict, store
from ._common import DefaultsHelp, parent_parsers, run_command

__all__ = ["main"]

#: The subcommand modules, in the order ``dkern --help`` lists them.
_SUBCOMMANDS = (info, make_data, fit, predict, plan, demo, store)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dkern", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dkern {__version__}")
    common, cluster = parent_parsers()
    sub = parser.add_subparsers(dest="command", required=True,
                                parser_class=functools.partial(
                                    argparse.ArgumentParser, formatter_class=DefaultsHelp))
    for module in _SUBCOMMANDS:
        module.add_parser(sub, common, cluster)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dkern`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return run_command(args)
