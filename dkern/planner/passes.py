"""The passes each solver makes, counted from its code, as :class:`~.costs.Phase` lists.

* Falkon (:mod:`dkern.solvers.falkon`): centres drawn (a read pass), ``K_nm`` cached on the
  workers or X persisted (``cache_blocks``), the sketched preconditioner on the client
  (``falkon_factors``: two M × M Cholesky factors, a triangular solve and a product over s
  sample rows), ``K_nmᵀ y`` (a pass), then per CG iteration one normal-matvec pass; a true
  residual before stopping, one every 50 steps, and the normal residual after (a pass each).
* The sparse GP (:mod:`dkern.solvers.sgpr`): centres, ``chol(K_uu)``, ONE statistics pass
  (per row: M kernel values, a whitening solve and a rank update, each M² flops), then M × M
  factorisations on the client.
* CG on ``K + alpha I`` (:mod:`dkern.solvers.cg`, :mod:`~dkern.solvers.preconditioners`):
  RPCholesky's pivot steps (a pass of ``block`` kernel columns each), then per iteration a
  Gram matvec over every chunk pair: n² kernel values.
* Exact (:mod:`dkern.solvers.exact`): X on the client, n² kernel values and an n³/3 Cholesky.
* Predictions: a pass over the test rows, M kernel values a row (Nyström) or n (exact, CG),
  plus the sparse GP's two whitening solves a row when it gives variances.
"""

from __future__ import annotations

import math

from ..operators.memory import TILE_OVERHEAD
from ..solvers.falkon import KNM_CACHE_BYTES, sketch_size
from ..solvers.preconditioners import FACTOR_VALUES_PER_PIVOT, RPCHOLESKY_STEPS
from ..solvers.sgpr import WHITENING_TILE_BYTES
from .costs import (
    FLOAT,
    Cluster,
    Data,
    Phase,
    pass_seconds,
    persist_budget,
    read_task_bytes,
    row_pass,
    task_budget,
)
from .rates import Rates

__all__ = ["cg_phases", "exact_phases", "falkon_phases", "predict_phases", "sgpr_phases"]

#: CG steps between true-residual refreshes in float64 (``REFRESH_EVERY``, ``refresh_every``).
REFRESH_EVERY = 50
#: Partial results a worker holds while a tree reduction combines them (dask's split_every).
HELD_PARTIALS = 4
#: Copies of a whitening tile a sparse-GP task holds at once: the kernel tile, A, and Aᵀ.
WHITENING_COPIES = 3
#: Vectors of n rows CG keeps persisted per right-hand side: B, x, r, p, A p, and P r.
CG_VECTORS = 6


def falkon_phases(data: Data, M: int, iterations: int, cluster: Cluster,
                  rates: Rates) -> tuple[list[Phase], dict[str, int], int]:
    """Falkon's phases, one worker's memory by part, and the client's memory.

    ``K_nm`` is cached when it and X fit ``min(KNM_CACHE_BYTES, persist budget)`` and a
    task making one row block fits a worker (``NystromOperator.cache_blocks``); then each
    pass multiplies cached blocks (memory-bound BLAS) instead of evaluating the kernel.
    """
    knm = data.n * M * FLOAT
    budget = min(KNM_CACHE_BYTES, persist_budget(cluster))
    cached = (knm + data.nbytes <= budget
              and read_task_bytes(data, M) <= task_budget(cluster, rates))
    persisted = cached or data.nbytes <= budget
    if cached:
        per_pass = M / rates.cached_normal_entries_per_s
        normal, transpose, entries = per_pass, per_pass / 2, 0
        prepare = row_pass("cache K_nm", data, cluster, rates,
                           M * rates.per_entry("kernel_block", data.d), entries_per_row=M,
                           note="K_nm computed once and kept on the workers")
    else:
        normal = M * rates.per_entry("normal_matvec", data.d)
        transpose, entries = M * rates.per_entry("kernel_matvec", data.d), M
        prepare = row_pass("persist X", data, cluster, rates, 0.0,
                           note="X kept on the workers") if persisted else \
            Phase("persist X", 0.0, note="X is over the persist budget: every pass re-reads "
                                         "it from the store")
    on_store = not persisted
    loop_client = 5 * M * M * FLOAT * data.targets / rates.client_bytes_per_s
    phases = [
        row_pass("centres", data, cluster, rates, 0.0, note=f"{M} rows drawn uniformly"),
        prepare,
        _falkon_sketch(data, M, cluster, rates, read=on_store),
        row_pass("K_nm^T y", data, cluster, rates, transpose, entries_per_row=entries,
                 read=on_store),
        _with_client(row_pass("CG iterations", data, cluster, rates, normal,
                              entries_per_row=entries, read=on_store, count=iterations,
                              note=f"{iterations} iterations, one normal-matvec pass each"),
                     iterations * loop_client),
        row_pass("residuals", data, cluster, rates, normal, entries_per_row=entries,
                 read=on_store, count=2 + (iterations - 1) // REFRESH_EVERY,
                 note="true residual before stopping (and every 50 steps), normal residual"),
    ]
    held = data.chunks_per_worker(cluster) * data.chunk_rows * FLOAT
    # a cached row block is made in place by its task and then kept: counted once, resident
    memory = {"resident": held * (data.d + (M if cached else 0)) if persisted else 0,
              "tasks": cluster.threads * read_task_bytes(data),
              "matrices": M * (data.d + data.targets) * FLOAT}
    return phases, memory, 4 * M * M * FLOAT + M * data.d * FLOAT


def _falkon_sketch(data: Data, M: int, cluster: Cluster, rates: Rates, *,
                   read: bool) -> Phase:
    """``falkon_factors`` on the client: K_mm and its Cholesky, s sample rows gathered, their
    kernel block against the centres, ``T⁻ᵀ K_smᵀ`` (s·M² flops), ``W Wᵀ`` (2·s·M²) and A's
    Cholesky."""
    s = sketch_size(data.n, M)
    gather = row_pass("", data, cluster, rates, 0.0, read=read).seconds if s > M else 0.0
    rows = s if s > M else M
    kernel = (M * M + (rows if s > M else 0) * M) * rates.per_entry("kernel_block", data.d)
    flops = 2 * M**3 / 3 / rates.client_cholesky_flops + 3 * rows * M * M / rates.client_flops
    return Phase("preconditioner", gather + kernel + flops, int(s > M), M * M + rows * M,
                 note=f"sketch of s = {s} rows, two M x M Cholesky factors on the client")


def _with_client(phase: Phase, seconds: float) -> Phase:
    """``phase`` with ``seconds`` of client work (M-sized, between passes) added."""
    return Phase(phase.name, phase.seconds + seconds, phase.passes, phase.entries,
                 phase.bytes_read, phase.note)


def sgpr_phases(data: Data, M: int, cluster: Cluster,
                rates: Rates) -> tuple[list[Phase], dict[str, int], int]:
    """The sparse GP's phases (``optimizer=None``: one statistics pass), a worker's memory
    by part, and the client's memory."""
    entry = rates.per_entry("kernel_block", data.d)
    per_row = M * entry + M * M / rates.sgpr_statistics_units_per_s
    factor = M * M * entry + M**3 / 3 / rates.client_cholesky_flops
    phases = [
        row_pass("centres", data, cluster, rates, 0.0, note=f"{M} rows drawn uniformly"),
        Phase("K_uu factor", factor, entries=M * M),
        row_pass("statistics", data, cluster, rates, per_row, entries_per_row=M,
                 note="one pass: whitened K_un K_nu and K_un y"),
        Phase("posterior", 3 * M**3 / 3 / rates.client_cholesky_flops,
              note="M x M factorisations on the client"),
    ]
    partial = M * (M + data.targets) * FLOAT
    memory = {"tasks": cluster.threads * (read_task_bytes(data) + _whitening_bytes(M)
                                          + M * M * FLOAT + partial),
              "matrices": M * M * FLOAT + M * data.d * FLOAT,
              "partials": min(data.chunks_per_worker(cluster), HELD_PARTIALS) * partial}
    return phases, memory, 6 * M * M * FLOAT


def _whitening_bytes(M: int) -> int:
    """Bytes of the whitening tiles of one sparse-GP task (``whitening_rows``: at least 256
    rows, else ``WHITENING_TILE_BYTES`` a tile)."""
    return WHITENING_COPIES * max(256 * M * FLOAT, WHITENING_TILE_BYTES)


def cg_phases(data: Data, iterations: int, rank: int, cluster: Cluster,
              rates: Rates) -> tuple[list[Phase], dict[str, int], int]:
    """CG on ``K + alpha I`` with the RPCholesky preconditioner of ``rank`` pivots: its
    phases, a worker's memory by part, and the client's memory."""
    block = max(16, -(-rank // RPCHOLESKY_STEPS))
    steps = math.ceil(rank / block)
    pivots = row_pass("preconditioner", data, cluster, rates,
                      block * rates.per_entry("kernel_block", data.d), entries_per_row=block,
                      count=steps, note=f"RPCholesky: {steps} steps of {block} pivots")
    pivots = _with_client(pivots, 2 * steps * rates.round_trip_seconds)
    per_entry = rates.per_entry("kernel_matvec", data.d)
    pair = [(a * b * per_entry, m * k) for a, m in data.chunks for b, k in data.chunks]
    matvec = pass_seconds(pair, cluster, rates) + rates.round_trip_seconds
    refreshes = 1 + (iterations - 1) // REFRESH_EVERY
    square = float(data.n) ** 2
    phases = [pivots,
              Phase("CG iterations", (iterations + refreshes) * matvec, iterations + refreshes,
                    (iterations + refreshes) * square,
                    note=f"{iterations} iterations and {refreshes} true residual(s), n^2 "
                         "kernel values each")]
    held = data.chunks_per_worker(cluster) * data.chunk_rows * FLOAT
    memory = {"resident": held * (rank + CG_VECTORS * data.targets),
              "tasks": cluster.threads * (read_task_bytes(data, FACTOR_VALUES_PER_PIVOT * rank)
                                          + read_task_bytes(data))}
    return phases, memory, rank * rank * FLOAT * 4


def exact_phases(data: Data, cluster: Cluster,
                 rates: Rates) -> tuple[list[Phase], dict[str, int], int]:
    """The dense solve on the client: X gathered, ``K`` (n² entries) and its Cholesky."""
    n = data.n
    phases = [row_pass("gather X", data, cluster, rates, 0.0),
              Phase("kernel matrix", n * n * rates.per_entry("kernel_block", data.d),
                    entries=float(n) ** 2, note="on the client"),
              Phase("Cholesky", n**3 / 3 / rates.client_cholesky_flops, note="on the client")]
    memory = {"tasks": cluster.threads * read_task_bytes(data)}
    return phases, memory, 2 * n * n * FLOAT


def predict_phases(test: Data, columns: int, kind: str, cluster: Cluster,
                   rates: Rates) -> tuple[list[Phase], dict[str, int], int]:
    """A prediction pass over the test rows against ``columns`` centres (``kind``
    ``"nystrom"``, or ``"sgpr"`` for the sparse GP, mean and variance) or training rows
    (``"expansion"``: exact and CG models' means), written to the store."""
    out_row = (test.targets + (kind == "sgpr")) * FLOAT / rates.write_bytes_per_s
    entry = rates.per_entry("kernel_block" if kind == "sgpr" else "kernel_matvec", test.d)
    per_row = columns * entry + out_row
    if kind == "sgpr":
        per_row += columns * columns / rates.sgpr_predict_units_per_s
    note = {"nystrom": f"K(X*, centres) @ beta, {columns} centres",
            "sgpr": f"mean and variance, two M x M whitening solves a row, M = {columns}",
            "expansion": f"K(X*, X_fit) @ dual_coef over {columns} training rows"}[kind]
    phases = [row_pass("predict", test, cluster, rates, per_row, entries_per_row=columns,
                       note=note)]
    tile = _whitening_bytes(columns) if kind == "sgpr" else TILE_OVERHEAD
    out = test.chunk_rows * (test.targets + 1) * FLOAT
    memory = {"tasks": cluster.threads * (read_task_bytes(test) + tile + 2 * out),
              "matrices": (2 * columns * columns * FLOAT if kind == "sgpr" else 0)
              + columns * (test.d + test.targets) * FLOAT}
    return phases, memory, columns * (test.d + test.targets) * FLOAT
