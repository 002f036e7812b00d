"""dkern's worker settings, one YAML file shipped in the package (``worker.yaml``).

``python -m dkern.runtime`` prints its path, for ``DASK_CONFIG`` in the start
scripts of ``cluster/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: The worker settings file: memory fractions, malloc environment, the trimming preload.
WORKER_CONFIG = Path(__file__).with_name("worker.yaml")


def worker_config() -> dict[str, Any]:
    """The settings of ``WORKER_CONFIG`` as dotted keys for ``dask.config.set``.

    Returns
    -------
    dict
        ``{"distributed.worker.memory.pause": 0.8, ...}``: one entry per leaf, so that
        setting them keeps every other default (a nested dict would replace whole
        sections, e.g. distributed's other ``pre-spawn-environ`` entries).
    """
    with open(WORKER_CONFIG) as file:
        return dict(_leaves(yaml.safe_load(file)))


def _leaves(tree: dict[str, Any], prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
