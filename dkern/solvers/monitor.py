"""Watching an iterative solve while it runs, e.g. from a notebook."""

from __future__ import annotations

import threading

import numpy as np


class SolveMonitor:
    """A callback that records each iteration's relative residuals, readable meanwhile.

    Pass it as ``callback=`` to :func:`~dkern.solvers.cg` or :func:`~dkern.solvers.falkon`,
    or to ``fit`` of :class:`dkern.KernelRidge` / :class:`dkern.GaussianProcessRegressor`;
    run the fit in a thread and read the monitor from another (a notebook cell)::

        monitor = SolveMonitor()
        fit = threading.Thread(target=model.fit, args=(X, y), kwargs={"callback": monitor})
        fit.start()
        monitor.residuals()  # grows while the solve runs

    A solve resumed from a checkpoint starts at the checkpoint's iteration.

    Attributes
    ----------
    iterations : list of int
        The iterations reported so far, in order.
    """

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self._residuals: list[np.ndarray] = []
        self._lock = threading.Lock()

    def __call__(self, iteration: int, residuals: np.ndarray) -> None:
        with self._lock:
            self.iterations.append(int(iteration))
            self._residuals.append(np.array(residuals, dtype=np.float64))

    def residuals(self) -> np.ndarray:
        """A copy of the history so far; shape (iterations reported, t)."""
        with self._lock:
            rows = list(self._residuals)
        return np.vstack(rows) if rows else np.empty((0, 0))
