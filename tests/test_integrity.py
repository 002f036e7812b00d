"""Behaviour 9, data integrity: killed writes, damaged chunks, and `dkern fsck`.

* A write SIGKILLed at random moments: readers see the complete old or the complete new
  version, checked element by element against both (every element encodes its version).
* A flipped bit and a deleted chunk are reported naming the store, the array and the
  chunk (index and key), both by the error a computation raises and by `dkern fsck`.
* `dkern fsck STORE` verifies everything, lists leftovers, removes them with --clean,
  and never removes published data.
"""

import inspect
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

from dkern import KernelRidge, cli
from dkern.errors import CorruptChunkError
from dkern.io import open_array, read_attrs, write_arrays
from dkern.io._lock import lease
from dkern.kernels import Gaussian

ROOT = Path(__file__).resolve().parents[1]

N, D, CHUNK = 40_000, 8, 2_000  # X: 2.56 MB, y: 0.32 MB, 20 chunks each


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def version_arrays(v):
    """Version ``v``'s arrays: every element differs from every other version's."""
    X = v * 1e6 + np.arange(N * D, dtype=float).reshape(N, D)
    return {"X": X, "y": v - np.arange(float(N))}


# A fork server: it imports dkern once (importing starts no thread, so forking is safe),
# then forks one writer per version number read from stdin, prints the writer's pid,
# reaps it and prints how it ended and how long it ran. Forking saves the ~2 s import of a
# fresh interpreter per trial.
ZYGOTE = textwrap.dedent(f"""
    import os, sys, time
    import numpy as np
    import dask
    from dkern.io import write_arrays
    dask.config.set(scheduler="synchronous")
    N, D, CHUNK = {N}, {D}, {CHUNK}
""") + inspect.getsource(version_arrays) + textwrap.dedent("""
    url = sys.argv[1]
    for line in sys.stdin:
        v = int(line)
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the writer; it never returns to the loop
            code = 1
            try:
                write_arrays(url, version_arrays(v), attrs={"version": v}, overwrite=True,
                             chunk_rows=CHUNK)
                code = 0
            finally:
                os._exit(code)
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        ended = "killed" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        print(ended, time.perf_counter() - start, flush=True)
""")


class Zygote:
    """The fork server as a subprocess; ``write(v, kill_after)`` runs one writer."""

    def __init__(self, url):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, url], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def write(self, version, kill_after=None):
        """(ended, seconds): "killed" or "exit 0", and the writer's lifetime."""
        self.proc.stdin.write(f"{version}\n")
        self.proc.stdin.flush()
        pid = int(self.proc.stdout.readline())
        if kill_after is not None:
            time.sleep(kill_after)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # finished, not yet reaped... or reaped: no kill
                pass
        ended, seconds = self.proc.stdout.readline().rsplit(" ", 1)
        return ended, float(seconds)

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def seen_version(url, candidates):
    """Which of ``candidates`` the store holds, complete; AssertionError for anything else."""
    X, y = open_array(url, "X").compute(), open_array(url, "y").compute()
    v = read_attrs(url)["version"]
    assert v in candidates, (v, candidates)
    want = version_arrays(v)  # arrays and attributes are one version: never a mix
    np.testing.assert_array_equal(X, want["X"])
    np.testing.assert_array_equal(y, want["y"])
    return v


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_the_old_or_the_new_version(tmp_path, record_figures):
    url = str(tmp_path / "s")
    write_arrays(url, version_arrays(0), attrs={"version": 0}, chunk_rows=CHUNK)
    zygote = Zygote(url)
    try:
        # the write's duration, to spread the kills over it: the median lifetime of the
        # writes that ran to the end (two first, then any the kill came too late for)
        lifetimes = [zygote.write(v)[1] for v in (1, 2)]
        assert seen_version(url, {2}) == 2
        current = 2
        rng = random.Random(20261123)
        trials = []
        while sum(t["killed"] for t in trials) < 20 and len(trials) < 60:
            new, write_s = current + 1, float(np.median(lifetimes))
            delay = rng.uniform(0.0, write_s)
            ended, lifetime = zygote.write(new, kill_after=delay)
            assert ended in ("killed", "exit 0"), ended  # a writer that failed by itself
            current = seen_version(url, {current, new})
            if ended != "killed":
                lifetimes.append(lifetime)
            trials.append({"delay_s": round(delay, 4), "fraction": round(delay / write_s, 3),
                           "killed": ended == "killed",
                           "outcome": "new" if current == new else "old"})
    finally:
        zygote.close()
    killed = [t for t in trials if t["killed"]]
    assert len(killed) >= 20, trials
    # the leftovers of the killed writes are found and cleaned; the data stays
    assert cli.main(["fsck", url, "--clean", "--min-age", "0", "--quiet"]) == 0
    assert seen_version(url, {current}) == current
    used = {e["path"].split("/")[1] for e in read_pointer_arrays(url)}
    assert set(os.listdir(os.path.join(url, ".dkern"))) - {"zarr.json", "zarr.pointer.json"} == used
    fractions = sorted(t["fraction"] for t in killed)
    report = {
        "test": "tests/test_integrity.py::test_sigkill_at_random_moments_leaves_the_old_or_"
                "the_new_version",
        "what": "a process writing a new version of two arrays (X 40000x8, y 40000; float64, "
                "2.9 MB, 20 chunks each) SIGKILLed after a delay drawn uniformly from "
                "[0, write time]; after each kill a reader compares every element with the "
                "old and the new version",
        "write_s_median": round(float(np.median(lifetimes)), 3), "trials": len(trials),
        "killed_mid_write": len(killed),
        "consistent": len(trials), "consistency_rate": 1.0,
        "outcomes_of_kills": {o: sum(t["outcome"] == o for t in killed) for o in ("old", "new")},
        "kill_fraction_of_write_time": {
            "min": fractions[0], "median": fractions[len(fractions) // 2],
            "max": fractions[-1],
            "deciles": [sum(int(f * 10) == k for f in fractions) for k in range(10)]},
        "trials_detail": trials,
    }
    record_figures("integrity", **report)


def read_pointer_arrays(url, group=""):
    return zarr.open_group(url, path=group, mode="r").attrs["dkern"]["arrays"].values()


def chunk_file(url, name, index, group=""):
    """The path and key of chunk ``index`` of the dkern array ``name``."""
    entry = zarr.open_group(url, path=group, mode="r").attrs["dkern"]["arrays"][name]
    key = "/".join(p for p in (group, entry["path"], "c", *map(str, index)) if p)
    return os.path.join(url, key), key


def fsck(capsys, *argv):
    code = cli.main(["fsck", *argv, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out else None), out.err


@pytest.fixture
def fitted_store(tmp_path):
    """A store with X (60, 2) in 4 chunks, y = sin(X[:, 0]), and a nested group's array."""
    url = str(tmp_path / "data.zarr")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    write_arrays(url, {"X": X, "y": np.sin(X[:, 0])}, chunk_rows=15)
    write_arrays(url, {"w": np.arange(6.0)}, group="models/a", chunk_rows=2)
    return url, X


def fit(url):
    return KernelRidge(Gaussian(lengthscale=1.0), alpha=1e-2, solver="exact").fit(
        (url, "X"), (url, "y"))


@pytest.mark.parametrize("damage", ["flipped bit", "deleted chunk"])
def test_damaged_chunk_is_named_by_the_computation_and_by_fsck(fitted_store, capsys, damage):
    url, X = fitted_store
    code, report, _ = fsck(capsys, url)
    assert code == 0 and report["ok"] and report["damage"] == []
    assert report["arrays"] == {"X": [60, 2], "y": [60], "models/a/w": [6]}
    path, key = chunk_file(url, "X", (2, 0))
    if damage == "flipped bit":
        raw = bytearray(Path(path).read_bytes())
        raw[len(raw) // 2] ^= 0x04  # one bit inside the compressed payload
        Path(path).write_bytes(bytes(raw))
        what = "failed its checksum"
    else:
        os.remove(path)
        what = "is missing"
    named = [f"store {url!r}", "array 'X'", "chunk (2, 0)", f"key {key!r}", what]
    with pytest.raises(CorruptChunkError) as err:  # a fit reading the store
        fit(url)
    assert all(part in str(err.value) for part in named), str(err.value)
    code, report, err_text = fsck(capsys, url)
    assert code == 1 and not report["ok"] and len(report["damage"]) == 1
    assert all(part in report["damage"][0] for part in named), report["damage"]
    assert report["arrays"] == {"y": [60], "models/a/w": [6]}  # the sound ones, verified
    assert f"{url!r} is damaged" in err_text
    np.testing.assert_array_equal(open_array(url, "y").compute(), np.sin(X[:, 0]))


OLD = "20000101T000000Z-00000000000000aa"  # a version folder name from long ago


def leftover(url, name, group=""):
    """What a killed write leaves: an unpublished array with a chunk, no pointer to it."""
    path = "/".join(p for p in (group, ".dkern", name, "X") if p)
    zarr.create_array(url, name=path, shape=(4,), chunks=(2,), dtype="f8")[:2] = 1.0
    return "/".join(p for p in (group, ".dkern", name) if p)


def tree(url):
    return sorted(str(p.relative_to(url)) for p in Path(url).rglob("*"))


def test_fsck_lists_then_cleans_leftovers_and_never_published_data(fitted_store, capsys):
    url, _ = fitted_store
    stale = [leftover(url, OLD), leftover(url, OLD, group="models/a")]
    partial = Path(url, f"zarr.{'0123abcd' * 4}.partial")  # a publish killed mid-file
    partial.write_text('{"zarr_format": 3, "node_')
    os.utime(partial, (time.time() - 3600, time.time() - 3600))
    young_name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:16]
    young = leftover(url, young_name)  # maybe a write that just began
    leased_name = "20000101T000000Z-00000000000000bb"
    before = tree(url)
    with lease(url, "", f".dkern/{leased_name}"):  # a live writer, however old its folder
        leased = leftover(url, leased_name)
        before = tree(url)
        code, report, _ = fsck(capsys, url)  # the default only reports
        assert code == 0 and report["ok"] and tree(url) == before
        removable = sorted([*stale, partial.name])
        assert report["would_remove"] == removable
        assert report["kept"] == sorted([young, leased])
        code, report, _ = fsck(capsys, url, "--clean")
        assert code == 0 and report["removed"] == removable and report["kept"] == sorted(
            [young, leased])
    assert not partial.exists() and not any(Path(url, p).exists() for p in stale)
    assert Path(url, young).exists() and Path(url, leased).exists()
    code, report, _ = fsck(capsys, url, "--clean", "--min-age", "0")  # the writer is gone
    assert report["removed"] == sorted([young, leased]) and report["kept"] == []
    for name, group in (("X", ""), ("y", ""), ("w", "models/a")):  # published data intact
        assert Path(chunk_file(url, name, (0,) * (1 + (name == "X")), group)[0]).exists()
    assert fsck(capsys, url)[1]["arrays"] == {"X": [60, 2], "y": [60], "models/a/w": [6]}
    np.testing.assert_array_equal(open_array(url, "models/a/w").compute(), np.arange(6.0))


def test_fsck_removes_nothing_from_a_damaged_store(fitted_store, capsys):
    url, _ = fitted_store
    stale = leftover(url, OLD)
    g = zarr.open_group(url, path="models/a", mode="a")
    g.update_attributes({"dkern": {**g.attrs["dkern"], "version": 99}})  # fails its checksum
    code, report, _ = fsck(capsys, url, "--clean", "--min-age", "0")
    assert code == 1 and report["removed"] == [] and report["kept"] == [stale]
    assert "(group 'models/a'): the dkern pointer" in report["damage"][0]
    assert Path(url, stale).exists()


def test_fsck_readable_output_and_a_missing_store(tmp_path, capsys):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones(3)})
    assert cli.main(["fsck", url]) == 0
    out = capsys.readouterr().out
    assert "ok: True" in out and "would_remove: []" in out
    assert cli.main(["fsck", str(tmp_path / "nothing")]) == 1
    assert "no Zarr group at" in capsys.readouterr().err
