"""Kernel-matvec throughput: dkern (numpy's fused C loop and BLAS tiles, KeOps, Triton;
in-process and on a LocalCluster) against raw pykeops and a straightforward blocked loop
(on one thread, and on every core), on the same arrays, in one run.

    python benchmarks/gram.py                 # CPU: n = m = 20,000, d in {3, 8, 32}, f32 and f64
    python benchmarks/gram.py --gpu --n 1000000 --dims 3 --repeats 1 --no-cluster
        # GPU: dkern's Triton and KeOps paths vs raw pykeops and a blocked torch loop
    python benchmarks/gram.py --gpu --tile-sweep ...   # also time Triton's tile shapes

Prints a table and rewrites its section of benchmarks/RESULTS.md. Throughput is kernel entries
(n·m) per second, best of --repeats after a warm-up. "err" is the max error on 256 sampled rows
relative to max |K v|, against a float64 reference computed from exact differences. On the
CPU, each row is also given as a fraction of the machine's bound for a fused Gaussian entry
(the peak multiply-add rate measured in the same run over the flops of an entry,
``_results.fused_bound``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import (  # noqa: E402
    EXP_FLOPS,
    FUSED_EXP_FLOPS,
    best_time,
    fused_bound,
    gpu_line,
    machine,
    markdown_table,
    naive_numpy,
    naive_numpy_threaded,
    peak_rates,
    scratch_dir,
    update_section,
)

import dkern  # noqa: E402
from dkern.backends import fused_cpu  # noqa: E402
from dkern.kernels import Gaussian  # noqa: E402


def raw_pykeops(X, Z, v, ell):
    """pykeops LazyTensor on the same arrays, as its documentation writes a Gaussian matvec."""
    from pykeops.numpy import LazyTensor

    x_i, z_j = LazyTensor(X[:, None, :]), LazyTensor(Z[None, :, :])
    K = (-((x_i - z_j) ** 2).sum(-1) / (2 * ell**2)).exp()
    return K @ v


def dkern_matvec(Xd, Zd, v, ell, backend, client=None):
    op = dkern.gram(Gaussian(ell), Xd, Zd, backend=backend)
    product = op @ v
    return client.compute(product).result() if client else product.compute(scheduler="threads")


@contextlib.contextmanager
def fused_off() -> Iterator[None]:
    """This process without the fused C loop (DKERN_FUSED_CPU=0): the BLAS tiles."""
    before = os.environ.get("DKERN_FUSED_CPU")
    os.environ["DKERN_FUSED_CPU"] = "0"
    fused_cpu._load.cache_clear()
    try:
        yield
    finally:
        os.environ.pop("DKERN_FUSED_CPU") if before is None else os.environ.update(
            DKERN_FUSED_CPU=before)
        fused_cpu._load.cache_clear()


def tiles_matvec(Xd, Zd, v, ell):
    with fused_off():
        return dkern_matvec(Xd, Zd, v, ell, "numpy")


def reference(X, Z, v, ell, rows):
    from scipy.spatial.distance import cdist

    Xr, Z64 = X[rows].astype(np.float64), Z.astype(np.float64)
    return np.exp(-cdist(Xr, Z64, "sqeuclidean") / (2 * ell**2)) @ v.astype(np.float64)


def run_case(n, d, dtype, methods, repeats, client, rng):
    X = rng.standard_normal((n, d)).astype(dtype)
    Z = rng.standard_normal((n, d)).astype(dtype)
    v = rng.standard_normal((n, 1)).astype(dtype)
    ell = float(np.sqrt(d))  # typical k(x, z) ~ exp(-1): neither all ones nor all zeros
    rows = rng.choice(n, 256, replace=False)
    ref = reference(X, Z, v, ell, rows)
    results = {}
    for name, fn in methods(X, Z, v, ell, client).items():
        seconds, out = best_time(fn, repeats)
        err = np.abs(np.asarray(out)[rows] - ref).max() / np.abs(ref).max()
        results[name] = (seconds, n * n / seconds, err)
        print(f"{dtype} d={d} {name}: {seconds:.3f} s, err {err:.1e}", file=sys.stderr)
    return results


def cpu_methods(X, Z, v, ell, client):
    chunks = (len(X) // 2, -1)  # one chunk per core
    methods = {
        "naive numpy": lambda: naive_numpy(X, Z, v, ell),
        f"naive numpy, {os.cpu_count()} threads": lambda: naive_numpy_threaded(X, Z, v, ell),
        "raw pykeops": lambda: raw_pykeops(X, Z, v, ell),
    }
    Xd, Zd = da.from_array(X, chunks=chunks), da.from_array(Z, chunks=chunks)
    if client is not None:  # the cluster reads its operands from a Zarr store, as in real use
        store = os.path.join(scratch_dir("dkern-bench-"), "gram.zarr")
        dkern.io.write_arrays(store, {"X": X, "Z": Z}, chunk_rows=chunks[0])
    fused = "fused C" if fused_cpu._load()[0] is not None else "BLAS tiles, no fused C"
    for backend, label in (("numpy", f"numpy ({fused})"), ("keops", "keops")):
        methods[f"dkern/{label} in-process"] = (
            lambda b=backend: dkern_matvec(Xd, Zd, v, ell, b))
        if client is not None:
            methods[f"dkern/{label} LocalCluster(2), Zarr"] = (
                lambda b=backend: dkern_matvec((store, "X"), (store, "Z"), v, ell, b, client))
        if backend == "numpy":
            methods["dkern/numpy (BLAS tiles) in-process"] = lambda: tiles_matvec(Xd, Zd, v, ell)
    return methods


def blocked_torch(X, Z, v, ell, rows=1024):
    """The straightforward GPU loop: ``exp(-cdist² / 2l²) @ v``, 1,024 rows of K at a time
    stored in GPU memory (what a user writes with torch)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the script
    Xt, Zt, vt = (torch.from_numpy(a).to(device) for a in (X, Z, v))
    out = torch.empty((len(X), v.shape[1]), dtype=Xt.dtype, device=device)
    for i in range(0, len(X), rows):
        out[i:i + rows] = torch.exp(torch.cdist(Xt[i:i + rows], Zt) ** 2 / (-2 * ell**2)) @ vt
    return out.cpu().numpy()


def gpu_methods(X, Z, v, ell, client, torch_loop=True):
    from dkern.backends import keops_status
    from dkern.backends.triton_backend import matvec_block_triton

    Xd, Zd = da.from_array(X, chunks=(len(X) // 2, -1)), da.from_array(Z, chunks=(len(Z) // 2, -1))
    methods = {"blocked torch (GPU)": lambda: blocked_torch(X, Z, v, ell)} if torch_loop else {}
    methods.update({
        "dkern/triton block, one launch (GPU)": lambda: matvec_block_triton(Gaussian(ell), X, Z, v),
        "dkern/triton in-process (GPU)": lambda: dkern_matvec(Xd, Zd, v, ell, "triton"),
    })
    backends = ["triton"]
    if keops_status().available:  # checked in a child process: KeOps may crash compiling
        backends.append("keops")
        methods["raw pykeops (GPU)"] = lambda: raw_pykeops(X, Z, v, ell)
        methods["dkern/keops in-process (GPU)"] = lambda: dkern_matvec(Xd, Zd, v, ell, "keops")
    else:
        print(f"KeOps left out: {keops_status().detail}", file=sys.stderr)
    if client is not None:  # one worker process owning the GPU, operands persisted there
        Xc, Zc = client.persist(Xd), client.persist(Zd)
        for b in backends:
            methods[f"dkern/{b} LocalCluster(1 worker, GPU)"] = (
                lambda b=b: dkern_matvec(Xc, Zc, v, ell, b, client))
    return methods


def tile_sweep(n, d, dtypes, rng):
    """Seconds of one fused Triton product per (BN, BM, warps, chunk), n = m, Gaussian,
    t = 1: the table, and the fastest shape per dtype."""
    from dkern.backends.triton_backend import matvec_block_triton

    rows, best = [], {}
    for dtype in dtypes:
        X, Z = (rng.standard_normal((n, d)).astype(dtype) for _ in range(2))
        v = rng.standard_normal((n, 1)).astype(dtype)
        for shape in TILES[dtype]:
            seconds, _ = best_time(
                lambda s=shape, X=X, Z=Z, v=v: matvec_block_triton(
                    Gaussian(np.sqrt(d)), X, Z, v, tiles=s[:3], chunk=s[3]), 1)
            rows.append([dtype, d, str(shape), f"{seconds:.3f}", f"{n * n / seconds / 1e9:,.1f}"])
            print(f"tiles {dtype} {shape}: {seconds:.3f} s", file=sys.stderr, flush=True)
            if dtype not in best or seconds < best[dtype][1]:
                best[dtype] = (shape, seconds)
    header = ["dtype", "d", "(BN, BM, warps, chunk)", "seconds", "G entries/s"]
    return markdown_table(header, rows), {dtype: shape for dtype, (shape, _) in best.items()}


#: Shapes the sweep times: rows and columns of a tile, warps, and the tiles a one-column
#: product sums entry by entry before reducing across columns.
TILES = {
    "float32": [(128, 32, 4, 16), (128, 32, 4, 64), (64, 32, 2, 16), (64, 64, 4, 16),
                (128, 64, 4, 64), (128, 32, 8, 16), (256, 32, 8, 16)],
    "float64": [(64, 32, 2, 16), (64, 32, 2, 64), (32, 32, 1, 16), (128, 32, 4, 16)],
}


def use_tiles(best):
    """Make the sweep's fastest shapes the Triton backend's for this run's table."""
    from dkern.backends import triton_backend

    for dtype, shape in best.items():
        triton_backend.GPU_TILES[dtype], triton_backend.GPU_CHUNK[dtype] = shape[:3], shape[3]
    return "; ".join(f"{dtype} {shape}" for dtype, shape in best.items())


def summarise(n, table, gpu, rates=None):
    """Rows for the markdown table and the headline ratio per (dtype, d); on the CPU
    (``rates`` from :func:`_results.peak_rates`) each rate as a fraction of the bound."""
    rows, ratios = [], []
    for (dtype, d), results in table.items():
        base = {k: r for k, r in results.items() if not k.startswith("dkern")}
        ours = {k: r for k, r in results.items() if k.startswith("dkern")}
        best_base = max(r[1] for r in base.values())
        best_ours_name = max(ours, key=lambda k: ours[k][1])
        bound = fused_bound(rates, d) if rates else None
        ratios.append((dtype, d, best_ours_name, ours[best_ours_name][1], best_base, bound))
        for name, (sec, rate, err) in results.items():
            rows.append([dtype, d, name, f"{sec:.3f}", f"{rate / 1e6:,.0f}",
                         f"{rate / best_base:.2f}"] + ([f"{rate / bound:.0%}"] if bound else [])
                        + [f"{err:.1e}"])
    header = (["dtype", "d", "method", "seconds", "M entries/s", "× best baseline"]
              + (["of bound"] if rates else []) + ["err"])
    target = ("dkern's Triton and KeOps paths ≥ 0.8× raw pykeops on the GPU" if gpu else
              "≥ 1.5 G entries/s at d = 8 float64 (≥ 50% of the bound), ≥ 4× raw pykeops "
              "and the naive loop on every core, equal to the dense result to 1e-12")
    lines = [markdown_table(header, rows), "", f"Target: {target}.", ""]
    if rates:
        lines += [bound_line(rates), ""]
    for dt, d, name, rate, best_base, bound in ratios:
        share = f", {rate / bound:.0%} of the bound" if bound else ""
        lines.append(f"- {dt} d={d}: best dkern = {name}, {rate / 1e9:.2f} G entries/s, "
                     f"**{rate / best_base:.2f}×** the best baseline{share}")
    return "\n".join(lines)


def bound_line(rates):
    """The machine's bound, measured in this run, in words."""
    return (f"Bound (measured in this run, every core busy): peak float64 multiply-add rate "
            f"{rates['fma_gflops']:.1f} GFLOP/s; dkern's compiled full-range exp (the tiles') "
            f"{rates['exp_per_s'] / 1e9:.2f} G values/s (numpy's exp, one thread, "
            f"{rates['numpy_exp_per_s'] / 1e9:.2f} G/s). A fused Gaussian entry costs "
            f"3 d + {FUSED_EXP_FLOPS} flops with the fused loop's exp (3 d of distance, "
            f"{EXP_FLOPS} of exp, "
            f"1 of lengthscale, 2 to accumulate), so the bound is "
            f"{fused_bound(rates, 8) / 1e9:.2f} G entries/s at d = 8 (the issue's 33-flop count, "
            f"which assumes a 15-flop exp, would give "
            f"{rates['fma_gflops'] / 33:.2f} G/s). float32 rows are computed in float64 by "
            f"the fused loop; their bound is taken as float64's.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[3, 8, 32])
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="GPU comparison (needs CUDA)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the LocalCluster runs")
    parser.add_argument("--no-torch-loop", action="store_true",
                        help="with --gpu: skip the blocked torch loop (the slowest baseline)")
    parser.add_argument("--tile-sweep", nargs="*", metavar="DTYPE",
                        help="with --gpu: also time Triton's tile shapes at the first d, for "
                             "these dtypes (default: --dtypes)")
    args = parser.parse_args()
    client = None
    if not args.no_cluster:
        client = (dkern.connect(n_workers=1, threads_per_worker=2) if args.gpu
                  else dkern.connect(n_workers=2, threads_per_worker=1))
    rng = np.random.default_rng(0)
    sweep, tiles = "", ""
    if args.gpu and args.tile_sweep is not None:  # first: the table then uses the best
        sweep, best = tile_sweep(args.n, args.dims[0], args.tile_sweep or args.dtypes, rng)
        update_section("gram-gpu", "## Gram matvec throughput, GPU: the tile sweep alone (the "
                       "run stopped before its table)\n\n" + sweep)  # kept if it times out
        tiles = (" Triton's tiles (BN, BM, warps, chunk) in this process's rows: the sweep's "
                 f"fastest, {use_tiles(best)}.")
    table = {}
    rates = None if args.gpu else peak_rates()
    gpu = functools.partial(gpu_methods, torch_loop=not args.no_torch_loop)
    for dtype in args.dtypes:
        for d in args.dims:
            table[(dtype, d)] = run_case(args.n, d, np.dtype(dtype),
                                         gpu if args.gpu else cpu_methods,
                                         args.repeats, client, rng)
            print(f"done {dtype} d={d}", file=sys.stderr)
    where = "GPU" if args.gpu else "CPU"
    body = (f"## Gram matvec throughput, {where} (`benchmarks/gram.py`)\n\n"
            f"n = m = {args.n:,}, Gaussian kernel, t = 1. Machine: {machine()}"
            f"{gpu_line() if args.gpu else ''}.{tiles}\n\n"
            + summarise(args.n, table, args.gpu, rates))
    if sweep:
        body += ("\n\n### Triton tile shapes (one fused product, best of one after a warm-up)"
                 "\n\n" + sweep)
    update_section(f"gram-{where.lower()}", body)
    print(body)
    if client is not None:
        client.close()


if __name__ == "__main__":
    with dask.config.set({"array.slicing.split_large_chunks": False}):
        main()
