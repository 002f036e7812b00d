"""Fitted models to settle before their Dask client closes.

A fit on dask or Zarr rows leaves its n-sized coefficients persisted on the workers (CG
vectors never cross to the client while it solves), and they vanish with the client that
holds them. Such a model registers here under that client's id
(:func:`settle_before_close`); the client :func:`dkern.connect` returns calls
:func:`settle` as it closes, and each model gathers what it holds into numpy (its
``_bring_home``), so that it outlives the client that fitted it. Models are held weakly:
registering keeps none alive. ``distributed`` is not imported here.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

__all__ = ["settle", "settle_before_close"]

logger = logging.getLogger(__name__)

_models: dict[str, weakref.WeakSet[Any]] = {}
_lock = threading.Lock()


def settle_before_close(client_id: str, model: Any) -> None:
    """Have ``model._bring_home()`` run before the client ``client_id`` closes."""
    with _lock:
        _models.setdefault(client_id, weakref.WeakSet()).add(model)


def settle(client_id: str) -> None:
    """Bring home the arrays of every live model registered under ``client_id``.

    A model that cannot (its arrays are larger than it gathers) is logged at WARNING and
    left as it is: the close goes on, and the model says what to do when next used.
    """
    with _lock:
        models = list(_models.pop(client_id, ()))
    for model in models:
        try:
            model._bring_home(client_id)
        except Exception as err:
            logger.warning("%s keeps arrays on the closing cluster, which loses them: %s",
                           type(model).__name__, err)
