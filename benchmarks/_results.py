"""Shared helpers of the benchmark scripts: machine facts, timing, and RESULTS.md sections."""

from __future__ import annotations

import datetime
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> str:
    """One line naming the machine, for the table headers."""
    import numpy as np
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gib = psutil.virtual_memory().total / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {gib:.0f} GiB, Python {platform.python_version()}, "
            f"numpy {np.__version__}, {datetime.date.today().isoformat()}")


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
