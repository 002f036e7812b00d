"""Hardening, second round, the store layer: what a store handed over by someone else can
make dkern do.

* Paths: a pointer naming a folder outside the store (absolute, ``..``, or through a
  symbolic link) is refused before anything is read from or deleted at it, by reads,
  overwrites, model saves, ``fsck`` and ``fsck --clean``; the victim folder survives.
* Chunks bound to their array and position: copied, swapped or foreign chunks and swapped
  array folders are reported with store, array and chunk.
* Claims a store cannot back: a chunk count beyond the chunk files present is refused
  before a task graph is built.
* Plain Zarr arrays: ``fsck`` checks that a chunk exists for every grid position and says
  that their contents cannot be checked.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr

import dkern
from dkern import cli
from dkern.errors import CorruptChunkError, StoreError
from dkern.io import check_store, clean_store, open_array, write_array, write_arrays
from dkern.io._store import checksum
from dkern.models.persist import check_can_save

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def forge(url, edit, group=""):
    """Edit a group's pointer table as an adversary would: change it, recompute its sha256."""
    meta = Path(url, group, "zarr.json")
    doc = json.loads(meta.read_text())
    pointer = doc["attributes"]["dkern"]
    edit(pointer)
    pointer["checksum"] = checksum(pointer)
    meta.write_text(json.dumps(doc))


def victim(tmp_path):
    """A folder that is no part of any store, with a file in it."""
    folder = tmp_path / "victim" / "sub"
    folder.mkdir(parents=True)
    (folder / "precious.txt").write_text("keep me")
    return folder


def intact(folder):
    return (folder / "precious.txt").read_text() == "keep me"


def retarget(name, path):
    def edit(pointer):
        pointer["arrays"][name]["path"] = path
    return edit


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "other name"])
def test_overwrite_never_deletes_what_a_forged_pointer_names(tmp_path, kind):
    url = str(tmp_path / "evil.zarr")
    target = victim(tmp_path)
    write_array(np.zeros((10, 2)), url, "X")
    folder = json.loads(Path(url, "zarr.json").read_text())["attributes"]["dkern"]["arrays"][
        "X"]["path"].rpartition("/")[0]
    path = {"absolute": str(target),
            "dotdot": f"{folder}/../../../victim/sub",
            "other name": f"{folder}/Y"}[kind]
    forge(url, retarget("X", path))
    with pytest.raises(StoreError, match="cannot be trusted") as err:
        write_array(np.ones((10, 2)), url, "X", overwrite=True)
    assert repr(path) in str(err.value) and "'X'" in str(err.value)
    assert intact(target)
    with pytest.raises(StoreError, match="cannot be trusted"):
        open_array(url, "X")


def test_symlinked_version_folder_is_neither_read_nor_deleted(tmp_path):
    url = str(tmp_path / "evil.zarr")
    target = victim(tmp_path)
    write_array(np.zeros((10, 2)), url, "X")
    entry = json.loads(Path(url, "zarr.json").read_text())["attributes"]["dkern"]["arrays"]["X"]
    folder = Path(url, entry["path"]).parent
    shutil.rmtree(folder)
    folder.symlink_to(target)  # the pointer is untouched: its checksum still holds
    with pytest.raises(StoreError, match="symbolic link"):
        write_array(np.ones((10, 2)), url, "X", overwrite=True)
    with pytest.raises(StoreError, match="symbolic link"):
        open_array(url, "X")
    assert intact(target)


def test_symlinked_versions_dir_is_not_cleaned_through(tmp_path, capsys):
    """``fsck --clean`` with the group's ``.dkern`` a link to another folder: nothing there
    is listed or removed, and the report says why."""
    url = str(tmp_path / "s.zarr")
    target = victim(tmp_path)
    write_array(np.zeros((10, 2)), url, "X")
    forge(url, lambda p: p.update(arrays={}))  # a store with no arrays; .dkern is leftovers
    shutil.rmtree(Path(url, ".dkern"))
    Path(url, ".dkern").symlink_to(target)
    code = cli.main(["fsck", url, "--clean", "--min-age", "0", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "symbolic link" in report["damage"][0], report
    assert intact(target)
    with pytest.raises(StoreError, match="symbolic link"):
        clean_store(url, min_age=0)
    assert intact(target)


def test_symlinked_leftover_is_unlinked_not_followed(tmp_path, capsys):
    url = str(tmp_path / "s.zarr")
    target = victim(tmp_path)
    write_array(np.zeros((10, 2)), url, "X")
    link = Path(url, ".dkern", "20000101T000000Z-00000000000000aa")
    link.symlink_to(target)
    code = cli.main(["fsck", url, "--clean", "--min-age", "0", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["removed"] == [".dkern/20000101T000000Z-00000000000000aa"]
    assert not link.is_symlink() and intact(target)
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.zeros((10, 2)))


def test_cli_fit_over_a_forged_model_store_keeps_the_victim(tmp_path, capsys,
                                                            _session_cluster):
    """The issue's CLI repro: a model store whose ``residuals`` entry names another folder
    (and one naming ``../nothing``), then ``dkern fit … --model model.zarr --overwrite``.

    The model is first saved by ``dkern fit`` on the session's cluster. The forged runs
    name a scheduler address where nothing listens: the refusal must come before any
    cluster is reached (not after a fit, as it once did). The first is a real command line
    (exit status, one-line error, no traceback), the second runs in this process."""
    data, model = str(tmp_path / "data.zarr"), str(tmp_path / "model.zarr")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    write_arrays(data, {"X": X, "y": np.sin(X[:, 0])}, chunk_rows=50)
    args = ["fit", "--data", data, "--x", "X", "--y", "y", "--model", model, "--solver",
            "exact", "--alpha", "0.01", "--quiet", "--scheduler"]
    assert cli.main([*args, _session_cluster.scheduler.address]) == 0
    args += ["tcp://127.0.0.1:1", "--overwrite"]  # nothing listens there
    names = json.loads(Path(model, "zarr.json").read_text())["attributes"]["dkern"]["arrays"]
    name = "residuals" if "residuals" in names else sorted(names)[0]
    target = victim(tmp_path)
    forge(model, retarget(name, str(target)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "dkern", *args], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode != 0 and "cannot be trusted" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert intact(target)
    (tmp_path / "bystander.txt").write_text("keep me")
    forge(model, retarget(name, "../nothing"))
    capsys.readouterr()
    code = cli.main(args)
    err = capsys.readouterr().err
    assert code != 0 and "cannot be trusted" in err, err
    assert (tmp_path / "bystander.txt").read_text() == "keep me" and Path(data).exists()


def test_a_forged_model_store_is_refused_before_the_fit(tmp_path):
    """check_can_save (called before a fit) raises the error save would raise, so a fit
    is not spent on a model that could not be saved."""
    url = str(tmp_path / "model.zarr")
    X = np.random.default_rng(1).normal(size=(40, 2))
    dkern.save(dkern.KernelRidge(alpha=0.1, solver="exact").fit(X, X[:, 0]), url)
    check_can_save(url, overwrite=True)  # intact: fine
    forge(url, retarget(entry_name(url), str(victim(tmp_path))))
    with pytest.raises(StoreError, match="cannot be trusted"):
        check_can_save(url, overwrite=True)


def entry_name(url):
    return sorted(json.loads(Path(url, "zarr.json").read_text())["attributes"]["dkern"][
        "arrays"])[0]


def entry_of(url, name):
    return json.loads(Path(url, "zarr.json").read_text())["attributes"]["dkern"]["arrays"][name]


def chunk(url, name, index):
    return Path(url, entry_of(url, name)["path"], "c", *map(str, index))


@pytest.fixture
def two_arrays(tmp_path):
    """X (40, 2) and Y (40, 2), 4 chunks each, the same shapes, dtypes and codecs."""
    url = str(tmp_path / "s.zarr")
    rng = np.random.default_rng(1)
    write_arrays(url, {"X": rng.normal(size=(40, 2)), "Y": rng.normal(size=(40, 2))},
                 chunk_rows=10)
    return url


def moved_chunk(url, tmp_path):
    shutil.copyfile(chunk(url, "Y", (1, 0)), chunk(url, "X", (1, 0)))
    return "X", (1, 0), "no chunk of this array"


def swapped_chunks(url, tmp_path):
    a, b = chunk(url, "X", (0, 0)), chunk(url, "X", (2, 0))
    tmp = a.with_suffix(".tmp")
    a.rename(tmp), b.rename(a), tmp.rename(b)
    return "X", None, "it holds chunk"  # (0, 0) holds (2, 0) and (2, 0) holds (0, 0)


def swapped_folders(url, tmp_path):
    a, b = Path(url, entry_of(url, "X")["path"]), Path(url, entry_of(url, "Y")["path"])
    tmp = a.with_name("tmp")
    a.rename(tmp), b.rename(a), tmp.rename(b)
    return "X", None, None  # each folder's zarr.json (its crc list) fails the other's digest


def foreign_copy(url, tmp_path):
    other = str(tmp_path / "other.zarr")
    write_arrays(other, {"X": np.random.default_rng(2).normal(size=(40, 2))}, chunk_rows=10)
    shutil.rmtree(Path(url, entry_of(url, "X")["path"]))
    shutil.copytree(Path(other, entry_of(other, "X")["path"]),
                    Path(url, entry_of(url, "X")["path"]))
    return "X", None, None  # its zarr.json differs now (the crc list): the metadata digest fails


def float32_chunk(url, tmp_path):
    """A chunk of a float32 array twice as long: the same byte size, other bytes."""
    other = str(tmp_path / "f32.zarr")
    write_arrays(other, {"X": np.random.default_rng(3).normal(size=(80, 2)).astype("f4")},
                 chunk_rows=20)
    shutil.copyfile(chunk(other, "X", (1, 0)), chunk(url, "X", (1, 0)))
    return "X", (1, 0), "no chunk of this array"


@pytest.mark.parametrize("damage", [moved_chunk, swapped_chunks, swapped_folders,
                                    foreign_copy, float32_chunk], ids=lambda f: f.__name__)
def test_chunks_are_bound_to_their_array_and_position(two_arrays, tmp_path, capsys, damage):
    url = two_arrays
    before = {n: open_array(url, n).compute() for n in ("X", "Y")}
    name, index, how = damage(url, tmp_path)
    error = CorruptChunkError if how is not None else StoreError
    with pytest.raises(error) as err:
        open_array(url, name).compute()
    message = str(err.value)
    assert f"{url!r}" in message and f"{name!r}" in message, message
    if how is None:
        assert "fails its checksum" in message, message
    else:
        assert "is not the chunk published at this position" in message and how in message
        if index is not None:
            assert f"chunk {index}" in message, message
        else:
            assert "(0, 0)" in message and "(2, 0)" in message, message
    code = cli.main(["fsck", url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and name not in report["arrays"], report
    assert any(f"{name!r}" in line for line in report["damage"]), report
    if damage is not swapped_folders:  # the other array is untouched and still verifies
        np.testing.assert_array_equal(open_array(url, "Y").compute(), before["Y"])


def test_a_small_file_claiming_many_chunks_is_refused_before_any_task(tmp_path, record_figures):
    """The issue's 7.5 KB store claiming 1e6 rows in one-row chunks: the manifest, the
    array's metadata and both digests forged consistently. Refused at open, in well under
    a second, before a task graph is built."""
    url = str(tmp_path / "s.zarr")
    write_array(np.ones((4, 3)), url, "centers", chunk_rows=1)
    entry = entry_of(url, "centers")
    meta = Path(url, entry["path"], "zarr.json")
    doc = json.loads(meta.read_text())
    n = 1_000_000
    doc["shape"] = [n, 3]
    doc["attributes"]["dkern_chunk_crc32c"] = [0] * n
    meta.write_text(json.dumps(doc))
    digest = "sha256:" + __import__("hashlib").sha256(meta.read_bytes()).hexdigest()

    def claim(pointer):
        pointer["arrays"]["centers"].update(shape=[n, 3], n_chunks=n, meta=digest)
    forge(url, claim)
    start = time.perf_counter()
    with pytest.raises(CorruptChunkError, match=r"chunk \(4, 0\) .* is missing, and 999,995 "
                       r"more .* 4 chunk files are present for the 1,000,000"):
        open_array(url, "centers")
    elapsed = time.perf_counter() - start
    record_figures("forged_chunk_count", refused_s=round(elapsed, 3),
                   store_kb=round(sum(p.stat().st_size for p in Path(url).rglob("*")
                                      if p.is_file()) / 1e3, 1),
                   what="a store whose manifest and metadata claim 1e6 one-row chunks, 4 "
                        "present: open_array refuses before building a task")
    assert elapsed < 5.0


def test_fsck_checks_what_it_can_of_plain_zarr_arrays(tmp_path, capsys):
    url = str(tmp_path / "plain.zarr")
    z = zarr.create_array(url, name="A", shape=(40, 2), chunks=(10, 2), dtype="f8")
    z[:] = np.arange(80.0).reshape(40, 2) + 1
    code = cli.main(["fsck", url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and "no checksums" in report["plain"]["A"] and "absent" not in report[
        "plain"]["A"]
    os.remove(Path(url, "A", "c", "2", "0"))
    report = check_store(url)
    assert "1 of 4 chunks are absent ((2, 0))" in report.plain["A"], report.plain
    assert "cannot be told apart" in report.plain["A"]


@pytest.mark.parametrize("name", ["zarr.json", "zarr.foo", "x.partial"])
def test_names_zarr_and_dkern_use_are_refused(tmp_path, name):
    url = str(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match="names zarr and dkern use") as err:
        write_array(np.ones(3), url, name)
    assert repr(name) in str(err.value)
    assert not Path(url).exists()


def test_fsck_walks_deeply_nested_groups(tmp_path, capsys):
    """The issue's store nested 1,100 deep hit Python's recursion limit of 1,000; here 200
    levels under a limit of 150: more levels than frames, so a walk that recursed even one
    frame per level would overflow. fsck of a 3-deep store needs under 60 frames from a
    test (measured), so 150 leaves it room. Each level costs fsck about 0.1 s (400 levels
    under a limit of 300 took 38 s of CI time)."""
    url = str(tmp_path / "deep.zarr")
    root = zarr.open_group(url, mode="w")
    root.create_group("/".join(["g"] * 200))
    try:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(150)
        try:
            code = cli.main(["fsck", url, "--json"])
        finally:
            sys.setrecursionlimit(limit)
        report = json.loads(capsys.readouterr().out)
        assert code == 0 and report["ok"], report
    finally:  # shutil.rmtree (pytest's own clean-up too) recurses, and would fail on it
        remove_tree(url)


def remove_tree(top):
    """Delete a folder tree of any depth without recursion."""
    folders, pending = [], [top]
    while pending:
        folder = pending.pop()
        folders.append(folder)
        with os.scandir(folder) as entries:
            for item in entries:
                if item.is_dir(follow_symlinks=False):
                    pending.append(item.path)
                else:
                    os.unlink(item.path)
    for folder in reversed(folders):
        os.rmdir(folder)


def test_local_fsspec_urls_get_the_same_link_checks(tmp_path):
    """``local://`` (fsspec's local file system) was not recognised as local disk, so a
    symlinked ``.dkern`` was cleaned through."""
    url = str(tmp_path / "s.zarr")
    target = victim(tmp_path)
    write_array(np.zeros((10, 2)), url, "X")
    forge(url, lambda p: p.update(arrays={}))
    shutil.rmtree(Path(url, ".dkern"))
    Path(url, ".dkern").symlink_to(target)
    for spelling in (f"local://{url}", f"file://{url}"):
        with pytest.raises(StoreError, match="symbolic link"):
            clean_store(spelling, min_age=0)
    assert intact(target)


def test_a_symlinked_group_is_neither_read_written_nor_cleaned(tmp_path):
    """A group folder that is a link to another store: nothing there is listed as this
    store's, written, or removed."""
    other = str(tmp_path / "other.zarr")
    write_array(np.ones(4), other, "X")
    keep = Path(other, ".dkern", "backup_of_old_model")
    keep.mkdir()
    (keep / "notes.txt").write_text("keep me")
    url = str(tmp_path / "s.zarr")
    write_array(np.zeros(3), url, "Y")
    Path(url, "g").symlink_to(other)
    with pytest.raises(StoreError, match="symbolic link"):
        clean_store(url, min_age=0)
    with pytest.raises(StoreError, match="symbolic link"):
        write_array(np.zeros(3), url, "g/Z")
    with pytest.raises(StoreError, match="symbolic link"):
        open_array(url, "g/X")
    report = check_store(url)
    assert not report.ok and "g/X" not in report.arrays, report
    assert (keep / "notes.txt").read_text() == "keep me"
    # nothing was added: X is the link showing its own array (dkern.io._visible)
    assert sorted(p.name for p in Path(other).iterdir()) == [".dkern", "X", "zarr.json"]


@pytest.mark.parametrize("name", ["..", ".", "", "a/b"])
def test_entries_named_as_no_array_can_be_are_refused(tmp_path, name):
    """An entry named '..' (its path '.dkern/<v>/..') passed, and superseding it deleted the
    whole version tree, the version just published included."""
    url = str(tmp_path / "s.zarr")
    write_array(np.zeros(3), url, "X")

    def add(pointer):
        entry = dict(pointer["arrays"]["X"])
        entry["path"] = entry["path"].rpartition("/")[0] + "/" + name
        pointer["arrays"][name] = entry
    forge(url, add)
    with pytest.raises(StoreError, match="a name dkern never writes"):
        write_arrays(url, {"Y": np.ones(3)}, replace_all=True, overwrite=True)
    assert Path(url, entry_of(url, "X")["path"]).exists()


def test_a_chunk_larger_than_its_array_is_refused_before_it_is_read(tmp_path):
    """A 20-row array whose metadata (and both digests) claim chunks of 5·10⁷ rows: its one
    chunk file, zstd zeros of a few dozen KB, decompressed to 1.2 GB. dkern never writes a
    chunk larger than its array, so the claim is refused before anything is read."""
    url = str(tmp_path / "s.zarr")
    write_array(np.ones((20, 3)), url, "X")
    entry = entry_of(url, "X")
    meta = Path(url, entry["path"], "zarr.json")
    doc = json.loads(meta.read_text())
    rows = 50_000_000
    doc["chunk_grid"]["configuration"]["chunk_shape"] = [rows, 3]
    meta.write_text(json.dumps(doc))
    digest = "sha256:" + __import__("hashlib").sha256(meta.read_bytes()).hexdigest()
    forge(url, lambda pointer: pointer["arrays"]["X"].update(chunks=[rows, 3], meta=digest))
    with pytest.raises(StoreError, match=r"shape \(20, 3\) claims chunks of \(50000000, 3\), "
                                         "larger than the array"):
        open_array(url, "X")
    assert not check_store(url).ok


@pytest.mark.parametrize("what", ["chunk", "metadata", "chunk folder"])
def test_links_inside_an_array_folder_are_refused(tmp_path, what):
    """A chunk file, an array's zarr.json or its whole chunk folder ``c`` replaced by a
    link to a copy outside the store read fine (their bytes pass the checks); dkern reads
    nothing through a link."""
    url = str(tmp_path / "s.zarr")
    write_array(np.arange(20.0).reshape(10, 2), url, "X", chunk_rows=5)
    folder = Path(url, entry_of(url, "X")["path"])
    path = {"chunk": chunk(url, "X", (1, 0)), "metadata": folder / "zarr.json",
            "chunk folder": folder / "c"}[what]
    copy = tmp_path / "outside"
    (shutil.copytree if path.is_dir() else shutil.copyfile)(path, copy)
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(copy)
    with pytest.raises(StoreError, match="symbolic link"):
        open_array(url, "X")
    code = check_store(url)
    assert not code.ok and "symbolic link" in code.damage[0]


@pytest.mark.parametrize("run", [check_store, clean_store])
def test_a_group_leading_out_of_the_store_is_refused_by_fsck_as_such(tmp_path, run):
    """``--group ../decoy``: refused and nothing outside touched, as before, but the
    message called the decoy's metadata damaged ('restore the file from a backup'); it now
    names the '..' component, as writes do."""
    url = str(tmp_path / "store")
    write_array(np.ones(3), url, "X")
    write_array(np.ones(3), str(tmp_path / "decoy"), "Y")
    with pytest.raises(ValueError, match=r"got '\.\./decoy' \(component '\.\.'\)"):
        run(url, "../decoy")
    np.testing.assert_array_equal(open_array(str(tmp_path / "decoy"), "Y"), 1.0)


def test_a_read_of_a_group_above_the_store_names_the_component(tmp_path):
    """read_attrs(url, '../decoy') called the decoy's metadata damaged ('restore the file
    from a backup'): every group path with a '.' or '..' component is refused as such."""
    from dkern.io import read_attrs

    url = str(tmp_path / "store")
    write_array(np.ones(3), url, "X")
    write_array(np.ones(3), str(tmp_path / "decoy"), "Y")
    for group in ("../decoy", "a/../../decoy", "./x"):
        with pytest.raises(ValueError, match=r"has a '\.\.?' component: a group path names"):
            read_attrs(url, group)
