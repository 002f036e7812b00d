"""The Triton kernels of the Triton backend, as source text: five templates, and the
functions that complete them with a kernel's tile (:mod:`.triton_source`).

Each kernel is one Triton program per ``BN`` rows of its first operand, walking the other
operand ``BM`` rows at a time; the kernel's values (and derivatives) are made in
registers for each tile and folded into the result at once, never stored.
``kernel_matvec`` also splits the other operand's rows across a second grid axis when the
first has too few rows to fill the GPU, each split writing its own partial sums:

========================  ==========================================  ==================
kernel                    computes, per row i                         source
========================  ==========================================  ==================
``kernel_matvec``         ``Σⱼ k(xᵢ, zⱼ) vⱼ``                          ``matvec_source``
``gaussian_log_sums``     ``[m, Σⱼ e^(log kᵢⱼ − m) [1, tⱼ]]``, online   ``GAUSSIAN_LOG_SUMS``
``nearest``               the k nearest (distance, index) pairs       ``NEAREST``
``kernel_grad_matvec``    ``Σⱼ ∂k(xᵢ, zⱼ)/∂θ_p vⱼ`` for every p          ``grad_matvec_source``
``pair_weighted_grads``   ``Σⱼ wⱼᵢ ∂k(xᵢ, zⱼ)/∂θ_p`` for every p         ``pair_weighted_…``
========================  ==========================================  ==================
"""

from __future__ import annotations

import textwrap

import numpy as np

from ..kernels import Kernel
from .triton_source import TileLines, tile_source

MATVEC = '''
import triton
import triton.language as tl


@triton.jit
def kernel_matvec(x_ptr, z_ptr, v_ptr, p_ptr, out_ptr, n, m, span, D: tl.constexpr,
                  T: tl.constexpr, TP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                  S: tl.constexpr, CT: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rmask = rows < n
    tcols = tl.arange(0, TP)
    tmask = tcols < T
    # this program's columns: the split program_id(1) of span columns; its sums go to
    # out[program_id(1)], which the launcher adds up (int32 offsets: splits > 1 only for
    # blocks of few rows, so program_id(1) * n * T stays small)
    first = tl.program_id(1) * span
    end = tl.minimum(first + span, m)
{prologue}
    acc = tl.zeros([BN, TP], dtype=tl.float64)
    for outer in range(first, end, BM * S):
        # one column: S tiles are summed entry by entry in CT (one multiply-add each), and
        # only then across the tile's columns and into the float64 total
        part = tl.zeros([BN, BM], dtype=CT)
        for start in range(outer, tl.minimum(outer + BM * S, end), BM):
            cols = start + tl.arange(0, BM)
            cmask = cols < end
{tile}
            if TP == 1:
                part += K * tl.load(v_ptr + cols, mask=cmask, other=0.0).to(CT)[None, :]
            else:
                V = tl.load(v_ptr + cols[:, None] * T + tcols[None, :],
                            mask=cmask[:, None] & tmask[None, :], other=0.0).to(CT)
                acc += tl.dot(K, V, input_precision="ieee").to(tl.float64)
        if TP == 1:
            acc += tl.sum(part, axis=1).to(tl.float64)[:, None]
    tl.store(out_ptr + tl.program_id(1) * n * T + rows[:, None] * T + tcols[None, :], acc,
             mask=rmask[:, None] & tmask[None, :])
'''


GAUSSIAN_LOG_SUMS = '''
import triton
import triton.language as tl


@triton.jit
def gaussian_log_sums(x_ptr, z_ptr, v_ptr, p_ptr, out_ptr, n, m, D: tl.constexpr,
                      T: tl.constexpr, TP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rmask = rows < n
    tcols = tl.arange(0, TP)
    tmask = tcols < T
    top = tl.full([BN], float("-inf"), dtype=tl.float64)
    sums = tl.zeros([BN, TP], dtype=tl.float64)
    for start in range(0, m, BM):
        cols = start + tl.arange(0, BM)
        cmask = cols < m
        L = tl.zeros([BN, BM], dtype=tl.float64)
        for k in tl.static_range(D):
            xk = tl.load(x_ptr + rows * D + k, mask=rmask, other=0.0)
            zk = tl.load(z_ptr + cols * D + k, mask=cmask, other=0.0)
            # scaled before it is squared: 1 / l² overflows for l below ~1e-154
            scaled = (xk[:, None] - zk[None, :]) * tl.load(p_ptr + k)
            L += scaled * scaled
        L = tl.where(cmask[None, :], -0.5 * L, float("-inf"))
        new_top = tl.maximum(top, tl.max(L, axis=1))
        # no finite weight yet (every distance overflowed): shift by 0, as e^(-inf + inf)
        # would be NaN; the weights are e^-inf = 0 and the sums stay 0
        shift = tl.where(new_top > float("-inf"), new_top, 0.0)
        W = tl.exp(L - shift[:, None])
        V = tl.load(v_ptr + cols[:, None] * T + tcols[None, :],
                    mask=cmask[:, None] & tmask[None, :], other=0.0)
        sums = sums * tl.exp(top - shift)[:, None] + tl.dot(W, V, input_precision="ieee")
        top = new_top
    tl.store(out_ptr + rows * (T + 1), top, mask=rmask)
    tl.store(out_ptr + rows[:, None] * (T + 1) + 1 + tcols[None, :], sums,
             mask=rmask[:, None] & tmask[None, :])
'''


NEAREST = '''
import triton
import triton.language as tl


@triton.jit
def nearest(x_ptr, z_ptr, index_ptr, limit_ptr, sq_ptr, idx_ptr, n, m, D: tl.constexpr,
            K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rmask = rows < n
    slots = tl.arange(0, KP)
    # slots past K hold -inf: never the worst, so never replaced, never returned
    best = tl.where(slots[None, :] < K, float("inf"), float("-inf")) + tl.zeros([BN, KP],
                                                                                dtype=tl.float64)
    best_i = tl.full([BN, KP], PAD, dtype=tl.int64)
    limit = tl.load(limit_ptr + rows, mask=rmask, other=0.0)
    for start in range(0, m, BM):
        cols = start + tl.arange(0, BM)
        cmask = cols < m
        sq = tl.zeros([BN, BM], dtype=tl.float64)
        for k in tl.static_range(D):
            xk = tl.load(x_ptr + rows * D + k, mask=rmask, other=0.0)
            zk = tl.load(z_ptr + cols * D + k, mask=cmask, other=0.0)
            diff = xk[:, None] - zk[None, :]
            sq += diff * diff
        sq = tl.where(cmask[None, :] & (sq <= limit[:, None]), sq, float("inf"))
        index = tl.load(index_ptr + cols, mask=cmask, other=PAD)
        # up to K rounds: the tile's nearest (lowest column on ties: the lowest index, as
        # z's indices ascend) replaces the worst kept pair by (distance, index)
        for _ in tl.static_range(K):
            near = tl.min(sq, axis=1)
            at = tl.argmin(sq, axis=1)
            near_i = tl.max(tl.where(cols[None, :] == start + at[:, None], index[None, :], -1),
                            axis=1)
            worst = tl.max(best, axis=1)
            worst_i = tl.max(tl.where(best == worst[:, None], best_i, -1), axis=1)
            tied = (best == worst[:, None]) & (best_i == worst_i[:, None])
            slot = tl.min(tl.where(tied, slots[None, :], KP), axis=1)
            take = ((near < worst) | ((near == worst) & (near_i < worst_i))) & \
                (near < float("inf"))
            put = (slots[None, :] == slot[:, None]) & take[:, None]
            best = tl.where(put, near[:, None], best)
            best_i = tl.where(put, near_i[:, None], best_i)
            sq = tl.where(cols[None, :] == start + at[:, None], float("inf"), sq)
    out = rows[:, None] * K + slots[None, :]
    keep = rmask[:, None] & (slots[None, :] < K)
    tl.store(sq_ptr + out, best, mask=keep)
    tl.store(idx_ptr + out, best_i, mask=keep)
'''


GRAD_MATVEC = '''
import triton
import triton.language as tl


@triton.jit
def kernel_grad_matvec(x_ptr, z_ptr, v_ptr, p_ptr, out_ptr, n, m, D: tl.constexpr,
                       T: tl.constexpr, TP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                       CT: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rmask = rows < n
    tcols = tl.arange(0, TP)
    tmask = tcols < T
{prologue}
{init}
    for start in range(0, m, BM):
        cols = start + tl.arange(0, BM)
        cmask = cols < m
{tile}
        V = tl.load(v_ptr + cols[:, None] * T + tcols[None, :],
                    mask=cmask[:, None] & tmask[None, :], other=0.0).to(CT)
{fold}
    where = rows[:, None] * (T * P) + tcols[None, :] * P
    keep = rmask[:, None] & tmask[None, :]
{store}
'''


PAIR_WEIGHTED_GRADS = '''
import triton
import triton.language as tl


@triton.jit
def pair_weighted_grads(x_ptr, z_ptr, w_ptr, p_ptr, out_ptr, n, m, D: tl.constexpr,
                        BN: tl.constexpr, BM: tl.constexpr, CT: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rmask = rows < n
{prologue}
{init}
    for start in range(0, m, BM):
        cols = start + tl.arange(0, BM)
        cmask = cols < m
{tile}
        W = tl.load(w_ptr + cols[None, :] * n + rows[:, None],
                    mask=rmask[:, None] & cmask[None, :], other=0.0)
{fold}
{store}
'''


def _fill(template: str, lines: TileLines, tile_indent: int) -> str:
    """``template`` with a kernel's prologue and tile put in at their places."""
    return (template.replace("{prologue}", textwrap.indent("\n".join(lines.prologue), " " * 4))
            .replace("{tile}", textwrap.indent("\n".join(lines.tile), " " * tile_indent)))


def matvec_source(kernel: Kernel, d: int) -> tuple[str, np.ndarray]:
    """The Triton module computing ``kernel(x, z) @ v`` on d features, and its parameters.

    Raises :class:`~dkern.backends.triton_source.NoTritonSource` when the kernel has
    a part Triton cannot express.
    """
    lines = tile_source(kernel, d)
    return _fill(MATVEC, lines, 12), lines.params


def _per_param(template: str, p: int, indent: int) -> str:
    """``template`` once per log-hyperparameter j, as lines (``pass`` for none)."""
    return "\n".join(" " * indent + template.format(j=j) for j in range(p)) or \
        " " * indent + "pass"


def grad_matvec_source(kernel: Kernel, d: int) -> tuple[str, np.ndarray]:
    """The Triton module computing ``∂kernel(x, z)/∂θ_j @ v`` for each of the p
    log-hyperparameters on d features, one accumulator per j, and its parameters."""
    lines = tile_source(kernel, d, grads=True)
    p = kernel.n_dims
    fold = ("        if TP == 1:\n"
            + _per_param("acc{j} += tl.sum(G{j} * tl.reshape(V, [BM])[None, :], "
                         "axis=1)[:, None]", p, 12)
            + "\n        else:\n"
            + _per_param("acc{j} += tl.dot(G{j}, V, input_precision='ieee').to(tl.float64)",
                         p, 12))
    text = (_fill(GRAD_MATVEC, lines, 8)
            .replace("{init}", _per_param("acc{j} = tl.zeros([BN, TP], dtype=tl.float64)", p, 4))
            .replace("{fold}", fold)
            .replace("{store}", _per_param("tl.store(out_ptr + where + {j}, acc{j}, mask=keep)",
                                           p, 4))
            .replace("T * P", f"T * {p}").replace("tcols[None, :] * P", f"tcols[None, :] * {p}"))
    return text, lines.params


def pair_weighted_grads_source(kernel: Kernel, d: int) -> tuple[str, np.ndarray]:
    """The Triton module computing ``Σ_i W[i, m] ∂kernel(z_m, x_i)/∂θ_j`` per row m of its
    first operand and log-hyperparameter j, and its parameters."""
    lines = tile_source(kernel, d, grads=True)
    p = kernel.n_dims
    text = (_fill(PAIR_WEIGHTED_GRADS, lines, 8)
            .replace("{init}", _per_param("acc{j} = tl.zeros([BN], dtype=tl.float64)", p, 4))
            .replace("{fold}", _per_param("acc{j} += tl.sum(G{j} * W, axis=1)", p, 8))
            .replace("{store}", _per_param(f"tl.store(out_ptr + rows * {p} + {{j}}, acc{{j}}, "
                                           "mask=rmask)", p, 4)))
    return text, lines.params


__all__ = ["GAUSSIAN_LOG_SUMS", "NEAREST", "grad_matvec_source", "matvec_source",
           "pair_weighted_grads_source"]
