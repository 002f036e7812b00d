"""``exp`` of float64 kernel tiles, compiled once per machine, with numpy as the fallback.

numpy vectorises float64 ``exp`` only on AVX-512 CPUs; on the others (AVX2 laptops
and servers, ARM) it costs ~5 ns a value, more than the rest of a Gaussian tile
together. ``fastexp.c`` is a loop the C compiler vectorises (several times numpy's
speed there, within a few ulp: benchmarks/RESULTS.md). It is compiled the first time
a process needs it, like KeOps compiles its formulas, into ``$DKERN_CACHE_DIR`` (default
``~/.cache/dkern``) under a name that hashes the source, the flags, the compiler and
the CPU's features, so a cache shared by different machines never runs code built
for another CPU. A freshly loaded library is checked against ``numpy.exp`` before
use; without a compiler, or if the check fails, dkern logs why and uses
``numpy.exp``. ``DKERN_FASTEXP=0`` turns it off.

Loading a library runs its code, so a cached one is loaded only from a cache nobody
else can write to (the same rule as OpenSSH's for ``~/.ssh``): the cache folder and
the files must be owned by the user or root and not writable by group or others,
and every folder above the cache may be writable by others only with the sticky bit
(as ``/tmp``). The library's sha256, recorded at build time in a file beside it
(``sha256sum`` format), must match too. That record alone would prove nothing (whoever
can replace the library can rewrite its record): it catches a library changed after
its build, while the owner and mode checks keep others from doing either. They
cannot protect against the user's own account or root, which can run code as the
user anyway; and a group-writable folder is refused even when the group is the
user's own. A cache that fails these checks is not used: dkern logs a warning
naming the path, the problem and the fix, ``dkern info`` shows it, and ``numpy.exp``
is used instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fastexp.c")
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-shared", "-fPIC")
#: The largest error against numpy.exp accepted when a freshly built library is checked.
MAX_ULP = 4.0


def exp(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``numpy.exp(a, out=out)``, through the compiled loop for C-contiguous float64 arrays.

    Parameters
    ----------
    a : ndarray of any shape
    out : ndarray of a's shape and dtype, optional
        May be ``a`` itself (in place).

    Returns
    -------
    ndarray of a's shape
    """
    fast = _load()[0]
    if (fast is None or a.dtype != np.float64 or not a.flags.c_contiguous
            or (out is not None and (out.dtype != np.float64 or not out.flags.c_contiguous
                                     or out.shape != a.shape))):
        return np.exp(a, out=out)
    if out is None:
        out = np.empty_like(a)
    fast(a.ctypes.data, out.ctypes.data, a.size)
    return out


def status() -> str:
    """One line for ``dkern info``: whether the compiled exp is in use, and why not."""
    return _load()[1]


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, str]:
    """This machine's checked ``dkern_exp`` function and a status line, or None and the reason.

    Built and checked once per process; the reason for a fallback is logged.
    """
    if os.environ.get("DKERN_FASTEXP", "1") == "0":
        return _fallback("turned off by DKERN_FASTEXP=0")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return _fallback("no C compiler (cc/gcc) on PATH")
    try:
        path = _build(compiler)
        function = ctypes.CDLL(str(path)).dkern_exp
    except _UntrustedCache as err:
        return _fallback(f"the cached library was not loaded: {err}", logging.WARNING)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", None) or str(err)
        return _fallback(f"building it with {compiler} failed: {detail.strip()[:200]}")
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ssize_t]
    function.restype = None
    if (ulp := _ulp_error(function)) > MAX_ULP:
        return _fallback(f"the build differs from numpy.exp by {ulp:.1f} ulp")
    return function, f"compiled ({Path(compiler).name}), within {ulp:.2f} ulp of numpy.exp"


def _fallback(reason: str, level: int = logging.INFO) -> tuple[None, str]:
    logger.log(level, "dkern fast exp unavailable, using numpy.exp: %s", reason)
    return None, f"numpy.exp ({reason})"


class _UntrustedCache(Exception):
    """A cached file that others could have written; the message names it and the fix."""


def _build(compiler: str) -> Path:
    """This machine's library: the cached one once checked, else compiled now; its path."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version,
                                    platform.machine(), _cpu_features()]).encode()).hexdigest()
    cache = _private_folder(Path(os.environ.get("DKERN_CACHE_DIR")
                                 or Path.home() / ".cache" / "dkern"))
    record = cache / f"fastexp-{key[:20]}.sha256"
    if os.path.lexists(record):
        return _recorded_library(record)
    return _compile(compiler, record)


def _private_folder(folder: Path) -> Path:
    """``folder`` made absolute, created with mode 0o700 where missing (as the XDG base
    directory spec asks), once no one but the user and root can write to it."""
    folder = folder.expanduser().resolve()
    for missing in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        missing.mkdir(mode=0o700, exist_ok=True)
    fix = "set DKERN_CACHE_DIR to a folder of your own"
    for parent in folder.parents:  # others may write here only under the sticky bit (/tmp)
        _check_private(parent, os.stat(parent), f"run `chmod go-w {parent}`, or {fix}",
                       sticky_ok=True)
    _check_private(folder, os.stat(folder), f"run `chmod go-w {folder}`, or {fix}")
    return folder


def _check_private(path: Path, st: os.stat_result, fix: str, sticky_ok: bool = False) -> None:
    """Raise _UntrustedCache unless ``path`` is owned by the user or root and not writable
    by group or others (or, for a folder above the cache, is so with the sticky bit)."""
    if st.st_uid not in (os.geteuid(), 0):
        raise _UntrustedCache(f"{path} is owned by uid {st.st_uid}, expected you (uid "
                              f"{os.geteuid()}) or root; {fix}")
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise _UntrustedCache(f"{path} is writable by group or others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}), expected writable by its "
                              f"owner only; {fix}")


def _read_private(path: Path, fix: str) -> bytes:
    """The bytes of the regular file ``path`` (not a link), once _check_private passes."""
    if os.path.islink(path):
        raise _UntrustedCache(f"{path} is a symbolic link, expected the file itself; {fix}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _UntrustedCache(f"{path} is not a regular file; {fix}")
        _check_private(path, info, fix)
        return file.read()


def _recorded_library(record: Path) -> Path:
    """The library ``record`` names, if both are private files and its sha256 is the
    recorded one (a change after the build: the library is not loaded)."""
    fix = f"delete the cached build (rm {record.parent}/fastexp-*) and dkern rebuilds it"
    text = _read_private(record, fix).decode(errors="replace")
    digest, _, name = text.rstrip("\n").partition("  ")
    library = record.parent / name
    if not name or library.name != name or not library.name.startswith(record.stem + "-"):
        raise _UntrustedCache(f"{record} does not read '<sha256>  {record.stem}-<id>.so'; "
                              f"{fix}")
    if hashlib.sha256(_read_private(library, fix)).hexdigest() != digest:
        raise _UntrustedCache(f"{library} is not the library built there: its sha256 differs "
                              f"from the one {record} recorded at build time; {fix}")
    return library


def _compile(compiler: str, record: Path) -> Path:
    """Compile fastexp.c into the cache folder; record its sha256; return its path."""
    # Built in a folder only this user can enter (the linker writes with the umask's
    # mode), then renamed into place: processes building at once each publish a
    # complete library, named by its own hash, and the record names one of them.
    building = tempfile.mkdtemp(dir=record.parent, prefix=".fastexp-build-")
    try:
        tmp = os.path.join(building, "fastexp.so")
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], check=True,
                       capture_output=True, text=True, timeout=120)
        os.chmod(tmp, 0o700)
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        library = record.with_name(f"{record.stem}-{digest[:16]}.so")
        os.replace(tmp, library)
        record_tmp = os.path.join(building, "record")  # mkdtemp: mode 0o700
        Path(record_tmp).write_text(f"{digest}  {library.name}\n")
        os.chmod(record_tmp, 0o600)
        os.replace(record_tmp, record)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    logger.info("dkern fast exp compiled to %s (sha256 %s, recorded in %s)", library, digest,
                record)
    return library


def _cpu_features() -> str:
    """The CPU's feature flags (Linux), so ``-march=native`` builds are keyed by CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    flags = [line for line in text.splitlines() if line.startswith(("flags", "Features"))]
    return flags[0] if flags else platform.processor()


def _ulp_error(function: Any) -> float:
    """Largest error of ``function`` against numpy.exp, in ulp, over the finite range."""
    x = np.concatenate([np.linspace(-745.0, 709.7, 20_001), np.linspace(-1.0, 1.0, 2_001)])
    got = np.empty_like(x)
    function(x.ctypes.data, got.ctypes.data, x.size)
    want = np.exp(x)
    normal = want > np.finfo(np.float64).tiny
    special = np.array([np.nan, np.inf, -np.inf, 710.0, -746.0])
    got_special = np.empty_like(special)
    function(special.ctypes.data, got_special.ctypes.data, special.size)
    with np.errstate(over="ignore"):
        if not np.array_equal(got_special, np.exp(special), equal_nan=True):
            return np.inf
    return float(np.max(np.abs(got[normal] - want[normal]) / np.spacing(want[normal])))
