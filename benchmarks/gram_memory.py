"""Peak memory of a Gram matvec whose dense matrix would need 80 GB.

    python benchmarks/gram_memory.py            # n = 1,000,000, m = 10,000, d = 3

X lives in a Zarr store (written chunk by chunk by the cluster); the matvec
``K(X, X[:m]) @ v`` runs on a LocalCluster of 2 single-threaded workers and the
result is written back to the store. Reports the peak resident memory (VmHWM)
of the client, the scheduler and every worker process, and rewrites its section of
benchmarks/RESULTS.md. Target: every process under 1.5 GB.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import (  # noqa: E402
    machine,
    markdown_table,
    peak_rss_gb,
    scratch_dir,
    update_section,
)

import dkern  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402

LIMIT_GB = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--m", type=int, default=10_000)
    parser.add_argument("--d", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    args = parser.parse_args()
    store = os.path.join(scratch_dir("dkern-mem-"), "mem.zarr")
    with dkern.connect(n_workers=2, threads_per_worker=1) as client:
        start = time.perf_counter()
        dkern.io.make_regression_store(store, args.n, args.d, chunk_rows=args.chunk_rows)
        made = time.perf_counter() - start
        X = dkern.io.open_array(store, "X")
        op = dkern.gram(Gaussian(0.5), X, X[: args.m], backend="numpy")
        v = np.random.default_rng(0).standard_normal(args.m)
        start = time.perf_counter()
        dkern.io.write_array(op @ v, store, "Kv")
        seconds = time.perf_counter() - start
        peaks = {"client (and the in-process scheduler)": peak_rss_gb()}
        peaks.update({f"worker {addr.rsplit(':', 1)[-1]}": gb
                      for addr, gb in client.run(peak_rss_gb).items()})
        Kv = dkern.io.open_array(store, "Kv")[:5].compute()
    rows = [[name, f"{gb:.2f}", "yes" if gb < LIMIT_GB else "**NO**"] for name, gb in peaks.items()]
    dense_gb = args.n * args.m * 8 / 1e9
    body = (f"## Gram matvec memory (`benchmarks/gram_memory.py`)\n\n"
            f"K(X, X[:m]) @ v with n = {args.n:,}, m = {args.m:,}, d = {args.d} (the dense "
            f"matrix would need {dense_gb:,.0f} GB), X read from and K v written to a Zarr store, "
            f"LocalCluster of 2 workers. Machine: {machine()}.\n\n"
            + markdown_table(["process", "peak RSS (GB)", f"< {LIMIT_GB} GB"], rows)
            + f"\n\nData written in {made:.1f} s; matvec + write {seconds:.1f} s "
            f"({args.n * args.m / seconds / 1e6:,.0f} M entries/s). First entries of K v: "
            f"{np.array2string(Kv, precision=4)}.")
    print(body)
    update_section("gram-memory", body)


if __name__ == "__main__":
    main()
