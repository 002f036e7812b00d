"""Versioned, checksummed stores: round trips, publishing, refusal, crashes and damage."""

import os
import pickle
import re
import uuid

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

from dkern.errors import CorruptChunkError, StoreError
from dkern.io import check_store, list_arrays, open_array, read_attrs, write_array, write_arrays


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


@pytest.fixture(params=["local", "memory"])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return f"memory://dkern-test-{uuid.uuid4().hex}"


def pointer(url, group=""):
    return zarr.open_group(url, path=group, mode="r").attrs["dkern"]


def version_dirs(path):
    listed = set(os.listdir(os.path.join(path, ".dkern")))
    return sorted(listed - {"zarr.json", "zarr.pointer.json"})


def stored_path(url, name, group=""):
    """Where the pointer says ``name`` lives, e.g. ``.dkern/<folder>/X``."""
    return pointer(url, group)["arrays"][name]["path"]


def folder(url, name):
    return stored_path(url, name).split("/")[1]


def reseal(g, p):
    """Publish an edited pointer the way dkern would (with a valid checksum)."""
    from dkern.io._store import sealed
    g.update_attributes({"dkern": sealed({k: v for k, v in p.items() if k != "checksum"})})


def x_data(n=1001, d=3, dtype=np.float64):
    return np.random.default_rng(0).standard_normal((n, d)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_round_trip_is_exact(url, dtype, kind):
    x = x_data(dtype=dtype)
    y = x[:, 0].copy()
    source = {"numpy": lambda a: a, "dask": lambda a: da.from_array(a, chunks=200)}[kind]
    write_arrays(url, {"X": source(x), "y": source(y)}, chunk_rows=128)
    X2, y2 = open_array(url, "X"), open_array(url, "y")
    assert X2.dtype == dtype and y2.dtype == dtype
    assert X2.chunks == ((128,) * 7 + (105,), (3,))
    assert y2.chunks == ((128,) * 7 + (105,),)
    assert X2.name.startswith("dk-read-X-")
    np.testing.assert_array_equal(X2.compute(), x)
    np.testing.assert_array_equal(y2.compute(), y)


def test_regular_dask_row_chunks_are_kept(url):
    x = x_data()
    a, b = da.from_array(x, chunks=(300, 1)), da.from_array(x, chunks=(500, 3))
    write_arrays(url, {"a": a, "b": b})
    assert open_array(url, "a").chunks == ((300, 300, 300, 101), (3,))
    assert open_array(url, "b").chunks == ((500, 500, 1), (3,))
    np.testing.assert_array_equal(open_array(url, "b").compute(), x)


def test_irregular_dask_chunks_are_regularised(url):
    x = da.from_array(np.arange(10.0), chunks=((2, 5, 3),))
    write_array(x, url, "v")
    assert open_array(url, "v").chunks == ((10,),)  # default_row_chunk(10, 1, 8)
    write_array(x, url, "w", chunk_rows=4)
    assert open_array(url, "w").chunks == ((4, 4, 2),)
    np.testing.assert_array_equal(open_array(url, "w").compute(), np.arange(10.0))


def test_int_and_bool_keep_their_dtype(url):
    write_arrays(url, {"idx": np.arange(7, dtype=np.int64), "mask": np.arange(7) % 2 == 0})
    assert open_array(url, "idx").dtype == np.int64
    np.testing.assert_array_equal(open_array(url, "mask").compute(), np.arange(7) % 2 == 0)


def test_layout_manifest_and_codecs(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": x_data(n=10)}, attrs={"kernel": "rbf"}, chunk_rows=4)
    p = pointer(url)
    assert p["format"] == 2 and p["version"] == 1 and p["attrs"] == {"kernel": "rbf"}
    entry = p["arrays"]["X"]
    assert re.fullmatch(r"\.dkern/\d{8}T\d{6}Z-[0-9a-f]{16}/X", entry["path"])
    assert (entry["shape"], entry["dtype"], entry["chunks"], entry["n_chunks"]) == (
        [10, 3],
        "float64",
        [4, 3],
        3,
    )
    z = zarr.open_array(url, path=entry["path"], mode="r")
    names = [type(c).__name__ for c in z.metadata.codecs]
    assert names == ["BytesCodec", "ZstdCodec", "Crc32cCodec"]
    assert sorted(os.listdir(tmp_path / "s" / entry["path"] / "c")) == ["0", "1", "2"]


def test_list_and_attrs_merge_across_writes(url):
    write_arrays(url, {"X": np.ones((4, 2)), "y": np.ones(4)}, attrs={"a": 1, "b": [1, 2]})
    write_arrays(url, {"pred": np.zeros(4)}, attrs={"b": "new"})
    assert list_arrays(url) == ["X", "pred", "y"]
    assert read_attrs(url) == {"a": 1, "b": "new"}


def test_writing_pred_keeps_x(url):
    x = x_data(n=50)
    write_arrays(url, {"X": x})
    before = stored_path(url, "X")
    write_array(np.arange(50.0), url, "pred")
    assert stored_path(url, "X") == before
    assert stored_path(url, "pred").split("/")[1] != before.split("/")[1]
    assert pointer(url)["version"] == 2
    np.testing.assert_array_equal(open_array(url, "X").compute(), x)


def test_overwrite_refused_and_old_data_intact(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones((5, 2)), "y": np.ones(5)})
    before = pointer(url)
    with pytest.raises(StoreError, match=r"already has arrays \['X'\]; pass overwrite=True"):
        write_arrays(url, {"X": np.zeros((5, 2)), "z": np.zeros(5)})
    assert pointer(url) == before
    assert version_dirs(url) == [folder(url, "X")]  # nothing was created for the refused write
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.ones((5, 2)))
    assert list_arrays(url) == ["X", "y"]


def test_overwrite_replaces_and_deletes_superseded(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones((5, 2)), "y": np.ones(5)})
    first = folder(url, "y")
    write_arrays(url, {"X": np.zeros((5, 2))}, overwrite=True)
    second = folder(url, "X")
    assert version_dirs(url) == sorted([first, second])  # y still lives in the first
    assert sorted(os.listdir(tmp_path / "s/.dkern" / first)) == ["y", "zarr.json"]
    write_arrays(url, {"y": np.zeros(5)}, overwrite=True)
    assert version_dirs(url) == sorted([second, folder(url, "y")])  # first held nothing in use
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.zeros((5, 2)))
    np.testing.assert_array_equal(open_array(url, "y").compute(), np.zeros(5))


def _fail_on_third(block, block_info=None):
    if block_info[0]["chunk-location"][0] == 2:
        raise RuntimeError("worker died")
    return block


def test_crash_mid_write_keeps_previous_version(tmp_path):
    url = str(tmp_path / "s")
    old = x_data(n=100)
    write_arrays(url, {"X": old, "y": old[:, 0]}, chunk_rows=10)
    before = pointer(url)
    bad = da.from_array(np.zeros((100, 3)), chunks=(10, 3)).map_blocks(_fail_on_third, dtype=float)
    with pytest.raises(RuntimeError, match="worker died"):
        write_arrays(url, {"X": bad, "y": np.zeros(100)}, overwrite=True, chunk_rows=10)
    assert pointer(url) == before
    assert version_dirs(url) == [folder(url, "X")]  # the partial version was removed
    np.testing.assert_array_equal(open_array(url, "X").compute(), old)
    np.testing.assert_array_equal(open_array(url, "y").compute(), old[:, 0])


def tree(path):
    return sorted(os.path.relpath(os.path.join(d, n), path)
                  for d, dirs, files in os.walk(path) for n in dirs + files)


def test_crash_mid_write_leaves_no_new_store_group_or_files(tmp_path):
    bad = da.from_array(np.zeros((100, 3)), chunks=(10, 3)).map_blocks(_fail_on_third, dtype=float)
    with pytest.raises(RuntimeError, match="worker died"):  # a new store
        write_arrays(tmp_path / "new", {"X": bad}, chunk_rows=10)
    assert not (tmp_path / "new").exists()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="worker died"):  # a folder that was no store
        write_arrays(tmp_path / "plain", {"X": bad}, chunk_rows=10)
    assert tree(tmp_path / "plain") == ["notes.txt"]
    url = str(tmp_path / "s")
    write_arrays(url, {"y": np.ones(4)})
    before = tree(url)
    with pytest.raises(RuntimeError, match="worker died"):  # a new nested group
        write_arrays(url, {"X": bad}, chunk_rows=10, group="models/krr")
    assert tree(url) == before


def test_leftovers_of_a_killed_write_are_never_visible_and_get_replaced(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones((4, 2))})
    # A process killed mid-write leaves an unpublished version behind.
    zarr.create_array(url, name=".dkern/20000101T000000Z-0123456789abcdef/X", shape=(4, 2),
                      dtype="f8", fill_value=7.0)
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.ones((4, 2)))
    write_arrays(url, {"y": np.arange(3.0)})
    # the next publish collected it (older than the grace period, no live writer's lease)
    assert version_dirs(url) == sorted([folder(url, "X"), folder(url, "y")])
    np.testing.assert_array_equal(open_array(url, "y").compute(), np.arange(3.0))


def test_flipped_byte_raises_corrupt_chunk_naming_it(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": x_data(n=100)}, chunk_rows=30)
    chunk = tmp_path / "s" / stored_path(url, "X") / "c/2/0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    chunk.write_bytes(bytes(raw))
    X = open_array(url, "X")
    np.testing.assert_array_equal(X[:60].compute(), x_data(n=100)[:60])  # other chunks read
    key = re.escape(f"{stored_path(url, 'X')}/c/2/0")
    with pytest.raises(CorruptChunkError,
                       match=rf"array 'X': chunk \(2, 0\) \(key '{key}'\) failed its checksum"):
        X.compute()
    with pytest.raises(CorruptChunkError, match=repr(url)):
        open_array(url, "X", verify=False).compute()


def test_deleted_chunk_raises_corrupt_chunk(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"y": np.arange(100.0)}, chunk_rows=30)
    os.remove(tmp_path / "s" / stored_path(url, "y") / "c/1")
    with pytest.raises(
        CorruptChunkError,
        match=rf"array 'y': chunk \(1,\) \(key '{stored_path(url, 'y')}/c/1'"
        r"\) is missing",
    ):
        open_array(url, "y").compute()
    # without verification zarr reads the missing chunk as the fill value: NaN for floats,
    # so that readers who do not check (plain zarr, xarray) see the loss, not zeros
    assert np.isnan(open_array(url, "y", verify=False).compute()[30:60]).all()


def test_all_zero_chunks_are_written(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"z": np.zeros((20, 2))}, chunk_rows=10)
    assert sorted(os.listdir(tmp_path / "s" / stored_path(url, "z") / "c")) == ["0", "1"]
    np.testing.assert_array_equal(open_array(url, "z").compute(), np.zeros((20, 2)))


def test_manifest_mismatch_and_unknown_format(tmp_path):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones((4, 2))})
    g = zarr.open_group(url, mode="a")
    p = g.attrs["dkern"]
    p["arrays"]["X"]["shape"] = [5, 2]
    reseal(g, p)
    with pytest.raises(StoreError, match=r"'X' does not match its manifest: expected \{'shape'"):
        open_array(url, "X")
    p["arrays"]["X"].update(shape=[4, 2], n_chunks=3)
    reseal(g, p)
    with pytest.raises(StoreError, match=r"expected .*'n_chunks': 3\}, found .*'n_chunks': 1\}"):
        open_array(url, "X")
    g.update_attributes({"dkern": {**p, "format": 99}})
    with pytest.raises(StoreError, match="pointer of format 99; this dkern reads format 2"):
        open_array(url, "X")


def test_missing_store_and_array(url):
    with pytest.raises(StoreError, match=f"no Zarr group at {url!r}"):
        open_array(url, "X")
    with pytest.raises(StoreError, match=f"no Zarr group at {url!r}"):
        list_arrays(url)
    write_arrays(url, {"X": np.ones((2, 2)), "y": np.ones(2)})
    with pytest.raises(
        StoreError,
        match=r"has no array 'Z' \(nothing there\); arrays present: "
        r"\['X', 'y'\]",
    ):
        open_array(url, "Z")
    with pytest.raises(
        StoreError,
        match=r"no group 'g', so no array 'g/X'; arrays at the top: "
        r"\['X', 'y'\]",
    ):
        open_array(url, "g/X")


def test_plain_zarr_array_is_opened_as_is_and_guarded(tmp_path):
    url = str(tmp_path / "s")
    g = zarr.open_group(url, mode="w")
    g.create_array("raw", shape=(6, 4), chunks=(4, 2), dtype="i4")[...] = np.arange(24).reshape(
        6, 4
    )
    raw = open_array(url, "raw")
    assert raw.chunks == ((4, 2), (2, 2))
    np.testing.assert_array_equal(raw.compute(), np.arange(24).reshape(6, 4))
    write_array(np.ones(3), url, "pred")
    assert list_arrays(url) == ["pred", "raw"]
    with pytest.raises(StoreError, match="already has arrays"):
        write_array(np.ones(3), url, "raw")
    write_array(np.zeros((6, 4)), url, "raw", overwrite=True)
    # the plain array was superseded: "raw" now shows dkern's version to plain readers
    assert os.readlink(os.path.join(url, "raw")) == stored_path(url, "raw")
    np.testing.assert_array_equal(zarr.open_group(url, mode="r")["raw"][...], np.zeros((6, 4)))
    np.testing.assert_array_equal(open_array(url, "raw").compute(), np.zeros((6, 4)))


def test_groups(url):
    write_array(np.arange(3.0), url, "models/krr/coef")
    write_arrays(url, {"X": np.ones((2, 1))})
    assert list_arrays(url, "models/krr") == ["coef"]
    assert list_arrays(url) == ["X"]
    np.testing.assert_array_equal(open_array(url, "models/krr/coef").compute(), np.arange(3.0))


@pytest.mark.parametrize(
    ("arrays", "kwargs", "error", "match"),
    [
        ({}, {}, ValueError, "non-empty mapping"),
        ({"a/b": np.ones(2)}, {}, ValueError, "got 'a/b'"),
        ({".hidden": np.ones(2)}, {}, ValueError, "got '.hidden'"),
        ({"s": np.array(["a"])}, {}, TypeError, "s must have a bool, integer or floating"),
        ({"s": np.float64(1.0)}, {}, ValueError, "s is 0-D"),
        ({"X": np.ones(2)}, {"attrs": {"a": np.float32(1)}}, TypeError, r"\.item\(\)"),
        ({"X": np.ones(2)}, {"chunk_rows": -1}, ValueError, "chunk_rows must be a positive int"),
        ({"X": np.ones(2)}, {"coordinates": {"Y": ["c"]}}, ValueError, r"got \['Y'\]"),
        ({"é" * 108: np.ones(2)}, {}, ValueError, "at most 214 bytes .UTF-8.*got 216 bytes"),
        ({"X": np.ones(2)}, {"coordinates": {"X": ["a b"]}}, ValueError, "without spaces"),
    ],
)
def test_bad_write_touches_nothing(tmp_path, arrays, kwargs, error, match):
    url = tmp_path / "s"
    with pytest.raises(error, match=match):
        write_arrays(url, arrays, **kwargs)
    assert not url.exists()


def test_opened_array_pickles_and_reads_with_threads(tmp_path):
    url = str(tmp_path / "s")
    x = x_data(n=500)
    write_arrays(url, {"X": x}, chunk_rows=50)
    X = pickle.loads(pickle.dumps(open_array(url, "X")))
    with dask.config.set(scheduler="threads"):
        np.testing.assert_array_equal(X.compute(), x)


def test_writing_back_an_opened_array_keeps_it_in_place(tmp_path, monkeypatch):
    url = str(tmp_path / "s")
    write_arrays(url, {"X": x_data(n=30), "y": np.arange(30.0)}, chunk_rows=10)
    X = open_array(url, "X")
    path = stored_path(url, "X")
    write_arrays(url, {"X": X, "y": np.zeros(30)}, overwrite=True)  # X is the stored X itself
    assert stored_path(url, "X") == path  # kept, not copied and then deleted under X
    np.testing.assert_array_equal(X.compute(), x_data(n=30))
    np.testing.assert_array_equal(open_array(url, "y").compute(), np.zeros(30))
    write_arrays(url, {"X": X[::-1]}, overwrite=True)  # a different array: written anew
    assert stored_path(url, "X") != path
    np.testing.assert_array_equal(open_array(url, "X").compute(), x_data(n=30)[::-1])


def test_read_names_follow_the_stored_array_not_the_spelling_of_its_url(tmp_path, monkeypatch):
    import shutil

    url = str(tmp_path / "s")
    write_arrays(url, {"X": np.ones(3)})
    monkeypatch.chdir(tmp_path)
    assert open_array("s", "X").name == open_array(url, "X").name == open_array(
        f"file://{url}/", "X").name
    shutil.copytree(url, tmp_path / "copy")
    assert open_array(tmp_path / "copy", "X").name != open_array(url, "X").name


def test_an_edited_array_metadata_file_is_refused(tmp_path):
    """The crc32c checks the stored bytes; the byte order in zarr.json says what they mean."""
    url = str(tmp_path / "s")
    x = x_data(n=20)
    write_arrays(url, {"X": x})
    meta = tmp_path / "s" / stored_path(url, "X") / "zarr.json"
    text = meta.read_text()
    assert text.count('"endian": "little"') == 1
    meta.write_text(text.replace('"endian": "little"', '"endian": "big"'))
    with pytest.raises(StoreError, match=r"the metadata of array 'X' \(.*/X/zarr.json\) fails "
                                         "its checksum: it was edited or damaged"):
        open_array(url, "X")
    assert not np.array_equal(open_array(url, "X", verify=False).compute(), x)  # what it hid


@pytest.mark.parametrize("path", [".dkern/x", "../evil", "a/.hidden/x", "__zarr/x"])
def test_hidden_or_escaping_group_paths_are_refused_before_writing(tmp_path, path):
    """'.dkern/x' used to turn the hidden version tree into a group that check_store could
    not see and clean_store then broke; '../evil' was reported as a damaged zarr.json."""
    url = str(tmp_path / "s.zarr")
    write_array(np.ones(4), url, "keep")
    with pytest.raises(ValueError, match="group path components must be non-empty"):
        write_array(np.ones(4), url, path)
    assert list_arrays(url) == ["keep"] and check_store(url).ok


@pytest.mark.parametrize("shape", [(0, 3), (5, 0), (0,), (2, 0, 4)])
def test_empty_arrays_are_written_and_read_back(tmp_path, shape):
    """An array with no element has no chunk. Its write failed, saying the chunk had
    'vanished right after it was written' (zarr writes nothing for an empty region), and
    nothing was published; it is now stored with an empty checksum list, beside others."""
    url = str(tmp_path / "s.zarr")
    write_arrays(url, {"E": np.zeros(shape), "Y": np.arange(4.0)})
    write_arrays(url, {"L": da.zeros(shape, chunks=1)})
    for name in ("E", "L"):
        got = open_array(url, name).compute()
        assert got.shape == shape and got.dtype == np.float64
    np.testing.assert_array_equal(open_array(url, "Y"), np.arange(4.0))
    assert check_store(url).ok
