"""Concurrent writers to one store group: both land intact, or one is clearly refused."""

import multiprocessing

import dask
import dask.array as da
import numpy as np
import pytest

from dkern.errors import StoreError
from dkern.io import _lock, check_store, list_arrays, open_array, write_array, write_arrays

N_PAIRS = 60


def data(i, name):
    """The array that writer ``name`` writes into store ``i``: distinct for every pair."""
    seed = 2 * i + (name == "b")
    return np.random.default_rng(seed).standard_normal((40, 3))


def _writer(root, name, barrier, failures):
    with dask.config.set(scheduler="synchronous"):
        for i in range(N_PAIRS):
            barrier.wait()  # both processes start each pair's write at the same moment
            try:
                write_arrays(f"{root}/s{i}", {name: data(i, name)}, chunk_rows=10)
            except Exception as err:  # reported, so the test says what went wrong
                failures.put((i, name, f"{type(err).__name__}: {err}"))


def test_two_processes_writing_different_arrays_both_land(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, failures = ctx.Barrier(2, timeout=60), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), name, barrier, failures))
             for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=280)
    assert [p.exitcode for p in procs] == [0, 0]
    refused = []
    while not failures.empty():
        refused.append(failures.get())
    # Different names never conflict: every publish merges onto the pointer as it is then.
    assert refused == []
    for i in range(N_PAIRS):
        url = tmp_path / f"s{i}"
        assert list_arrays(url) == ["a", "b"]
        for name in ("a", "b"):
            np.testing.assert_array_equal(open_array(url, name).compute(), data(i, name))
        report = check_store(url)
        assert report.ok and report.orphans == [], (i, report)


def test_a_conflicting_publish_is_refused_and_the_other_write_kept(tmp_path):
    """Writer 1 replaces X while writer 2, which started earlier, is still writing X."""
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.zeros(6), "y": np.ones(6)})
    theirs = np.arange(6.0)

    def write_theirs_meanwhile(block):
        write_array(theirs, url, "X", overwrite=True)  # published while ours is being filled
        return block

    ours = da.from_array(np.full(6, 7.0), chunks=6).map_blocks(write_theirs_meanwhile)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(StoreError, match=r"arrays \['X'\] were written by another writer "
                                             "while this write ran, so this write was not "
                                             "published"):
            write_arrays(url, {"X": ours}, overwrite=True)
    np.testing.assert_array_equal(open_array(url, "X").compute(), theirs)
    np.testing.assert_array_equal(open_array(url, "y").compute(), np.ones(6))
    report = check_store(url)
    assert report.ok and report.orphans == []  # our unpublished folder was removed


def test_publish_lock_held_too_long_is_a_clear_error(tmp_path, monkeypatch):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.zeros(3)})
    monkeypatch.setattr(_lock, "LOCK_TIMEOUT_S", 0.2)
    with _lock.publish_lock(url, ""):  # another process publishing, as the writer sees it
        with pytest.raises(StoreError, match=r"could not take the publish lock on .*\.dkern"
                                             r"' within 0.2 s; another process kept it"):
            write_arrays(url, {"y": np.ones(3)})
    assert list_arrays(url) == ["X"]
    assert check_store(url).orphans == []
    write_arrays(url, {"y": np.ones(3)})
    assert list_arrays(url) == ["X", "y"]
