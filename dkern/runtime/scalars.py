"""numpy scalars in dask's own serialization family, so a safe client gets them back as such.

A client that accepts only dask/msgpack results (``connect()``'s default) would otherwise
get a numpy scalar (a task result such as ``x.sum()``) through msgpack, as a plain Python
``float``; dask's ``float(array)`` then fails (``'float' object has no attribute 'item'``).
Sent as a 0-d array instead, it arrives as the numpy scalar it was. Registered on import of
``dkern.runtime``: by the client in ``connect()`` and by the workers' dkern preload.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from distributed.protocol import dask_deserialize, dask_serialize
from distributed.protocol.numpy import deserialize_numpy_ndarray, serialize_numpy_ndarray


@dask_serialize.register(np.generic)
def _serialize_scalar(x: np.generic) -> tuple[dict[str, Any], list[Any]]:
    return serialize_numpy_ndarray(np.asarray(x))


@dask_deserialize.register(np.generic)
def _deserialize_scalar(header: dict[str, Any], frames: list[Any]) -> np.generic:
    return deserialize_numpy_ndarray(header, frames)[()]
