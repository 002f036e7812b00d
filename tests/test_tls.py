"""Issue 11, behaviour 7: a cluster on tls:// that refuses whoever lacks a certificate of its CA.

A scheduler and a worker run as separate processes (``dask scheduler`` / ``dask worker``
with ``--tls-*`` options and ``distributed.comm.require-encryption: True``), their
certificates made by ``cluster/make-certs.sh``. A client without a certificate, with one
from another CA, or speaking tcp:// is refused, and no task of theirs runs; one holding the
cluster's client certificate gets through. (The fit with the right certificate, equal to a
LocalCluster's, is tests/test_multihost.py, which runs on tls:// across namespaces.)
The embedded LocalCluster listens on loopback only.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
import stat
import subprocess
import time
from pathlib import Path

import pytest
from _daskproc import MAKE_CERTS, Procs, client_security, make_certs, tls_args

import dkern

logger = logging.getLogger(__name__)

#: The cluster processes' Dask config (the test's clients keep the defaults, as an outsider's).
CONFIG = {"distributed": {"comm": {"require-encryption": True,
                                   "timeouts": {"connect": "10s"}}}}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """The cluster's certificates and, in ``other/``, those of an unrelated CA."""
    root = tmp_path_factory.mktemp("certs")
    seconds = make_certs(root / "cluster", "localhost", "127.0.0.1")
    make_certs(root / "other", "localhost", "127.0.0.1")
    logger.info("make-certs.sh made a CA and 3 certificates in %.2f s", seconds)
    assert seconds < 10, f"key generation must be fast (EC keys); it took {seconds:.1f} s"
    return root


@pytest.fixture(scope="module")
def tls_cluster(certs, tmp_path_factory):
    """(address, Procs) of a scheduler and a worker on tls://127.0.0.1, require-encryption."""
    procs = Procs(tmp_path_factory.mktemp("tls-cluster"), CONFIG)
    try:
        procs.scheduler("127.0.0.1", tls_args(certs / "cluster", "scheduler"))
        procs.worker("worker", "127.0.0.1", tls_args(certs / "cluster", "worker"))
        yield procs.address(), procs
    finally:
        procs.close()


def test_make_certs_files_are_owner_only_and_verify(certs):
    cluster = certs / "cluster"
    assert stat.S_IMODE(cluster.stat().st_mode) == 0o700
    names = sorted(p.name for p in cluster.iterdir())
    assert names == sorted(f"{r}{s}" for r in ("ca", "scheduler", "worker", "client")
                           for s in (".pem", "-key.pem"))
    for path in cluster.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for role in ("scheduler", "worker", "client"):
        ok = subprocess.run(["openssl", "verify", "-CAfile", str(cluster / "ca.pem"),
                             str(cluster / f"{role}.pem")], capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        other = subprocess.run(["openssl", "verify", "-CAfile", str(certs / "other" / "ca.pem"),
                                str(cluster / f"{role}.pem")], capture_output=True, timeout=30)
        assert other.returncode != 0  # two runs make two unrelated CAs
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in",
                           str(cluster / "scheduler.pem")], capture_output=True, text=True,
                          timeout=30).stdout
    assert "DNS:localhost" in text and "IP Address:127.0.0.1" in text
    refused = subprocess.run(["bash", str(MAKE_CERTS), str(cluster), "localhost"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and "not empty" in refused.stderr  # nothing overwritten


def _task_prefixes(client) -> list[str]:
    """The prefixes of every task the scheduler has seen (a function pickled by value: the
    scheduler cannot import this test module)."""
    def prefixes(dask_scheduler):
        return sorted(dask_scheduler.task_prefixes)

    return client.run_on_scheduler(prefixes)


def _no_certificate_handshake(address: str, ca: Path) -> None:
    """Connect with a TLS context that trusts the cluster's CA but holds no certificate
    (distributed's own Security will not even try: the server must refuse it)."""
    from distributed.comm import connect

    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    ctx.check_hostname = False

    async def attempt():
        comm = await connect(address, timeout=10, ssl_context=ctx)
        await comm.write({"op": "identity"})
        return await comm.read()

    asyncio.run(attempt())


@pytest.mark.distributed
@pytest.mark.slow
def test_clients_without_the_cluster_certificate_are_refused(certs, tls_cluster, tmp_path):
    address, procs = tls_cluster
    marker = tmp_path / "ran"
    other = certs / "other"
    foreign = client_security(other)  # trusts and presents the other CA
    foreign_cert = client_security(other)  # trusts the cluster's CA, presents the other's cert
    foreign_cert.tls_ca_file = str(certs / "cluster" / "ca.pem")
    attempts = {
        "no security": lambda: dkern.connect(address, timeout=10),
        "another CA": lambda: dkern.connect(address, security=foreign, timeout=10),
        "certificate of another CA": lambda: dkern.connect(address, security=foreign_cert,
                                                           timeout=10),
        "tcp://": lambda: dkern.connect(address.replace("tls://", "tcp://"), timeout=10),
    }
    start = time.perf_counter()
    for name, connect in attempts.items():
        # A client that got through would create the marker file on a worker. One with no
        # TLS settings is told what to pass before it connects (distributed's own error
        # was a bare TypeError about an ssl_context).
        refused = (ValueError if name == "no security" else (OSError, TypeError))
        with pytest.raises(refused, match="no TLS settings" if name == "no security" else ""):
            connect().submit(Path.touch, marker).result(timeout=30)
        assert not marker.exists(), name
        # The half-made Client of a failed attempt must be collected here: collected later
        # in the IO-loop thread of the next Client, its __del__ waits on that very thread
        # (distributed 2026.8 deadlocks the next connect).
        gc.collect()
    with pytest.raises(OSError):  # trusts the cluster's CA, holds no certificate
        _no_certificate_handshake(address, certs / "cluster" / "ca.pem")
    logger.info("5 refused connection attempts took %.2f s", time.perf_counter() - start)

    log = procs.workdir / "scheduler.log"
    deadline = time.monotonic() + 10  # the scheduler's log lines may lag the refusals
    while log.read_text().count("TLS handshake failed") < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    # Refused by the scheduler itself: the foreign certificate, the missing one, and tcp://
    # (the "another CA" client also refuses the scheduler's certificate on its side).
    assert log.read_text().count("TLS handshake failed") >= 4, procs.logs()

    with dkern.connect(address, security=client_security(certs / "cluster"), timeout=30) as c:
        c.wait_for_workers(1, timeout=60)
        assert all(w.startswith("tls://") for w in c.scheduler_info()["workers"])
        assert "touch" not in _task_prefixes(c)  # no refused client's task
        c.submit(Path.touch, marker).result(timeout=30)  # the check can see a task that ran
        assert marker.exists() and "touch" in _task_prefixes(c)


def _listening_hosts(port: int) -> set[str]:
    """The local addresses on which some socket listens on TCP ``port`` (IPv4 and IPv6)."""
    import ipaddress

    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(host)
                # /proc prints each 32-bit word of the address in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                hosts.add(str(ipaddress.ip_address(words)))
    return hosts


@pytest.mark.distributed
@pytest.mark.slow
def test_embedded_cluster_listens_on_loopback_only():
    from urllib.parse import urlparse

    with dkern.connect(n_workers=1) as client:
        ports = {"dashboard": urlparse(client.dashboard_link).port,
                 "scheduler": int(client.scheduler.address.rsplit(":", 1)[1])}
        ports.update({w: int(w.rsplit(":", 1)[1]) for w in client.scheduler_info()["workers"]})
        bound = {name: _listening_hosts(port) for name, port in ports.items()}
    assert all(hosts == {"127.0.0.1"} for hosts in bound.values()), bound
