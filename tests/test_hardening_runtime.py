"""Hangs turned into errors: connect() to a port that is not a scheduler, and work whose
chunks cannot fit beside the memory an idle worker already holds."""

import http.server
import socket
import threading
import time

import pytest

from dkern.runtime import NotASchedulerError, connect

#: How long a test waits for connect() to give up: SILENCE_SECONDS (10 s) and a margin.
CONNECT_BOUND_S = 15.0


def _connect_outcome(address: str, **kwargs) -> tuple[BaseException | None, float]:
    """connect(address, **kwargs) in a thread given CONNECT_BOUND_S: what it raised, when.

    A connect() still waiting after that fails the test; its thread is left behind, as the
    hang it shows cannot be interrupted."""
    outcome: dict[str, BaseException | None] = {}
    start = time.perf_counter()

    def attempt() -> None:
        try:
            connect(address, check_versions=False, watch_pauses=False, **kwargs).close()
            outcome["error"] = None
        except BaseException as err:  # noqa: BLE001  (the test inspects it)
            outcome["error"] = err

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(CONNECT_BOUND_S)
    elapsed = time.perf_counter() - start
    assert not thread.is_alive(), f"connect({address!r}) still waiting after {elapsed:.0f} s"
    return outcome["error"], elapsed


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


def test_connect_to_a_silent_tcp_server_is_refused_in_bounded_time(silent_port,
                                                                     record_figures):
    address = f"tcp://127.0.0.1:{silent_port}"
    error, elapsed = _connect_outcome(address)
    assert isinstance(error, NotASchedulerError)
    assert address in str(error) and "sent nothing in 10 s" in str(error)
    record_figures("connect_not_a_scheduler", silent_server_error_s=round(elapsed, 2))


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
