"""dkern's exceptions and warnings.

Every error is a ``ValueError`` subclass (or ``TypeError`` for wrong types), so
callers that catch ``ValueError`` keep working; the subclasses let callers tell
store damage from bad arguments. ``ConvergenceWarning`` is scikit-learn's, so
``warnings.filterwarnings`` and scikit-learn's tooling treat dkern's like its own.
"""

import contextlib
import os
import sys

from sklearn.exceptions import ConvergenceWarning as _SklearnConvergenceWarning

#: Frames a warning skips: dkern's, and contextlib's (decorators such as worker_failures).
_INSIDE = (os.path.dirname(os.path.abspath(__file__)) + os.sep, contextlib.__file__)


class DkernError(ValueError):
    """Base class of dkern's own errors."""


class StoreError(DkernError):
    """A Zarr store is missing, damaged, or not what dkern expected."""


class CorruptChunkError(StoreError):
    """A chunk failed its checksum, or a chunk the manifest lists is missing."""


class MemoryLimitError(DkernError):
    """A task of the requested work would need more memory than a worker may give it."""


class NotPositiveDefiniteError(DkernError):
    """An operator that must be symmetric positive definite is not (numerically)."""


class WorkerFailureError(DkernError):
    """A task killed every Dask worker that ran it (``distributed.KilledWorker``).

    The message names the task's block and its row ranges; the ``KilledWorker`` is
    chained as ``__cause__``. Attributes: ``key`` (the task's key), ``layer`` (the
    key's prefix, e.g. ``"dk-gram-mv-<token>"``) and ``rows`` (a mapping of
    side label to the ``(start, stop)`` row range of the block, empty when the key is
    not one of dkern's block tasks).
    """

    def __init__(self, message: str, key: object = None, layer: str = "",
                 rows: dict[str, tuple[int, int]] | None = None) -> None:
        super().__init__(message)
        self.key, self.layer, self.rows = key, layer, dict(rows or {})


class LostDataError(DkernError):
    """Arrays a computation needs were persisted on a Dask cluster that no longer holds
    them: their client was closed, or the workers holding them died (distributed's
    ``FutureCancelledError``, "lost dependencies", chained as ``__cause__``)."""


class SchedulerLostError(DkernError):
    """The Dask client lost its scheduler while a computation ran or waited: distributed
    tried to reconnect for ``distributed.comm.timeouts.connect``, then cancelled the
    computation (its ``FutureCancelledError`` is chained as ``__cause__``)."""


class ConvergenceWarning(_SklearnConvergenceWarning):
    """An iterative solver stopped before reaching its tolerance.

    A subclass of :class:`sklearn.exceptions.ConvergenceWarning` (itself a
    ``UserWarning``): filters set for scikit-learn's warning apply to dkern's.
    """


def caller_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the calling function that points the
    warning at the first frame outside dkern (the user's call), however deep the call."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level
