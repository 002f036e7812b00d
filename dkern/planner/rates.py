"""This machine's rates for the block functions a run is made of, stored once per machine.

:func:`dkern.planner.measure.calibrate` measures them (``dkern plan --calibrate``) and
:func:`save_rates` writes them as JSON to ``$DKERN_CACHE_DIR/plan-rates.json`` (default
``~/.cache/dkern``), the folder where dkern caches its compiled ``exp``, under the same
rules (:mod:`dkern.kernels.fastexp`): a folder and a file only the user can write to.
Rates read from a file others could have changed would only mislead a plan, not run code,
but one rule for the whole cache is easier to trust than two.

Every rate is of ONE thread of one worker (dask runs one task per thread, each with
single-threaded BLAS), except the ``client_*`` rates (the client's multithreaded BLAS on
the M × M work) and the cluster's fixed costs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..kernels.native import UntrustedCache, private_folder, read_private, source_digest

logger = logging.getLogger(__name__)

__all__ = ["RATES_FILE", "Rates", "code_digest", "load_rates", "rates_path", "save_rates"]

#: The calibration's file name in the cache folder.
RATES_FILE = "plan-rates.json"
#: Bumped when a field changes meaning: an older file is then measured again.
RATES_VERSION = 2


@dataclass(frozen=True)
class Rates:
    """Measured rates of this machine (one thread while every core is busy, unless named
    ``client_``).

    Attributes
    ----------
    entry_seconds : dict of str to [float, float]
        Seconds per kernel entry of a block function, ``a + b·d`` for d features, by
        block: ``"kernel_matvec"`` (``k(x, z) @ v``), ``"normal_matvec"`` (``k(x, c)ᵀ
        (k(x, c) v)``), ``"kernel_block"`` (the dense ``k(x, z)``); Gaussian kernel.
    cached_normal_entries_per_s : float
        Entries per second of ``Kᵀ (K v)`` over a cached float64 block (memory-bound).
    sgpr_statistics_units_per_s, sgpr_predict_units_per_s : float
        ``rows · M²`` per second of the sparse GP's whitening work beyond the kernel
        values (a triangular solve and a rank update per row; two solves when predicting).
    read_bytes_per_s, write_bytes_per_s : float
        Zarr chunks read (decoded, checksums checked) and written, bytes of array per s.
    client_flops, client_cholesky_flops : float
        Flops per second of the client's multithreaded GEMM and Cholesky (M × M work).
    client_bytes_per_s : float
        Bytes per second the client's triangular solves and matrix-vector products stream.
    start_seconds : float
        Seconds of a command with no work: imports, the embedded cluster's start and stop,
        the interpreter's exit.
    round_trip_seconds : float
        Seconds of one ``dask.compute`` of a one-task graph: a pass's fixed cost.
    task_seconds : float
        Scheduler seconds per extra task of a graph.
    worker_idle_bytes : int
        Resident memory of an idle worker process that has imported dkern.
    machine : str
        The CPU and core count the rates were measured on.
    code : str
        :func:`code_digest` when the rates were measured: of the compiled block functions.
    measured : dict
        The raw measurements behind the fitted figures, for the record.
    """

    entry_seconds: dict[str, list[float]]
    cached_normal_entries_per_s: float
    sgpr_statistics_units_per_s: float
    sgpr_predict_units_per_s: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    client_flops: float
    client_cholesky_flops: float
    client_bytes_per_s: float
    start_seconds: float
    round_trip_seconds: float
    task_seconds: float
    worker_idle_bytes: int
    machine: str = ""
    code: str = ""
    measured: dict[str, Any] = field(default_factory=dict)

    def per_entry(self, block: str, d: int) -> float:
        """Seconds per kernel entry of ``block`` at d features, ``a + b·d``."""
        a, b = self.entry_seconds[block]
        return a + b * d

    def to_json(self) -> str:
        return json.dumps({"version": RATES_VERSION, **dataclasses.asdict(self)}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Rates:
        """The rates of a file :meth:`to_json` wrote; ValueError for another version."""
        data = json.loads(text)
        if data.pop("version", None) != RATES_VERSION:
            raise ValueError(f"the calibration is of another dkern version (format "
                             f"{RATES_VERSION} expected); run `dkern plan --calibrate`")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(data) - {"machine", "code", "measured"}
        if missing:
            raise ValueError(f"the calibration lacks {sorted(missing)}; run "
                             "`dkern plan --calibrate`")
        rates = cls(**{k: v for k, v in data.items() if k in names})
        rates.check()
        return rates

    def check(self) -> None:
        """ValueError naming the first figure that is not a usable measurement: a rate that
        is not a finite number > 0, a time or size that is not one >= 0, or an entry cost
        ``[a, b]`` missing or not positive at d = 1."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith(("_per_s", "_flops")):
                ok = _finite(value) and value > 0
            elif f.name.endswith(("_seconds", "_bytes")) and f.name != "entry_seconds":
                ok = _finite(value) and value >= 0
            else:
                continue
            if not ok:
                raise ValueError(f"the calibration's {f.name} is {value!r}, not a usable "
                                 "measurement; run `dkern plan --calibrate`")
        for block in ENTRY_BLOCKS:
            cost = self.entry_seconds.get(block) if isinstance(self.entry_seconds, dict) else None
            if not (isinstance(cost, list) and len(cost) == 2 and all(map(_finite, cost))
                    and cost[0] + cost[1] > 0):
                raise ValueError(f"the calibration's entry_seconds[{block!r}] is {cost!r}, "
                                 "not [a, b] with a + b > 0; run `dkern plan --calibrate`")


#: The block functions whose per-entry cost the calibration holds (``Rates.entry_seconds``).
ENTRY_BLOCKS = ("kernel_matvec", "normal_matvec", "kernel_block")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def code_digest() -> str:
    """A digest of the compiled block functions' sources (the fused Gaussian loop, the exp
    of the tiles): their speed is most of the rates, so a calibration measured with other
    sources (an upgrade of dkern) is measured again rather than trusted."""
    from ..backends.fused_cpu import LIBRARY
    from ..kernels.fastexp import LIBRARY as EXP_LIBRARY

    return source_digest(LIBRARY, EXP_LIBRARY)


def machine_name() -> str:
    """The CPU's model name and the number of cores, as the rates file records them."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def rates_path() -> Path:
    """``$DKERN_CACHE_DIR/plan-rates.json`` (default ``~/.cache/dkern``), the folder created
    private where missing; PermissionError, naming the fix, if others could write there."""
    folder = Path(os.environ.get("DKERN_CACHE_DIR") or Path.home() / ".cache" / "dkern")
    try:
        return private_folder(folder) / RATES_FILE
    except UntrustedCache as err:
        raise PermissionError(str(err)) from None


def save_rates(rates: Rates) -> Path:
    """Write ``rates`` to :func:`rates_path`, readable and writable by the user only, by an
    atomic rename (a reader sees the old file or the new one); returns the path."""
    path = rates_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(rates.to_json())
    os.replace(tmp, path)
    return path


def load_rates() -> Rates | None:
    """The stored calibration, or None when there is none (or it is of another format or
    of other compiled block functions: logged). Raises OSError when the file or its folder
    could be written by others."""
    path = rates_path()
    if not path.exists():
        return None
    try:
        text = read_private(path, f"delete {path} and run `dkern plan --calibrate`")
    except UntrustedCache as err:
        raise PermissionError(str(err)) from None
    try:
        rates = Rates.from_json(text.decode())
    except (ValueError, TypeError) as err:
        logger.warning("dkern plan: %s is not a usable calibration (%s); measuring again",
                       path, err)
        return None
    if rates.code != code_digest():
        logger.warning("dkern plan: %s was measured with other compiled block functions "
                       "(another dkern); measuring again", path)
        return None
    return rates
