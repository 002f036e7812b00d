"""Exact fixed-radius neighbours: the training rows within a radius, regression and votes.

Every (query chunk × training chunk) pair computes its exact distances tile by tile and
keeps the rows within the radius (:func:`dkern.operators.reductions.radius_neighbors`);
the per-row lists are merged across training chunks. The lists come back to the client:
their size is the answer's (rows × neighbours each), whatever the training data's.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from .._failures import worker_failures
from ..backends import resolve_backend
from ..backends.keops_backend import log_fallback_once
from ..io import Rows
from ..operators import data_rows
from ..operators.reductions import radius_neighbors
from ._labels import labelled_fit, labelled_output, labelled_score
from ._model_file import DeclaredState
from ._validation import (
    check_choice,
    check_X,
    finite_number,
)
from .neighbors import (
    LABELS_FILE,
    TARGETS_FILE,
    _inverse_distance,
    checked_metric,
    held_labels,
    held_rows,
    held_targets,
)


class _RadiusNeighbors(DeclaredState, BaseEstimator):
    """Shared code: the rows within ``radius``, exact, by scikit-learn's metrics."""

    def __init__(self, radius: float = 1.0, *, weights: str = "uniform", p: float = 2,
                 metric: str = "minkowski", backend: str = "auto") -> None:
        self.radius = radius
        self.weights = weights
        self.p = p
        self.metric = metric
        self.backend = backend

    def _fit_rows(self, X: Any) -> Any:
        _check_radius(self.radius)
        return held_rows(self, X)

    @labelled_output("distance", "index")
    def radius_neighbors(self, X: Rows | None = None, radius: float | None = None,
                         return_distance: bool = True, sort_results: bool = False) -> Any:
        """The training rows within ``radius`` of each row of X, as scikit-learn's.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array or (url, path), shape (m, d), optional
            None: the training rows, each without itself.
        radius : float, optional
            Default ``self.radius``.
        return_distance : bool, default=True
        sort_results : bool, default=False
            Each row's neighbours by ascending distance (ties by index); else by index.

        Returns
        -------
        distances : ndarray of shape (m,), object (if ``return_distance``)
            Per row, the neighbours' exact distances (float64).
        indices : ndarray of shape (m,), object
            Per row, their rows of ``X_fit_`` (int64). In memory whatever X is.

        For xarray X, DataArrays of these along X's sample dimension, with its coordinates.
        """
        return self._within(X, radius, return_distance, sort_results)

    @worker_failures()
    def _within(self, X: Rows | None, radius: float | None, return_distance: bool,
                sort_results: bool) -> Any:
        """:meth:`radius_neighbors` of X as the search takes it (not xarray)."""
        check_is_fitted(self, "X_fit_")
        if sort_results and not return_distance:
            raise ValueError("return_distance must be True if sort_results is True.")
        r = _check_radius(self.radius if radius is None else radius)
        itself = X is None
        Xv = self.X_fit_ if itself else check_X(self, X, reset=False)
        metric, p = checked_metric(self.metric, self.p)
        backend = resolve_backend(self.backend)
        if backend != "numpy":
            log_fallback_once("radius neighbours", "the radius search has a numpy block only",
                              backend=backend)
        lists = radius_neighbors(data_rows(Xv, name="X"), data_rows(self.X_fit_, name="X_fit"),
                                 r, metric=metric, p=p).compute()[:, 0]
        dist, ind = np.empty(len(lists), object), np.empty(len(lists), object)
        for row, hits in enumerate(lists):
            if itself:
                hits = hits[hits["index"] != row]
            if sort_results:
                hits = hits[np.lexsort((hits["index"], hits["dist"]))]
            dist[row], ind[row] = hits["dist"].copy(), hits["index"].copy()
        return (dist, ind) if return_distance else ind

    def radius_neighbors_graph(self, X: Rows | None = None, radius: float | None = None,
                               mode: str = "connectivity",
                               sort_results: bool = False) -> scipy.sparse.csr_matrix:
        """The rows within ``radius`` as a sparse graph (m, n_samples_fit_), as
        scikit-learn's: entries 1 (``"connectivity"``) or the distances (``"distance"``)."""
        check_choice(mode, "mode", ("connectivity", "distance"))
        # the lists as arrays: a sparse graph has no coordinates to give DataArrays
        dist, ind = self._within(X, radius, True, sort_results)
        counts = np.array([len(i) for i in ind], dtype=np.int64)
        cols = np.concatenate([*ind, np.empty(0, np.int64)])
        data = np.ones(len(cols)) if mode == "connectivity" else \
            np.concatenate([*dist, np.empty(0)])
        return scipy.sparse.csr_matrix((data, cols, np.concatenate([[0], np.cumsum(counts)])),
                                       shape=(len(ind), self.n_samples_fit_))

    def _neighbour_weights(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """(indices, weights) of each row's neighbours (object arrays; weights as
        scikit-learn's)."""
        dist, ind = self._within(X, None, True, False)
        weights = np.empty(len(dist), object)
        for row, d in enumerate(dist):
            weights[row] = np.ones(len(d)) if self.weights == "uniform" or not len(d) \
                else _inverse_distance(d[None])[0]
        return ind, weights


class RadiusNeighborsRegressor(RegressorMixin, _RadiusNeighbors):
    """Regression by the (optionally distance-weighted) mean target of the training rows
    within a radius, as scikit-learn's ``RadiusNeighborsRegressor``: a row with none is
    predicted NaN, with a warning.

    Parameters
    ----------
    radius : float, default=1.0
    weights : {"uniform", "distance"}, default="uniform"
    p, metric
        As :class:`dkern.KNeighborsRegressor`'s.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        Checked as elsewhere; the radius search is numpy's on every backend.

    Attributes
    ----------
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
    y_fit_ : ndarray of shape (n,) or (n, T)
    n_samples_fit_, n_features_in_ : int
    """

    score = labelled_score(RegressorMixin.score)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    @labelled_fit
    def fit(self, X: Rows, y: Rows) -> RadiusNeighborsRegressor:
        """Keep the training rows and targets (held in memory)."""
        return held_targets(self, X, y)

    @labelled_output("prediction")
    def predict(self, X: Rows) -> Any:
        """The neighbours' (weighted) mean target per row of X; shape (m,) or (m, T). For
        xarray X, a DataArray along its sample dimension, with its coordinates."""
        check_is_fitted(self, "y_fit_")
        ind, w = self._neighbour_weights(X)
        y2 = self.y_fit_.reshape(len(self.y_fit_), -1)
        pred = np.full((len(ind), y2.shape[1]), np.nan)
        for row, (i, wi) in enumerate(zip(ind, w, strict=True)):
            if len(i):
                pred[row] = wi @ y2[i] / wi.sum()
        if np.isnan(pred[:, 0]).any():
            warnings.warn("One or more samples have no neighbors within specified radius; "
                          "predicting NaN.", UserWarning, stacklevel=2)
        return pred[:, 0] if self.y_fit_.ndim == 1 else pred

    _model_file = TARGETS_FILE


class RadiusNeighborsClassifier(ClassifierMixin, _RadiusNeighbors):
    """Classification by the (optionally distance-weighted) vote of the training rows
    within a radius, as scikit-learn's ``RadiusNeighborsClassifier``.

    Parameters
    ----------
    radius : float, default=1.0
    weights : {"uniform", "distance"}, default="uniform"
    outlier_label : label, "most_frequent" or None, default=None
        The class of a row with no training row within the radius; None refuses such
        rows (ValueError naming them), as scikit-learn does.
    p, metric, backend
        As :class:`RadiusNeighborsRegressor`'s.

    Attributes
    ----------
    X_fit_ : ndarray or dask.array.Array of shape (n, d)
    classes_ : ndarray of shape (n_classes,)
    y_codes_ : ndarray of shape (n,)
    n_samples_fit_, n_features_in_ : int
    """

    score = labelled_score(ClassifierMixin.score)

    def __init__(self, radius: float = 1.0, *, weights: str = "uniform", outlier_label: Any = None,
                 p: float = 2, metric: str = "minkowski", backend: str = "auto") -> None:
        super().__init__(radius, weights=weights, p=p, metric=metric, backend=backend)
        self.outlier_label = outlier_label

    @labelled_fit
    def fit(self, X: Rows, y: Rows) -> RadiusNeighborsClassifier:
        """Keep the training rows and labels.

        Raises
        ------
        TypeError
            ``outlier_label`` is not one label of the classes' type (as scikit-learn).
        """
        held_labels(self, X, y)
        self._check_outlier_label()
        return self

    def _check_outlier_label(self) -> None:
        """Refuse an outlier label of another type than the classes: predictions would
        change type (ints to strings, say) whenever a batch holds an outlier."""
        label, classes = self.outlier_label, self.classes_
        if label is None or (isinstance(label, str) and label == "most_frequent"):
            return
        if np.ndim(label) != 0:
            raise TypeError(f"outlier_label must be one label, 'most_frequent' or None; got "
                            f"{label!r}.")
        if np.append(classes, label).dtype.kind != classes.dtype.kind:
            raise TypeError(
                f"outlier_label={label!r} is not of the classes' type ({classes.dtype}, e.g. "
                f"{classes.tolist()[0]!r}): the predictions of a batch with a row without "
                "neighbours would change type. Give a label of that type, or 'most_frequent'.")

    @labelled_output("probability", column_dim="class", columns="classes_")
    def predict_proba(self, X: Rows) -> Any:
        """The neighbours' (weighted) vote shares; shape (m, n_classes). A row without
        neighbours has probability 1 for ``outlier_label`` when it is a class, else 0. For
        xarray X, a DataArray (sample, class) with X's coordinates and the classes."""
        check_is_fitted(self, "y_codes_")
        ind, w = self._neighbour_weights(X)
        empty = np.array([len(i) == 0 for i in ind], dtype=bool)
        outlier = self._outlier_code(empty)
        shares = np.zeros((len(ind), len(self.classes_)))
        for row, (i, wi) in enumerate(zip(ind, w, strict=True)):
            if len(i):
                np.add.at(shares[row], self.y_codes_[i], wi)
                shares[row] /= shares[row].sum()
            elif outlier is not None:
                shares[row, outlier] = 1.0
        return shares

    @labelled_output("prediction")
    def predict(self, X: Rows) -> Any:
        """The class with the largest vote share per row of X (``outlier_label`` for rows
        without neighbours); shape (m,). For xarray X, a DataArray along its sample
        dimension."""
        shares = self.predict_proba(X)
        pred = self.classes_[shares.argmax(axis=1)]
        empty = ~shares.any(axis=1)
        if empty.any():  # outliers whose label is not a class
            value = self._outlier_value()
            try:
                dtype = np.result_type(pred.dtype, np.asarray(value).dtype)
            except TypeError:
                dtype = np.dtype(object)
            pred = pred.astype(dtype)
            pred[empty] = value
        return pred

    def _outlier_code(self, empty: np.ndarray) -> int | None:
        """Index in ``classes_`` of the outlier label (None when it is not a class);
        refuses rows without neighbours when there is no outlier label."""
        if empty.any() and self.outlier_label is None:
            raise ValueError(f"No neighbors found for test samples {np.flatnonzero(empty)}, "
                             "you can try using larger radius, giving a label for outliers, "
                             "or considering removing them from your dataset.")
        label = self._outlier_value()
        hit = np.flatnonzero(self.classes_ == label) if label is not None else []
        if empty.any() and not len(hit):
            warnings.warn(f"Outlier label {label!r} is not in training classes. All class "
                          "probabilities of outliers will be assigned with 0.", UserWarning,
                          stacklevel=3)
        return int(hit[0]) if len(hit) else None

    def _outlier_value(self) -> Any:
        if isinstance(self.outlier_label, str) and self.outlier_label == "most_frequent":
            return self.classes_[np.bincount(self.y_codes_).argmax()]
        return self.outlier_label

    _model_file = LABELS_FILE


def _check_radius(radius: Any) -> float:
    value = finite_number(radius)
    if value is None or value < 0:
        raise ValueError(f"radius must be a finite number >= 0; got {radius!r}.")
    return value
