"""``dkern plan``: usage errors, the report's keys, the model's scaling, the calibration file,
and one predicted time against a measured fit."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import time

import dask
import dask.array as da
import numpy as np
import pytest

from dkern.backends import block_backend
from dkern.cli import main
from dkern.kernels import Gaussian
from dkern.planner import Cluster, Data, Rates, load_rates, plan_fit, plan_predict, save_rates
from dkern.planner.rates import RATES_FILE, code_digest
from dkern.solvers import falkon

#: A made-up machine, for the tests of the model's structure (not of its figures).
FAKE = Rates(entry_seconds={"kernel_matvec": [5e-9, 1e-10], "normal_matvec": [6e-9, 1e-10],
                            "kernel_block": [5e-9, 1e-10]},
             cached_normal_entries_per_s=1e9, sgpr_statistics_units_per_s=1e10,
             sgpr_predict_units_per_s=8e9, read_bytes_per_s=2e8, write_bytes_per_s=1e8,
             client_flops=5e10, client_cholesky_flops=2e10, client_bytes_per_s=1e10,
             start_seconds=5.0, round_trip_seconds=0.05, task_seconds=0.002,
             worker_idle_bytes=200 * 2**20, machine="made up", code=code_digest())
GB = 10**9
TWO = Cluster(workers=2, threads=1, memory_limit=12 * GB)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private DKERN_CACHE_DIR holding FAKE's rates."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("DKERN_CACHE_DIR", str(folder))
    save_rates(FAKE)
    return folder


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["plan"], "fit or predict"),
    (["plan", "fit"], "--data and --x"),
    (["plan", "fit", "--n", "1000"], "--n and --d"),
    (["plan", "fit", "--n", "-5", "--d", "8"], "must be a positive integer; got -5"),
    # it said "invalid positive_int value": the helper's name, and no fix (1e6 is taken)
    (["plan", "fit", "--n", "1.5", "--d", "8"], "expected an integer such as 1000 or 1e6"),
    (["plan", "fit", "--n", "1000", "--d", "8", "--solver", "falkon"], "invalid choice: 'falkon'"),
    (["plan", "fit", "--data", "store.zarr"], "add --x"),
    (["plan", "predict", "--test-rows", "10"], "--model"),
    (["plan", "predict", "--d", "8", "--centers", "100"], "--test-rows"),
    (["plan", "fit", "--n", "10", "--d", "2", "--memory-limit", "lots"], "4GB"),
    # 1e400GB parses as an infinite size: OverflowError and a traceback before
    (["plan", "fit", "--n", "10", "--d", "2", "--memory-limit", "1e400GB"], "4GB"),
    (["plan", "fit", "--n", "10", "--d", "2", "--memory-limit", "1e20GB"], "below 9e9 GB"),
    (["plan", "fit", "--n", "10", "--d", "2", "--tol", "inf"],
     "--tol: must be a finite number > 0; got inf"),
    (["plan", "predict", "--n", "100", "--d", "2", "--test-rows", "10", "--std"],
     "--std plans a Gaussian process's standard deviations; add --model-type gp"),
    (["plan", "fit", "--n", "10", "--d", "2", "--model-type", "gp", "--optimizer", "lbfgs"],
     "--optimizer none"),
])
def test_usage_errors_exit_2_naming_the_option(argv, expected, capsys, cache):
    assert expected in _usage_error(argv, capsys)


def test_a_solver_that_cannot_take_n_rows_is_a_failure_with_the_fix(capsys, cache):
    assert main(["plan", "fit", "--n", "100000", "--d", "8", "--solver", "exact"]) == 1
    assert "Use solver='cg' or 'nystrom'" in capsys.readouterr().err


def test_json_report_keys_and_phases(capsys, cache):
    assert main(["plan", "fit", "--n", "200000", "--d", "8", "--centers", "1000",
                 "--iterations", "12", "--workers", "2", "--memory-limit", "12GB",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("seconds", "worker_memory_bytes", "passes", "entries", "bytes_read", "phases",
                "worker_memory", "warnings", "assumptions", "client_memory_bytes"):
        assert key in report
    assert report["calibrated_now"] is False
    assert report["seconds"] == pytest.approx(sum(p["seconds"] for p in report["phases"].values()),
                                              abs=0.05)
    assert report["worker_memory_bytes"] == sum(report["worker_memory"].values())
    assert report["phases"]["CG iterations"]["passes"] == 12
    # 200,000 x 1,000 float64 is 1.6 GB: K_nm is cached, its passes evaluate no kernel
    assert "cache K_nm" in report["phases"] and report["phases"]["CG iterations"]["entries"] == 0


def test_the_command_measures_a_stale_calibration_again_and_says_why(capsys, cache,
                                                                    monkeypatch):
    """Rates of other compiled block functions are measured again (calibrate, here FAKE's),
    stored with this code's digest, and stderr says the stored file was not usable, not that
    there was none."""
    import dkern.planner

    save_rates(dataclasses.replace(FAKE, code="0123456789abcdef"))
    monkeypatch.setattr(dkern.planner, "calibrate", lambda workers=None: FAKE)
    assert main(["plan", "fit", "--n", "200000", "--d", "8", "--centers", "1000",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["calibrated_now"] is True
    assert "no usable calibration (the log above says why)" in err
    assert load_rates() == FAKE


def test_doubling_n_doubles_falkons_pass_time():
    """Not cached (n M = 16 GB and more): each pass evaluates n M kernel values; 10, 20 and 30
    chunks fill the two slots evenly, so the time is affine in n, and the fixed part (round
    trips, the client's M-sized work) is under 1% of it."""
    k = 15
    cg = [next(p for p in plan_fit(Data(n, 8, 100_000), TWO, FAKE, centers=2000,
                                   iterations=k).phases if p.name == "CG iterations")
          for n in (1_000_000, 2_000_000, 3_000_000)]
    seconds = [p.seconds for p in cg]
    assert seconds[2] - seconds[1] == pytest.approx(seconds[1] - seconds[0], rel=1e-12)
    assert seconds[1] == pytest.approx(2 * seconds[0], rel=0.01)
    assert [p.entries for p in cg] == [k * n * 2000 for n in (1_000_000, 2_000_000, 3_000_000)]


def test_more_workers_less_time_more_centres_more_time():
    data = Data(1_000_000, 8, 100_000)
    base = plan_fit(data, TWO, FAKE, centers=2000, iterations=10).seconds
    wider = Cluster(workers=5, threads=1, memory_limit=12 * GB)
    assert plan_fit(data, wider, FAKE, centers=2000, iterations=10).seconds < base
    assert plan_fit(data, TWO, FAKE, centers=4000, iterations=10).seconds > base


def test_auto_resolves_as_the_estimators_do():
    assert "solver 'exact'" in plan_fit(Data(5000, 4, 5000), TWO, FAKE).assumptions[0]
    assert "solver 'cg'" in plan_fit(Data(50_000, 4, 10_000), TWO, FAKE).assumptions[0]
    assert "M = 300" in plan_fit(Data(50_000, 4, 10_000), TWO, FAKE, centers=300).assumptions[0]


def test_a_worker_short_of_its_idle_memory_is_told_once_to_raise_the_limit(cache):
    """The advice for the largest part, 'idle', is a larger --memory-limit: it was then
    said twice ('use a larger --memory-limit, or a larger --memory-limit')."""
    tiny = dataclasses.replace(TWO, memory_limit=1000)
    (warning,) = [w for w in plan_predict(Data(1000, 8, 1000), tiny, FAKE, kind="sgpr",
                                          columns=30).warnings if "pause" in w]
    assert "'idle'" in warning and warning.count("--memory-limit") == 2, warning  # its own


def test_memory_warning_when_the_limit_is_below_the_estimate(capsys, cache):
    data = Data(1_000_000, 8, 100_000)
    roomy = plan_predict(data, TWO, FAKE, kind="sgpr", columns=3000)
    assert roomy.warnings == []
    need = roomy.worker_memory_bytes
    tight = dataclasses.replace(TWO, memory_limit=int(need))  # pauses at 80% of it
    warnings = plan_predict(data, tight, FAKE, kind="sgpr", columns=3000).warnings
    assert len(warnings) == 1 and "--memory-limit" in warnings[0]
    assert main(["plan", "predict", "--d", "8", "--centers", "3000", "--model-type", "gp",
                 "--test-rows", "1000000", "--memory-limit", str(need), "--json"]) == 0
    captured = capsys.readouterr()
    assert "dkern plan: warning: memory:" in captured.err
    assert json.loads(captured.out)["fits"] is False


def test_chunks_larger_than_the_data_hold_only_its_rows():
    """A chunk size above n (the CLI's default at small n) is priced as one chunk of n rows:
    it used to price 1,000 rows as 100,000 (1.5 GB a worker) and refuse a small run."""
    for solver in ("cg", "exact"):
        small, capped = (plan_fit(Data(1000, 8, rows), TWO, FAKE, solver=solver)
                         for rows in (100_000, 1000))
        assert small.worker_memory_bytes == capped.worker_memory_bytes
    assert Data(1000, 8, 10**9).chunks == [(1000, 1)]


def test_a_task_over_the_budget_names_the_chunk_size():
    tiny = Cluster(workers=2, threads=1, memory_limit=600 * 2**20)
    warnings = plan_fit(Data(1_000_000, 100, 100_000), tiny, FAKE, centers=100,
                        iterations=5).warnings
    assert any("--chunk-rows" in w and "refuse" in w for w in warnings)


def test_a_cg_factor_the_workers_cannot_keep_is_a_refusal_the_plan_names():
    """dkern refuses a CG fit whose n x 300 preconditioner factor is over 30% of the
    workers' memory (check_persisted); the plan passed such a fit (2.5 million rows on four
    4 GB workers: 6.0 GB against 4.8 GB) without a word (the diff review). A tenth of the
    rows is within it."""
    four = Cluster(workers=4, threads=1, memory_limit=4 * GB)
    (warning,) = [w for w in plan_fit(Data(2_500_000, 8, 100_000), four, FAKE,
                                      solver="cg").warnings if "factor" in w]
    assert "2,500,000 x 300 float64 (6.00 GB), is over the 4.80 GB" in warning
    assert "dkern would refuse" in warning
    assert not [w for w in plan_fit(Data(250_000, 8, 100_000), four, FAKE,
                                     solver="cg").warnings if "factor" in w]


def test_each_task_thread_and_the_main_one_may_keep_a_trim_threshold_of_heap():
    """The kept heap is the worker's own glibc setting, per arena: one per task thread and
    the main one (with MALLOC_TRIM_THRESHOLD_ unset glibc's default is 128 KiB)."""
    from dkern.runtime import WORKER_MALLOC_ENV

    threshold = int(WORKER_MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"])
    for threads in (1, 4):
        plan = plan_fit(Data(100_000, 8, 10_000), Cluster(2, threads, 12 * GB), FAKE,
                        centers=200, iterations=5)
        assert plan.worker_memory["kept heap"] == (threads + 1) * threshold
        assert plan.worker_memory_bytes == sum(plan.worker_memory.values())


def test_calibration_times_a_call_while_forked_copies_run_it(tmp_path):
    """With slots = 2 another process runs the same call while this one times it (each
    call leaves a file named by its process), and none is left running after."""
    from dkern.planner.measure import best_seconds

    def call():
        (tmp_path / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        time.sleep(0.02)

    seconds = best_seconds(call, repeats=3, slots=2)
    pids = {path.name.split("-")[0] for path in tmp_path.iterdir()}
    assert str(os.getpid()) in pids and len(pids) == 2
    assert 0.02 <= seconds < 5
    after = len(list(tmp_path.iterdir()))
    time.sleep(0.1)
    assert len(list(tmp_path.iterdir())) == after  # the copy stopped with the timing


def test_calibration_file_is_private_and_read_back(tmp_path, monkeypatch):
    folder = tmp_path / "fresh" / "cache"
    monkeypatch.setenv("DKERN_CACHE_DIR", str(folder))
    assert load_rates() is None
    path = save_rates(FAKE)
    assert path == folder.resolve() / RATES_FILE
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_rates() == FAKE
    os.chmod(path, 0o664)
    with pytest.raises(PermissionError, match="writable by group or others"):
        load_rates()


def test_a_calibration_of_another_format_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DKERN_CACHE_DIR", str(tmp_path))
    path = save_rates(FAKE)
    text = json.loads(path.read_text())
    path.write_text(json.dumps({**text, "version": 0}))
    assert load_rates() is None


@pytest.mark.parametrize("damage", [{"read_bytes_per_s": 0}, {"client_flops": -1.0},
                                    {"start_seconds": None}, {"entry_seconds": {}},
                                    {"entry_seconds": {"kernel_matvec": [0, 0]}}])
def test_a_damaged_calibration_is_measured_again_naming_the_figure(tmp_path, monkeypatch,
                                                                     caplog, damage):
    """A figure edited to 0, a negative, null or missing entry costs: measured again with
    the figure named. On the old code a plan divided by it (ZeroDivisionError) or looked
    it up (KeyError)."""
    monkeypatch.setenv("DKERN_CACHE_DIR", str(tmp_path))
    path = save_rates(FAKE)
    path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
    with caplog.at_level(logging.WARNING, logger="dkern.planner.rates"):
        assert load_rates() is None
    assert f"calibration's {next(iter(damage))}" in caplog.text


def test_a_calibration_of_other_compiled_blocks_is_measured_again(tmp_path, monkeypatch,
                                                                   caplog):
    """Rates measured with other sources of the fused loop (an upgrade: a faster exp) would
    mislead every plan; they are measured again, and the log says why."""
    monkeypatch.setenv("DKERN_CACHE_DIR", str(tmp_path))
    save_rates(dataclasses.replace(FAKE, code="0123456789abcdef"))
    with caplog.at_level(logging.WARNING, logger="dkern.planner.rates"):
        assert load_rates() is None
    assert "other compiled block functions" in caplog.text
    save_rates(FAKE)
    assert load_rates() == FAKE


@pytest.mark.filterwarnings("ignore::dkern.errors.ConvergenceWarning")  # tol=1e-14: 8 steps
def test_predicted_time_of_a_small_falkon_fit_within_a_loose_factor(monkeypatch):
    """This machine's block rates and pass overheads, measured here, plan a Falkon fit of
    exactly 8 iterations on 40,000 rows in 8 chunks, run on one thread (dask's synchronous
    scheduler). Times are this process's CPU seconds, rates and fit alike: the host is shared,
    and other processes' load stretched wall times 4-fold from one run to the next. A factor of
    3 either way: the fit is small enough for fixed costs to matter."""
    from dkern.planner import measure as cal

    monkeypatch.setattr(cal, "clock", time.process_time)
    rng = np.random.default_rng(0)
    n, d, M, chunk = 40_000, 8, 300, 5_000
    X = rng.uniform(-1, 1, (n, d))
    y = np.sin(X.sum(1))
    with dask.config.set(scheduler="synchronous"):
        measured: dict = {}
        blocks = block_backend("numpy")
        entry = {name: cal._entry_fit(blocks, name, measured, ds=(d,))  # the cached path's
                 for name in ("kernel_matvec", "kernel_block")}
        entry["normal_matvec"] = entry["kernel_matvec"]  # unused: K_nm is cached (96 MB)
        trip, per_task = cal.pass_overheads()
        rates = dataclasses.replace(FAKE, entry_seconds=entry, start_seconds=0.0,
                                    round_trip_seconds=trip, task_seconds=per_task,
                                    cached_normal_entries_per_s=cal._cached_rate(measured))
        plan = plan_fit(Data(n, d, chunk), Cluster(1, 1, 16 * GB), rates, centers=M,
                        iterations=8)
        Xd, yd = da.from_array(X, chunks=(chunk, d)), da.from_array(y, chunks=chunk)
        C = X[rng.choice(n, M, replace=False)]
        start = time.process_time()
        result = falkon(Gaussian(lengthscale=1.0), Xd, yd, C, 1e-3, tol=1e-14, max_iter=8)
        seconds = time.process_time() - start
    assert result.n_iter == 8
    assert [p.name for p in plan.phases[:3]] == ["start", "centres", "cache K_nm"]
    predicted = plan.seconds - plan.phases[0].seconds - plan.phases[1].seconds  # falkon()'s
    assert 1 / 3 < predicted / seconds < 3, (predicted, seconds)


def test_predict_reads_the_saved_models_kind_and_size(tmp_path, capsys, cache):
    """A saved Nyström kernel ridge model: its centres and features set the plan."""
    import dkern

    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (400, 3))
    model = dkern.KernelRidge(Gaussian(lengthscale=1.0), alpha=1e-3, solver="nystrom",
                              n_centers=50, random_state=0).fit(X, np.sin(X[:, 0]))
    dkern.save(model, tmp_path / "m.zarr")
    assert main(["plan", "predict", "--model", str(tmp_path / "m.zarr"), "--test-rows",
                 "100000", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["phases"]["predict"]["entries"] == 100_000 * 50
    assert "K(X*, centres) @ beta, 50 centres" in report["phases"]["predict"]["note"]
    assert "--n" in _usage_error(["plan", "predict", "--d", "3", "--solver", "nystrom",
                                  "--test-rows", "10"], capsys)


def test_plans_of_any_chunk_count_cost_the_same():
    """Chunks are priced as (rows, count) groups: a billion one-row chunks are two groups,
    and a CG plan's pairs four, where lists of every chunk (pair) took 75 s and 4 GB at
    n = 10^9 and ran out of memory at n = 2·10^5 in one-row chunks. The grouped makespan
    equals the task-by-task greedy one where whole rounds start level."""
    import heapq

    from dkern.planner.costs import makespan

    assert Data(10**9 + 5, 8, 1000).chunks == [(1000, 10**6), (5, 1)]
    plan = plan_fit(Data(200_000, 3, 1), TWO, FAKE, solver="cg")
    assert plan.seconds > 0

    def greedy(tasks, slots):
        free = [0.0] * min(slots, len(tasks))
        for seconds in tasks:
            heapq.heappush(free, heapq.heappop(free) + seconds)
        return max(free)

    for groups, slots in [([(1.0, 10)], 4), ([(2.0, 8), (1.0, 3)], 4), ([(3.0, 5), (0.5, 1)], 5)]:
        flat = [seconds for seconds, count in groups for _ in range(count)]
        assert makespan(groups, slots) == greedy(flat, slots)


def test_counts_are_taken_in_exponent_form():
    from dkern.cli._common import nonnegative_int, positive_int

    assert positive_int("1e6") == 1_000_000 and positive_int("2000") == 2000
    assert nonnegative_int("0") == 0 and nonnegative_int("1E3") == 1000
