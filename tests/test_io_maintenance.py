"""check_store / clean_store, collecting leftovers, and the `dkern store` command."""

import os
import time
import uuid
import warnings

import dask
import numpy as np
import pytest
import zarr

from dkern import cli
from dkern.errors import StoreError
from dkern.io import check_store, clean_store, list_arrays, open_array, write_arrays
from dkern.io._lock import lease

OLD = "20000101T000000Z-00000000000000aa"  # a version folder name from long ago


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def leftover(url, name, group=""):
    """What a killed write leaves: an unpublished array with a chunk, and no pointer to it."""
    path = "/".join(p for p in (group, ".dkern", name, "X") if p)
    zarr.create_array(url, name=path, shape=(4,), chunks=(2,), dtype="f8")[:2] = 1.0
    return "/".join(p for p in (group, ".dkern", name) if p)


def folders(url, group=""):
    listed = set(os.listdir(os.path.join(url, group, ".dkern")))
    return sorted(listed - {"zarr.json", "zarr.pointer.json"})


def test_stray_partial_files_raise_no_warning_and_are_cleaned(tmp_path):
    """zarr's temporary files (``<name>.<uuid4 hex>.partial``) a killed write left are
    reported and cleaned; a user's own ``*.partial`` files (a download) are kept, at the
    top and in a folder of their own, by a publish and by clean_store alike."""
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones((4, 2))})
    top, hidden = f"zarr.{'0123abcd' * 4}.partial", f"zarr.{'4567cdef' * 4}.partial"
    strays = [os.path.join(url, top),  # a killed publish
              os.path.join(url, ".dkern", hidden)]
    os.makedirs(os.path.join(url, "downloads"))
    users = [os.path.join(url, "movie.mkv.partial"),
             os.path.join(url, "downloads", "data.tar.partial")]
    for path in strays + users:
        with open(path, "w") as f:
            f.write('{"zarr_format": 3, "node_')
    for path in users:
        os.utime(path, (1e9, 1e9))  # old: no grace period protects them
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # zarr's "not recognized as a component" warning
        write_arrays(url, {"y": np.arange(3.0)})
        assert list_arrays(url) == ["X", "y"]
    assert all(os.path.exists(p) for p in users)
    report = check_store(url)
    assert report.ok and report.orphans == [f".dkern/{hidden}", top]
    assert sorted(clean_store(url, min_age=0)) == [f".dkern/{hidden}", top]
    assert not any(os.path.exists(p) for p in strays)
    assert all(os.path.exists(p) for p in users)


def test_orphaned_folders_are_reported_then_cleaned_and_data_kept(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.arange(10.0)}, chunk_rows=3)
    write_arrays(url, {"y": np.ones(2)}, group="models/a")
    orphans = [leftover(url, OLD), leftover(url, OLD, group="models/a")]
    report = check_store(url)
    assert report.ok
    assert report.arrays == {"X": (10,), "models/a/y": (2,)}
    # named from the store's root, as clean_store names them (was ".dkern/<name>" twice)
    assert sorted(report.orphans) == sorted(orphans)
    assert sorted(clean_store(url)) == sorted(orphans)  # old enough for the default age
    assert check_store(url).orphans == []
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.arange(10.0))
    np.testing.assert_array_equal(open_array(url, "models/a/y").compute(), np.ones(2))


def test_young_or_leased_folders_are_never_collected(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones(3)})
    young = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:16]
    leftover(url, young)
    assert clean_store(url) == []  # might be a write that just began
    with lease(url, "", f".dkern/{OLD}"):  # a live writer filling an old-named folder
        leftover(url, OLD)
        assert clean_store(url, min_age=0) == [".dkern/" + young]
        write_arrays(url, {"y": np.ones(3)})  # a publish collects too, but not this
        assert OLD in folders(url)
    write_arrays(url, {"z": np.ones(3)})  # the writer is gone: the next publish collects it
    assert OLD not in folders(url)
    assert list_arrays(url) == ["X", "y", "z"]


def test_check_store_reports_damage_and_clean_store_leaves_damaged_groups(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.arange(20.0)}, chunk_rows=5)
    write_arrays(url, {"y": np.ones(2)}, group="g")
    entry = zarr.open_group(url, mode="r").attrs["dkern"]["arrays"]["X"]
    chunk = os.path.join(url, entry["path"], "c", "1")
    raw = bytearray(open(chunk, "rb").read())
    raw[-1] ^= 0x10
    open(chunk, "wb").write(bytes(raw))
    report = check_store(url)
    assert not report.ok and report.arrays == {"g/y": (2,)}
    key = f"{entry['path']}/c/1"
    assert len(report.damage) == 1 and f"array 'X': chunk (1,) (key {key!r}) failed its " \
        "checksum" in report.damage[0]
    g = zarr.open_group(url, path="g", mode="a")
    g.update_attributes({"dkern": {**g.attrs["dkern"], "version": 99}})  # checksum now fails
    leftover(url, OLD, group="g")
    damage = check_store(url).damage
    assert len(damage) == 2 and "(group 'g'): the dkern pointer in" in damage[1]
    with pytest.raises(StoreError, match="fails its checksum"):
        clean_store(url, min_age=0)
    assert OLD in folders(url, "g")  # what a damaged pointer uses is unknown: nothing removed


def test_fsspec_stores_clean_by_age_only(monkeypatch):
    url = f"memory://dkern-test-{uuid.uuid4().hex}"
    write_arrays(url, {"X": np.ones(3)})
    young = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:16]
    for name in (OLD, young):
        zarr.create_array(url, name=f".dkern/{name}/X", shape=(2,), dtype="f8")
    assert clean_store(url) == [f".dkern/{OLD}"]  # default age there: one day
    assert clean_store(url, min_age=0) == [f".dkern/{young}"]
    assert check_store(url).orphans == []


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_store_check_and_clean(tmp_path, capsys):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.arange(6.0)}, chunk_rows=2)
    orphan = leftover(url, OLD)
    code, out, err = run(capsys, "store", "check", url, "--json")
    assert code == 0 and err == ""
    assert '"X": [\n      6\n    ]' in out and orphan in out
    code, out, _ = run(capsys, "store", "clean", url, "--min-age", "0", "--json")
    assert code == 0 and orphan in out and OLD not in folders(url)
    entry = zarr.open_group(url, mode="r").attrs["dkern"]["arrays"]["X"]
    os.remove(os.path.join(url, entry["path"], "c", "2"))
    code, out, err = run(capsys, "store", "check", url)
    assert code == 1 and out == ""
    assert err.startswith(f"dkern store: error: {url!r} is damaged: ") and (
        "array 'X': chunk (2,)" in err and "is missing" in err)


def test_check_store_reports_a_group_whose_metadata_is_unreadable(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones(3)})
    write_arrays(url, {"y": np.ones(2)}, group="g")
    meta = os.path.join(url, "g", "zarr.json")
    open(meta, "w").write(open(meta).read()[:-40])  # truncated, as by a full disk
    report = check_store(url)
    assert report.arrays == {"X": (3,)}
    assert len(report.damage) == 1 and f"its metadata file '{meta}' is damaged" in (
        report.damage[0])
