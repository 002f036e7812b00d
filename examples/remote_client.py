"""A laptop or notebook driving a Dask cluster: Zarr store -> Nyström KRR -> Zarr predictions.

    python examples/remote_client.py --scheduler tls://head:8786 --store /shared/demo.zarr
    DKERN_SCHEDULER_ADDRESS=tcp://head:8786 python examples/remote_client.py --store s3://b/d.zarr
    python examples/remote_client.py                  # embedded cluster, temporary store

Attaches to the scheduler given by --scheduler or $DKERN_SCHEDULER_ADDRESS (without either,
dkern's embedded LocalCluster starts, so the script runs anywhere), prints the dashboard
link, makes the store unless it already holds X, y, X_test and y_test, fits on the cluster
with a progress bar per Falkon iteration, predicts to the store with Dask's progress bar,
and checks itself: exits 1 unless the test RMSE against the noise-free target is below
TOLERANCE (the training noise is 0.1; the target's spread about 0.7). The store must be a
path or URL that every worker sees. examples/remote_client.ipynb holds the same steps.
"""

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
from distributed import progress, wait

import dkern
from dkern.kernels import Gaussian

#: Largest acceptable test RMSE: a Nyström fit with 300 centres on 40,000 rows of this
#: 4-d target reaches about 0.03; a wrong fit (or predicting the mean) is above 0.5.
TOLERANCE = 0.1


def ensure_store(store, n):
    """Write the synthetic problem unless the store already has it (a store to reuse)."""
    try:
        if {"X", "y", "X_test", "y_test"} <= set(dkern.io.list_arrays(store)):
            return "reused"
    except dkern.errors.StoreError:  # no store there yet
        pass
    dkern.io.make_regression_store(store, n=n, d=4, n_test=n // 10, chunk_rows=n // 4,
                                   overwrite=True)
    return "written"


def fit_and_predict(store):
    """Fit on the cluster, then predict X_test into the store as 'pred'."""
    model = dkern.KernelRidge(Gaussian(lengthscale=2.0), alpha=1e-3, solver="nystrom",
                              n_centers=300, tol=1e-4, random_state=0, verbose=True)
    model.fit((store, "X"), (store, "y"))  # the client receives M x M matrices, never rows
    pred = model.predict((store, "X_test")).persist()  # computed on the workers, kept there
    progress(pred)  # a text bar here, a widget in a notebook
    wait(pred)
    dkern.io.write_arrays(store, {"pred": pred}, overwrite=True)
    return model


def test_rmse(store):
    """RMSE of the stored predictions against the noise-free target, chunk by chunk."""
    diff = dkern.io.open_array(store, "pred") - dkern.io.open_array(store, "y_test")
    return float(np.sqrt((diff**2).mean().compute()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", default=os.environ.get("DKERN_SCHEDULER_ADDRESS"),
                        help="scheduler address (default: $DKERN_SCHEDULER_ADDRESS, else "
                             "an embedded LocalCluster)")
    parser.add_argument("--store", default=None,
                        help="Zarr store every worker sees (default: a temporary folder, "
                             "embedded cluster only)")
    parser.add_argument("--n", type=int, default=40_000, help="training rows to make")
    args = parser.parse_args(argv)
    if args.store is None and args.scheduler:
        parser.error("--store: give a path or URL the cluster's workers see; a temporary "
                     "folder on this machine exists only here.")
    folder = tempfile.mkdtemp(prefix="dkern-remote-") if args.store is None else None
    store = args.store or os.path.join(folder, "demo.zarr")
    kwargs = {} if args.scheduler else {"n_workers": 2, "threads_per_worker": 1}
    try:
        with dkern.connect(args.scheduler, **kwargs) as client:
            print(f"scheduler {client.scheduler.address}; dashboard {client.dashboard_link}")
            print(f"store {store}: {ensure_store(store, args.n)}")
            model = fit_and_predict(store)
            rmse = test_rmse(store)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    ok = rmse < TOLERANCE
    print(f"{model.n_iter_} Falkon iterations; test RMSE {rmse:.4f} "
          f"({'below' if ok else 'NOT below'} the tolerance {TOLERANCE})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
