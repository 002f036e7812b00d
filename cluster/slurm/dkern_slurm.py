"""dkern's workers as Slurm jobs: a dask-jobqueue ``SLURMCluster`` with dkern's settings.

Run on a node that can submit jobs (``sbatch``) and that the compute nodes can reach::

    from dkern_slurm import slurm_cluster
    import dkern

    cluster = slurm_cluster(queue="compute", cores=32, memory="120GiB", walltime="02:00:00")
    cluster.scale(jobs=4)                    # 4 nodes, 32 single-threaded workers each
    client = dkern.connect(cluster.scheduler_address)
    print(cluster.job_script())              # what sbatch receives

See README.md beside this file.
"""

from __future__ import annotations

from typing import Any

from dask_jobqueue import SLURMCluster

from dkern.runtime import WORKER_MALLOC_ENV


def worker_environment() -> str:
    """The job script line that gives every worker process dkern's malloc settings.

    A plain ``export MALLOC_TRIM_THRESHOLD_=...`` does not reach the workers: the nanny
    sets its ``distributed.nanny.pre-spawn-environ`` (``MALLOC_TRIM_THRESHOLD_=65536`` by
    default) when it spawns each worker. Nor does
    ``DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON__MALLOC_TRIM_THRESHOLD_``: dask lowercases
    the key and glibc reads only the upper-case name. A dict literal as the value of
    ``..._PRE_SPAWN_ENVIRON`` keeps the names' case and merges with distributed's defaults.
    """
    return f'export DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON="{dict(WORKER_MALLOC_ENV)!r}"'


def slurm_cluster(
    *,
    queue: str,
    cores: int,
    memory: str,
    walltime: str = "01:00:00",
    account: str | None = None,
    local_directory: str = "$TMPDIR",
    interface: str | None = None,
    dashboard_address: str = "127.0.0.1:8787",
    **kwargs: Any,
) -> SLURMCluster:
    """A ``SLURMCluster`` whose every job runs one single-threaded worker per core.

    Parameters
    ----------
    queue : str
        The Slurm partition (``#SBATCH -p``).
    cores : int
        CPUs per job (``#SBATCH --cpus-per-task``); one worker process with one thread per
        core, as dkern's embedded cluster runs (each task's BLAS is single-threaded, the
        parallelism comes from the tasks).
    memory : str
        Memory per job, e.g. ``"120GiB"`` (``#SBATCH --mem``); each worker's
        ``--memory-limit`` is ``memory / cores``. Leave a few GiB of the node for the OS.
    walltime : str, default "01:00:00"
        ``#SBATCH -t``; workers stop with their job, so give long fits room.
    account : str, optional
        ``#SBATCH -A``.
    local_directory : str, default "$TMPDIR"
        Where workers spill: node-local scratch, never the shared file system holding the
        store. Expanded by the job's shell.
    interface : str, optional
        Network interface the scheduler and workers bind to (e.g. ``"ib0"``); default:
        distributed's choice.
    dashboard_address : str, default "127.0.0.1:8787"
        The dashboard has no authentication, so it binds loopback; reach it through an SSH
        tunnel (``ssh -L 8787:localhost:8787 login-node``).
    **kwargs
        Passed to ``SLURMCluster`` (e.g. ``job_extra_directives=["--exclusive"]``,
        ``job_script_prologue`` lines run after dkern's, ``python``).

    Returns
    -------
    dask_jobqueue.SLURMCluster
        Its scheduler runs in this process; ``cluster.scale(jobs=k)`` submits k jobs.
    """
    prologue = [worker_environment(), *kwargs.pop("job_script_prologue", [])]
    kwargs.setdefault("job_name", "dkern-worker")  # what squeue shows
    scheduler_options = {"dashboard_address": dashboard_address,
                         **kwargs.pop("scheduler_options", {})}
    return SLURMCluster(
        queue=queue,
        account=account,
        cores=cores,
        processes=cores,
        memory=memory,
        walltime=walltime,
        local_directory=local_directory,
        interface=interface,
        job_script_prologue=prologue,
        scheduler_options=scheduler_options,
        **kwargs,
    )
