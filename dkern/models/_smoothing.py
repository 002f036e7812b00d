"""What kernel density estimation and Nadaraya–Watson share: the kernel argument, the
bandwidth, and the pass over the training rows
(:func:`dkern.operators.reductions.kernel_log_sums`)."""

from __future__ import annotations

import contextlib
from typing import Any

import dask.array as da
import numpy as np

from ..kernels import Gaussian, Kernel
from ..kernels.profiles import PROFILES, RadialProfile
from ..operators import data_rows
from ..operators.base import sent_once
from ..operators.in_process import in_process, pass_scheduler
from ..operators.reductions import kernel_log_sums
from ._validation import finite_number

#: The kernels named by a string: the Gaussian, the hypercube (box; Bishop 2006, §2.5.1)
#: and scikit-learn's other density kernels (radial profiles).
NAMED_KERNELS = ("gaussian", "box", *PROFILES)


def check_bandwidth(bandwidth: Any) -> float:
    """``bandwidth`` as a float > 0."""
    value = finite_number(bandwidth)
    if value is None or value <= 0:
        raise ValueError(f"bandwidth must be a finite number > 0 (the kernel's width h); got "
                         f"{bandwidth!r}. Use e.g. bandwidth=0.5, choose it with "
                         "GridSearchCV, or (KernelDensity) bandwidth='scott' or 'silverman'.")
    return value


def smoothing_kernel(kernel: Any, *, any_kernel: bool) -> tuple[Kernel | None, bool]:
    """(the dkern kernel, is_box) for ``kernel="gaussian"``, ``"box"`` or a dkern kernel.

    ``any_kernel=False`` accepts only a dkern ``Gaussian`` among kernel objects (a density
    needs the kernel's normalising constant).
    """
    if isinstance(kernel, str) and kernel in NAMED_KERNELS:
        if kernel in PROFILES:
            return RadialProfile(kernel), False
        return (None, True) if kernel == "box" else (Gaussian(1.0), False)
    if isinstance(kernel, Kernel) and kernel.has_white:
        # White's weights k(x*, x_i) are zero: a smoother would silently drop the term
        raise ValueError(f"kernel {kernel!r} holds a White noise term, which has no weight "
                         "between distinct points; remove it (kernel.without_white()).")
    if isinstance(kernel, Kernel) and (any_kernel or type(kernel) is Gaussian):
        return kernel, False
    names = ", ".join(map(repr, NAMED_KERNELS))
    allowed = f"one of {names} or a dkern kernel with non-negative values" if any_kernel \
        else f"one of {names} or a dkern Gaussian (its lengthscale in units of the bandwidth)"
    raise ValueError(f"kernel must be {allowed}; got {kernel!r}.")


def log_sums(queries: Any, training: Any, targets: Any = None, *, kernel: Kernel | None,
             box: bool, bandwidth: float, name: str, backend: str) -> da.Array:
    """The pass over the training rows: ``[m, s₀, s₁ … s_T]`` per query row, lazily.

    Weights are ``k((x − xₙ)/h)``: the box kernel of side 1 or ``kernel`` on rows divided
    by the bandwidth h; ``backend`` is a concrete one (``"numpy"`` or ``"keops"``).
    """
    Q, X = data_rows(queries, name="X"), data_rows(training, name="X_fit")
    T = None
    if isinstance(targets, da.Array):
        T = targets.reshape(targets.shape[0], -1).astype(np.float64).rechunk((X.chunks[0], -1))
    elif targets is not None:  # sent to the workers once, like data_rows' in-memory rows
        values = np.asarray(targets, dtype=np.float64).reshape(len(targets), -1)
        T = sent_once(da.from_array(values, chunks=(X.chunks[0], -1)))
    return kernel_log_sums(Q, X, T, kernel=kernel, box_width=1.0 if box else None,
                           scale=bandwidth, name=name, backend=backend)


def in_process_when_small(queries: Any, training: Any, *others: Any,
                          name: str) -> contextlib.AbstractContextManager[bool]:
    """:func:`dkern.operators.in_process.in_process` for a pass of the query rows over the
    training rows (and their targets or weights, ``others``)."""
    return in_process(len(queries) * len(training), queries, training, *others, name=name)


def finish(result: da.Array, lazy: bool) -> Any:
    """A numpy result for in-memory queries, the dask array for lazy ones."""
    return result if lazy else result.compute(scheduler=pass_scheduler())
