"""One worker per GPU for the embedded cluster, each seeing only its own device.

As ``cluster/start-workers.sh`` does on a GPU node (and dask-cuda's LocalCUDACluster):
every worker process gets ``CUDA_VISIBLE_DEVICES`` set to one GPU by its nanny before it
starts, so KeOps, Triton and torch in that process use that GPU as device 0, and the
tasks dask sends there run on it. A worker that restarts keeps its GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from numbers import Integral
from typing import Any

from distributed import LocalCluster

#: Threads per GPU worker: one task computes on the GPU while another moves its operands
#: (cluster/start-workers.sh uses the same).
GPU_WORKER_THREADS = 2


def blas_threads(n_gpus: int) -> int:
    """BLAS threads of each of n_gpus GPU workers: its share of the host's cores.

    The CPU workers' one BLAS thread each (worker.yaml) would leave a GPU host's cores idle
    in the CPU work around the GPU's kernel sums (the sparse GP's triangular solves and
    products per test row: on an H200 host its prediction took 47.7 s on the GPU worker
    against 6.8 s on 16 CPU workers, benchmarks/RESULTS.md).
    """
    return max(1, (os.cpu_count() or 1) // n_gpus)


def visible_gpus() -> int:
    """How many CUDA GPUs ``nvidia-smi -L`` lists here (0 without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def gpu_facts() -> list[dict[str, str]]:
    """Each CUDA GPU ``nvidia-smi`` reports: name, memory, driver and the CUDA version the
    driver supports (empty without nvidia-smi or a GPU)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        rows = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True,
                                timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    facts = []
    for row in rows.strip().splitlines():
        name, memory, driver = (part.strip() for part in row.split(",", 2))
        facts.append({"name": name, "memory": memory, "driver": driver,
                      "cuda": cuda.group(1) if cuda else "?"})
    return facts


def gpu_ids(gpus: bool | int | Sequence[int]) -> list[int]:
    """The GPU indices ``gpus`` asks for: ``True`` every GPU here, an int that many (from
    0), or the indices themselves.

    Raises ValueError naming ``gpus`` when it asks for none, repeats one, or is not a
    bool, an int or a sequence of non-negative ints; and when ``True`` finds no GPU.
    """
    if gpus is True:
        count = visible_gpus()
        if count == 0:
            raise ValueError("gpus=True asks for one worker per GPU, but nvidia-smi lists no "
                             "CUDA GPU here; leave gpus out for CPU workers.")
        return list(range(count))
    if isinstance(gpus, Integral) and not isinstance(gpus, bool):
        if gpus < 1:
            raise ValueError(f"gpus must be at least 1 (one worker per GPU); got {gpus}.")
        return list(range(int(gpus)))
    if isinstance(gpus, Sequence) and not isinstance(gpus, str) and gpus and all(
            isinstance(g, Integral) and not isinstance(g, bool) and g >= 0 for g in gpus):
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"gpus lists a GPU twice: {list(gpus)}; one worker per GPU.")
        return [int(g) for g in gpus]
    raise ValueError(f"gpus must be True (every GPU), a number of GPUs, or a list of GPU "
                     f"indices such as [0, 1]; got {gpus!r}.")


class GpuLocalCluster(LocalCluster):
    """A ``LocalCluster`` with one worker process per GPU, named ``gpu<i>``, whose nanny
    sets ``CUDA_VISIBLE_DEVICES=<i>`` before the worker starts, and ``DKERN_BLAS_THREADS``
    to its share of the cores (:func:`blas_threads`, applied by dkern's worker preload).

    Parameters
    ----------
    gpus : list of int
        The GPU indices, one worker each.
    **kwargs
        Passed to ``LocalCluster`` (not ``n_workers``: the GPUs decide it).
    """

    def __init__(self, gpus: list[int], **kwargs: Any) -> None:
        self._gpus = [str(g) for g in gpus]
        kwargs.setdefault("threads_per_worker", GPU_WORKER_THREADS)
        super().__init__(n_workers=0, **kwargs)
        self.scale(len(self._gpus))  # through new_worker_spec: one GPU per worker

    def new_worker_spec(self) -> dict[str, dict[str, Any]]:
        """The next worker: the first GPU no worker has, seen through CUDA_VISIBLE_DEVICES."""
        [(_, spec)] = super().new_worker_spec().items()
        taken = {s["options"].get("env", {}).get("CUDA_VISIBLE_DEVICES")
                 for s in self.worker_spec.values()}
        free = [g for g in self._gpus if g not in taken]
        if not free:
            raise ValueError(f"every GPU of this cluster ({', '.join(self._gpus)}) has its "
                             "worker; one worker per GPU.")
        device = free[0]
        env = {**spec["options"].get("env", {}), "CUDA_VISIBLE_DEVICES": device,
               "DKERN_BLAS_THREADS": str(blas_threads(len(self._gpus)))}
        options = {**spec["options"], "name": f"gpu{device}", "env": env}
        return {f"gpu{device}": {**spec, "options": options}}
