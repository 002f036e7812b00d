"""A fit's or a prediction's plan: the solver ``"auto"`` picks, its passes, time and memory.

:func:`plan_fit` and :func:`plan_predict` resolve what the estimators would run (the
policy of :func:`dkern.models.posteriors.choose_solver`, the default number of centres of
:func:`dkern.solvers.select_centers`), add the command's start (imports and the embedded
cluster), and check the memory against the workers' limit: a warning names the option that
brings it within (row chunks, workers, threads, centres).
"""

from __future__ import annotations

import math

import psutil

from ..models.kernel_ridge import CG_PRECONDITIONER_RANK
from ..models.posteriors.policy import check_solver_fits, choose_solver
from ..operators.memory import PERSIST_FRACTION
from ..runtime.resources import PAUSE_FRACTION
from ..solvers import EXACT_MAX_N
from ..solvers.centers import MAX_DEFAULT_CENTERS
from ..solvers.falkon import DEFAULT_MAX_ITER
from .costs import (
    Cluster,
    Data,
    Phase,
    Plan,
    kept_heap_bytes,
    persist_budget,
    read_task_bytes,
    task_budget,
)
from .passes import cg_phases, exact_phases, falkon_phases, predict_phases, sgpr_phases
from .rates import Rates

__all__ = ["ITERATIONS_PER_DECADE", "SOLVERS", "default_centers", "iteration_estimate",
           "plan_fit", "plan_predict"]

SOLVERS = ("auto", "exact", "cg", "nystrom")
#: Iterations per decade of tol when none is given, from measured runs (benchmarks/RESULTS.md,
#: "Solver notes" and "KRR: iterations"): Falkon with its sketched preconditioner, and CG
#: with the rank-300 RPCholesky preconditioner. Problems differ; --iterations fixes it.
ITERATIONS_PER_DECADE = {"nystrom": 3, "cg": 5}
#: What each part of a worker's memory is changed by, for the warning.
_MEMORY_ADVICE = {
    "tasks": "smaller row chunks (--chunk-rows; a store is rewritten with dkern.io.write_array("
             "..., chunk_rows=...)) or fewer --threads per worker",
    "resident": "more --workers (the persisted blocks spread over them)",
    "matrices": "fewer centres (--centers)",
    "partials": "fewer centres (--centers)",
    "idle": "a larger --memory-limit",
    "kept heap": "fewer --threads per worker",
}


def default_centers(n: int) -> int:
    """The centres ``select_centers`` draws when none are given: ``sqrt(n)``, at most
    ``MAX_DEFAULT_CENTERS``."""
    return min(max(1, round(math.sqrt(n))), MAX_DEFAULT_CENTERS)


def iteration_estimate(solver: str, tol: float, max_iter: int | None,
                       given: int | None = None) -> tuple[int, str]:
    """CG iterations to plan for, and where the figure comes from.

    ``given`` wins; else ``ITERATIONS_PER_DECADE[solver] · log10(1 / tol)``, at most the
    solver's ``max_iter`` (Falkon's ``DEFAULT_MAX_ITER``, CG's ``min(10 n, 10,000)``).
    """
    if given is not None:
        return given, "given (--iterations)"
    cap = max_iter or DEFAULT_MAX_ITER
    estimate = math.ceil(ITERATIONS_PER_DECADE[solver] * max(1.0, math.log10(1 / tol)))
    return min(estimate, cap), (f"estimated: {ITERATIONS_PER_DECADE[solver]} per decade of tol="
                                f"{tol:g} (measured runs), at most max_iter={cap}; the real "
                                "count depends on the data, kernel and alpha: pass "
                                "--iterations to plan for another")


def plan_fit(data: Data, cluster: Cluster, rates: Rates, *, model_type: str = "krr",
             solver: str = "auto", centers: int | None = None, tol: float = 1e-6,
             max_iter: int | None = None, iterations: int | None = None) -> Plan:
    """The plan of ``dkern fit`` (``KernelRidge`` or ``GaussianProcessRegressor`` with
    ``optimizer=None``) on ``data`` and ``cluster``.

    Raises
    ------
    ValueError
        An unknown model type or solver, a non-positive tol, or a solver that cannot take n
        rows (the estimators' own refusal).
    """
    if model_type not in ("krr", "gp"):
        raise ValueError(f"model_type must be 'krr' or 'gp'; got {model_type!r}.")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}.")
    if not tol > 0:
        raise ValueError(f"tol must be > 0 (the relative residual to reach); got {tol!r}.")
    if solver == "auto":
        solver, _ = choose_solver(data.n, centers, exact_max_n=EXACT_MAX_N)
    check_solver_fits(solver, data.n, centers, exact_max_n=EXACT_MAX_N)
    M = centers or default_centers(data.n)
    notes = [f"solver {solver!r}" + (f", M = {M} centres" if solver == "nystrom" else "")]
    if solver == "nystrom" and model_type == "gp":
        phases, memory, client = sgpr_phases(data, M, cluster, rates)
    elif solver == "nystrom":
        k, source = iteration_estimate(solver, tol, max_iter, iterations)
        phases, memory, client = falkon_phases(data, M, k, cluster, rates)
        notes.append(f"iterations {k}: {source}")
    elif solver == "cg":
        cap = max_iter or min(10 * data.n, 10_000)
        k, source = iteration_estimate(solver, tol, cap, iterations)
        phases, memory, client = cg_phases(data, k, CG_PRECONDITIONER_RANK, cluster, rates)
        notes.append(f"iterations {k}: {source}")
    else:
        phases, memory, client = exact_phases(data, cluster, rates)
    plan = _finish(phases, memory, client, data, cluster, rates, notes)
    if solver == "cg":
        plan.warnings.extend(factor_warnings(data, cluster))
    return plan


def factor_warnings(data: Data, cluster: Cluster) -> list[str]:
    """The CG preconditioner's n x r factor over what the workers may keep: dkern refuses
    such a fit before it starts (:func:`dkern.operators.memory.check_persisted`)."""
    factor, budget = 8 * data.n * CG_PRECONDITIONER_RANK, persist_budget(cluster)
    if factor <= budget:
        return []
    return [f"memory: the CG preconditioner's factor, {data.n:,} x {CG_PRECONDITIONER_RANK} "
            f"float64 ({factor / 1e9:.2f} GB), is over the {budget / 1e9:.2f} GB the workers "
            f"may keep ({PERSIST_FRACTION:.0%} of their --memory-limit): dkern would refuse the "
            "run. Use more --workers, a larger --memory-limit, or --solver nystrom"]


def plan_predict(test: Data, cluster: Cluster, rates: Rates, *, kind: str,
                 columns: int) -> Plan:
    """The plan of ``dkern predict`` on ``test`` rows: ``kind`` ``"nystrom"`` (kernel ridge
    on ``columns`` centres), ``"sgpr"`` (the sparse GP's mean and variance) or
    ``"expansion"`` (an exact or CG model's mean over ``columns`` training rows)."""
    if kind not in ("nystrom", "sgpr", "expansion"):
        raise ValueError(f"kind must be 'nystrom', 'sgpr' or 'expansion'; got {kind!r}.")
    phases, memory, client = predict_phases(test, columns, kind, cluster, rates)
    return _finish(phases, memory, client, test, cluster, rates, [f"model {kind!r}"])


def _finish(phases: list[Phase], memory: dict[str, int], client: int, data: Data,
            cluster: Cluster, rates: Rates, notes: list[str]) -> Plan:
    """The plan with the command's start, the idle worker, the heap it keeps, and the memory
    warnings."""
    start = Phase("start", rates.start_seconds,
                  note="imports, the embedded cluster's start and stop (calibrated)")
    kept = {"idle": rates.worker_idle_bytes, "kept heap": kept_heap_bytes(cluster)}
    plan = Plan([start, *phases], {**kept, **memory}, client,
                cluster, assumptions=[*notes, *_assumptions(rates)])
    plan.warnings.extend(memory_warnings(plan, data, rates))
    return plan


def _assumptions(rates: Rates) -> list[str]:
    return [f"rates of this machine ({rates.machine or 'unknown'}), per worker thread, applied "
            "to the cluster described: the same speed per thread, the store on local disk",
            "kernel cost measured for a Gaussian kernel (other kernels cost more per entry)"]


def memory_warnings(plan: Plan, data: Data, rates: Rates) -> list[str]:
    """Warnings, each naming the option to change: a task over the per-task budget (dkern
    refuses the run before it starts), a worker past its pause threshold, a client whose
    matrices would not fit this machine."""
    cluster, out = plan.cluster, []
    task, budget = read_task_bytes(data), task_budget(cluster, rates)
    if task > budget:
        out.append(f"memory: one task over a row chunk of {data.chunk_rows} rows needs "
                   f"{task / 1e6:.0f} MB, over the {budget / 1e6:.0f} MB a task may take on "
                   "these workers: dkern would refuse the run on a store chunked so (rows "
                   "passed in memory to the Python API are split instead). Use smaller row "
                   "chunks (--chunk-rows), fewer --threads, or a larger --memory-limit")
    pause = PAUSE_FRACTION * cluster.memory_limit
    if plan.worker_memory_bytes > pause:
        part = max(plan.worker_memory, key=lambda k: plan.worker_memory[k])
        out.append(f"memory: a worker needs about {plan.worker_memory_bytes / 1e9:.2f} GB at "
                   f"its peak, over the {pause / 1e9:.2f} GB ({PAUSE_FRACTION:.0%} of "
                   f"--memory-limit {cluster.memory_limit / 1e9:.2f} GB) where workers pause; "
                   f"the largest part is {part!r}: use {_MEMORY_ADVICE[part]}"
                   + ("" if part == "idle" else ", or a larger --memory-limit"))
    total = psutil.virtual_memory().total
    if plan.client_memory_bytes > PAUSE_FRACTION * total:
        out.append(f"memory: the client (this process) needs about "
                   f"{plan.client_memory_bytes / 1e9:.1f} GB for its M x M (or n x n) "
                   f"matrices, more than {PAUSE_FRACTION:.0%} of this machine's "
                   f"{total / 1e9:.0f} GB: use fewer centres (--centers), or run the client "
                   "on a machine with more memory")
    return out
