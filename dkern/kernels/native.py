"""C loops compiled once per machine into a trusted cache, checked before use.

dkern's C sources (``fastexp.c``, ``fused_gaussian.c``) are compiled the first time a
process needs them, like KeOps compiles its formulas, into ``$DKERN_CACHE_DIR``
(default ``~/.cache/dkern``) under a name that hashes the sources, the flags, the
compiler and the CPU's features, so a cache shared by different machines never runs
code built for another CPU. A freshly loaded library is checked against its numpy
reference before use (the caller's ``check``); without a compiler, or if the build or
the check fails, :func:`load` logs why and the caller computes the same results with
numpy. Each library has an environment switch (``DKERN_FASTEXP=0`` …) turning it off.

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
naming the path, the problem and the fix, ``dkern info`` shows it, and numpy is used
instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
#: -fno-trapping-math lets the clamps become branch-free selects; -fopenmp-simd honours
#: ``#pragma omp simd`` (vectorised loops and reductions) without OpenMP's runtime.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp-simd", "-shared", "-fPIC")


@dataclass(frozen=True)
class Native:
    """One C library: its cache name, source, the headers it includes (hashed into the
    cache key too), its off switch, and what runs without it (for the status line)."""

    name: str
    source: Path
    switch: str
    fallback: str
    headers: tuple[Path, ...] = ()


def load(lib: Native, bind: Callable[[ctypes.CDLL], Any],
         check: Callable[[Any], tuple[bool, str]]) -> tuple[Any, str]:
    """``lib``'s checked functions and a status line, or None and the reason.

    Parameters
    ----------
    lib : Native
    bind : callable
        Takes the loaded library; returns its functions with their ctypes signatures set.
    check : callable
        Takes what ``bind`` returned; returns (whether it agrees with the numpy
        reference, a few words saying how closely or why not). A library failing its
        check is not used.

    Returns
    -------
    (functions or None, status line for ``dkern info``)
    """
    if os.environ.get(lib.switch, "1") == "0":
        return _fallback(lib, f"turned off by {lib.switch}=0")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return _fallback(lib, "no C compiler (cc/gcc) on PATH")
    try:
        functions = bind(ctypes.CDLL(str(_build(lib, compiler))))
    except UntrustedCache as err:
        return _fallback(lib, f"the cached library was not loaded: {err}", logging.WARNING)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", None) or str(err)
        return _fallback(lib, f"building it with {compiler} failed: {detail.strip()[:200]}")
    passed, detail = check(functions)
    if not passed:
        return _fallback(lib, detail)
    return functions, f"compiled ({Path(compiler).name}), {detail}"


def _fallback(lib: Native, reason: str, level: int = logging.INFO) -> tuple[None, str]:
    logger.log(level, "dkern %s unavailable, using %s: %s", lib.name, lib.fallback, reason)
    return None, f"{lib.fallback} ({reason})"


class UntrustedCache(Exception):
    """A cached file that others could have written; the message names it and the fix."""


def _build(lib: Native, compiler: str) -> Path:
    """This machine's library: the cached one once checked, else compiled now; its path."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    key = hashlib.sha256("\0".join([*_texts(lib), " ".join(FLAGS), version,
                                    platform.machine(), _cpu_features()]).encode()).hexdigest()
    cache = private_folder(Path(os.environ.get("DKERN_CACHE_DIR")
                                 or Path.home() / ".cache" / "dkern"))
    record = cache / f"{lib.name}-{key[:20]}.sha256"
    if os.path.lexists(record):
        return _recorded_library(lib, record)
    return _compile(lib, compiler, record)


def source_digest(*libs: Native) -> str:
    """A digest (16 hex digits) of the libraries' sources, headers and compiler flags: what
    their code is, whatever machine builds it."""
    texts = [t for lib in libs for t in _texts(lib)]
    return hashlib.sha256("\0".join([*texts, " ".join(FLAGS)]).encode()).hexdigest()[:16]


def _texts(lib: Native) -> list[str]:
    return [p.read_text() for p in (lib.source, *lib.headers)]


def private_folder(folder: Path) -> Path:
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
    """Raise UntrustedCache unless ``path`` is owned by the user or root and not writable
    by group or others (or, for a folder above the cache, is so with the sticky bit)."""
    if st.st_uid not in (os.geteuid(), 0):
        raise UntrustedCache(f"{path} is owned by uid {st.st_uid}, expected you (uid "
                              f"{os.geteuid()}) or root; {fix}")
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise UntrustedCache(f"{path} is writable by group or others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}), expected writable by its "
                              f"owner only; {fix}")


def read_private(path: Path, fix: str) -> bytes:
    """The bytes of the regular file ``path`` (not a link), once _check_private passes."""
    if os.path.islink(path):
        raise UntrustedCache(f"{path} is a symbolic link, expected the file itself; {fix}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedCache(f"{path} is not a regular file; {fix}")
        _check_private(path, info, fix)
        return file.read()


def _recorded_library(lib: Native, record: Path) -> Path:
    """The library ``record`` names, if both are private files and its sha256 is the
    recorded one (a change after the build: the library is not loaded)."""
    fix = f"delete the cached build (rm {record.parent}/{lib.name}-*) and dkern rebuilds it"
    text = read_private(record, fix).decode(errors="replace")
    digest, _, name = text.rstrip("\n").partition("  ")
    library = record.parent / name
    if not name or library.name != name or not library.name.startswith(record.stem + "-"):
        raise UntrustedCache(f"{record} does not read '<sha256>  {record.stem}-<id>.so'; "
                              f"{fix}")
    if hashlib.sha256(read_private(library, fix)).hexdigest() != digest:
        raise UntrustedCache(f"{library} is not the library built there: its sha256 differs "
                              f"from the one {record} recorded at build time; {fix}")
    return library


def _compile(lib: Native, compiler: str, record: Path) -> Path:
    """Compile ``lib.source`` into the cache folder; record its sha256; return its path."""
    # Built in a folder only this user can enter (the linker writes with the umask's
    # mode), then renamed into place: processes building at once each publish a
    # complete library, named by its own hash, and the record names one of them.
    building = tempfile.mkdtemp(dir=record.parent, prefix=f".{lib.name}-build-")
    try:
        tmp = os.path.join(building, f"{lib.name}.so")
        subprocess.run([compiler, *FLAGS, str(lib.source), "-o", tmp, "-lm"], check=True,
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
    logger.info("dkern %s compiled to %s (sha256 %s, recorded in %s)", lib.name, library,
                digest, record)
    return library


def _cpu_features() -> str:
    """The CPU's feature flags (Linux), so ``-march=native`` builds are keyed by CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    flags = [line for line in text.splitlines() if line.startswith(("flags", "Features"))]
    return flags[0] if flags else platform.processor()
