"""``python -m dkern.runtime``: print the path of dkern's worker settings (for DASK_CONFIG)."""

from .config import WORKER_CONFIG

print(WORKER_CONFIG)  # noqa: T201 - this module's command-line output
