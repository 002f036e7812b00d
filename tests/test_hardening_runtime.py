"""Hangs turned into errors: connect() to a port that is not a scheduler, and work whose
chunks cannot fit beside the memory an idle worker already holds."""

import http.server
import logging
import socket
import struct
import threading
import time

import dask
import distributed
import pytest

from dkern import cli
from dkern.errors import MemoryLimitError
from dkern.io import make_regression_store, open_array
from dkern.io.synthetic import WRITE_FACTOR, WRITE_OVERHEAD
from dkern.kernels import Gaussian
from dkern.models import KernelRidge
from dkern.runtime import NotASchedulerError, connect
from dkern.runtime.resources import PAUSE_FRACTION, scheduler_workers, task_budget

#: How long a test waits for connect() to give up: SILENCE_SECONDS (10 s) and a margin.
CONNECT_BOUND_S = 15.0


def _outcome(call, bound_s: float) -> tuple[BaseException | None, float]:
    """call() in a daemon thread given ``bound_s`` seconds: what it raised, and when.

    A call still running after that fails the test; its thread is left behind, as the hang
    it shows cannot be interrupted."""
    outcome: dict[str, BaseException | None] = {}
    start = time.perf_counter()

    def attempt() -> None:
        try:
            call()
            outcome["error"] = None
        except BaseException as err:  # noqa: BLE001  (the test inspects it)
            outcome["error"] = err

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(bound_s)
    elapsed = time.perf_counter() - start
    assert not thread.is_alive(), f"{call} still running after {elapsed:.0f} s"
    return outcome["error"], elapsed


def _connect_outcome(address: str, **kwargs) -> tuple[BaseException | None, float]:
    """connect(address, **kwargs), given CONNECT_BOUND_S: what it raised, and when."""
    return _outcome(lambda: connect(address, check_versions=False, watch_pauses=False,
                                    **kwargs).close(), CONNECT_BOUND_S)


@pytest.fixture
def http_port():
    """A plain HTTP server on loopback, as a dashboard or web app would be."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_port():
    """A TCP server on loopback that accepts connections and never writes."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:  # closed at teardown
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in accepted:
        conn.close()


def test_connect_to_an_http_server_says_so_within_seconds(http_port, record_figures):
    """Before: connect() to an HTTP port waited past 90 s without a word."""
    address = f"tcp://127.0.0.1:{http_port}"
    error, elapsed = _connect_outcome(address)
    assert isinstance(error, NotASchedulerError) and isinstance(error, ConnectionError)
    assert address in str(error) and "an HTTP server answered (HTTP/1.0 " in str(error)
    assert elapsed < 5.0
    record_figures("connect_not_a_scheduler", http_server_error_s=round(elapsed, 2))


def test_a_websocket_address_of_a_web_server_is_a_connection_error(capsys, tmp_path):
    """ws:// to a plain web server answering 200: the API raised tornado's bare
    WebSocketError without the address, and the CLI printed its traceback. The failed
    client also stayed the process's default client, so every later computation of the
    process waited on it for ever."""
    import functools

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"ws://127.0.0.1:{server.server_address[1]}"
    error, elapsed = _connect_outcome(address)
    assert isinstance(error, ConnectionError), error
    with pytest.raises(ValueError, match="No clients found"):  # the failed one is not kept
        distributed.default_client()
    assert address in str(error) and "WebSocketError: Non-websocket response" in str(error)
    assert elapsed < CONNECT_BOUND_S
    assert cli.main(["make-data", "--scheduler", address, "--n", "10", "--d", "2",
                     "--out", str(tmp_path / "unused.zarr")]) != 0
    server.shutdown()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "could not reach the Dask scheduler" in err


@pytest.mark.parametrize("limit", ["100MB", "150MB", 0.001])
def test_a_memory_limit_a_worker_cannot_start_in_is_refused_at_once(limit):
    """connect(memory_limit='100MB'): the nanny restarted its idle worker over and over
    until connect timed out (120 s); at 150 MB the workers started paused (adversary I).
    Refused before any worker starts, naming the limit and the way out; a fraction of the
    machine's memory counts per worker."""
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"memory_limit=.* gives each worker \d+ MiB, under "
                       r"the 160 MiB a dkern worker needs to start.*memory_limit='256MiB'"):
        connect(n_workers=2, memory_limit=limit)
    assert time.perf_counter() - start < 5


def test_an_error_without_a_message_is_named_by_its_type():
    from dkern.runtime import _reason

    assert _reason(TimeoutError()) == "TimeoutError (no message)"
    assert _reason(ValueError("Maximum allowed dimension exceeded")) == (
        "ValueError: Maximum allowed dimension exceeded")


def test_connect_to_a_silent_tcp_server_is_refused_in_bounded_time(silent_port,
                                                                     record_figures):
    address = f"tcp://127.0.0.1:{silent_port}"
    error, elapsed = _connect_outcome(address)
    assert isinstance(error, NotASchedulerError)
    assert address in str(error) and "sent nothing in 10 s" in str(error)
    record_figures("connect_not_a_scheduler", silent_server_error_s=round(elapsed, 2))


@pytest.fixture(params=["garbage frames", "frame header only"])
def imitating_port(request):
    """A TCP server that sends what opens like a Dask frame (total length, one frame of 100
    bytes), then garbage or nothing: the prelude alone passed the first probe, after which
    distributed's client waited without end."""
    listener = socket.create_server(("127.0.0.1", 0))
    prelude = struct.pack("<QQQ", 16 + 100, 1, 100)
    body = b"\xff" * 100 if request.param == "garbage frames" else b""
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:  # closed at teardown
                return
            accepted.append(conn)
            conn.sendall(prelude + body)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in accepted:
        conn.close()


def test_connect_to_a_server_imitating_the_framing_is_refused(imitating_port):
    address = f"tcp://127.0.0.1:{imitating_port}"
    error, elapsed = _connect_outcome(address)
    assert isinstance(error, NotASchedulerError), error
    assert address in str(error)
    assert elapsed < CONNECT_BOUND_S


def test_connect_to_a_tls_server_on_a_tcp_address_hints_at_tls():
    """A server that closes without a word (as Python's TLS servers do on plain text)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def close_each() -> None:
        while True:
            try:
                conn = listener.accept()[0]
            except OSError:
                return
            conn.recv(1024)
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    try:
        error, _ = _connect_outcome(f"tcp://127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()
    assert isinstance(error, NotASchedulerError) and "tls://" in str(error), error


def test_a_tls_address_without_tls_settings_says_what_to_pass(monkeypatch):
    """distributed's own error was a bare TypeError ("TLS expects a `ssl_context` argument
    ... Instead got None"); now a ValueError names both ways to give the certificates,
    before any connection is tried. With settings from the environment it goes on (and
    fails to connect here, as nothing listens)."""
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"no TLS settings.*security=distributed\.security"
                                         r"\.Security.*DASK_DISTRIBUTED__COMM__TLS__CA_FILE"):
        connect("tls://127.0.0.1:1", timeout=5)
    assert time.monotonic() - start < 2
    with dask.config.set({"distributed.comm.tls.ca-file": "/nowhere/ca.pem",
                          "distributed.comm.tls.client.cert": "/nowhere/client.pem"}):
        with pytest.raises(ConnectionError, match="could not reach"):
            connect("tls://127.0.0.1:1", timeout=2)


def test_connect_to_a_port_out_of_range_fails_at_once():
    """Port 99999 was retried for distributed's whole connect timeout (30 s)."""
    start = time.monotonic()
    with pytest.raises(ValueError, match="port 99999 is not a TCP port"):
        with connect("tcp://127.0.0.1:99999"):
            pass
    assert time.monotonic() - start < 5


def test_connect_to_a_closed_port_retries_for_the_connect_timeout():
    """As distributed does, for a scheduler still starting; then a plain ConnectionError."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    error, elapsed = _connect_outcome(f"tcp://127.0.0.1:{port}", timeout=2)
    assert isinstance(error, ConnectionError) and not isinstance(error, NotASchedulerError)
    assert "could not reach the Dask scheduler" in str(error)
    assert 1.5 < elapsed < 5.0


@pytest.mark.distributed
def test_connect_reaches_a_real_scheduler_and_refuses_its_dashboard(record_figures):
    """The probe lets a scheduler's handshake through; the dashboard's port is named."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, host="127.0.0.1", protocol="tcp",
                      dashboard_address="127.0.0.1:0") as cluster:
        start = time.perf_counter()
        with connect(cluster.scheduler_address, check_versions=False,
                     watch_pauses=False) as client:
            assert client.scheduler.address == cluster.scheduler_address
        record_figures("connect_not_a_scheduler",
                       real_scheduler_connect_s=round(time.perf_counter() - start, 2))
        dashboard = f"tcp://127.0.0.1:{cluster.scheduler.http_server.port}"
        error, elapsed = _connect_outcome(dashboard)
    assert isinstance(error, NotASchedulerError), error
    assert "an HTTP server answered" in str(error) and "8787, serves HTTP" in str(error)
    record_figures("connect_not_a_scheduler", dashboard_error_s=round(elapsed, 2))


def _limited(memory_limit: str | int):
    """connect() to one single-threaded worker process limited to ``memory_limit``."""
    return connect(n_workers=1, memory_limit=memory_limit, silence_logs=logging.CRITICAL)


def _transitions(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


@pytest.mark.distributed
@pytest.mark.slow
def test_work_that_would_pause_the_workers_is_refused_before_submitting(tmp_path,
                                                                      record_figures):
    """The issue's data step (200,000 x 8 in 50,000-row chunks) and a Nystrom KRR fit on it,
    on a worker whose pause threshold lies 16 MiB above what it holds idle (the limit is
    derived from an idle worker measured first; on a machine whose idle worker held 215 MiB,
    the README's 300 MB was such a worker). Before: the pre-check assumed ~150 MB of worker
    process, let both run, and the worker paused for good (a hang)."""
    url = str(tmp_path / "s.zarr")
    with dask.config.set(scheduler="synchronous"):  # the fit's input, written here
        make_regression_store(url, 200_000, 8, chunk_rows=50_000)
    with _limited("1GB"):
        idle = task_budget(scheduler_workers()).used
    with _limited(int((idle + 16 * 2**20) / PAUSE_FRACTION)) as client:
        budget = task_budget(scheduler_workers())
        before = _transitions(client)
        write = lambda: make_regression_store(tmp_path / "w.zarr", 200_000, 8,  # noqa: E731
                                              chunk_rows=50_000)
        error, write_s = _outcome(write, 30)
        assert isinstance(error, MemoryLimitError), error
        assert "MiB already in use by the worker process" in str(error)
        fit = lambda: KernelRidge(Gaussian(3.0), solver="nystrom", n_centers=100,  # noqa: E731
                                  random_state=0).fit((url, "X"), (url, "y"))
        error, fit_s = _outcome(fit, 30)
        assert isinstance(error, MemoryLimitError), error
        assert "Nothing was submitted" in str(error)
        assert _transitions(client) == before, "tasks were submitted before the refusal"
    record_figures("memory_precheck", idle_worker_mib=round(budget.used / 2**20, 1),
                   limit_mb=round(budget.limit / 1e6, 1),
                   task_room_mb=round(budget.budget / 1e6, 1),
                   write_refused_s=round(write_s, 2), fit_refused_s=round(fit_s, 2))


@pytest.mark.distributed
@pytest.mark.slow
def test_default_chunks_are_sized_from_the_workers_measured_room(tmp_path, record_figures):
    """The issue's 1,000,000 x 512 store (410 MB chunks killed a 1 GB worker 4 times) at a
    smaller scale: 12,000 x 512 on one 400 MB worker. Before: the default 100,000 rows made
    it one 49 MB chunk whatever the workers had, twice the rows that fit the worker's
    measured room by dkern's estimate (here it still got through)."""
    url = str(tmp_path / "s.zarr")
    with _limited("400MB") as client:
        budget = task_budget(scheduler_workers())
        workers = set(client.scheduler_info(n_workers=-1)["workers"])
        error, write_s = _outcome(lambda: make_regression_store(url, 12_000, 512), 60)
        assert error is None, error
        rows = open_array(url, "X").chunks[0][0]
        assert rows <= (budget.budget - WRITE_OVERHEAD) // (WRITE_FACTOR * 513 * 8) < 12_000
        info = client.scheduler_info(n_workers=-1)["workers"]
        assert set(info) == workers, "the worker was restarted"
        assert all(w["status"] == "running" for w in info.values())
    record_figures("memory_precheck", limit_400mb_task_room_mb=round(budget.budget / 1e6, 1),
                   d512_default_chunk_rows=int(rows), d512_write_s=round(write_s, 2))


def test_a_computation_whose_scheduler_died_says_so(tmp_path):
    """The scheduler killed while the client is open: the next prediction dkern computes
    (to Zarr) raises SchedulerLostError (distributed's FutureCancelledError chained) once
    the client's reconnect window (here distributed.comm.timeouts.connect = 3 s) has
    passed, and publishes nothing. On the old code: distributed's "cancelled for reason:
    unknown", which says nothing of the cause."""
    import dask.array as da
    import numpy as np
    from _daskproc import Procs
    from distributed.client import FutureCancelledError, FuturesCancelledError

    from dkern.errors import SchedulerLostError

    procs = Procs(tmp_path, {})
    try:
        procs.scheduler("127.0.0.1")
        procs.worker("w0", "127.0.0.1")
        with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):
            client = connect(procs.address())
        try:
            client.wait_for_workers(1, timeout=60)
            X = da.from_array(np.random.default_rng(0).normal(size=(400, 2)), chunks=100)
            model = KernelRidge(Gaussian(1.0), alpha=0.1, backend="numpy").fit(X, X[:, 0])
            procs.procs[0].kill()
            procs.procs[0].wait()
            start = time.monotonic()
            with pytest.raises(SchedulerLostError, match="lost its scheduler") as info:
                model.predict(X, out=(str(tmp_path / "pred.zarr"), "pred"))
            assert time.monotonic() - start < 60
            assert isinstance(info.value.__cause__, (FutureCancelledError, FuturesCancelledError))
        finally:
            client.close(timeout=5)
    finally:
        procs.close()
    assert not (tmp_path / "pred.zarr" / "pred").exists()
