"""``dkern info``: versions, the GPUs (name, memory, driver, CUDA), the backends (with a
real KeOps compile check, and Triton's), whether KeOps sees a GPU, and which path the
numpy backend's Gaussian products take (the fused C loop, or BLAS tiles and why)."""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

import numpy as np

from .. import __version__


def add_parser(sub: Any, common: argparse.ArgumentParser,
               cluster: argparse.ArgumentParser) -> None:
    sub.add_parser("info", parents=[common], help="versions, backends (with a real KeOps "
                   "compile check) and whether a GPU is visible").set_defaults(run=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import dask
    import distributed
    import psutil
    import zarr

    from ..backends import backend_statuses, fused_cpu, gpu_visible
    from ..runtime.gpus import gpu_facts

    return {
        "dkern": __version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "packages": {"numpy": np.__version__, "dask": dask.__version__,
                     "distributed": distributed.__version__, "zarr": zarr.__version__},
        "gpus": gpu_facts(),
        "gpu_visible": gpu_visible(),
        "backends": {s.name: {"available": s.available, "detail": s.detail}
                     for s in backend_statuses()},
        "fused_cpu": fused_cpu.status(),
        "scheduler": os.environ.get("DKERN_SCHEDULER_ADDRESS") or "embedded LocalCluster",
    }
