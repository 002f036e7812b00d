"""``dkern plan`` against measured runs: predicted and measured wall time and worker memory.

    python benchmarks/plan.py               # five runs from 1e5 to 1e6 rows; writes RESULTS.md
    python benchmarks/plan.py --scale 0.05  # every size x 0.05: a smoke run, prints only

Each configuration is planned first (``dkern plan ... --json``, from a calibration made at
the start of this run) and then run (``dkern fit`` / ``dkern predict`` as subprocesses, as a
user runs them), on the embedded cluster ``dkern.connect()`` starts (one single-threaded
worker per core). Measured: the command's wall time, and the largest peak resident memory
(``VmHWM``) of its worker processes, read every 0.1 s while it runs. Falkon runs a fixed
number of iterations (``--max-iter`` with ``--tol 1e-14``), planned with ``--iterations``:
this checks the model of a pass, not the iteration estimate, which depends on the problem.

The last part is on paper: ``dkern plan`` for Falkon's TAXI size (1e9 rows, d = 9) on 8, 64
and 512 workers, from this machine's rates.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, update_section  # noqa: E402

DKERN = [sys.executable, "-m", "dkern"]
WORKERS = os.cpu_count() or 1
#: (label, command, store, options of both, options of the run only, options of the plan only)
FIT_FALKON = ["--centers", "1000", "--tol", "1e-14"]
CONFIGS = [
    ("KRR Nyström fit, M = 1,000, 15 iterations", "fit", "small",
     FIT_FALKON, ["--max-iter", "15"], ["--iterations", "15"]),
    ("KRR Nyström fit, M = 1,000, 8 iterations", "fit", "large",
     FIT_FALKON, ["--max-iter", "8"], ["--iterations", "8"]),
    ("sparse GP fit, M = 1,000", "fit", "large",
     ["--model-type", "gp", "--solver", "nystrom", "--centers", "1000"], ["--alpha", "0.01"], []),
    ("KRR Nyström predict (the model above)", "predict-krr", "large", [], [], []),
    ("sparse GP predict, mean + std", "predict-gp", "large", ["--std"], [], []),
]
#: Falkon's TAXI problem as we take it (README of this section): rows, features, centres.
TAXI_N, TAXI_D, TAXI_M, TAXI_ITERATIONS = 1_000_000_000, 9, 100_000, 10
TAXI_WORKERS, TAXI_MEMORY = (8, 64, 512), "4GB"


def dkern_json(args: list[str]) -> dict:
    """Run ``dkern ... --json`` and return its report."""
    out = subprocess.run([*DKERN, *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def peak_of_workers(process: psutil.Process, peaks: dict[int, int]) -> None:
    """Record the VmHWM of every descendant of ``process`` (its cluster's worker processes
    and their fork server; the scheduler lives in ``process`` itself)."""
    try:
        children = process.children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            with open(f"/proc/{child.pid}/status") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            continue
        peaks[child.pid] = max(peaks.get(child.pid, 0), kib * 1024)


def measured_run(args: list[str]) -> tuple[float, int, dict]:
    """Wall seconds, the largest worker peak memory (bytes) and the report of one command."""
    peaks: dict[int, int] = {}
    start = time.perf_counter()
    proc = subprocess.Popen([*DKERN, *args, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    watched = psutil.Process(proc.pid)
    while proc.poll() is None:
        peak_of_workers(watched, peaks)
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"dkern {' '.join(args)} failed: {err[-2000:]}")
    return seconds, max(peaks.values(), default=0), json.loads(out)


def command(kind: str, store: str, model: str, options: list[str]) -> list[str]:
    """The fit or predict command line (without the plan's own options)."""
    if kind == "fit":
        return ["fit", "--data", store, "--x", "X", "--y", "y", "--model", model,
                "--overwrite", *options]
    return ["predict", "--model", model, "--data", store, "--x", "X_test", "--out", "pred",
            "--overwrite", *options]


def validate(stores: dict[str, str], folder: str) -> list[list[object]]:
    """Plan, then run, each configuration; the table's rows."""
    rows, models = [], {}
    for index, (label, kind, size, both, run_only, plan_only) in enumerate(CONFIGS):
        store = stores[size]
        if kind == "fit":  # the last fit of each model type is the one its predict uses
            model = os.path.join(folder, f"model-{index}.zarr")
            models["predict-gp" if "gp" in both else "predict-krr"] = model
        else:
            model = models[kind]
        cmd = command("fit" if kind == "fit" else "predict", store, model, both)
        plan = dkern_json(["plan", *cmd, *plan_only, "--workers", str(WORKERS)])
        seconds, peak, report = measured_run([*cmd, *run_only, "--workers", str(WORKERS)])
        rows.append(_row(label, plan, seconds, peak, report))
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
    return rows


def _row(label: str, plan: dict, seconds: float, peak: int, report: dict) -> list[object]:
    """One table row: the whole command, then its work alone (the report's fit_s or
    predict_s against the plan less its start phase), then the worker memory."""
    work = report.get("fit_s", report.get("predict_s"))
    planned_work = plan["seconds"] - plan["phases"]["start"]["seconds"]
    mem = plan["worker_memory_bytes"]
    ran = report.get("n_iter")
    return [label + ("" if ran is None else f" (ran {ran})"), plan["passes"],
            f"{plan['seconds']:.1f}", f"{seconds:.1f}", f"{plan['seconds'] / seconds:.2f}",
            f"{planned_work:.1f}", f"{work:.1f}", f"{planned_work / work:.2f}",
            f"{mem / 1e6:.0f}", f"{peak / 1e6:.0f}", f"{mem / peak:.2f}" if peak else "-"]


def taxi() -> list[list[object]]:
    """``dkern plan`` of Falkon on TAXI's size for each worker count; the table's rows."""
    rows = []
    for workers in TAXI_WORKERS:
        plan = dkern_json(["plan", "fit", "--n", str(TAXI_N), "--d", str(TAXI_D),
                           "--centers", str(TAXI_M), "--iterations", str(TAXI_ITERATIONS),
                           "--workers", str(workers), "--memory-limit", TAXI_MEMORY])
        phases = plan["phases"]
        rows.append([workers, f"{plan['seconds'] / 3600:.1f}",
                     f"{phases['CG iterations']['seconds'] / TAXI_ITERATIONS / 60:.1f}",
                     f"{phases['preconditioner']['seconds'] / 3600:.1f}",
                     f"{plan['worker_memory_bytes'] / 1e9:.2f}",
                     f"{plan['client_memory_bytes'] / 1e9:.0f}",
                     "; ".join(plan["warnings"]) or "none"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every row count by this (not 1: prints only)")
    args = parser.parse_args()
    sizes = {"small": int(100_000 * args.scale), "large": int(1_000_000 * args.scale)}
    start = time.perf_counter()
    calibration = dkern_json(["plan", "--calibrate", "--workers", str(WORKERS)])
    calibrate_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="dkern-plan-bench-") as folder:
        stores = {}
        for size, n in sizes.items():
            stores[size] = os.path.join(folder, f"{size}.zarr")
            dkern_json(["make-data", "--out", stores[size], "--n", str(n), "--d", "8",
                        "--n-test", str(n if size == "large" else 0),
                        "--workers", str(WORKERS)])
        rows = validate(stores, folder)
    table = markdown_table(["configuration (n = 1e5: first row; 1e6: the others)", "passes",
                            "plan (s)", "run (s)", "ratio", "plan, work (s)", "run, work (s)",
                            "ratio", "plan worker MB", "worker peak MB", "ratio"], rows)
    paper = markdown_table(["workers", "fit (h)", "per iteration (min)",
                            "preconditioner (h)", "worker GB", "client GB", "warnings"], taxi())
    text = _section(table, paper, calibration, calibrate_s)
    print(text)
    if args.scale == 1.0:
        update_section("plan", text)


def _section(table: str, paper: str, calibration: dict, calibrate_s: float) -> str:
    measured = calibration["measured"]
    return (
        "## dkern plan: predicted against measured (`benchmarks/plan.py`)\n\n"
        f"Machine: {machine()}.\n\n"
        f"Calibration (`dkern plan --calibrate`, {calibrate_s:.0f} s): kernel M entries/s per "
        f"thread (normal matvec, d = 2/8/32) {measured['normal_matvec_M_entries_per_s']}; "
        f"store MB/s {measured['store_MB_per_s']}; client GFlop/s "
        f"{measured['client_GFlops']}; cluster {measured['cluster']}.\n\n"
        f"### Five runs, synthetic d = 8 store, LocalCluster({WORKERS} workers); each planned, "
        "then run as a subprocess\n\n"
        "Time: the whole command's wall time (imports, cluster start and stop included), then "
        "its work alone (the command's own `fit_s`/`predict_s` against the plan less its "
        "start phase). "
        "Memory: the largest worker process's peak RSS (VmHWM), against the plan's "
        "`worker_memory_bytes`.\n\n"
        f"{table}\n\n"
        f"### On paper: Falkon at TAXI's size, n = 10⁹, d = {TAXI_D}, M = {TAXI_M:,}, "
        f"{TAXI_ITERATIONS} iterations, workers of one thread and {TAXI_MEMORY}\n\n"
        "`dkern plan fit --n 1000000000 --d 9 --centers 100000 --iterations 10 --workers W "
        f"--memory-limit {TAXI_MEMORY}`, from THIS machine's rates per thread: a cluster of "
        "such cores with the store on local disks and the same round trip. TAXI as we take "
        "it: 1.15e9 rows rounded to 1e9, d = 9, M = 100,000 centres and 10 iterations (our "
        "reading of Rudi et al. 2017's TAXI setting; not checked against the paper here, its "
        "code repository has no TAXI script).\n\n"
        f"{paper}\n"
    )


if __name__ == "__main__":
    main()
