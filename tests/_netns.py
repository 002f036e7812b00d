"""Several "hosts" on one machine for multi-process tests: Linux network namespaces on a bridge.

Each host is a network namespace with one veth link into a bridge that this module creates
on a private /24 (the bridge itself is the root namespace's address ``.1`` on it, so the test
process can reach every host). Names carry the test process's pid so parallel runs do not
collide; :meth:`Hosts.close` removes the namespaces and the bridge, whatever state they are
in (a process still running inside keeps its namespace alive: kill it first). Needs root
and iproute2's ``ip``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command"
    if os.geteuid() != 0:
        return "needs root to create network namespaces, veth links and a bridge"
    probe = f"dkern-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    return None


def _free_subnet() -> str:
    """A 10.213.X.0/24 that no interface of the root namespace uses (X from the pid)."""
    used = set(re.findall(r"inet 10\.213\.(\d+)\.", _ip("-o", "-4", "addr").stdout))
    for k in range(250):
        x = (os.getpid() + k) % 250 + 1
        if str(x) not in used:
            return f"10.213.{x}"
    raise RuntimeError("no free 10.213.X.0/24 test subnet")


class Hosts:
    """``n`` namespaces ``self.ns[i]`` with addresses ``self.addr[i]`` on one bridge."""

    def __init__(self, n: int) -> None:
        pid = os.getpid()
        self.bridge = f"dkb{pid}"
        self.ns = [f"dkern-{pid}-{i}" for i in range(n)]
        self.host_link = [f"dk{pid}h{i}" for i in range(n)]  # bridge side; <= 15 characters
        self._inner_link = [f"dk{pid}n{i}" for i in range(n)]  # namespace side
        self._made_bridge = False
        try:
            self._build(_free_subnet())
        except BaseException:
            self.close()
            raise

    def _build(self, prefix: str) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _ip("addr", "add", f"{prefix}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.addr = [f"{prefix}.{i + 10}" for i in range(len(self.ns))]
        for ns, link, inner, addr in zip(self.ns, self.host_link, self._inner_link, self.addr,
                                         strict=True):
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", link, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program inside host ``i``."""
        return ["ip", "netns", "exec", self.ns[i]]

    def link_down(self, i: int) -> None:
        """Cut host ``i`` off the bridge: its packets are dropped, no connection is reset."""
        _ip("link", "set", self.host_link[i], "down")

    def close(self) -> None:
        """Remove the namespaces and the bridge (kill the processes inside first)."""
        for ns, link in zip(self.ns, self.host_link, strict=True):
            _ip("link", "del", link, check=False)  # removes its peer in the namespace too
            _ip("netns", "del", ns, check=False)
        if self._made_bridge:
            _ip("link", "del", self.bridge, check=False)
