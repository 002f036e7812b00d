"""Falkon's normal product ``k(c, x)ᵀ (k(x, c) v)`` on one block, Triton against KeOps, for
each choice of how many programs per multiprocessor the column split aims at
(``triton_backend.PROGRAMS_PER_MULTIPROCESSOR``): the product over M centres has few rows,
so its programs come from splitting the columns.

    python benchmarks/gpu_splits.py                 # 250,000 rows x 10,000 centres, d = 8

Prints a table and rewrites its section of benchmarks/RESULTS.md. Seconds are the best of
--repeats after a warm-up; "rel. diff" is the largest difference from KeOps' result (or
from the first Triton row without KeOps) over its largest entry.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import best_time, gpu_line, machine, markdown_table, update_section  # noqa: E402

from dkern.backends import block_backend, keops_status, triton_backend  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=250_000, help="rows of the block")
    p.add_argument("--m", type=int, default=10_000, help="centres")
    p.add_argument("--d", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-sm", type=int, nargs="+", default=[4, 8, 16, 32])
    args = p.parse_args()
    rng = np.random.default_rng(0)
    kernel = Gaussian(3.0)
    rows, reference = [], {}
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((args.n, args.d)).astype(dtype)
        c = x[rng.choice(args.n, args.m, replace=False)]
        v = rng.standard_normal((args.m, 1))
        runs = []
        if keops_status().available:
            runs.append(("keops", None))
        runs += [("triton", k) for k in args.per_sm]
        for backend, per_sm in runs:
            if per_sm is not None:
                triton_backend.PROGRAMS_PER_MULTIPROCESSOR = per_sm
            product = functools.partial(block_backend(backend).normal_matvec, x, c, v,
                                        kernel=kernel)
            seconds, out = best_time(product, args.repeats)
            ref = reference.setdefault(dtype, out)
            diff = np.abs(out - ref).max() / np.abs(ref).max()
            label = "KeOps" if per_sm is None else f"Triton, {per_sm} programs per SM"
            rows.append([np.dtype(dtype).name, label, f"{seconds:.4f}",
                         f"{2 * args.n * args.m / seconds / 1e9:,.1f}", f"{diff:.1e}"])
            print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["dtype", "path", "seconds", "G entries/s (both products)",
                            "rel. diff"], rows)
    body = (f"## Triton's column split: Falkon's normal product (`benchmarks/gpu_splits.py`)\n\n"
            f"Machine: {machine()}{gpu_line()}\n\n"
            f"### {args.n:,} rows × {args.m:,} centres, d = {args.d}, Gaussian, one block, "
            f"best of {args.repeats}\n\n{table}\n")
    print(table)
    update_section("gpu-splits", body)


if __name__ == "__main__":
    main()
