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

from dkern import cli
from dkern.errors import CorruptChunkError, StoreError
from dkern.io import check_store, clean_store, open_array, write_array, write_arrays
from dkern.io._store import checksum

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


def test_cli_fit_over_a_forged_model_store_keeps_the_victim(tmp_path):
    """The issue's CLI repro: a model store whose ``residuals`` entry names another folder
    (and one naming ``../nothing``), then ``dkern fit … --model model.zarr --overwrite``."""
    data, model = str(tmp_path / "data.zarr"), str(tmp_path / "model.zarr")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    write_arrays(data, {"X": X, "y": np.sin(X[:, 0])}, chunk_rows=50)
    argv = [sys.executable, "-m", "dkern", "fit", "--data", data, "--x", "X", "--y", "y",
            "--model", model, "--solver", "exact", "--alpha", "0.01", "--workers", "1",
            "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    names = json.loads(Path(model, "zarr.json").read_text())["attributes"]["dkern"]["arrays"]
    name = "residuals" if "residuals" in names else sorted(names)[0]
    target = victim(tmp_path)
    forge(model, retarget(name, str(target)))
    done = subprocess.run([*argv, "--overwrite"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode != 0 and "cannot be trusted" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert intact(target)
    (tmp_path / "bystander.txt").write_text("keep me")
    forge(model, retarget(name, "../nothing"))
    done = subprocess.run([*argv, "--overwrite"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode != 0 and "cannot be trusted" in done.stderr, done.stderr
    assert (tmp_path / "bystander.txt").read_text() == "keep me" and Path(data).exists()
