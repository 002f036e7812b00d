"""Checkpoints of iterative solves: the loop's state saved to Zarr every k iterations.

A checkpoint is a dkern store (:func:`dkern.io.write_arrays`: versioned, checksummed,
published atomically by one pointer update), so a solve killed at any moment leaves
the previous checkpoint complete. It holds

* the vectors of block CG, ``X`` (iterate), ``R`` (residual), ``P`` (direction) and
  ``S = A P``, and the residual ``history``, as arrays;
* the per-column scalars and flags, the iteration and the replacement record in its
  attributes, floats written exactly (``float.hex``), so a resumed solve takes the very
  steps an uninterrupted one takes: on the same chunking the result is bitwise equal;
* the problem's fingerprint: dask names of the data, the operator and preconditioner
  applied to the right-hand side (deterministic for Zarr inputs, tokens of the data
  for numpy ones, and carrying the kernel, its parameters and alpha), and the solver
  settings. A checkpoint of another problem is refused, never resumed.

Continuing from the arrays read back also cuts the lineage Dask keeps: without it the
scheduler holds every iteration's tasks (each iteration's vectors depend on the
previous ones, and Dask keeps that chain to recompute lost results), growing by tens
of tasks per iteration. Without a checkpoint nothing cuts it: a cut without durable
storage would leave a lost worker's results unrecoverable.

When the solve ends the checkpoint is marked complete and kept (the returned persisted
solution is recomputed from it if a worker holding it is lost); a later solve at the
same location starts afresh, and :func:`remove_checkpoint` deletes it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import dask
import dask.array as da
import numpy as np

from ..errors import DkernError
from ..io import filesystem, open_array, read_attrs, remove_store, write_arrays
from ._checks import integer

logger = logging.getLogger(__name__)

#: Default iterations between checkpoints: a write of four n-vectors per 50 passes over n².
CHECKPOINT_EVERY = 50
_KEY = "dkern_checkpoint"
_FORMAT = 1


class Checkpoint:
    """Where one solve saves its state, and resumes from.

    Parameters
    ----------
    url : str or os.PathLike
        A local folder or fsspec URL, reachable from the client and every worker.
    every : int
        Iterations between checkpoints.
    fingerprint : dict of str to str
        Tokens naming the problem, part by part (data, operator, settings, ...).
    solver : str
        ``"cg"`` or ``"falkon"``, for messages.
    """

    def __init__(self, url: Any, every: int, fingerprint: dict[str, str], solver: str) -> None:
        self.url = os.fspath(url)
        self.every = integer(every, "checkpoint_every")
        self.fingerprint, self.solver = fingerprint, solver
        self.writes: list[float] = []  # seconds per write, for benchmarks

    def due(self, k: int) -> bool:
        return k % self.every == 0

    def load(self) -> dict[str, Any] | None:
        """The saved state of this problem, or None to start afresh (logged why)."""
        meta = self._meta()
        if meta is None:
            return None
        if meta.get("complete"):
            logger.info("checkpoint %r holds a completed %s solve; starting afresh",
                        self.url, meta.get("solver"))
            return None
        differ = sorted(k for k in {**meta["fingerprint"], **self.fingerprint}
                        if meta["fingerprint"].get(k) != self.fingerprint.get(k))
        if differ:
            raise DkernError(
                f"checkpoint {self.url!r} holds an unfinished {meta.get('solver')} solve of "
                f"another problem (its {', '.join(differ)} differ from this one's), so it "
                "cannot be resumed. Pass another checkpoint location, or delete that one "
                "(dkern.solvers.remove_checkpoint) to start afresh.")
        logger.info("resumed from iteration %d of the %s checkpoint %r", meta["iteration"],
                    self.solver, self.url)
        return meta

    def vectors(self, names: list[str], like: Any) -> dict[str, Any]:
        """The saved vectors, chunked like ``like`` (dask, persisted) or in memory (numpy)."""
        got = {name: open_array(self.url, name) for name in names}
        if isinstance(like, da.Array):
            return dict(zip(got, dask.persist(*(v.rechunk(like.chunks) for v in got.values())),
                            strict=True))
        return dict(zip(got, dask.compute(*got.values()), strict=True))

    def history(self) -> np.ndarray:
        return open_array(self.url, "history").compute()

    def save(self, vectors: dict[str, Any], history: np.ndarray, state: dict[str, Any]) -> None:
        """Publish a new checkpoint (replacing the previous one at once)."""
        start = time.perf_counter()
        write_arrays(self.url, {**vectors, "history": history}, overwrite=True,
                     replace_all=True,
                     attrs={_KEY: self._attrs(state, sorted(vectors), complete=False)})
        self.writes.append(time.perf_counter() - start)
        logger.debug("checkpoint of iteration %d written to %r in %.2f s", state["iteration"],
                     self.url, self.writes[-1])

    def complete(self, history: np.ndarray, state: dict[str, Any]) -> None:
        """Mark the checkpoint of a finished solve complete (its vectors are kept)."""
        if self._meta() is None:  # ended before its first checkpoint
            return
        write_arrays(self.url, {"history": history}, overwrite=True,
                     attrs={_KEY: self._attrs(state, [], complete=True)})

    def _attrs(self, state: dict[str, Any], arrays: list[str], complete: bool) -> dict:
        return {"format": _FORMAT, "solver": self.solver, "fingerprint": self.fingerprint,
                "complete": complete, "arrays": arrays, **encode(state)}

    def _meta(self) -> dict[str, Any] | None:
        """The checkpoint's attributes; None when there is none; an error for other stores."""
        fs, path = filesystem(self.url)
        if not fs.exists(path) or (fs.isdir(path) and not fs.ls(path)):
            return None
        try:
            meta = read_attrs(self.url).get(_KEY)
        except DkernError:
            meta = None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise DkernError(
                f"checkpoint={self.url!r} exists and is not a dkern checkpoint; dkern writes "
                "checkpoints to a location of their own (and replaces what is there). Pass a "
                "new or empty folder.")
        return meta


def check_checkpoint(checkpoint: Any, every: Any) -> None:
    """Refuse a ``checkpoint`` that is not a location, or a ``checkpoint_every`` < 1."""
    if checkpoint is not None and not isinstance(checkpoint, str | os.PathLike):
        raise TypeError(f"checkpoint must be a folder or fsspec URL (str or path-like) or "
                        f"None; got {type(checkpoint).__name__}. Pass e.g. 'fit.ckpt'.")
    integer(every, "checkpoint_every", hint=" It counts iterations between checkpoints.")


def check_checkpoint_location(url: Any) -> None:
    """Refuse, before any work, a ``url`` holding something other than a dkern checkpoint.

    Raises
    ------
    DkernError
        As a fit writing or removing its checkpoints there would, only later.
    """
    Checkpoint(os.fspath(url), 1, {}, "")._meta()


def remove_checkpoint(url: Any) -> None:
    """Delete the checkpoint at ``url`` (nothing if there is none): what dkern wrote there;
    anything else in its folder stays, and the folder with it.

    Raises
    ------
    DkernError
        ``url`` holds something other than a dkern checkpoint (it is left alone).
    """
    url = os.fspath(url)
    if Checkpoint(url, 1, {}, "")._meta() is not None:
        remove_store(url)
        logger.info("removed checkpoint %r", url)


def encode(state: dict[str, Any]) -> dict[str, Any]:
    """Solver state as JSON: float arrays as ``float.hex`` lists (exact, inf included)."""
    return {name: _encode(value) for name, value in state.items()}


def decode(meta: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {name: _decode(meta[name]) for name in names}


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return {"f": [float(v).hex() for v in value.ravel()]}
    if isinstance(value, np.ndarray):
        return {"b": value.ravel().tolist()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "f" in value:
        return np.array([float.fromhex(v) for v in value["f"]])
    if isinstance(value, dict) and "b" in value:
        return np.array(value["b"], dtype=bool)
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value
