"""Shared helpers of the benchmark scripts: machine facts, timing, and RESULTS.md sections."""

from __future__ import annotations

import datetime
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).with_name("RESULTS.md")
NAIVE_BLOCK_ROWS = 1000


def machine() -> str:
    """One line naming the machine, for the table headers."""
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gib = psutil.virtual_memory().total / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {gib:.0f} GiB, Python {platform.python_version()}, "
            f"numpy {np.__version__}, {datetime.date.today().isoformat()}; speed probe "
            f"{speed_probe():,.0f} M entries/s")


def speed_probe() -> float:
    """Throughput of the naive float64 loop (n = m = 4,000, d = 8) right now, in M entries/s.

    These machines are shared and their speed drifts several-fold over a day; this number,
    taken when a section is written, says how fast the machine was for that section.
    """
    rng = np.random.default_rng(0)
    X, Z = rng.standard_normal((2, 4_000, 8))
    v = rng.standard_normal((4_000, 1))
    seconds, _ = best_time(lambda: naive_numpy(X, Z, v, np.sqrt(8.0)), 3)
    return 4_000**2 / seconds / 1e6


def naive_numpy(X: np.ndarray, Z: np.ndarray, v: np.ndarray, ell: float) -> np.ndarray:
    """The straightforward loop: X_b @ Z.T -> sq. distances -> exp -> @ v, 1000 rows at a time."""
    out = np.empty((len(X), v.shape[1]), dtype=X.dtype)
    zz = (Z * Z).sum(1)
    for i in range(0, len(X), NAIVE_BLOCK_ROWS):
        Xb = X[i:i + NAIVE_BLOCK_ROWS]
        D = (Xb * Xb).sum(1)[:, None] + zz[None, :] - 2 * Xb @ Z.T
        out[i:i + NAIVE_BLOCK_ROWS] = np.exp(-D / (2 * ell**2)) @ v
    return out


def peak_rss_gb() -> float:
    """This process's peak resident set size in GB, from /proc/self/status (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that across fork + exec, so a worker
    spawned by a process at 3.6 GB reports 3.6 GB however little it uses itself.
    """
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kib * 1024 / 1e9


def reset_peak_rss() -> None:
    """Restart this process's peak-RSS count (Linux ``clear_refs``), so a benchmark part
    reports its own peak, not that of the parts before it in the same process."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def best_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Best wall time of ``repeats`` calls after one warm-up call, and the last result."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def update_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace the section between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = f"{text.rstrip()}\n\n{block}\n"
    path.write_text(text)


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
