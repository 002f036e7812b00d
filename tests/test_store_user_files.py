"""What a write never touches: the user's own folders, links and files in a store, its
groups, other tools' rewrites of its metadata, and places the path does not name.

Each case is one an adversarial review found deleting or misplacing data: a failed write
into a user's plain folder removed the folder; a group or ``.dkern`` that is a link to
elsewhere was written through when the group had no pointer yet; xarray's
``to_zarr(mode="a")`` dropped the pointer from ``zarr.json`` and the next dkern write
collected every published version; ``~`` and ``::`` in a local path meant one folder to
zarr and another to the clean-up; ``overwrite=True`` on a group's name deleted the group;
a backslash in a name was stored as a path; a user's link at a name was replaced.
"""

import json
import logging
import os
import shutil

import dask
import dask.array as da
import numpy as np
import pytest

from dkern.errors import StoreError
from dkern.io import list_arrays, open_array, write_array, write_arrays
from dkern.solvers.checkpoint import remove_checkpoint


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def failing(n: int = 10) -> da.Array:
    """A dask array whose computation fails, as a worker error mid-write does."""
    def fail(block):
        raise RuntimeError("a worker failed mid-write")
    return da.ones(n, chunks=5).map_blocks(fail, dtype=float)


@pytest.mark.parametrize("path", ["notes/pred", "notes/sub/pred"])
def test_a_failed_write_into_a_users_plain_folder_keeps_the_folder(tmp_path, path):
    """The group's folder existed (the user's, not a Zarr group): a failed write removes
    only what it created there, and deeper folders it created whole."""
    url = str(tmp_path / "s.zarr")
    write_arrays(url, {"X": np.ones((10, 2))})
    os.makedirs(tmp_path / "s.zarr" / "notes")
    (tmp_path / "s.zarr" / "notes" / "lab-notebook.md").write_text("three months of notes")
    with pytest.raises(RuntimeError, match="mid-write"):
        write_array(failing(), url, path)
    assert sorted(os.listdir(tmp_path / "s.zarr" / "notes")) == ["lab-notebook.md"]
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.ones((10, 2)))


@pytest.mark.parametrize("link, path, refused", [("g", "g/h/pred", True),
                                                  ("g/.dkern", "g/pred", True),
                                                  ("g/.dkern", "g/h/pred", False)])
def test_a_linked_group_or_version_tree_is_never_written_through(tmp_path, link, path,
                                                                 refused):
    """A link to a folder outside the store, at a group that holds no pointer yet or at its
    version tree: a write to that group is refused before anything is written; a write
    below it, which does not use that tree, succeeds; a failed write's clean-up never
    reaches the folder either."""
    outside = tmp_path / "home-docs"
    outside.mkdir()
    (outside / "private.txt").write_text("x")
    url = tmp_path / "s.zarr"
    write_arrays(str(url), {"X": np.ones(3)})
    if link == "g/.dkern":
        (url / "g").mkdir()
    os.symlink(outside, url / link)
    if refused:
        for x in (np.ones(4), failing()):
            with pytest.raises(StoreError, match="symbolic link"):
                write_array(x, str(url), path)
    else:
        with pytest.raises(RuntimeError, match="mid-write"):
            write_array(failing(), str(url), path)
        assert os.path.islink(url / link)
        write_array(np.ones(4), str(url), path)
        np.testing.assert_array_equal(open_array(str(url), path).compute(), np.ones(4))
    assert sorted(os.listdir(outside)) == ["private.txt"]


def test_a_pointer_dropped_by_xarray_is_restored_and_no_data_is_collected(tmp_path, caplog):
    """xarray's ``to_zarr(mode="a")`` replaces the root's attributes, dkern's pointer with
    them. dkern then reads the pointer's copy in ``.dkern`` (saying so), and its next write
    restores it: every array stays readable, and xarray's new variable too."""
    xr = pytest.importorskip("xarray")
    url = str(tmp_path / "s.zarr")
    X, y = np.arange(20.0).reshape(10, 2), np.arange(10.0)
    write_arrays(url, {"X": X, "y": y}, dims={"X": ("sample", "feature"), "y": ("sample",)})
    ds = xr.open_zarr(url, consolidated=False)
    xr.Dataset({"residual": ("sample", ds["y"].values * 0)}).to_zarr(
        url, mode="a", consolidated=False)
    with open(os.path.join(url, "zarr.json")) as f:
        assert "dkern" not in json.load(f)["attributes"]  # what xarray did
    with caplog.at_level(logging.WARNING, logger="dkern.io._store"):
        np.testing.assert_array_equal(open_array(url, "X").compute(), X)
    assert "lost its dkern pointer" in caplog.text
    write_array(np.ones(10), url, "pred", dims=("sample",))
    with open(os.path.join(url, "zarr.json")) as f:
        assert "dkern" in json.load(f)["attributes"]
    for name, value in (("X", X), ("y", y), ("pred", np.ones(10))):
        np.testing.assert_array_equal(open_array(url, name).compute(), value)
    assert set(xr.open_zarr(url, consolidated=False).data_vars) >= {"X", "y", "pred", "residual"}


def test_tilde_and_double_colon_paths_name_one_folder_for_every_step(tmp_path, monkeypatch):
    """``~`` and ``::`` in a local path are literal, as zarr takes them: a failed write to
    ``~/s.zarr`` cleans up ``./~/s.zarr``, never ``$HOME/s.zarr``; removing checkpoint
    ``~/ckpt`` leaves ``$HOME/ckpt``; a write to ``a::b.zarr`` leaves the store ``b.zarr``
    (which fsspec would take it for) alone."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "s.zarr").mkdir(parents=True)
    (home / "ckpt").mkdir()
    (home / "ckpt" / "thesis.tex").write_text("x")
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    write_arrays(str(home / "s.zarr"), {"X": np.arange(3.0)})
    before = sorted(os.listdir(home / "s.zarr"))
    with pytest.raises(RuntimeError, match="mid-write"):
        write_array(failing(), "~/s.zarr", "X")
    assert sorted(os.listdir(home / "s.zarr")) == before
    np.testing.assert_array_equal(open_array(str(home / "s.zarr"), "X").compute(),
                                  np.arange(3.0))
    remove_checkpoint("~/ckpt")  # nothing there: ./~/ckpt does not exist
    assert os.listdir(home / "ckpt") == ["thesis.tex"]
    write_arrays("b.zarr", {"X": np.arange(3.0), "y": np.arange(3.0)})
    write_arrays("a::b.zarr", {"y": np.ones(2)})
    assert os.path.isdir(work / "a::b.zarr")
    np.testing.assert_array_equal(open_array("b.zarr", "y").compute(), np.arange(3.0))
    np.testing.assert_array_equal(open_array("a::b.zarr", "y").compute(), np.ones(2))


def test_overwrite_never_replaces_a_group(tmp_path):
    """A name that is a group (a GP's mean and std, xarray's group) is refused with or
    without overwrite, naming it as a group; the group and what it holds stay."""
    url = str(tmp_path / "s.zarr")
    write_arrays(url, {"X": np.ones((5, 2))})
    write_arrays(url, {"mean": np.ones(5), "std": np.ones(5)}, group="gp")
    write_arrays(url, {"deep": np.ones(3)}, group="gp/run2")
    for overwrite in (False, True):
        with pytest.raises(StoreError, match=r"groups named \['gp'\].*never a group"):
            write_array(np.zeros(5), url, "gp", overwrite=overwrite)
    np.testing.assert_array_equal(open_array(url, "gp/mean").compute(), np.ones(5))
    np.testing.assert_array_equal(open_array(url, "gp/run2/deep").compute(), np.ones(3))


@pytest.mark.parametrize("name", ["run\\1", "a\\..\\b"])
def test_a_backslash_in_a_name_is_refused(tmp_path, name):
    """zarr stores a backslash as a path separator, which bricked the whole store."""
    url = str(tmp_path / "s.zarr")
    write_arrays(url, {"X": np.ones(3)})
    with pytest.raises(ValueError, match=r"without '/' or '\\'"):
        write_arrays(url, {name: np.ones(3)})
    with pytest.raises(ValueError, match=r"hold no '\\'"):
        write_arrays(url, {"y": np.ones(3)}, group=name)
    assert list_arrays(url) == ["X"]


def test_a_users_links_at_an_array_name_stay(tmp_path, caplog):
    """Links the user placed (to a folder, to a file) are the user's, as a file is: a write
    of those names publishes the arrays for dkern, warns, and leaves the links as they
    were."""
    outside = tmp_path / "external"
    outside.mkdir()
    url = tmp_path / "s.zarr"
    write_arrays(str(url), {"X": np.ones(3)})
    os.symlink(outside, url / "results")
    os.symlink(tmp_path / "file.txt", url / "notes")
    with caplog.at_level(logging.WARNING):
        write_arrays(str(url), {"results": np.ones(3), "notes": np.ones(3)})
    assert os.readlink(url / "results") == str(outside)
    assert os.readlink(url / "notes") == str(tmp_path / "file.txt")
    assert "something else is there" in caplog.text
    np.testing.assert_array_equal(open_array(str(url), "results").compute(), np.ones(3))
    shutil.rmtree(outside)


def test_a_plain_group_reached_through_a_link_is_read_as_before(tmp_path):
    """Groups dkern never wrote (plain zarr) stay readable through a link: only what a
    dkern pointer or its copy names is held to the no-link rule."""
    zarr = pytest.importorskip("zarr")
    outside = tmp_path / "train"
    zarr.create_array(str(outside), name="X", data=np.arange(6.0).reshape(3, 2))
    url = tmp_path / "s.zarr"
    write_arrays(str(url), {"y": np.ones(3)})
    os.symlink(outside, url / "train")
    np.testing.assert_array_equal(open_array(str(url), "train/X").compute(),
                                  np.arange(6.0).reshape(3, 2))
    assert list_arrays(str(url), "train") == ["X"]


def _drop_pointer(url: str) -> None:
    """What xarray's to_zarr(mode="a") does to dkern's pointer: the attributes replaced."""
    path = os.path.join(url, "zarr.json")
    with open(path) as f:
        meta = json.load(f)
    meta["attributes"] = {"title": "appended by another tool"}
    with open(path, "w") as f:
        json.dump(meta, f)


def test_a_copy_older_than_the_published_version_is_refused_and_nothing_collected(
        tmp_path, monkeypatch, caplog):
    """A publish whose copy write fails keeps its publish (logged) and removes the older
    copy; a copy that names arrays a later publish superseded is refused, and a clean
    deletes nothing on its word."""
    from dkern.io import _store, clean_store

    url = str(tmp_path / "s.zarr")
    write_arrays(url, {"a": np.zeros(3)})
    copy = os.path.join(url, ".dkern", "zarr.pointer.json")
    stale = open(copy).read()

    from zarr.storage import LocalStore

    real_set = LocalStore.set

    async def copy_fails(self, key, value):
        if key.endswith(_store.POINTER_COPY):
            raise OSError("disk full")
        await real_set(self, key, value)

    monkeypatch.setattr(LocalStore, "set", copy_fails)
    with caplog.at_level(logging.WARNING):
        write_arrays(url, {"a": np.ones(3)}, overwrite=True)  # the publish stands
    monkeypatch.undo()
    assert "could not write the pointer's copy" in caplog.text and not os.path.exists(copy)
    np.testing.assert_array_equal(open_array(url, "a").compute(), np.ones(3))
    with open(copy, "w") as f:  # as if the removal had failed too: the older copy stays
        f.write(stale)
    _drop_pointer(url)
    with pytest.raises(StoreError, match=r"names arrays that are gone \(\['a'\]\)"):
        open_array(url, "a")
    folders = sorted(os.listdir(os.path.join(url, ".dkern")))
    with pytest.raises(StoreError, match="names arrays that are gone"):
        clean_store(url, min_age=0)
    assert sorted(os.listdir(os.path.join(url, ".dkern"))) == folders


def test_a_failed_write_keeps_a_group_another_writer_published_meanwhile(tmp_path):
    """Two writers create groups of a new store; the one that fails used to remove the
    whole store (it had created it), the other's published group included."""
    url = str(tmp_path / "new.zarr")

    def sibling_then_fail(block):
        write_arrays(url, {"y": np.arange(3.0)}, group="b")  # the other writer publishes
        raise RuntimeError("a worker failed mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        failing_a = da.ones(4, chunks=4).map_blocks(sibling_then_fail,  # meta: not run yet
                                                    meta=np.empty(0, dtype=float))
        write_array(failing_a, url, "a/x")
    np.testing.assert_array_equal(open_array(url, "b/y").compute(), np.arange(3.0))
    assert not os.path.exists(os.path.join(url, "a"))


def _old_dkern_store_after_xarray(url: str) -> list[str]:
    """A store as a dkern older than the pointer's copy left it, after xarray's
    to_zarr(mode="a"): no copy, and no pointer in zarr.json. Its version folders."""
    os.remove(os.path.join(url, ".dkern", "zarr.pointer.json"))
    _drop_pointer(url)
    return sorted(os.listdir(os.path.join(url, ".dkern")))


def test_published_versions_without_pointer_or_copy_are_never_collected(tmp_path):
    """With neither the pointer nor its copy, the group's published versions (complete
    arrays) would look like leftovers: a write, a clean and a check each refuse, naming
    the versions and the ways out, and so does dkern's reader (not "no array X"); nothing
    is deleted, and plain zarr still reads the arrays under their names (the links)."""
    from dkern.io import check_store, clean_store

    url = str(tmp_path / "s.zarr")
    X = np.arange(20.0).reshape(10, 2)
    write_arrays(url, {"X": X})
    folders = _old_dkern_store_after_xarray(url)
    with pytest.raises(StoreError, match=r"no dkern pointer and no copy of it, yet \.dkern "
                                         r"holds published versions \['\.dkern/"):
        write_array(np.ones(10), url, "pred")
    with pytest.raises(StoreError, match="Restore zarr.json from a backup"):
        clean_store(url, min_age=0)
    report = check_store(url)
    assert not report.ok and "no dkern pointer and no copy" in report.damage[0]
    with pytest.raises(StoreError, match="no dkern pointer and no copy"):
        open_array(url, "X")
    assert sorted(os.listdir(os.path.join(url, ".dkern"))) == folders  # nothing added or lost
    import zarr

    np.testing.assert_array_equal(zarr.open_array(os.path.join(url, "X"), mode="r")[:], X)


def test_a_killed_first_writes_complete_folder_is_collected_not_mistaken_for_a_lost_version(
        tmp_path):
    """A first write killed after its arrays were complete (chunk checksums recorded) but
    before it published: no pointer, no copy, and no link to its folder. The next write
    goes ahead and collects that folder."""
    import zarr

    from dkern.io._store import CHUNK_CRCS

    url = str(tmp_path / "s.zarr")
    zarr.open_group(url, mode="w")
    leftover = ".dkern/20200101T000000Z-0123456789abcdef"
    zarr.create_array(url, name=f"{leftover}/X", shape=(4,), dtype="f8").update_attributes(
        {CHUNK_CRCS: [0]})
    write_array(np.ones(4), url, "X")
    assert not os.path.exists(os.path.join(url, leftover))
    np.testing.assert_array_equal(open_array(url, "X").compute(), np.ones(4))


def test_a_concurrent_first_publish_is_not_taken_for_a_lost_pointer(tmp_path, monkeypatch):
    """Two writers of different names into a new group: writer A publishes (pointer, copy,
    links) just after writer B looked for a pointer and found none. B then sees A's links:
    it looks again, finds A's pointer, and writes; both arrays read back."""
    import zarr

    from dkern.io import _store

    url = str(tmp_path / "s.zarr")
    zarr.open_group(url, mode="w")
    real_copy = _store._pointer_copy

    def writer_a_publishes_now(root, url_, group):
        found = real_copy(root, url_, group)  # B's first look: no pointer, no copy yet
        monkeypatch.setattr(_store, "_pointer_copy", real_copy)
        write_array(np.arange(3.0), url, "a")
        return found

    monkeypatch.setattr(_store, "_pointer_copy", writer_a_publishes_now)
    write_array(np.ones(4), url, "b")
    np.testing.assert_array_equal(open_array(url, "a").compute(), np.arange(3.0))
    np.testing.assert_array_equal(open_array(url, "b").compute(), np.ones(4))


def test_a_model_that_lost_its_pointer_is_named_so_by_load(tmp_path):
    """dkern.load said "is not a dkern model store" of a saved model whose pointer and
    copy were gone; it now gives the lost-pointer error, as save and check do."""
    import dkern
    from dkern.kernels import Gaussian
    from dkern.models import KernelRidge

    url = str(tmp_path / "m.zarr")
    X = np.random.default_rng(0).normal(size=(20, 2))
    dkern.save(KernelRidge(Gaussian(1.0), alpha=1e-2).fit(X, X[:, 0]), url)
    _old_dkern_store_after_xarray(url)
    with pytest.raises(StoreError, match="no dkern pointer and no copy"):
        dkern.load(url)


def test_clean_of_the_root_cleans_the_groups_beside_one_that_lost_its_pointer(tmp_path):
    """The refusal of one sub-group stopped the whole walk: a sibling's leftover stayed.
    Now every other group is cleaned, and then the refusal is raised, naming the group."""
    from dkern.io import clean_store

    url = str(tmp_path / "s.zarr")
    for path in ("r", "a/x", "b/y"):
        write_array(np.ones(3), url, path)
    kept = _old_dkern_store_after_xarray(os.path.join(url, "a"))
    leftover = os.path.join(url, "b", ".dkern", "20200101T000000Z-0123456789abcdef")
    os.makedirs(leftover)
    with pytest.raises(StoreError, match=r"\(group 'a'\): zarr.json has no dkern pointer.*"
                                         r"the other groups were cleaned"):
        clean_store(url, min_age=0)
    assert not os.path.exists(leftover)
    assert sorted(os.listdir(os.path.join(url, "a", ".dkern"))) == kept
    for path in ("r", "b/y"):
        np.testing.assert_array_equal(open_array(url, path).compute(), np.ones(3))


def test_removing_a_checkpoint_keeps_what_else_its_folder_holds(tmp_path):
    """A checkpoint in a folder that also holds a user's file and store (written while the
    fit ran) and a user's link at an array's name: its removal deletes what dkern wrote,
    keeps the rest and the folder. On the old code the folder went, recursively, with
    them; a checkpoint alone still goes whole."""
    from dkern.solvers.checkpoint import Checkpoint

    ck = tmp_path / "ck"
    ck.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", ck / "history")  # a user's link at an array's name
    Checkpoint(str(ck), 1, {"data": "x"}, "cg").save({"r": np.zeros(4)}, np.zeros(1),
                                                      {"iteration": 1})
    (ck / "notes.txt").write_text("mine")
    write_array(np.arange(3.0), ck / "other.zarr", "z")
    remove_checkpoint(ck)
    assert sorted(os.listdir(ck)) == ["history", "notes.txt", "other.zarr"]
    assert os.path.islink(ck / "history") and (tmp_path / "elsewhere").is_dir()
    np.testing.assert_array_equal(open_array(ck / "other.zarr", "z").compute(), np.arange(3.0))
    alone = tmp_path / "alone"
    Checkpoint(str(alone), 1, {"data": "x"}, "cg").save({"r": np.zeros(4)}, np.zeros(1),
                                                         {"iteration": 1})
    remove_checkpoint(alone)
    assert not alone.exists()


def test_folders_in_the_version_tree_not_named_by_dkern_are_never_collected(tmp_path):
    """A user's copy of a version folder (``<folder>.bak``) and a folder of notes inside
    ``.dkern``: later writes collect unused version folders only. On the old code every
    folder there not named as dkern names them was deleted at the next write."""
    url = tmp_path / "s.zarr"
    write_array(np.arange(3.0), url, "x")
    (version,) = [n for n in os.listdir(url / ".dkern") if n.startswith("20")]
    shutil.copytree(url / ".dkern" / version, url / ".dkern" / f"{version}.bak", symlinks=True)
    (url / ".dkern" / "notes").mkdir()
    write_array(np.arange(4.0), url, "x", overwrite=True)
    listed = os.listdir(url / ".dkern")
    assert f"{version}.bak" in listed and "notes" in listed and version not in listed


@pytest.mark.parametrize("group", ["", "models/m"])
def test_a_zarr_v2_store_is_never_hidden_under_a_v3_group(tmp_path, group):
    """A Zarr v2 dataset (xarray's to_zarr(zarr_format=2)): writing or saving into it, or
    into a group below it, is refused naming it; its files stay as they were. On the old
    code dkern's zarr.json was laid over it and xarray then showed only dkern's arrays."""
    import zarr

    import dkern
    from dkern.models import KernelDensity

    url = tmp_path / "v2.zarr"
    root = zarr.open_group(str(url), mode="w", zarr_format=2)
    root.create_array("temperature", shape=(5,), dtype="f8")[:] = np.arange(5.0)
    before = sorted(os.listdir(url))
    with pytest.raises(StoreError, match=r"holds a Zarr v2 group \(\.zgroup\).*zarr_format=3"):
        write_arrays(url, {"x": np.ones(3)}, group=group)
    if not group:
        with pytest.raises(StoreError, match="holds a Zarr v2 group"):
            dkern.save(KernelDensity().fit(np.ones((5, 2))), url)
    assert sorted(os.listdir(url)) == before
    np.testing.assert_array_equal(zarr.open_group(str(url), mode="r")["temperature"][:],
                                  np.arange(5.0))
