"""dkern's exceptions and warnings.

Every error is a ``ValueError`` subclass (or ``TypeError`` for wrong types), so
callers that catch ``ValueError`` keep working; the subclasses let callers tell
store damage from bad arguments. ``ConvergenceWarning`` is scikit-learn's, so
``warnings.filterwarnings`` and scikit-learn's tooling treat dkern's like its own.
"""

from sklearn.exceptions import ConvergenceWarning as _SklearnConvergenceWarning


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


class ConvergenceWarning(_SklearnConvergenceWarning):
    """An iterative solver stopped before reaching its tolerance.

    A subclass of :class:`sklearn.exceptions.ConvergenceWarning` (itself a
    ``UserWarning``): filters set for scikit-learn's warning apply to dkern's.
    """
