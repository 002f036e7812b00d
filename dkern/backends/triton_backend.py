"""Running the Triton backend's fused kernels (:mod:`.triton_kernels`) on one block.

Kernel values are made and used in registers, never stored: one Triton program owns
``BN`` rows of x and walks z's rows ``BM`` at a time, computing each tile from the
coordinates (:mod:`.triton_source` writes that part for the kernel at hand) and folding
it into the result at once, flash-attention style. This module moves the operands to
the device, compiles each generated source once per process, and launches.
float64 operands compute in float64; float32 operands compute their kernel values
and the partial sums of a few tiles in float32 and accumulate those in float64, so a
sum over a million columns keeps float32's relative accuracy, not loses it.

Triton compiles for CUDA GPUs; with ``TRITON_INTERPRET=1`` its interpreter runs the
same kernels on the CPU with numpy (slowly), which is how CI checks them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import linecache
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels import Gaussian, Kernel
from .triton_kernels import (
    GAUSSIAN_LOG_SUMS,
    NEAREST,
    grad_matvec_source,
    matvec_source,
    pair_weighted_grads_source,
)
from .triton_source import NoTritonSource

logger = logging.getLogger(__name__)

#: Tile sizes (rows × columns of one kernel tile) and warps per program of the Gram
#: product on a GPU: the fastest of benchmarks/gram.py's sweep (RESULTS.md names the GPU).
GPU_TILES = {"float32": (128, 32, 8), "float64": (64, 32, 2)}
#: The other fused kernels' (smoothing sums, neighbours' ∂K/∂θ products, the sparse GP's
#: gradient), not swept: those they were written with. _launch shrinks what does not fit.
GPU_OTHER_TILES = (128, 64, 4)
#: Under the interpreter bigger tiles mean fewer Python-level steps.
INTERPRETER_TILES = (128, 128, 1)
#: Tiles a one-column product sums entry by entry before it reduces across their columns
#: into its float64 total: more is fewer reductions, fewer is float32 sums of fewer terms.
GPU_CHUNK = {"float32": 16, "float64": 16}
INTERPRETER_CHUNK = 2
#: The interpreter patches triton.language while a kernel runs, so two threads' launches
#: (dask's threaded scheduler) would see each other's patches: it takes one at a time.
_INTERPRETER_LOCK = threading.Lock()
#: Columns of v one launch handles; wider v is done in groups (each recomputes the tile).
MAX_COLUMNS = 64

def interpreting() -> bool:
    """True when Triton runs its kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=64)
def _compiled(source: str, name: str = "kernel_matvec") -> Callable[..., Any]:
    """The function ``name`` of this generated source, as a Triton function.

    The source is registered with :mod:`linecache` under a name of its own (Triton
    reads a kernel's source through :mod:`inspect`), so nothing is written to disk;
    Triton caches the compiled binaries itself.
    """
    file = f"<dkern-triton-{hashlib.sha256(source.encode()).hexdigest()[:16]}>"
    linecache.cache[file] = (len(source), None, source.splitlines(True), file)
    namespace: dict[str, Any] = {"__name__": file}
    exec(compile(source, file, "exec"), namespace)  # noqa: S102 - our own generated source
    logger.debug("compiled Triton kernel %s %s", name, file)
    return namespace[name]


def _device() -> Any:
    import torch

    return torch.device("cpu" if interpreting() else "cuda")


def _tensor(a: np.ndarray, device: Any) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


_STREAMS = threading.local()


def _on_thread_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` on its thread's own CUDA stream (as is under the interpreter).

    dask runs one block per thread; on torch's one default stream their launches would
    queue behind each other, each leaving part of the GPU idle at its tail. On a stream
    per thread they overlap. A block's copies, launches and results stay on its stream,
    and bringing a result to the host waits for that stream alone.
    """
    @functools.wraps(fn)
    def on_stream(*args: Any, **kwargs: Any) -> Any:
        if interpreting():
            return fn(*args, **kwargs)
        import torch

        stream = getattr(_STREAMS, "stream", None)
        if stream is None:
            stream = _STREAMS.stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            return fn(*args, **kwargs)
    return on_stream


@functools.lru_cache(maxsize=1)
def _multiprocessors() -> int:
    """The GPU's streaming multiprocessors (2 under the interpreter, so that the tests'
    small blocks take the split path too)."""
    if interpreting():
        return 2
    import torch

    return torch.cuda.get_device_properties(_device()).multi_processor_count


def _other_tiles() -> tuple[int, int, int]:
    return INTERPRETER_TILES if interpreting() else GPU_OTHER_TILES


#: Programs per multiprocessor a product with few rows is split into (by columns): more
#: hides more memory latency, each adds a partial sum to reduce. benchmarks/gpu_splits.py
#: times the choices on a GPU.
PROGRAMS_PER_MULTIPROCESSOR = 16


def _splits(rows: int, bn: int, m: int, bm: int) -> int:
    """Column ranges to split a product's columns into, so that one with few rows (Falkon's
    ``k(c, x) u`` over M centres) still has programs for every multiprocessor
    (:data:`PROGRAMS_PER_MULTIPROCESSOR` each), and no range under one tile."""
    row_programs = max(1, -(-rows // bn))
    wanted = PROGRAMS_PER_MULTIPROCESSOR * _multiprocessors()
    return max(1, min(-(-m // bm), -(-wanted // row_programs)))


#: Tiles that fit, per kernel, requested tiles and compile-time constants: a kernel whose
#: tiles did not fit starts at the ones that did.
_FITTED: dict[tuple[Any, ...], tuple[int, int]] = {}


def _launch(run: Any, rows: int, tiles: tuple[int, int, int], *args: Any, splits: int = 1,
            min_bm: int = 1, **meta: Any) -> None:
    """Run ``run`` on ⌈rows / BN⌉ × ``splits`` programs with tiles (BN, BM, warps).

    Where the GPU lacks the shared memory or registers those tiles need (Triton's
    OutOfResources: a kernel with many derivative tiles, a GPU smaller than the one the
    tiles were chosen on), BN and then BM are halved until it fits, logged; later launches
    of that kernel start from the tiles that fitted.
    """
    import triton
    from triton.runtime.errors import OutOfResources

    key = (run, tiles, min_bm, repr(sorted(meta.items())))
    bn, bm = _FITTED.get(key, (tiles[0], max(tiles[1], min_bm)))
    while True:
        try:
            with _INTERPRETER_LOCK if interpreting() else contextlib.nullcontext():
                run[(triton.cdiv(rows, bn), splits)](*args, BN=bn, BM=bm, num_warps=tiles[2],
                                                     **meta)
            _FITTED[key] = (bn, bm)
            return
        except OutOfResources as err:
            if bn > 16:
                bn //= 2
            elif bm > max(min_bm, 16):
                bm //= 2
            else:
                raise
            logger.info("Triton kernel %s: %s; trying tiles of %d x %d", run.__name__, err,
                        bn, bm)


@_on_thread_stream
def matvec_block_triton(kernel: Kernel, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                        tiles: tuple[int, int, int] | None = None,
                        chunk: int | None = None) -> np.ndarray:
    """``kernel(x, z) @ v`` for x (n, d), z (m, d), v (m, t) or (m,); shape (n, t), float64.

    The kernel values are computed in x's float dtype (float32 or float64) and never
    stored. ``tiles`` overrides (BN, BM, warps) and ``chunk`` the tiles summed entry by
    entry (:data:`GPU_CHUNK`), as the GPU benchmark's sweep does.
    Raises :class:`~dkern.backends.triton_source.NoTritonSource` for a kernel Triton
    cannot express.
    """
    return _matvec_on_device(kernel, x, z, v, tiles=tiles, chunk=chunk).cpu().numpy()


def _matvec_on_device(kernel: Kernel, x: np.ndarray, z: np.ndarray, v: Any, *,
                      tiles: tuple[int, int, int] | None = None,
                      chunk: int | None = None) -> Any:
    """:func:`matvec_block_triton`'s product, left on the device: a float64 tensor (n, t).
    ``v`` is an ndarray or a tensor already on the device (not copied again)."""
    import torch
    import triton

    dtype = np.result_type(x.dtype, z.dtype, np.float32)
    x, z = x.astype(dtype, copy=False), z.astype(dtype, copy=False)
    v2 = v.reshape(len(z), 1) if v.ndim == 1 else v
    v2 = v2 if torch.is_tensor(v2) else torch.from_numpy(np.array(v2, dtype=dtype))
    torch_dtype = torch.float32 if dtype == np.float32 else torch.float64
    n, m, d = x.shape[0], z.shape[0], x.shape[1]
    source, params = matvec_source(kernel, d)
    run = _compiled(source)
    device = _device()
    bn, bm, warps = tiles or (INTERPRETER_TILES if interpreting() else GPU_TILES[dtype.name])
    chunk = chunk or (INTERPRETER_CHUNK if interpreting() else GPU_CHUNK[dtype.name])
    ct = triton.language.float32 if dtype == np.float32 else triton.language.float64
    xt, zt = _tensor(x, device), _tensor(z, device)
    pt = _tensor(params.astype(dtype) if len(params) else np.zeros(1, dtype), device)
    out = torch.empty((n, v2.shape[1]), dtype=torch.float64, device=device)
    splits = _splits(n, bn, m, bm)
    span = -(-m // (splits * bm)) * bm  # whole tiles per split, the last split's fewer
    splits = -(-m // span) if m else 1
    for lo in range(0, v2.shape[1], MAX_COLUMNS):
        vt = v2[:, lo:lo + MAX_COLUMNS].to(device=device, dtype=torch_dtype).contiguous()
        t = vt.shape[1]
        tp = 1 if t == 1 else max(16, triton.next_power_of_2(t))
        res = torch.empty((splits, n, t), dtype=torch.float64, device=device)
        if n and m:
            _launch(run, n, (bn, bm, warps), xt, zt, vt, pt, res, n, m, span, splits=splits,
                    min_bm=16 if tp > 1 else 1, D=d, T=t, TP=tp, S=chunk, CT=ct)
        else:
            res.zero_()
        out[:, lo:lo + t] = res.sum(dim=0)
    return out


@_on_thread_stream
def sgpr_statistics_triton(kernel: Kernel, x: np.ndarray, z: np.ndarray, y: np.ndarray,
                           L: np.ndarray, *, rows: int | None = None) -> np.ndarray:
    """One row chunk of the sparse GP's sums ``[AᵀA, Aᵀy]`` with ``A = k(x, z) L⁻ᵀ``, as
    :meth:`~dkern.backends.projections.ProjectionBlocks.sgpr_statistics`, all on the device.

    A comes from the fused product with the columns of ``L⁻ᵀ`` (kernel values never
    stored) and stays on the device, where its M × M sums run too: only the (M, M + t)
    result comes back, so the host does none of the O(n M²) work.

    Parameters
    ----------
    kernel : Kernel
    x : ndarray of shape (n, d)
    z : ndarray of shape (M, d)
        The centres.
    y : ndarray of shape (n, t)
    L : ndarray of shape (M, M)
        Lower Cholesky factor of ``k(z, z)`` (plus jitter).
    rows : int, optional
        Rows of x per device tile of A; default :func:`_whitening_rows`.

    Returns
    -------
    ndarray of shape (M, M + t), float64
        ``AᵀA`` (its lower triangle; zeros above) beside ``Aᵀy``.
    """
    import torch

    M = len(z)
    rows = rows or _whitening_rows(M)
    device = _device()
    Wt = _inverse_lower(L, device).T  # L⁻ᵀ on the device, shape: (M, M)
    y = np.asarray(y, np.float64)
    yt = _tensor(y.reshape(len(x), 1) if y.ndim == 1 else y, device)
    out = torch.zeros((M, M + yt.shape[1]), dtype=torch.float64, device=device)
    for i0 in range(0, len(x), rows):
        A = _matvec_on_device(kernel, x[i0:i0 + rows], z, Wt)  # shape: (rows, M)
        out[:, :M] += A.T @ A
        out[:, M:] += A.T @ yt[i0:i0 + rows]
    out[:, :M] = torch.tril(out[:, :M])  # the host path's contract: the caller mirrors it
    return out.cpu().numpy()


@_on_thread_stream
def sgpr_predict_triton(kernel: Kernel, x: np.ndarray, z: np.ndarray, L: np.ndarray,
                        LB: np.ndarray, c: np.ndarray, prior: np.ndarray, *,
                        rows: int | None = None) -> np.ndarray:
    """One test chunk of the sparse GP's ``[mean, latent variance]``, as
    :meth:`~dkern.backends.projections.ProjectionBlocks.sgpr_predict`, all on the device.

    With ``A = k(x, z) L⁻ᵀ`` (the fused product) and ``A_B = A L_B⁻ᵀ``: mean ``A_B c``,
    variance ``min(max(k(x, x) − ‖A‖², 0) + ‖A_B‖², k(x, x))`` per row. ``L_B`` is the
    factor of ``I + AᵀA / σ²`` (eigenvalues ≥ 1), so its explicit inverse loses nothing
    the triangular solve would keep; only (n, t + 1) numbers come back to the host.

    Parameters
    ----------
    kernel : Kernel
    x : ndarray of shape (n, d)
    z : ndarray of shape (M, d)
    L, LB : ndarray of shape (M, M)
        Lower Cholesky factors of ``k(z, z)`` and of ``I + AᵀA / σ²``.
    c : ndarray of shape (M, t)
    prior : ndarray of shape (n,)
        ``k(x_i, x_i)``.
    rows : int, optional
        Rows of x per device tile of A; default :func:`_whitening_rows`.

    Returns
    -------
    ndarray of shape (n, t + 1), float64
    """
    import torch

    M = len(z)
    rows = rows or _whitening_rows(M)
    device = _device()
    Wt = _inverse_lower(L, device).T  # L⁻ᵀ on the device, shape: (M, M)
    WBt = _inverse_lower(LB, device).T  # L_B⁻ᵀ on the device
    ct = _tensor(np.asarray(c, np.float64), device)
    kxx = _tensor(np.asarray(prior, np.float64), device)
    out = torch.empty((len(x), ct.shape[1] + 1), dtype=torch.float64, device=device)
    for i0 in range(0, len(x), rows):
        A = _matvec_on_device(kernel, x[i0:i0 + rows], z, Wt)  # shape: (rows, M)
        AB = A @ WBt
        p = kxx[i0:i0 + rows]
        gap = torch.clamp(p - (A * A).sum(dim=1), min=0.0)
        out[i0:i0 + rows, :-1] = AB @ ct
        out[i0:i0 + rows, -1] = torch.minimum(gap + (AB * AB).sum(dim=1), p)
    return out.cpu().numpy()


#: Bytes of one device tile of the whitened block A (rows × M float64): big enough that
#: the M × M products run at the GPU's pace, small beside its memory with a few dask
#: threads each holding one.
DEVICE_TILE_BYTES = 1 << 30


def _whitening_rows(M: int) -> int:
    return max(256, DEVICE_TILE_BYTES // (8 * max(1, M)))


def _inverse_lower(L: np.ndarray, device: Any) -> Any:
    """``L⁻¹`` of a lower-triangular L (M × M), computed on the device; float64 tensor."""
    import torch

    Lt = _tensor(np.asarray(L, np.float64), device)
    eye = torch.eye(len(Lt), dtype=torch.float64, device=device)
    return torch.linalg.solve_triangular(Lt, eye, upper=False)


@_on_thread_stream
def log_sums_block_triton(x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                          kernel: Gaussian, scale: float = 1.0) -> np.ndarray:
    """``[m, s₀, s₁ … s_T]`` of the Gaussian weights ``k(x/scale, z/scale)`` per row of x,
    as :func:`dkern.backends.smoothing.weighted_log_sums_block`, in float64.

    One pass over z keeps a running maximum of the log weights per row and rescales its
    sums whenever the maximum grows (an online log-sum-exp): no weight underflows
    however far a query lies from the data.

    Parameters
    ----------
    x : ndarray of shape (n, d)
    z : ndarray of shape (m, d)
    t : ndarray of shape (m, T), optional
    kernel : Gaussian
        Exactly a dkern Gaussian; its lengthscale ℓ (scalar or per feature) times
        ``scale`` is the width.
    scale : float, default=1.0

    Returns
    -------
    ndarray of shape (n, 2 + T), float64
    """
    import torch
    import triton

    x, z = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(z, np.float64)
    ones = np.ones((len(z), 1))
    values = ones if t is None else np.hstack([ones, np.asarray(t, dtype=np.float64)])
    width = np.broadcast_to(np.asarray(kernel.lengthscale, dtype=np.float64) * scale,
                            (x.shape[1],))
    n, m, d, cols = len(x), len(z), x.shape[1], values.shape[1]
    if n == 0 or m == 0:  # the empty sum
        return np.tile(np.array([-np.inf] + [0.0] * cols), (n, 1))
    device = _device()
    run = _compiled(GAUSSIAN_LOG_SUMS, "gaussian_log_sums")
    res = torch.empty((n, 1 + cols), dtype=torch.float64, device=device)
    _launch(run, n, _other_tiles(),
            _tensor(x, device), _tensor(z, device), _tensor(values, device),
            _tensor(1.0 / width, device), res, n, m, min_bm=16, D=d, T=cols,
            TP=max(16, triton.next_power_of_2(cols)))
    return res.cpu().numpy()


@_on_thread_stream
def nearest_block_triton(x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray,
                         *, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of z to each row of x within ``limit``, by exact squared
    distance, then index, as :func:`dkern.backends.neighbors.nearest_block`.

    One pass over z keeps each query row's k best (distance, index) pairs in registers:
    each tile offers its nearest rows one at a time, each replacing the worst kept pair
    when it is better, so ties go to the lower index as in the numpy block.

    Parameters
    ----------
    x : ndarray of shape (n, d)
    z : ndarray of shape (m, d)
    limit : ndarray of shape (n, 1)
        Rows of z farther than this (squared) are not taken.
    index : ndarray of shape (m, 1)
        z's global row indices (int64), ascending.
    k : int

    Returns
    -------
    sq : ndarray of shape (n, k), float64
        Ascending; ``inf`` in slots no row within ``limit`` fills.
    index : ndarray of shape (n, k), int64
        ``PAD_INDEX`` in those slots.
    """
    import torch
    import triton

    from .neighbors import PAD_INDEX

    x, z = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(z, np.float64)
    n, m, d = len(x), len(z), x.shape[1]
    sq = np.full((n, k), np.inf)
    idx = np.full((n, k), PAD_INDEX, dtype=np.int64)
    if n == 0 or m == 0:
        return sq, idx
    device = _device()
    run = _compiled(NEAREST.replace("PAD", str(PAD_INDEX)), "nearest")
    sq_t = torch.empty((n, k), dtype=torch.float64, device=device)
    idx_t = torch.empty((n, k), dtype=torch.int64, device=device)
    _launch(run, n, (64, 64, 1) if interpreting() else (32, 64, 4),
            _tensor(x, device), _tensor(z, device),
            _tensor(np.asarray(index, np.int64).reshape(-1), device),
            _tensor(np.asarray(limit, np.float64).reshape(-1), device), sq_t, idx_t, n, m,
            D=d, K=k, KP=triton.next_power_of_2(k))
    sq, idx = sq_t.cpu().numpy(), idx_t.cpu().numpy()
    order = np.lexsort((idx, sq), axis=1)  # each row by (distance, index)
    return np.take_along_axis(sq, order, axis=1), np.take_along_axis(idx, order, axis=1)


@_on_thread_stream
def grad_matvec_block_triton(kernel: Kernel, x: np.ndarray, z: np.ndarray,
                             v: np.ndarray) -> np.ndarray:
    """``∂kernel(x, z)/∂θ_j @ v`` for every log-hyperparameter j (``kernel.theta``'s
    order), as :meth:`dkern.backends.projections.ProjectionBlocks.kernel_grad_matvec`;
    float64, the derivative tiles made in registers and never stored.

    Parameters
    ----------
    x : ndarray of shape (n, d)
    z : ndarray of shape (m, d)
    v : ndarray of shape (m, t)

    Returns
    -------
    ndarray of shape (n, t, p), float64

    Raises :class:`~dkern.backends.triton_source.NoTritonSource` for a kernel Triton
    cannot express.
    """
    import torch
    import triton

    x, z = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(z, np.float64)
    n, m, d, p = len(x), len(z), x.shape[1], kernel.n_dims
    source, params = grad_matvec_source(kernel, d)
    run = _compiled(source, "kernel_grad_matvec")
    device = _device()
    tiles = _other_tiles()
    pt = _tensor(params if len(params) else np.zeros(1), device)
    xt, zt = _tensor(x, device), _tensor(z, device)
    out = np.zeros((n, v.shape[1], p))
    for lo in range(0, v.shape[1], MAX_COLUMNS):
        vt = _tensor(np.asarray(v[:, lo:lo + MAX_COLUMNS], np.float64), device)
        t = vt.shape[1]
        tp = 1 if t == 1 else max(16, triton.next_power_of_2(t))
        res = torch.zeros((n, t, p), dtype=torch.float64, device=device)
        if n and m and p:
            _launch(run, n, tiles, xt, zt, vt, pt, res, n, m, min_bm=16 if tp > 1 else 1,
                    D=d, T=t, TP=tp, CT=triton.language.float64)
        out[:, lo:lo + t] = res.cpu().numpy()
    return out


@_on_thread_stream
def pair_weighted_grads_triton(kernel: Kernel, z: np.ndarray, x: np.ndarray,
                               w: np.ndarray) -> np.ndarray:
    """``out[m, j] = Σᵢ w[i, m] ∂kernel(z_m, xᵢ)/∂θ_j`` for z (M, d), x (n, d), w (n, M):
    the SGPR bound gradient's contraction, the derivative tiles never stored; shape
    (M, p), float64."""
    import torch
    import triton

    z, x = np.ascontiguousarray(z, np.float64), np.ascontiguousarray(x, np.float64)
    M, n, d, p = len(z), len(x), z.shape[1], kernel.n_dims
    device = _device()
    out = torch.zeros((M, p), dtype=torch.float64, device=device)
    if M and n and p:
        source, params = pair_weighted_grads_source(kernel, d)
        run = _compiled(source, "pair_weighted_grads")
        _launch(run, M, _other_tiles(),
                _tensor(z, device), _tensor(x, device), _tensor(np.asarray(w, np.float64), device),
                _tensor(params if len(params) else np.zeros(1), device), out, M, n, D=d,
                CT=triton.language.float64)
    return out.cpu().numpy()


__all__ = ["NoTritonSource", "grad_matvec_block_triton", "interpreting", "log_sums_block_triton",
           "matvec_block_triton", "matvec_source", "nearest_block_triton",
           "pair_weighted_grads_triton", "sgpr_predict_triton", "sgpr_statistics_triton"]
