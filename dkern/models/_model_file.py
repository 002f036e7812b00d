"""What a fitted model's file holds, declared once on each estimator class.

Each estimator class states its file as a :class:`ModelFile` (its ``_model_file`` class
attribute): per solver, the arrays with their dimensions and the JSON scalars with their
kinds, and how its kernel is stored. :class:`DeclaredState`, a base of every estimator,
gives the fitted state the declaration names (``_file_state``) and takes it back
(``_set_file_state``); a class whose state is partly private (the GP regressor's target
scaling and posterior statistics) extends those two methods. :mod:`dkern.models.persist`
writes and reads files by walking the declaration, and :mod:`dkern.models._file_checks`
checks a file against it before any array is read.

Names: a file's array ``X_fit`` is the attribute ``X_fit_``; a scalar such as
``n_iter_`` is the attribute of that name; names a layout lists as ``private`` are
neither (the class gives and takes them itself). ``<array>_lazy`` flags say which arrays
were dask arrays when saved (they load lazily again).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import dask
import dask.array as da
import numpy as np
from dask.utils import format_bytes

from .. import _closing
from .._failures import LOST_DATA_HELP, worker_failures
from ..errors import LostDataError, StoreError
from ._validation import finite_number
from .labels import decode_classes, encode_classes

logger = logging.getLogger(__name__)

#: The most bytes of cluster-held arrays a model gathers into the client so that it
#: outlives that client (:meth:`DeclaredState._bring_home`); a larger model is saved
#: with ``dkern.save`` while its client is open (the workers write its arrays).
GATHER_MAX_BYTES = 2**30

#: A rule giving dimensions fixed by a file's attributes: ``(params, fitted)`` to
#: ``{symbol: (size, where it comes from)}``.
DimensionRule = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, tuple[int, str]]]


@dataclass(frozen=True)
class FileLayout:
    """The arrays and JSON scalars of one solver's model file.

    Parameters
    ----------
    arrays : mapping of str to tuple of str
        Each array's dimensions by symbol (``n`` rows, ``d`` features, ...), in the order
        the load checks them; a last symbol ending in ``"?"`` may be absent (1-D array).
    scalars : mapping of str to str
        The "fitted" scalars and their kinds (keys of :data:`VALUE_KINDS`).
    lazy : tuple of str
        The arrays whose ``<name>_lazy`` flag the file holds.
    private : frozenset of str
        Names that are not attributes of the estimator: its ``_file_state`` gives them
        and its ``_set_file_state`` takes them.
    optional : tuple of str
        Arrays whose attribute may be None (e.g. sample weights not given): the file
        then lacks them, and a load sets None.
    """

    arrays: Mapping[str, tuple[str, ...]]
    scalars: Mapping[str, str]
    lazy: tuple[str, ...] = ()
    private: frozenset[str] = field(default_factory=frozenset)
    optional: tuple[str, ...] = ()

    def stored(self, listed: Any) -> dict[str, tuple[str, ...]]:
        """The arrays a file must hold, with their dimensions: every one not ``optional``,
        and the optional ones its "arrays" attribute (``listed``) names."""
        names = set(listed) if isinstance(listed, list) else set()
        return {name: dims for name, dims in self.arrays.items()
                if name not in self.optional or name in names}

    def kinds(self) -> dict[str, str]:
        """Every name the file's "fitted" attribute may hold, with its kind."""
        kinds = {**self.scalars, **{f"{name}_lazy": "bool" for name in self.lazy},
                 "feature_names_in_": "strings", "sample_dim_": "str"}
        if "classes_" in self.scalars:
            kinds["classes_dtype"] = "label dtype"
        return kinds


#: "fitted" names a file may lack: feature names (fitted on arrays without them), the
#: sample dimension (fitted on other than xarray data), the bandwidth (older files).
OPTIONAL = frozenset({"feature_names_in_", "sample_dim_", "bandwidth_"})


@dataclass(frozen=True)
class ModelFile:
    """What the file of one estimator class holds.

    Parameters
    ----------
    marker : str
        The fitted attribute that marks the model as fitted (``check_is_fitted``).
    kernel : {"fitted", "learned", "given"}
        How the kernel is stored: ``"fitted"``, attribute "kernel" is ``kernel_`` (with
        "kernel_is_default"); ``"learned"``, "kernel" is the kernel given (null for the
        default) and "fitted_kernel" ``kernel_`` (hyperparameters learned); ``"given"``,
        the kernel is a parameter, its repr in "kernel" when it is a dkern kernel (null
        for a named one, and for models without a kernel).
    layouts : mapping of str to FileLayout, or a FileLayout
        The layout per fitted ``solver_``; one layout for models without solvers.
    dims : tuple of DimensionRule
        The dimensions the attributes fix (``d`` is always ``n_features_in_``).
    """

    marker: str
    kernel: str
    layouts: Mapping[str, FileLayout] | FileLayout
    dims: tuple[DimensionRule, ...] = ()

    @property
    def solvers(self) -> tuple[str, ...] | None:
        """The fitted solvers a file may name; None for models without solvers."""
        return None if isinstance(self.layouts, FileLayout) else tuple(self.layouts)

    def layout(self, solver: Any) -> FileLayout | None:
        """The layout of ``solver`` (None for a solver this model does not have)."""
        if isinstance(self.layouts, FileLayout):
            return self.layouts
        return self.layouts.get(solver) if isinstance(solver, str) else None

    def names(self, solver: Any) -> dict[str, str]:
        """The "fitted" names and kinds for ``solver``; of every solver's layout together
        when ``solver`` is not one of this model's (then the solver check refuses it)."""
        layout = self.layout(solver)
        if layout is not None:
            return layout.kinds()
        assert not isinstance(self.layouts, FileLayout)
        return {name: kind for each in self.layouts.values()
                for name, kind in each.kinds().items()}

    def known_dims(self, params: Mapping[str, Any], fitted: Mapping[str, Any]
                   ) -> dict[str, tuple[int, str]]:
        """The dimensions ``params`` and ``fitted`` fix, by symbol."""
        d = fitted["n_features_in_"]
        known = {"d": (d, f"n_features_in_ = {d} in 'fitted'")}
        for rule in self.dims:
            known.update(rule(params, fitted))
        return known


class DeclaredState:
    """The fitted state an estimator's :class:`ModelFile` declares, given and taken back.

    Estimators inherit it and set ``_model_file``; one whose layout has ``private``
    names extends both methods.
    """

    _model_file: ClassVar[ModelFile]

    def _file_layout(self) -> FileLayout:
        layout = self._model_file.layout(getattr(self, "solver_", None))
        assert layout is not None, "a fitted model has one of its declared solvers"
        return layout

    def _file_state(self) -> dict[str, Any]:
        """The fitted arrays and scalars the file holds, by file name, as Python objects
        (numpy or dask arrays; flags, numbers, strings, label arrays)."""
        layout = self._file_layout()
        state = {name: getattr(self, f"{name}_") for name in (*layout.arrays, *layout.lazy)
                 if name not in layout.private and hasattr(self, f"{name}_")}
        state.update({name: getattr(self, name) for name in (*layout.scalars, *OPTIONAL)
                      if name not in layout.private and hasattr(self, name)})
        return state

    def _set_file_state(self, state: dict[str, Any]) -> None:
        """Become the fitted model ``state`` (as :meth:`_file_state` gives it) describes;
        the estimator is built from the file's parameters, with ``kernel_`` set."""
        if "solver_" in state:  # the layout follows the solver
            self.solver_ = state["solver_"]
        layout = self._file_layout()
        for name, value in state.items():
            if name not in layout.private:
                setattr(self, f"{name}_" if name in layout.arrays else name, value)

    # ------------------------------------------- arrays held on a Dask cluster
    def _cluster_held(self, client_id: str | None = None) -> dict[str, Any]:
        """The fitted attributes that are dask arrays persisted on a Dask cluster, which
        vanish with the client holding them (a CG solution on dask or Zarr rows); with
        ``client_id``, only those that client holds."""
        return {name: value for name, value in vars(self).items()
                if name.endswith("_") and (futures := _futures(value))
                and (client_id is None or all(f.client.id == client_id for f in futures))}

    def _settle_at_close(self) -> None:
        """At the end of a fit: have :meth:`_bring_home` run before a client that
        settles its models (``dkern.connect()``'s) and holds this model's arrays closes."""
        clients = {f.client for v in self._cluster_held().values() for f in _futures(v)}
        for client in clients:
            if getattr(client, "settles_models", False):
                _closing.settle_before_close(client.id, self)

    def _bring_home(self, client_id: str | None = None) -> None:
        """Gather the cluster-held arrays (those of ``client_id`` only, if given) into
        numpy, through the client holding them, at most ``GATHER_MAX_BYTES``; what depends
        on them is rebuilt (a GP's posterior). The model is then a value: it pickles, and
        predicts after its client closes.

        Raises
        ------
        TypeError
            They are larger than ``GATHER_MAX_BYTES`` (a pickle could not hold them).
        LostDataError
            The cluster no longer holds them.
        """
        held = self._cluster_held(client_id)
        if not held:
            return
        size = sum(value.nbytes for value in held.values())
        if not size <= GATHER_MAX_BYTES:  # NaN: chunks of unknown size
            raise TypeError(
                f"{type(self).__name__}'s {', '.join(held)} ({format_bytes(size)}) are held "
                "in the memory of the Dask cluster that fitted it, more than dkern gathers "
                f"into a client ({format_bytes(GATHER_MAX_BYTES)}), so a pickle cannot hold "
                "them. Save the model with dkern.save(model, 'model.zarr') while its client "
                "is open (the workers write the arrays) and dkern.load it later.")
        client = _futures(next(iter(held.values())))[0].client
        if client.status not in ("running", "closing"):
            raise LostDataError(LOST_DATA_HELP.format(err=f"client {client.status}"))
        with worker_failures():
            values = dask.compute(*held.values(), scheduler=client)
        arrays = {name: np.ascontiguousarray(v) for name, v in zip(held, values, strict=True)}
        layout = self._file_layout()
        state = {**self._file_state(), **{name[:-1]: a for name, a in arrays.items()
                                          if name[:-1] in layout.arrays}}
        self._set_file_state(state)
        for name, a in arrays.items():
            if name[:-1] not in layout.arrays:
                setattr(self, name, a)
        logger.info("%s: gathered %s (%s) from the cluster into this process, so the model "
                    "outlives its client", type(self).__name__, ", ".join(held),
                    format_bytes(size))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its arrays in numpy: cluster-held ones are gathered into the
        pickle; the model itself keeps them on the cluster (and its posterior as built)."""
        if not self._cluster_held():
            return super().__getstate__()  # type: ignore[misc]
        twin = object.__new__(type(self))  # not copy.copy: that pickles through here
        twin.__dict__.update(self.__dict__)
        twin._bring_home()
        return super(DeclaredState, twin).__getstate__()  # type: ignore[misc]


def _futures(value: Any) -> list[Any]:
    """The distributed futures a dask array's graph holds (its persisted chunks)."""
    if not isinstance(value, da.Array) or "distributed" not in sys.modules:
        return []
    from distributed.client import futures_of

    return futures_of(value)


# ---------------------------------------------------------------- dimension rules
def centers_dim(params: Mapping[str, Any], fitted: Mapping[str, Any]
                ) -> dict[str, tuple[int, str]]:
    """``m``, the Nyström centres, when ``n_centers`` was given."""
    m = params.get("n_centers")
    if fitted.get("solver_") != "nystrom" or m is None:
        return {}
    return {"m": (m, f"n_centers = {m} in 'params'")}


def residual_rows_dim(params: Mapping[str, Any], fitted: Mapping[str, Any]
                      ) -> dict[str, tuple[int, str]]:
    """``r``, the rows of ``residuals``: one per iteration and the start."""
    r = fitted["n_iter_"] + 1
    return {"r": (r, f"n_iter_ + 1 = {r}")}


def targets_dim(params: Mapping[str, Any], fitted: Mapping[str, Any]
                ) -> dict[str, tuple[int, str]]:
    """``t``, the target columns, one mean each in ``y_train_mean``."""
    t = len(fitted["y_train_mean"])
    return {"t": (t, f"{t} target mean(s) in y_train_mean")}


def problems_dim(params: Mapping[str, Any], fitted: Mapping[str, Any]
                 ) -> dict[str, tuple[int, str]]:
    """``p``, the binary problems: 1 for two classes, one per class for more."""
    c = len(fitted["classes_"])
    if "n_classes_" in fitted and fitted["n_classes_"] != c:
        raise StoreError(f"the model's n_classes_ = {fitted['n_classes_']} but it lists {c} "
                         "classes_; they must match. The file was edited or damaged; save "
                         "the model again.")
    return {"p": (1 if c == 2 else c, f"{c} classes_")}


def samples_dim(params: Mapping[str, Any], fitted: Mapping[str, Any]
                ) -> dict[str, tuple[int, str]]:
    """``n``, the training rows, from ``n_samples_fit_``."""
    n = fitted["n_samples_fit_"]
    return {"n": (n, f"n_samples_fit_ = {n}")}


# ---------------------------------------------------------------- scalar kinds
def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def is_dtype(value: Any, kinds: str) -> bool:
    """True for a numpy dtype string whose kind is one of ``kinds``."""
    try:
        return isinstance(value, str) and np.dtype(value).kind in kinds
    except TypeError:
        return False


def _number_or_null(value: Any) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


@dataclass(frozen=True)
class ValueKind:
    """One kind of "fitted" scalar: its test and description for the load check, and
    how a value is written as JSON and read back."""

    test: Callable[[Any], bool]
    expected: str
    encode: Callable[[Any], Any] = lambda v: v
    decode: Callable[[Any], Any] = lambda v: v


#: The kinds of a model file's "fitted" scalars.
VALUE_KINDS: dict[str, ValueKind] = {
    "str": ValueKind(lambda v: isinstance(v, str), "a string"),
    "bool": ValueKind(lambda v: isinstance(v, bool), "true or false", bool),
    "count": ValueKind(lambda v: _is_count(v, 0), "an integer >= 0", int),
    "positive": ValueKind(lambda v: _is_count(v, 1), "an integer >= 1", int),
    "counts": ValueKind(lambda v: isinstance(v, list) and all(_is_count(i, 0) for i in v),
                        "a list of integers >= 0", lambda v: [int(i) for i in v],
                        lambda v: np.asarray(v, dtype=np.int64)),
    "number": ValueKind(lambda v: finite_number(v) is not None, "a finite number", float,
                        float),
    "number or null": ValueKind(lambda v: v is None or finite_number(v) is not None,
                                "a finite number or null", _number_or_null,
                                lambda v: float("nan") if v is None else float(v)),
    "numbers": ValueKind(lambda v: isinstance(v, list)
                         and all(finite_number(i) is not None for i in v),
                         "a list of finite numbers",
                         lambda v: np.asarray(v, dtype=np.float64).tolist(),
                         lambda v: np.asarray(v, dtype=np.float64)),
    "strings": ValueKind(lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
                         "a list of strings", lambda v: [str(i) for i in v],
                         lambda v: np.asarray(v, dtype=object)),
    "labels": ValueKind(lambda v: isinstance(v, list) and len(v) >= 2
                        and all(isinstance(i, str | bool) or finite_number(i) is not None
                                for i in v),
                        "a list of at least 2 labels (strings, numbers or booleans)"),
    # "O": string labels held as Python objects (pandas' str and object Series), which
    # encode_classes writes only when every label is a string
    "label dtype": ValueKind(lambda v: is_dtype(v, "biufUO"),
                             "a numpy dtype string of numbers, booleans or strings, e.g. "
                             "'<i8' ('|O' for strings held as objects)"),
}


def encode_scalars(state: Mapping[str, Any], kinds: Mapping[str, str], owner: str
                   ) -> dict[str, Any]:
    """The JSON "fitted" entries of the scalars of ``state`` that ``kinds`` names.

    Raises
    ------
    DkernError
        Labels that are not numbers, booleans or strings (JSON could not restore them).
    """
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        if name not in state:
            continue
        if kind == "labels":
            out.update(encode_classes(np.asarray(state[name]), owner))
        else:
            out[name] = VALUE_KINDS[kind].encode(state[name])
    return out


def decode_scalars(fitted: dict[str, Any], kinds: Mapping[str, str]) -> dict[str, Any]:
    """The Python values of the checked "fitted" entries (labels rebuilt with their dtype;
    ``*_lazy`` flags and ``classes_dtype`` consumed)."""
    fitted = dict(fitted)
    out = {"classes_": decode_classes(fitted)} if "classes_" in fitted else {}
    out.update({name: VALUE_KINDS[kinds[name]].decode(value) for name, value in fitted.items()
                if not name.endswith("_lazy")})
    return out
