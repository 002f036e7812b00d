"""Where the work runs: an embedded LocalCluster by default, any Dask scheduler otherwise.

Worker settings live in one file, ``dkern/runtime/worker.yaml`` (``WORKER_CONFIG``): the
embedded cluster reads it here, the scripts of ``cluster/`` through ``DASK_CONFIG``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import dask
from dask.utils import parse_timedelta
from distributed import Client, LocalCluster
from distributed.security import Security
from distributed.worker_memory import parse_memory_limit
from tornado.websocket import WebSocketError

from .._closing import settle
from . import checks, scalars  # noqa: F401  (scalars: registers numpy scalars' serialization)
from .checks import SAFE_DESERIALIZERS, ClusterVersionError
from .config import WORKER_CONFIG, worker_config
from .forkserver import (
    METHOD_KEY,
    ForkserverNanny,
    start_preloaded_forkserver,
    user_start_method,
    worker_start_method,
)
from .gpus import GpuLocalCluster, gpu_ids
from .probe import NotASchedulerError, probe_scheduler
from .resources import PAUSE_FRACTION
from .watch import PauseWatch, WorkersPausedWarning

__all__ = ["NO_WORKERS_TIMEOUT", "SCHEDULER_ENV", "WORKER_CONFIG", "WORKER_MALLOC_ENV",
           "ClusterVersionError", "NotASchedulerError", "WorkersPausedWarning", "connect"]

logger = logging.getLogger(__name__)

#: Environment variable naming a scheduler to connect to when no address is given.
SCHEDULER_ENV = "DKERN_SCHEDULER_ADDRESS"

#: The glibc settings ``WORKER_CONFIG`` gives worker processes (why: in that file).
WORKER_MALLOC_ENV = {key.rsplit(".", 1)[1]: str(value) for key, value in worker_config().items()
                     if key.startswith("distributed.nanny.pre-spawn-environ.MALLOC_")}

_NO_WORKERS_KEY = "distributed.scheduler.no-workers-timeout"
#: How long tasks wait with no worker running before they fail, on the embedded cluster and
#: on a scheduler started by cluster/start-scheduler.sh (both read ``WORKER_CONFIG``).
#: Workers start before ``connect`` returns and a nanny restarts a worker killed for memory
#: within seconds, so minutes without any mean none will come back; without it the client
#: waits for ever (distributed's default). Workers paused for memory count as not running
#: (distributed's rule): long enough for a pause that spilling or freeing ends, and such a
#: job has been warned of (``WorkersPausedWarning``). In the embedded cluster a value in
#: dask's config wins.
NO_WORKERS_TIMEOUT = worker_config()[_NO_WORKERS_KEY]
_SCHEMES = ("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")


def connect(address: str | None = None, *, check_versions: bool = True,
            trusted_results: bool = False, watch_pauses: bool = True,
            gpus: bool | int | Sequence[int] | None = None, **kwargs: Any) -> Client:
    """A ``distributed.Client`` for dkern's work.

    Parameters
    ----------
    address : str, optional
        A scheduler address (``tcp://host:8786``, ``tls://…``). Without one,
        ``$DKERN_SCHEDULER_ADDRESS`` is used if set, else an embedded
        ``LocalCluster`` starts: one single-threaded worker process per core by default
        (each worker's BLAS uses one core), with the settings of ``WORKER_CONFIG``, the
        scheduler, workers and dashboard listening on 127.0.0.1 only. Its tasks fail with
        a ``WorkerFailureError`` after ``NO_WORKERS_TIMEOUT`` with no worker running
        (``distributed.scheduler.no-workers-timeout``, unless dask's config sets it)
        rather than wait for ever.
    check_versions : bool, default True
        Refuse (``ClusterVersionError``) a cluster whose scheduler or workers run other
        versions of dkern, dask, distributed or numpy than this process.
    trusted_results : bool, default False
        False: the client reads results only in dask's array format, msgpack (numbers,
        strings, lists, dicts) or distributed's error message, and refuses a result that
        would need unpickling (an arbitrary Python object). True: distributed's default,
        which unpickles whatever the cluster sends; only for a cluster you trust.
    watch_pauses : bool, default True
        Warn (logging WARNING and a ``WorkersPausedWarning``) within about two seconds
        when workers pause for memory, naming them, their memory and their limit.
    gpus : True, int or sequence of int, optional
        The embedded cluster gets one worker per GPU instead of one per core, each seeing
        only its own GPU (``CUDA_VISIBLE_DEVICES``) with 2 threads
        (:class:`~dkern.runtime.gpus.GpuLocalCluster`): ``True`` for every GPU
        ``nvidia-smi`` lists, a number for GPUs 0 … n-1, or the indices. A remote
        cluster's GPU workers are started by ``cluster/start-workers.sh``.
    **kwargs
        Passed to ``LocalCluster`` (e.g. ``n_workers``, ``memory_limit``) for the
        embedded cluster, or to ``Client`` for a remote scheduler.

    Returns
    -------
    DkernClient
        A ``distributed.Client`` that, as it closes, gathers into each model fitted under it
        the arrays the model keeps on the cluster, so the model outlives it. Its dashboard
        link is logged at INFO level.

    Raises
    ------
    ValueError
        ``address`` is not a scheduler address; or an embedded cluster's ``memory_limit``
        gives a worker less than ``MIN_WORKER_MEMORY``, in which an idle worker
        cannot run (checked before any worker starts).
    ConnectionError
        No scheduler answers at ``address`` (within distributed's connect timeout).
        ``NotASchedulerError``, a ``ConnectionError``: something else listens there (an
        HTTP server such as the dashboard, a silent TCP server); the message says what
        answered. Raised within the connect timeout plus ``probe.SILENCE_SECONDS`` (10 s),
        about 2 s for an HTTP server.
    ClusterVersionError
        With ``check_versions``: the versions differ; or the scheduler cannot import
        dkern (the client is closed).
    """
    address = address or os.environ.get(SCHEDULER_ENV) or None
    deserializers = None if trusted_results else SAFE_DESERIALIZERS
    if gpus is not None and address is not None:
        raise ValueError(f"gpus= starts the embedded cluster's workers, but connect() was given "
                         f"the scheduler {address}; start that cluster's GPU workers with "
                         "cluster/start-workers.sh (one per GPU), and leave gpus out here.")
    client = _embedded(deserializers, kwargs, gpus) if address is None else \
        _remote(address, deserializers, kwargs)
    try:
        if check_versions:
            checks.check_versions(client)
        _register_scalar_family(client)
    except Exception:
        client.close()  # and the cluster it started, if any
        raise
    if watch_pauses:
        PauseWatch(client).start()  # its thread ends when the client closes
    logger.info("dkern connected to %s; dashboard: %s", client.scheduler.address,
                client.dashboard_link)
    return client


class DkernClient(Client):
    """distributed's ``Client``, which lets the models fitted on its cluster gather their
    arrays before it closes (:mod:`dkern._closing`): they outlive it.

    Only an explicit close of a running synchronous client settles them (``with``, or
    ``close()``): not a close at interpreter exit, nor one of a client that lost its
    scheduler.

    Closing it also closes the embedded cluster connect() started for it: distributed
    closes only a cluster its ``Client`` created itself, so ``with dkern.connect():``
    would leave the scheduler and worker processes running until the interpreter exits
    (one more cluster for each such cell of a notebook).
    """

    #: Read by the models (``DeclaredState._settle_at_close``).
    settles_models = True
    #: The cluster connect() started for this client (None for a remote scheduler).
    started_cluster: Any = None

    def start(self, **kwargs: Any) -> None:
        """distributed's start; a client that fails to connect closes itself. distributed
        makes a client the process's default before it connects and leaves a failed one
        so: every later dask computation of the process then waited on it for ever
        (ws:// to a web server, tls:// to a plain port)."""
        try:
            super().start(**kwargs)
        except BaseException:
            with contextlib.suppress(Exception):
                self.close(timeout=5)
            raise

    def close(self, *args: Any, **kwargs: Any) -> Any:
        if self.status == "running" and not self.asynchronous and not sys.is_finalizing():
            settle(self.id)
        closed = super().close(*args, **kwargs)
        cluster, self.started_cluster = self.started_cluster, None
        if cluster is not None and not sys.is_finalizing():
            cluster.close()
        return closed


def _register_scalar_family(client: Client) -> None:
    """Teach the scheduler and every worker, present and future, the numpy-scalar family
    the safe client asks for (:mod:`.scalars`); dkern must be importable there (a worker
    joining later without dkern fails to start: the plugin cannot be unpickled there)."""
    if scalars.SCALAR_FAMILY not in (client._deserializers or ()):
        return  # trusted_results: the client reads pickle, numpy scalars included
    try:
        client.run_on_scheduler(scalars.register_on_scheduler)
        client.register_plugin(scalars.ScalarFamilyPlugin())
    except ModuleNotFoundError as error:
        with contextlib.suppress(Exception):  # leave no plugin behind on the cluster
            client.unregister_worker_plugin(scalars.ScalarFamilyPlugin.name)
        raise checks.ClusterVersionError(
            f"the cluster at {client.scheduler.address} cannot import dkern ({error}); "
            "install the same dkern on the scheduler and workers as on this client") from error


#: The least memory_limit an embedded worker may get. An idle dkern worker process (Python,
#: numpy, scipy, dask, distributed, dkern) takes about 150 MB: at a 100 MB limit its nanny
#: restarted it over and over until connect timed out, and at 150 MB it started paused
#: (adversary I). Limits a little above this are left alone, so that tests (and users) can
#: give a worker only a few MiB of room beyond what it holds idle.
MIN_WORKER_MEMORY = 160 * 2**20


def _check_memory_limit(kwargs: dict[str, Any]) -> None:
    """Refuse a ``memory_limit`` per worker under ``MIN_WORKER_MEMORY`` before any worker
    starts; "auto", None and 0 (no limit) are distributed's to size."""
    if kwargs.get("memory_limit") in (None, "auto"):
        return
    threads = int(kwargs.get("threads_per_worker") or 1)
    cores = threads * int(kwargs.get("n_workers") or 1)
    limit = parse_memory_limit(kwargs["memory_limit"], threads, cores, logger=logger)
    if limit is not None and limit < MIN_WORKER_MEMORY:
        raise ValueError(
            f"memory_limit={kwargs['memory_limit']!r} gives each worker {limit / 2**20:.0f} MiB, "
            f"under the {MIN_WORKER_MEMORY / 2**20:.0f} MiB a dkern worker needs to start: an "
            f"idle one takes about 150 MB, and workers pause at {PAUSE_FRACTION:.0%} of their "
            "limit. Give each worker at least memory_limit='256MiB' to leave it room for "
            "tasks, or fewer workers with more memory each.")


def _embedded(deserializers: list[str] | None, kwargs: dict[str, Any],
              gpus: bool | int | Sequence[int] | None = None) -> Client:
    """A LocalCluster with dkern's worker settings, on loopback, and its client: one
    worker per core, or per GPU."""
    devices = None if gpus is None else gpu_ids(gpus)
    if devices is not None and "n_workers" in kwargs:
        raise ValueError(f"connect() got gpus={gpus!r} and n_workers={kwargs['n_workers']}: "
                         "with gpus there is one worker per GPU; give one of the two.")
    if devices is None:
        kwargs.setdefault("n_workers", os.cpu_count() or 1)
        kwargs.setdefault("threads_per_worker", 1)
    _check_memory_limit(kwargs)
    # Loopback only: a scheduler runs any code its clients send, and the dashboard has no
    # authentication; neither should be reachable from the network by default. Threads only
    # (processes=False) talk in-process, where a host is refused.
    if kwargs.get("processes", True):
        kwargs.setdefault("host", "127.0.0.1")
    kwargs.setdefault("dashboard_address", "127.0.0.1:0")
    # Read by each nanny when it is created (and reused if it restarts its worker).
    settings = worker_config()
    if dask.config.get(_NO_WORKERS_KEY, None) is not None:  # the user's
        settings[_NO_WORKERS_KEY] = dask.config.get(_NO_WORKERS_KEY)
    settings[METHOD_KEY] = worker_start_method(user_start_method() or settings[METHOD_KEY])
    with dask.config.set(settings), _spawn_environ(settings):
        if settings[METHOD_KEY] == "forkserver" and kwargs.get("processes", True):
            kwargs["env"] = {**start_preloaded_forkserver(), **(kwargs.get("env") or {})}
            kwargs.setdefault("worker_class", ForkserverNanny)
        cluster = LocalCluster(**kwargs) if devices is None else \
            GpuLocalCluster(devices, **kwargs)
        try:
            client = DkernClient(cluster, deserializers=deserializers)
            client.started_cluster = cluster
            if devices is not None:
                # GpuLocalCluster's workers start after it returns: waiting for them here,
                # with the settings in force, is what gives them dkern's worker settings
                # (preload, memory fractions), which a worker reads when it starts
                client.wait_for_workers(len(devices))
                logger.info("embedded cluster: one worker per GPU (%s)",
                            ", ".join(map(str, devices)))
            return client
        except Exception:
            cluster.close()
            raise


@contextlib.contextmanager
def _spawn_environ(settings: dict[str, Any]) -> Iterator[None]:
    """Put the settings' ``pre-spawn-environ`` values in ``os.environ`` while nannies start.

    distributed's nanny prefers a variable already in ``os.environ`` to its config, and
    writes its pre-spawn values into the parent's ``os.environ`` for good: after any plain
    LocalCluster in this process, the config alone would leave dkern's workers with
    distributed's 64 KiB trim threshold (slow tiles). The previous values come back after.
    """
    prefix = "distributed.nanny.pre-spawn-environ."
    wanted = {k[len(prefix):]: str(v) for k, v in settings.items() if k.startswith(prefix)}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _remote(address: str, deserializers: list[str] | None, kwargs: dict[str, Any]) -> Client:
    """A client of the scheduler at ``address``."""
    if not address.startswith(_SCHEMES):
        raise ValueError(f"address must be a Dask scheduler address such as "
                         f"'tcp://host:8786'; got {address!r}.")
    if address.startswith("tls://"):
        _check_tls_settings(address, kwargs)
    kwargs.setdefault("deserializers", deserializers)
    try:
        # distributed waits without end on a port that is not a scheduler's (probe.py)
        probe_scheduler(address, _connect_timeout(kwargs))
    except NotASchedulerError:
        raise
    except OSError as err:
        raise _unreachable(address, err) from err
    try:
        return DkernClient(address, **kwargs)
    except (OSError, ValueError, WebSocketError) as err:
        # OSError: refused, timed out, closed (distributed's CommClosedError); ValueError:
        # bytes that are not Dask's messages; WebSocketError: ws:// to a plain web server
        raise _unreachable(address, err) from err


def _unreachable(address: str, err: BaseException) -> ConnectionError:
    return ConnectionError(
        f"could not reach the Dask scheduler at {address!r}: {_reason(err)}. Start it (see "
        f"cluster/README.md) or check the address; with no address (and ${SCHEDULER_ENV} "
        "unset) dkern starts an embedded LocalCluster.")


def _reason(err: BaseException) -> str:
    """What went wrong, by its type and message (some of distributed's have no message)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else f"{type(err).__name__} (no message)"


def _check_tls_settings(address: str, kwargs: dict[str, Any]) -> None:
    """Refuse a ``tls://`` address with no client certificate to present: distributed
    would fail later with a bare "TLS expects a `ssl_context`" TypeError."""
    security = kwargs.get("security")
    if security is None:
        security = Security()  # what distributed's Client takes from the Dask config
    if getattr(security, "tls_client_cert", None) and getattr(security, "tls_ca_file", None):
        return
    raise ValueError(
        f"{address} is a TLS scheduler, but this client has no TLS settings (a CA file and "
        "a client certificate): pass security=distributed.security.Security(tls_ca_file=..., "
        "tls_client_cert=..., tls_client_key=..., require_encryption=True) to "
        "dkern.connect, or export DASK_DISTRIBUTED__COMM__TLS__CA_FILE, "
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and ..._CLIENT__KEY (cluster/README.md)."
    )


def _connect_timeout(kwargs: dict[str, Any]) -> float:
    """Seconds ``Client(address, **kwargs)`` allows to connect: its ``timeout``, else
    distributed's ``comm.timeouts.connect``."""
    timeout = kwargs.get("timeout") or dask.config.get("distributed.comm.timeouts.connect")
    return float(parse_timedelta(timeout, default="seconds"))
