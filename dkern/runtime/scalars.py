"""numpy scalars for dkern's pickle-free client, in a serialization family of its own.

A client that accepts only dask/msgpack results (``connect()``'s default) would get a numpy
scalar (a task result such as ``x.sum()``) through msgpack as a plain Python ``float``,
and dask's ``float(array)`` then fails (``'float' object has no attribute 'item'``). That
client lists ``SCALAR_FAMILY`` first among the families it reads, and a worker answers a
request in the families the requesting client lists: a numpy scalar then travels as a 0-d
array's buffer and arrives as the numpy scalar it was. Any other client on the same
cluster (a plain ``distributed.Client`` without dkern) never lists it, so it gets what
distributed sends without dkern. Registering numpy scalars in dask's own family instead
made every plain client fail on them ("No dispatch for <class 'numpy.float64'>").
Registered on import of ``dkern.runtime``: by the client and by the workers' dkern
preload; ``connect()`` also registers it on the scheduler (:func:`register_on_scheduler`)
and installs :class:`ScalarFamilyPlugin` on every worker, present and future: a process
that never imported dkern fails (``KeyError``) on a request naming a family it does not
know, and a scheduler answers a client's requests in the client's families too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from distributed import WorkerPlugin
from distributed.protocol.numpy import deserialize_numpy_ndarray, serialize_numpy_ndarray
from distributed.protocol.serialize import register_serialization_family

#: The serialization family of numpy scalars that dkern's clients ask for.
SCALAR_FAMILY = "dkern-numpy-scalar"


def _dumps(x: Any) -> tuple[dict[str, Any], list[Any]]:
    """A numpy scalar as a 0-d array; anything else goes to the client's next family."""
    if not isinstance(x, np.generic) or x.dtype.hasobject:
        raise NotImplementedError(type(x).__name__)
    return serialize_numpy_ndarray(np.asarray(x))


def _loads(header: dict[str, Any], frames: list[Any]) -> np.generic:
    return deserialize_numpy_ndarray(header, frames)[()]


register_serialization_family(SCALAR_FAMILY, _dumps, _loads)


def register_on_scheduler() -> None:
    """Run by ``client.run_on_scheduler``: unpickling it there imports this module, which
    registers ``SCALAR_FAMILY``; nothing else is needed."""


class ScalarFamilyPlugin(WorkerPlugin):
    """A worker plugin whose unpickling on a worker imports this module, registering
    ``SCALAR_FAMILY`` there (workers that join later receive it too)."""

    name = "dkern-numpy-scalar"
