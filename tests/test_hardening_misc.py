"""Hardening: the compiled exp is loaded only from a private cache, and the command's
Ctrl-C and bad arguments end in one line, not a traceback."""

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dkern import cli

ROOT = Path(__file__).resolve().parents[1]
COMPILER = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler (cc/gcc) on PATH")

# Loads dkern's fastexp in a fresh process: _load runs once per process, and a library's
# constructor must not run in the test process. Prints the status.
_LOAD = """
import logging
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from dkern.kernels import fastexp
print(fastexp.status())
"""

# A library that exports dkern_exp (right, through libm) and, when loaded, writes a marker.
_PLANTED = r"""
#include <math.h>
#include <stddef.h>
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("planted code ran\n", f); fclose(f); }
}
void dkern_exp(const double *x, double *y, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++) y[i] = exp(x[i]);
}
"""


def load_in_child(cache: Path) -> tuple[str, str]:
    """fastexp's status line and log in a fresh process with ``DKERN_CACHE_DIR=cache``."""
    env = {**os.environ, "DKERN_CACHE_DIR": str(cache),  # this checkout's dkern
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("DKERN_FASTEXP", None)
    result = subprocess.run([sys.executable, "-c", _LOAD], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr


@pytest.fixture
def planted(tmp_path):
    """(library bytes, marker path): a library whose constructor creates the marker."""
    source, library = tmp_path / "planted.c", tmp_path / "planted.so"
    marker = tmp_path / "planted-code-ran"
    source.write_text(_PLANTED)
    subprocess.run([COMPILER, "-shared", "-fPIC", "-O1", f'-DMARKER="{marker}"', str(source),
                    "-o", str(library), "-lm"], check=True, capture_output=True, timeout=120)
    return library.read_bytes(), marker


def built_cache(folder: Path) -> Path:
    """``folder`` holding this machine's build, made by a first process."""
    status, log = load_in_child(folder)
    assert status.startswith("compiled"), log
    return folder


def replace_libraries(cache: Path, data: bytes, *, rewrite_records: bool) -> None:
    """Overwrite every library in ``cache`` with ``data``, as an attacker who can write
    there would; with rewrite_records, also record ``data``'s sha256 beside them."""
    for library in cache.glob("*.so"):
        library.write_bytes(data)
    for record in cache.glob("*.sha256") if rewrite_records else ():
        name = record.read_text().split("  ", 1)[1]
        record.write_text(f"{hashlib.sha256(data).hexdigest()}  {name}")


@needs_compiler
def test_a_library_planted_in_a_world_writable_cache_is_never_run(tmp_path, planted):
    data, marker = planted
    cache = built_cache(tmp_path / "cache")
    cache.chmod(0o777)
    replace_libraries(cache, data, rewrite_records=True)  # a hash beside it proves nothing
    status, log = load_in_child(cache)
    assert not marker.exists(), "the planted library was loaded and its code ran"
    assert status.startswith("numpy.exp (the cached library was not loaded: ")
    assert f"{cache} is writable by group or others (mode 0777)" in status
    assert f"run `chmod go-w {cache}`, or set DKERN_CACHE_DIR to a folder" in status
    assert "WARNING" in log


@needs_compiler
def test_a_library_replaced_after_its_build_is_not_loaded(tmp_path, planted):
    data, marker = planted
    cache = built_cache(tmp_path / "cache")
    replace_libraries(cache, data, rewrite_records=False)
    status, _ = load_in_child(cache)
    assert not marker.exists(), "the replaced library was loaded and its code ran"
    [library] = cache.glob("*.so")
    assert (f"{library} is not the library built there: its sha256 differs from the one "
            f"{library.parent}/") in status
    assert f"rm {cache}/fastexp-*" in status


@needs_compiler
def test_a_cache_below_a_folder_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could rename the cache folder and put their own there
    status, _ = load_in_child(shared / "cache")
    assert status.startswith("numpy.exp")
    assert f"{shared} is writable by group or others (mode 0777)" in status


@needs_compiler
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving files to another user needs root")
def test_a_cache_owned_by_another_user_is_refused(tmp_path):
    cache = built_cache(tmp_path / "cache")
    for path in (cache, *cache.iterdir()):
        os.chown(path, 65534, 65534)
    status, _ = load_in_child(cache)
    assert status.startswith("numpy.exp")
    assert f"{cache} is owned by uid 65534, expected you (uid 0) or root" in status


@needs_compiler
def test_a_private_cache_is_made_private_records_the_hash_and_loads(tmp_path):
    sticky = tmp_path / "tmp-like"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others may write, but not rename what is not theirs
    cache = sticky / "user" / "dkern"
    built_cache(cache)
    for folder in (cache, cache.parent):  # created 0o700, as XDG asks of ~/.cache
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = {path.name: path.stat() for path in cache.iterdir()}
    assert all(not info.st_mode & 0o022 for info in files.values()), files
    [record] = cache.glob("*.sha256")
    digest, name = record.read_text().rstrip("\n").split("  ")  # `sha256sum -c` reads it
    assert hashlib.sha256((cache / name).read_bytes()).hexdigest() == digest
    status, log = load_in_child(cache)  # a second process loads the build, not rebuilding
    assert status.startswith("compiled") and "compiled to" not in log
    assert {path.name: path.stat().st_mtime_ns for path in cache.iterdir()} == \
        {name: info.st_mtime_ns for name, info in files.items()}


def test_ctrl_c_is_one_line_exit_130_and_stops_the_workers(tmp_path):
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group, the embedded
    cluster's workers included, once the demo has started writing its store."""
    store = tmp_path / "demo.zarr"
    process = subprocess.Popen(
        [sys.executable, "-m", "dkern", "demo", "--store", str(store), "--workers", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not store.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, "the demo ended before it could be interrupted"
        time.sleep(1.0)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert "Traceback" not in err and len(err.splitlines()) <= 3, err
    assert err.startswith(f"dkern demo: interrupted; writes are published atomically, so "
                          f"'{store}' holds no half-written array"), err
    assert out == ""
    deadline = time.monotonic() + 30  # closing the cluster stopped every worker process
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(process.pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("argv, message", [
    (["make-data", "--out", "{tmp}/d.zarr", "--n", "10", "--d", "2", "--noise", "nan"],
     "argument --noise: must be a finite number >= 0; got nan"),
    (["make-data", "--out", "{tmp}/d.zarr", "--n", "10", "--d", "2", "--noise", "-0.1"],
     "argument --noise: must be a finite number >= 0; got -0.1"),
    (["fsck", "{tmp}/d.zarr", "--min-age", "-1"],
     "argument --min-age: must be a finite number >= 0; got -1"),
    (["store", "clean", "{tmp}/d.zarr", "--min-age", "inf"],
     "argument --min-age: must be a finite number >= 0; got inf"),
])
def test_numbers_out_of_range_are_usage_errors(capsys, tmp_path, argv, message):
    """A NaN noise used to write a store of NaN targets (exit 0); a negative --min-age was
    taken as is. Both are now refused before any work, with exit 2."""
    with pytest.raises(SystemExit) as exc:
        cli.main([arg.format(tmp=tmp_path) for arg in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(message) and "Traceback" not in err
    assert not (tmp_path / "d.zarr").exists()
