"""A Dask scheduler and workers as separate processes, started as a user would start them.

``dask scheduler`` / ``dask worker`` (as ``python -m distributed.cli.…`` of this interpreter),
each with this checkout on ``PYTHONPATH`` and a Dask config directory of the test's own
(``DASK_CONFIG``), optionally inside a network namespace (a command prefix such as
``ip netns exec NS``). :meth:`Procs.close` kills every process it started, by process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAKE_CERTS = ROOT / "cluster" / "make-certs.sh"


def make_certs(outdir: Path, *names: str) -> float:
    """Run cluster/make-certs.sh into ``outdir`` for ``names``; return its wall time (s)."""
    start = time.perf_counter()
    subprocess.run(["bash", str(MAKE_CERTS), str(outdir), *names], check=True,
                   capture_output=True, timeout=60)
    return time.perf_counter() - start


def tls_args(certs: Path, role: str) -> list[str]:
    """``dask scheduler`` / ``dask worker`` options for ``role``'s certificate in ``certs``."""
    return ["--tls-ca-file", str(certs / "ca.pem"), "--tls-cert", str(certs / f"{role}.pem"),
            "--tls-key", str(certs / f"{role}-key.pem")]


def client_security(certs: Path, **kwargs: Any) -> Any:
    """A ``distributed.Security`` for a client holding ``certs``' client certificate."""
    from distributed import Security

    return Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"),
                    tls_client_key=str(certs / "client-key.pem"), **kwargs)


class Procs:
    """Dask processes sharing one config directory ``workdir/dask`` and log directory."""

    def __init__(self, workdir: Path, config: dict) -> None:
        self.workdir = workdir
        (workdir / "dask").mkdir(parents=True, exist_ok=True)
        (workdir / "dask" / "dkern-test.yaml").write_text(yaml.safe_dump(config))
        self.env = dict(os.environ, PYTHONPATH=str(ROOT), DASK_CONFIG=str(workdir / "dask"),
                        OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.env.pop("DKERN_SCHEDULER_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []
        self.scheduler_file = workdir / "scheduler.json"

    def start(self, name: str, argv: Sequence[str], prefix: Sequence[str] = ()) -> subprocess.Popen:
        """Start ``prefix + argv`` with its output in ``workdir/name.log``, in its own session."""
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([*prefix, *argv], stdout=log, stderr=subprocess.STDOUT,
                                    env=self.env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def scheduler(self, host: str, extra: Sequence[str] = (), prefix: Sequence[str] = ()) -> None:
        self.start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler",
                                 "--host", host, "--port", "0", "--no-dashboard",
                                 "--scheduler-file", str(self.scheduler_file), *extra], prefix)

    def worker(self, name: str, host: str, extra: Sequence[str] = (),
               prefix: Sequence[str] = ()) -> None:
        """One single-threaded worker without a nanny: a dead one stays dead."""
        self.start(name, [sys.executable, "-m", "distributed.cli.dask_worker",
                          "--scheduler-file", str(self.scheduler_file), "--host", host,
                          "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name", name,
                          *extra], prefix)

    def address(self, timeout: float = 60) -> str:
        """The scheduler's address, once it has written its scheduler file."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Dask process exited early; logs:\n{self.logs()}")
            try:
                return json.loads(self.scheduler_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        raise TimeoutError(f"no scheduler file after {timeout} s; logs:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.workdir.glob("*.log")))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: what it started
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


def stop_groups(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM each process's group (a cluster/ script and what it started), then SIGKILL
    the groups still alive after 30 s."""
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def sample_worker_memory(client: Any, samples: list, stop: Any) -> None:
    """Sample the workers' process memory (as their heartbeats report it) into ``samples``
    every 0.5 s until ``stop`` (a ``threading.Event``) is set."""
    while not stop.wait(0.5):
        try:
            info = client.scheduler_info(n_workers=-1)["workers"].values()
        except Exception:  # the cluster closing under the last sample
            return
        samples.extend(w["metrics"]["memory"] for w in info)
