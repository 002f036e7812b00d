"""Is a Dask scheduler listening at an address? A bounded check before distributed connects.

distributed's ``Client(address)`` waits without end when the port is served by something
else: an HTTP server (the dashboard, a web app) or a TCP server that accepts and says
nothing. ``Client(timeout=...)`` does not bound that wait (distributed 2026.8). A Dask
scheduler speaks first: within milliseconds of accepting a ``tcp://`` connection it sends
its handshake, a framed msgpack message. :func:`probe_scheduler` waits for those bytes and,
if none come, asks in HTTP who is there, so the error can say what answered.
"""

from __future__ import annotations

import socket
import struct
import time

from distributed.comm.addressing import parse_address, parse_host_port
from distributed.protocol import loads
from distributed.protocol.utils import unpack_frames

__all__ = ["QUIET_SECONDS", "SILENCE_SECONDS", "NotASchedulerError", "probe_scheduler"]

#: How long to wait for the handshake a Dask scheduler sends unasked before sending an HTTP
#: request in its place: a scheduler sends it within milliseconds; an HTTP server answers
#: only a request.
QUIET_SECONDS = 2.0
#: How long, in all, a port that accepted may stay silent before it is refused: a scheduler
#: busy for this long could not serve the client's requests either.
SILENCE_SECONDS = 10.0
#: Pause between attempts to connect to a port that refuses.
_RETRY_SECONDS = 0.2
#: Bytes read of an answer, to recognise it and quote it.
_ANSWER_BYTES = 4096
#: The request sent to a silent port: any HTTP server answers it with a status line.
_HTTP_REQUEST = b"HEAD / HTTP/1.0\r\nUser-Agent: dkern-probe\r\n\r\n"


class NotASchedulerError(ConnectionError):
    """Something other than a Dask scheduler listens at the address given to connect()."""


def probe_scheduler(address: str, connect_timeout: float) -> None:
    """Raise :class:`NotASchedulerError` unless a Dask scheduler answers at ``address``.

    Only ``tcp://`` addresses are probed; for the others (``tls://``, whose server waits
    for the client's TLS hello) this returns at once.

    Parameters
    ----------
    address : str
        ``tcp://host:port``.
    connect_timeout : float
        Seconds to wait for the TCP connection itself.

    Raises
    ------
    ConnectionError
        Nothing accepts connections at the address (refused, unreachable, timed out).
    NotASchedulerError
        Something accepted but is not a Dask scheduler: the message says what answered
        (an HTTP server and its status line, other bytes, or silence for
        ``SILENCE_SECONDS``). Raised within ``connect_timeout + SILENCE_SECONDS``.
    """
    scheme, location = parse_address(address)
    if scheme != "tcp":
        return
    host, port = parse_host_port(location, default_port=8786)
    if not 0 < port < 65536:  # distributed would retry it until its timeout
        raise ValueError(f"{address!r}: port {port} is not a TCP port (1 to 65535). Check "
                         "the address (a scheduler's default port is 8786).")
    with _open(host, port, connect_timeout) as sock:
        answer = _answer(sock)
        if _is_dask_handshake(sock, answer):
            return
    raise NotASchedulerError(f"{address!r} is not a Dask scheduler: {_describe(answer)}. "
                             f"Check the address and port (a scheduler's default port is "
                             f"8786; the dashboard's, 8787, serves HTTP).")


def _open(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``(host, port)``, retried while refused until ``timeout``, as
    distributed does: a script may start the scheduler and its client together."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port),
                                            timeout=max(0.1, deadline - time.monotonic()))
        except ConnectionRefusedError:
            if time.monotonic() + _RETRY_SECONDS >= deadline:
                raise
            time.sleep(_RETRY_SECONDS)


def _answer(sock: socket.socket) -> bytes | None:
    """The first bytes the peer sends: unasked within ``QUIET_SECONDS``, else in answer to
    an HTTP request until ``SILENCE_SECONDS`` in all. ``b""``: it closed the connection;
    None: it stayed silent."""
    deadline = time.monotonic() + SILENCE_SECONDS
    answer = _read(sock, QUIET_SECONDS)
    if answer is not None:
        return answer
    try:
        sock.sendall(_HTTP_REQUEST)
    except OSError:  # reset by the peer
        return b""
    return _read(sock, max(0.0, deadline - time.monotonic()))


def _read(sock: socket.socket, seconds: float) -> bytes | None:
    """Up to ``_ANSWER_BYTES`` from one ``recv`` within ``seconds``: ``b""`` once the peer
    closed, None if nothing came in time."""
    sock.settimeout(seconds)
    try:
        return sock.recv(_ANSWER_BYTES)
    except TimeoutError:
        return None
    except OSError:  # reset by the peer
        return b""


def _is_dask_handshake(sock: socket.socket, answer: bytes | None) -> bool:
    """Whether the peer sent a whole Dask handshake: distributed's framing (the total
    length, the number of frames and their lengths, little-endian uint64) around a msgpack
    message naming the peer's pickle protocol. Read within ``SILENCE_SECONDS``, at most
    1 MiB, decoded without deserialising any object: a server that only imitates the
    framing is refused here, where distributed's client would wait for it without end."""
    if answer is None or len(answer) < 16:
        return False
    total, n_frames = struct.unpack_from("<QQ", answer)
    if not (1 <= n_frames <= 64 and 8 * (n_frames + 1) <= total <= 2**20):
        return False
    deadline, data = time.monotonic() + SILENCE_SECONDS, answer
    while len(data) < 8 + total:
        more = _read(sock, max(0.0, deadline - time.monotonic()))
        if not more:
            return False
        data += more
    try:
        message = loads(unpack_frames(data[8:8 + total]), deserialize=False)
    except Exception:  # whatever the bytes, they are not a handshake
        return False
    return isinstance(message, dict) and "pickle-protocol" in message


def _describe(answer: bytes | None) -> str:
    """What answered, for the error message."""
    if answer == b"":
        return ("it accepted the connection and closed it without a word (as a TLS server "
                "does when spoken to in plain text: a TLS scheduler's address starts with "
                "tls://)")
    if answer is None:
        return (f"it accepted the connection but sent nothing in {SILENCE_SECONDS:.0f} s, "
                f"not even in answer to an HTTP request")
    if answer.startswith(b"HTTP/"):
        head = answer.decode("latin-1").split("\r\n")
        server = next((line for line in head if line.lower().startswith("server:")), "")
        return f"an HTTP server answered ({head[0]}{'; ' + server if server else ''})"
    if answer[:2] == b"\x15\x03":  # a TLS alert record, the answer to a plain-text request
        return "a TLS server answered; a TLS scheduler's address starts with tls://"
    return (f"it answered {answer[:40]!r}, which is not (or not all of) a Dask scheduler's "
            "handshake")
