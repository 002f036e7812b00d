"""Nyström kernel ridge regression from a Zarr store to a Zarr store, and back from a model file.

    python examples/krr_from_zarr.py [--n 100000]

Fits on 100,000 stored rows (``--n``; 4 row chunks, n/20 test rows) on the embedded
cluster, writes the test predictions into the store, saves the model, loads it and predicts
again. Exits with status 1 unless the test RMSE (against the noise-free target; the training
noise is 0.1, the target's spread about 0.7) is below 0.1 and the loaded model's predictions
equal the stored ones.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import dkern
from dkern.kernels import Gaussian

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="training rows (4 row chunks)")
    n = parser.parse_args().n
    folder = Path(tempfile.mkdtemp())
    store, model_file = str(folder / "data.zarr"), str(folder / "model.zarr")
    with dkern.connect(n_workers=2, threads_per_worker=1):
        dkern.io.make_regression_store(store, n=n, d=4, n_test=n // 20, chunk_rows=-(-n // 4))
        model = dkern.KernelRidge(Gaussian(lengthscale=2.0), alpha=1e-3, solver="nystrom",
                                  n_centers=500, tol=1e-4, random_state=0)
        model.fit((store, "X"), (store, "y"))
        model.predict((store, "X_test"), out=(store, "pred"))
        dkern.save(model, model_file)
        stored = dkern.io.open_array(store, "pred").compute()
        again = dkern.load(model_file).predict((store, "X_test")).compute()
        truth = dkern.io.open_array(store, "y_test").compute()
    rmse = float(np.sqrt(np.mean((stored - truth) ** 2)))
    same = np.array_equal(stored, again)
    print(f"{model.n_iter_} Falkon iterations on {n:,} rows; test RMSE {rmse:.4f}; "
          f"loaded model reproduces the stored predictions: {same}")
    sys.exit(0 if rmse < 0.1 and same else 1)
