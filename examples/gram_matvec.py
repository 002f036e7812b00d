"""Gram matvec from a Zarr store on the embedded cluster, checked against a dense product.

    python examples/gram_matvec.py [--n 50000]

Exits with status 1 if the lazy product and the dense one differ by more than 1e-10.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import dkern
from dkern.kernels import Gaussian, Matern

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="rows of X (5 row chunks)")
    n = parser.parse_args().n
    store = str(Path(tempfile.mkdtemp()) / "example.zarr")
    with dkern.connect(n_workers=2, threads_per_worker=1):
        dkern.io.make_regression_store(store, n=n, d=5, chunk_rows=-(-n // 5))
        kernel = Gaussian(lengthscale=0.7) + 0.5 * Matern(lengthscale=1.5, nu=2.5)
        K = dkern.gram(kernel, (store, "X"))                 # n × n, never built
        v = np.random.default_rng(0).standard_normal(K.shape[1])
        Kv = (K @ v).compute()
        X = dkern.io.open_array(store, "X")
        rows = np.arange(0, n, 997)                          # check every 997th row densely
        dense = kernel(X[rows].compute(), X.compute()) @ v
        err = np.abs(Kv[rows] - dense).max() / np.abs(dense).max()
        print(f"K is {K.shape}, backend {K.backend}; max relative error on {len(rows)} rows: "
              f"{err:.1e}")
        sys.exit(0 if err < 1e-10 else 1)
