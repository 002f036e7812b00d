"""Exact k-nearest-neighbour classification and regression over the row chunks.

The Euclidean search on numpy's backend groups each training chunk's rows into tiles of
nearby rows (:mod:`dkern.backends.spatial`). For training rows held in memory the fit
computes that grouping once, as each chunk's row order (4 bytes a row, not a second copy
of the rows), and every search passes it to its blocks instead of sorting again; a loaded
model computes it when it is read back. Dask or Zarr rows are read where the work runs,
chunk by chunk, and their blocks still sort per call (an order held here for rows that
may not fit here, and a pass over them at fit, would defeat their laziness).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, NamedTuple

import dask
import dask.array as da
import numpy as np
import scipy.sparse
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..backends import resolve_backend
from ..backends.neighbors import tile_order
from ..io import Rows, as_rows
from ..operators import data_rows, pairwise_rows
from ..operators.in_process import in_process, pass_scheduler
from ..operators.reductions import nearest_neighbors
from ._labels import labelled_fit, labelled_output, labelled_score
from ._model_file import DeclaredState, FileLayout, ModelFile, samples_dim
from ._validation import (
    check_choice,
    check_labels,
    check_X,
    check_y,
    finite_number,
    in_memory,
)

WEIGHTS = ("uniform", "distance")
#: The file :func:`dkern.save` writes for a neighbours regressor: the training rows
#: (``n`` × ``d``) and targets (held in memory; "t?": (n,) or (n, t)); no kernel.
TARGETS_FILE = ModelFile(marker="y_fit_", kernel="given", dims=(samples_dim,),
                         layouts=FileLayout(arrays={"X_fit": ("n", "d"), "y_fit": ("n", "t?")},
                                            lazy=("X_fit",),
                                            scalars={"n_features_in_": "positive",
                                                     "n_samples_fit_": "positive"}))
#: ... and for a classifier: the rows and their labels as indices into ``classes_`` (JSON,
#: with its dtype).
LABELS_FILE = ModelFile(marker="y_codes_", kernel="given", dims=(samples_dim,),
                        layouts=FileLayout(arrays={"X_fit": ("n", "d"), "y_codes": ("n",)},
                                           lazy=("X_fit",),
                                           scalars={"n_features_in_": "positive",
                                                    "n_samples_fit_": "positive",
                                                    "classes_": "labels"}))
#: scikit-learn's metric names dkern computes, as (metric, p) of
#: :func:`dkern.operators.reductions.nearest_neighbors` (None: the ``p`` parameter's).
METRICS: dict[str, tuple[str, float | None]] = {
    "minkowski": ("minkowski", None), "euclidean": ("minkowski", 2), "l2": ("minkowski", 2),
    "manhattan": ("minkowski", 1), "cityblock": ("minkowski", 1), "l1": ("minkowski", 1),
    "chebyshev": ("minkowski", np.inf), "infinity": ("minkowski", np.inf),
    "cosine": ("cosine", 2)}


class _Neighbors(DeclaredState, BaseEstimator):
    """Exact k-nearest neighbours: per-chunk top-k merged across chunks.

    Of training rows at the same distance the lower index comes first (in every
    chunking); distances are exact for the indices returned (see
    :mod:`dkern.backends.neighbors`).
    """

    def __init__(self, n_neighbors: int = 5, *, weights: str = "uniform", p: float = 2,
                 metric: str = "minkowski", backend: str = "auto") -> None:
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.p = p
        self.metric = metric
        self.backend = backend

    def _fit_rows(self, X: Any) -> np.ndarray | da.Array:
        _check_k(self.n_neighbors)
        Xv = held_rows(self, X)
        self._tiles = fitted_tiles(self)
        return Xv

    def _set_file_state(self, state: dict[str, Any]) -> None:
        super()._set_file_state(state)
        self._tiles = fitted_tiles(self)  # derived from X_fit_, so not in the file

    def _tile_order(self, training: da.Array, backend: str, metric: str,
                    p: float) -> da.Array | None:
        """The fit's tile order of ``training`` (``X_fit_``'s rows as the search reads
        them), chunked like it; None where the search sorts its blocks itself."""
        tiles = getattr(self, "_tiles", None)
        if (tiles is None or tiles.chunks != training.chunks[0] or backend != "numpy"
                or (metric, p) != ("minkowski", 2.0)):
            return None
        return da.from_array(tiles.order, chunks=(tiles.chunks, 1))

    @labelled_output("distance", "index", column_dim="neighbor")
    @worker_failures()
    def kneighbors(self, X: Rows | None = None, n_neighbors: int | None = None,
                   return_distance: bool = True) -> Any:
        """The nearest training rows of each row of X.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d), optional
            None: the training rows, each without itself (as scikit-learn).
        n_neighbors : int, optional
            Default ``self.n_neighbors``.
        return_distance : bool, default=True

        Returns
        -------
        distances : ndarray of shape (m, k), float64 (if ``return_distance``)
            Ascending, exact.
        indices : ndarray of shape (m, k), int64
            Rows of ``X_fit_``. Lazy dask arrays for dask or Zarr X.
        """
        check_is_fitted(self, "X_fit_")
        k = _check_k(self.n_neighbors if n_neighbors is None else n_neighbors)
        itself = X is None
        Xv = self.X_fit_ if itself else check_X(self, X, reset=False)
        if k + itself > self.n_samples_fit_:
            raise ValueError(f"Expected n_neighbors <= n_samples_fit, but n_neighbors = "
                             f"{k + itself}, n_samples_fit = {self.n_samples_fit_}"
                             f"{' (the query is the training data itself)' if itself else ''}."
                             " Ask for fewer neighbours.")
        metric, p = checked_metric(self.metric, self.p)
        backend = resolve_backend(self.backend)
        with in_process(Xv.shape[0] * self.n_samples_fit_, Xv, self.X_fit_, name="dk-knn"):
            training = data_rows(self.X_fit_, name="X_fit")
            dist, ind = nearest_neighbors(data_rows(Xv, name="X"), training, k + itself,
                                          backend=backend, metric=metric, p=p,
                                          order=self._tile_order(training, backend, metric, p))
            if itself:
                rows = da.arange(ind.shape[0], chunks=ind.chunks[0])[:, None]
                dist, ind = _drop_self(dist, ind, rows)
            out = (dist, ind) if return_distance else (ind,)
            if not isinstance(Xv, da.Array):  # together: apart, the search would run twice
                out = dask.compute(*out, scheduler=pass_scheduler())
        return out if return_distance else out[0]

    def kneighbors_graph(self, X: Rows | None = None, n_neighbors: int | None = None,
                         mode: str = "connectivity") -> scipy.sparse.csr_matrix:
        """The k nearest training rows of each row of X as a sparse graph, as scikit-learn's.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d), optional
            None: the training rows, each without itself.
        n_neighbors : int, optional
            Default ``self.n_neighbors``.
        mode : {"connectivity", "distance"}, default="connectivity"
            Entries 1, or the neighbours' distances.

        Returns
        -------
        scipy.sparse.csr_matrix of shape (m, n_samples_fit_)
            k entries per row, in memory (m·k of them) whatever X is.
        """
        check_choice(mode, "mode", ("connectivity", "distance"))
        # as plain arrays: a sparse graph has no coordinates to give DataArrays
        dist, ind = (np.asarray(a) for a in dask.compute(*self.kneighbors(X, n_neighbors)))
        m, k = ind.shape
        data = np.ones(m * k) if mode == "connectivity" else dist.ravel()
        return scipy.sparse.csr_matrix((data, ind.ravel(), np.arange(0, m * k + 1, k)),
                                       shape=(m, self.n_samples_fit_))

    def _neighbour_weights(self, X: Any) -> tuple[Any, Any]:
        """(indices, weights) of each row's neighbours; weights as scikit-learn's."""
        dist, ind = self.kneighbors(X)
        lib = da if isinstance(ind, da.Array) else np
        if self.weights == "uniform":
            return ind, lib.ones_like(dist)
        return ind, (dist.map_blocks(_inverse_distance) if lib is da else _inverse_distance(dist))


class KNeighborsRegressor(RegressorMixin, _Neighbors):
    """k-nearest-neighbour regression: the (optionally distance-weighted) mean of the
    neighbours' targets.

    Parameters
    ----------
    n_neighbors : int, default=5
    weights : {"uniform", "distance"}, default="uniform"
        ``"distance"``: weights ``1/d``; a query at distance 0 from training rows takes
        the mean of those rows' targets (as scikit-learn).
    p : float, default=2
        Minkowski's power (>= 1; inf is Chebyshev), with ``metric="minkowski"``.
    metric : str, default="minkowski"
        As scikit-learn names them: ``"minkowski"`` (with ``p``), ``"euclidean"``/``"l2"``,
        ``"manhattan"``/``"cityblock"``/``"l1"``, ``"chebyshev"``/``"infinity"``,
        ``"cosine"`` (``1 − x̂·ẑ``). The Euclidean search has a KeOps and a Triton form;
        the other metrics compute exact distance tiles with numpy on any backend.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the search is computed: numpy's candidate tiles, or KeOps' ``KMin_ArgKMin``
        reduction (:mod:`dkern.backends.blocks`); ``"auto"`` logs its choice and reason.

    Attributes
    ----------
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
        The training rows as given (dask or Zarr rows stay lazy, read chunk by chunk).
    y_fit_ : ndarray of shape (n,) or (n, T)
        The targets, held in memory (n values: a neighbour's target is looked up).
    n_samples_fit_, n_features_in_ : int
    """

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(RegressorMixin.score)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    @labelled_fit
    def fit(self, X: Rows, y: Rows) -> KNeighborsRegressor:
        """Keep the training rows and targets (no index to build: search is exhaustive).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
        y : array-like, dask array, zarr.Array or (url, path), shape (n,) or (n, T)

        Returns
        -------
        self
        """
        return held_targets(self, X, y)

    @labelled_output("prediction")
    def predict(self, X: Rows) -> Any:
        """The neighbours' (weighted) mean target per row of X; shape (m,) or (m, T)."""
        check_is_fitted(self, "y_fit_")
        ind, w = self._neighbour_weights(X)
        y2 = self.y_fit_.reshape(len(self.y_fit_), -1)
        if isinstance(ind, da.Array):
            pred = pairwise_rows(_weighted_mean, ind, [w], width=y2.shape[1],
                                 dtype=np.float64, name="dk-knn-mean", broadcast={"y": y2})
        else:
            pred = _weighted_mean(ind, w, y=y2)
        return pred[:, 0] if self.y_fit_.ndim == 1 else pred

    _model_file = TARGETS_FILE


class KNeighborsClassifier(ClassifierMixin, _Neighbors):
    """k-nearest-neighbour classification: the (optionally distance-weighted) majority
    vote of the neighbours; a tied vote goes to the class first in ``classes_`` (as
    scikit-learn).

    Parameters
    ----------
    n_neighbors : int, default=5
    weights : {"uniform", "distance"}, default="uniform"
        ``"distance"``: votes weighted ``1/d``; a query at distance 0 from training rows
        takes those rows' votes only (as scikit-learn).
    p, metric
        As :class:`KNeighborsRegressor`'s.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How the search is computed: numpy's candidate tiles, or KeOps' ``KMin_ArgKMin``
        reduction (:mod:`dkern.backends.blocks`); ``"auto"`` logs its choice and reason.

    Attributes
    ----------
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
        The training rows as given (dask or Zarr rows stay lazy, read chunk by chunk).
    classes_ : ndarray of shape (n_classes,)
    y_codes_ : ndarray of shape (n,)
        Each training row's index into ``classes_``, held in memory.
    n_samples_fit_, n_features_in_ : int
    """

    # scikit-learn's score, taking xarray X and y as fit does
    score = labelled_score(ClassifierMixin.score)

    @labelled_fit
    def fit(self, X: Rows, y: Rows) -> KNeighborsClassifier:
        """Keep the training rows and labels.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (n, d)
        y : array-like of shape (n,)
            Class labels.

        Returns
        -------
        self
        """
        return held_labels(self, X, y)

    @labelled_output("probability", column_dim="class", columns="classes_")
    def predict_proba(self, X: Rows) -> Any:
        """The neighbours' (weighted) vote shares; shape (m, n_classes), columns as ``classes_``."""
        check_is_fitted(self, "y_codes_")
        ind, w = self._neighbour_weights(X)
        n_classes = len(self.classes_)
        if isinstance(ind, da.Array):
            return pairwise_rows(_vote_shares, ind, [w], width=n_classes, dtype=np.float64,
                                 name="dk-knn-vote", broadcast={"codes": self.y_codes_},
                                 n_classes=n_classes)
        return _vote_shares(ind, w, codes=self.y_codes_, n_classes=n_classes)

    @labelled_output("prediction")
    def predict(self, X: Rows) -> Any:
        """The class with the largest vote share per row of X; shape (m,)."""
        shares = self.predict_proba(X)
        winner = shares.argmax(axis=1)
        if isinstance(winner, da.Array):
            return da.map_blocks(self.classes_.take, winner, dtype=self.classes_.dtype)
        return self.classes_[winner]

    _model_file = LABELS_FILE


def held_rows(model: Any, X: Any) -> np.ndarray | da.Array:
    """A neighbours estimator's fit of X: its weights, metric and backend checked, the rows
    kept as given (dask or Zarr rows lazy); the checked rows."""
    check_choice(model.weights, "weights", WEIGHTS)
    checked_metric(model.metric, model.p)
    resolve_backend(model.backend)
    Xv = check_X(model, X, reset=True)
    model.X_fit_ = X if isinstance(X, da.Array) else Xv
    model.n_samples_fit_ = int(Xv.shape[0])
    return Xv


class FittedTiles(NamedTuple):
    """In-memory training rows' tile order: per row chunk of ``chunks``, its
    :func:`~dkern.backends.neighbors.tile_order`, in one (n, 1) int32 array."""

    chunks: tuple[int, ...]
    order: np.ndarray


def fitted_tiles(model: Any) -> FittedTiles | None:
    """The tile order of a fitted kNN model's ``X_fit_`` in memory, for numpy's Euclidean
    search; None for dask or Zarr rows and other metrics or backends."""
    if (not isinstance(model.X_fit_, np.ndarray) or resolve_backend(model.backend) != "numpy"
            or checked_metric(model.metric, model.p) != ("minkowski", 2.0)):
        return None
    rows = as_rows(model.X_fit_, name="X_fit", check_finite=False)  # the search's chunks
    order = da.map_blocks(tile_order, rows, dtype=np.int32, chunks=(rows.chunks[0], (1,)))
    # in memory already: sorted on this process's threads, never shipped to a cluster
    return FittedTiles(rows.chunks[0], order.compute(scheduler="threads"))


def held_targets(model: Any, X: Any, y: Any) -> Any:
    """A neighbours regressor's fit: its checked rows and its targets, held in memory."""
    Xv = model._fit_rows(X)
    model.y_fit_ = in_memory(check_y(y, Xv.shape[0], type(model).__name__))
    model._settle_at_close()
    return model


def held_labels(model: Any, X: Any, y: Any) -> Any:
    """A neighbours classifier's fit: its checked rows, ``classes_`` and each row's class."""
    Xv = model._fit_rows(X)
    labels = check_labels(y, Xv.shape[0], type(model).__name__)
    model.classes_, model.y_codes_ = np.unique(labels, return_inverse=True)
    model._settle_at_close()
    return model


def checked_metric(metric: Any, p: Any) -> tuple[str, float]:
    """(metric, p) of a neighbour search, checked: one of scikit-learn's names in
    ``METRICS``, and Minkowski's ``p`` >= 1 (inf allowed) where the name leaves it open."""
    name, power = METRICS[check_choice(metric, "metric", tuple(METRICS))]
    if power is None:
        power = finite_number(p) if p != np.inf else np.inf
        if power is None or power < 1:
            raise ValueError(f"p must be a number >= 1 (Minkowski's power: 1 Manhattan, 2 "
                             f"Euclidean, inf Chebyshev); got {p!r}.")
    return name, float(power)


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
        raise ValueError(f"n_neighbors must be an integer >= 1; got {k!r}.")
    return int(k)


def _drop_self(dist: da.Array, ind: da.Array, rows: da.Array) -> tuple[da.Array, da.Array]:
    """Remove each training row from its own k + 1 neighbours (the first if it is absent,
    as scikit-learn does when more than k rows duplicate it)."""
    keep = ind != rows
    keep = da.where(keep.all(axis=1, keepdims=True), da.arange(ind.shape[1]) > 0, keep)
    k = ind.shape[1] - 1
    return tuple(da.map_blocks(_compress, a, keep, k=k, dtype=a.dtype, chunks=(a.chunks[0], (k,)))
                 for a in (dist, ind))


def _compress(a: np.ndarray, keep: np.ndarray, k: int) -> np.ndarray:
    return a[keep].reshape(len(a), k)


def _inverse_distance(dist: np.ndarray) -> np.ndarray:
    """Weights ``1/d``; rows with a neighbour at distance 0 weigh those neighbours 1, others 0."""
    with np.errstate(divide="ignore"):
        w = 1.0 / dist
    exact = np.isinf(w).any(axis=1)
    w[exact] = np.isinf(w[exact])
    return w


def _weighted_mean(ind: np.ndarray, w: np.ndarray, *, y: np.ndarray) -> np.ndarray:
    """``Σ w y[ind] / Σ w`` per row; shape (m, T)."""
    return np.einsum("mk,mkt->mt", w, y[ind]) / w.sum(axis=1, keepdims=True)


def _vote_shares(ind: np.ndarray, w: np.ndarray, *, codes: np.ndarray,
                 n_classes: int) -> np.ndarray:
    """Each class's share of the weighted votes per row; shape (m, n_classes)."""
    votes = np.zeros((len(ind), n_classes))
    np.add.at(votes, (np.arange(len(ind))[:, None], codes[ind]), w)
    return votes / votes.sum(axis=1, keepdims=True)
