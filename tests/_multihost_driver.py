"""The client of tests/test_multihost.py: what a notebook on another host does.

    python _multihost_driver.py STORE OUT ADDRESS [CERTS]

connects to the scheduler at ADDRESS (with the client certificate in CERTS for tls://),
runs :func:`run` on the Zarr store STORE and writes its results under OUT. The test imports
:func:`run` for its reference run on an in-process LocalCluster.

In the CG solve, after :data:`PAUSE_AT` iterations, the driver writes ``OUT/paused.json``
(which worker holds how many keys) and waits until ``OUT/resume`` exists: the test takes a
worker's link down in between, so the loss falls inside the solve whatever the timing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import dkern
from dkern.io import open_array
from dkern.kernels import Gaussian, Scaled
from dkern.solvers import cg

PAUSE_AT = 2
CG_TOL = 1e-8


def run(store: Path, out: Path, on_iteration: Callable[[int, np.ndarray], None] | None = None,
        ) -> dict:
    """Nyström KRR from the store, a GP predict written to Zarr, and a CG solve of
    ``(K + alpha I) c = y``; arrays to ``out/*.npy`` and ``out/gp.zarr``; return timings."""
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    start = time.perf_counter()
    krr = dkern.KernelRidge(Gaussian(0.5), alpha=1e-3, solver="nystrom", n_centers=40,
                            tol=1e-8, random_state=0).fit((str(store), "X"), (str(store), "y"))
    np.save(out / "nystrom_coef.npy", krr.dual_coef_)
    np.save(out / "nystrom_pred.npy", krr.predict((str(store), "X_test")).compute())
    times["nystrom_s"] = time.perf_counter() - start

    start = time.perf_counter()
    X, y = open_array(store, "X"), open_array(store, "y")
    gp = dkern.GaussianProcessRegressor(Scaled(1.0, Gaussian(0.5)), alpha=1e-2, optimizer=None)
    gp.fit(X[:200], y[:200]).predict((str(store), "X_test"), return_std=True,
                                     out=(str(out / "gp.zarr"), "gp"))
    times["gp_s"] = time.perf_counter() - start

    # The CG system of KernelRidge(solver="cg"), unpreconditioned: 8 iterations, so a
    # worker can be lost in the middle (a strong ridge keeps them few on this slow box).
    start = time.perf_counter()
    result = cg(dkern.gram(Gaussian(1.0), X) + 100.0, y, tol=CG_TOL, callback=on_iteration)
    np.save(out / "cg_coef.npy", result.x.compute())
    times["cg_s"] = time.perf_counter() - start
    times["cg_iterations"] = result.n_iter
    return times


def _pause(client, out: Path) -> Callable[[int, np.ndarray], None]:
    def on_iteration(iteration: int, residuals: np.ndarray) -> None:
        if iteration != PAUSE_AT:
            return
        held = {w: len(keys) for w, keys in client.has_what().items()}
        (out / "paused.tmp").write_text(json.dumps(held))
        os.replace(out / "paused.tmp", out / "paused.json")  # the test never reads half of it
        deadline = time.monotonic() + 120
        while not (out / "resume").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test did not take the link down within 120 s")
            time.sleep(0.05)

    return on_iteration


def main(store: str, out: str, address: str, certs: str | None = None) -> None:
    security = None
    if certs is not None:
        from distributed import Security

        c = Path(certs)
        security = Security(tls_ca_file=str(c / "ca.pem"), tls_client_cert=str(c / "client.pem"),
                            tls_client_key=str(c / "client-key.pem"), require_encryption=True)
    with dkern.connect(address, security=security, timeout=60) as client:
        client.wait_for_workers(3, timeout=120)
        times = run(Path(store), Path(out), _pause(client, Path(out)))
        times["workers_after"] = sorted(client.scheduler_info()["workers"])
    (Path(out) / "times.json").write_text(json.dumps(times))


if __name__ == "__main__":
    main(*sys.argv[1:])
