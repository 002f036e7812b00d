"""What connect() checks before dkern sends work: the same versions everywhere, and
results the client may read without unpickling arbitrary objects."""

from __future__ import annotations

import importlib
from typing import Any

from .scalars import SCALAR_FAMILY

#: Packages whose versions must agree on client, scheduler and workers: task functions
#: are pickled by reference to dkern's code, and arrays cross in dask/numpy's formats.
CHECKED_PACKAGES = ("dkern", "dask", "distributed", "numpy")

#: Serialization families a dkern client accepts from the cluster by default: numpy scalars
#: as 0-d buffers (:mod:`.scalars`), dask's own (numpy arrays as raw buffers), msgpack
#: (numbers, strings, lists, dicts) and distributed's "could not serialize" message. Not
#: "pickle": a result that needs it (an arbitrary Python object) is refused instead of
#: unpickled on the client.
SAFE_DESERIALIZERS = [SCALAR_FAMILY, "dask", "msgpack", "error"]


class ClusterVersionError(RuntimeError):
    """Client, scheduler and workers run different versions of a package dkern needs."""


def package_versions(packages: tuple[str, ...] = CHECKED_PACKAGES) -> dict[str, str | None]:
    """``{package: __version__}`` of the modules this process imports (None: not installed).

    Run on scheduler and workers by ``check_versions``: the code that actually runs there,
    which an installed distribution's metadata need not describe (``pip install -e``,
    ``PYTHONPATH``).
    """
    versions: dict[str, str | None] = {}
    for package in packages:
        try:
            versions[package] = str(importlib.import_module(package).__version__)
        except ImportError:
            versions[package] = None
    return versions


def version_mismatches(versions: dict[str, dict[str, str | None]]) -> list[str]:
    """One line per process and package whose version differs from the client's.

    Parameters
    ----------
    versions : dict
        ``{"client": package_versions(), "scheduler": ..., "worker ADDRESS": ...}``.
    """
    mine = versions["client"]
    return [f"{package}: client {version}, {name} {theirs.get(package)}"
            for name, theirs in versions.items() if name != "client"
            for package, version in mine.items() if theirs.get(package) != version]


def check_versions(client: Any) -> None:
    """Raise ``ClusterVersionError`` naming every package and version that differ.

    Each worker and the scheduler import dkern, dask, distributed and numpy and report
    their ``__version__`` (``client.run``).
    """
    try:
        versions = {"client": package_versions(),
                    "scheduler": client.run_on_scheduler(package_versions),
                    **{f"worker {address}": v
                       for address, v in client.run(package_versions).items()}}
    except Exception as err:  # dkern missing there: its function cannot be unpickled
        raise ClusterVersionError(
            f"could not read package versions on the Dask cluster ({type(err).__name__}: "
            f"{err}); is dkern installed on the scheduler and every worker?") from err
    problems = version_mismatches(versions)
    if problems:
        raise ClusterVersionError(
            "the Dask cluster runs other versions than this client of packages dkern needs "
            "to agree: " + "; ".join(problems) + ". Install the same versions on every node "
            "(one environment for client, scheduler and workers), or pass "
            "check_versions=False to dkern.connect to go on at your own risk.")
