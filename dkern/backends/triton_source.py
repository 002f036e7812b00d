"""Triton source for a kernel expression: what one tile of kernel values is.

A kernel tree (``c * Gaussian(l) + Polynomial(2)``, …) becomes the body of a Triton
function that computes a (BN × BM) tile of kernel values in registers, from the
tile's coordinates loaded one feature at a time. The structure of the tree is
fixed in the source; its numbers (lengthscales, constants, degrees' bases) are
read from a parameter vector, so a new hyperparameter value reuses the compiled
kernel and only a new structure compiles anew (as KeOps' formulas do).

Each kernel class maps to one emitter here (:data:`EMITTERS`), keyed by type, so the
kernels package stays free of any GPU code; a kernel with no emitter (``Warp``,
a user's subclass) has no Triton source, and the backend computes its blocks with
numpy, logged. White terms are left out, as their cross blocks are zero (the models
add the noise on the diagonal).

Names the emitted code may use: ``x_ptr``/``z_ptr`` (row-major operands),
``rows``/``cols`` (tile indices), ``rmask``/``cmask``, ``p_ptr`` (parameters),
``D`` (features, a constexpr) and ``tl``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..kernels import Kernel
from ..kernels.algebra import Exp, Power, Product, Scaled, Sum
from ..kernels.constant import Constant
from ..kernels.dot import DotProduct, Linear, Polynomial
from ..kernels.periodic import Periodic
from ..kernels.rational import RationalQuadratic
from ..kernels.stationary import Gaussian, Laplacian, Matern, Stationary


@dataclass
class TileSource:
    """Source lines being built for one kernel tile, and the parameter vector they read.

    ``per_feature`` lines run inside the loop over features (with ``xk``, ``zk`` and
    ``diff`` the k-th coordinates and their difference); ``after`` lines run once the
    loop is done; ``params`` are the numbers read as ``p_ptr[i]``.
    """

    params: list[float] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    per_feature: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    names: int = 0
    shared: dict[str, str] = field(default_factory=dict)

    def param(self, value: float) -> str:
        """An expression reading ``value`` from the parameter vector."""
        self.params.append(float(value))
        return f"tl.load(p_ptr + {len(self.params) - 1})"

    def fresh(self, stem: str) -> str:
        self.names += 1
        return f"{stem}{self.names}"

    def accumulator(self, stem: str, update: str) -> str:
        """A tile summed over the features, ``update`` giving the k-th term."""
        name = self.fresh(stem)
        self.before.append(f"{name} = tl.zeros([BN, BM], dtype=CT)")
        self.per_feature.append(f"{name} += {update}")
        return name

    def once(self, key: str, stem: str, update: str) -> str:
        """An accumulator shared by every node asking for the same ``key`` (the plain
        squared distance, the dot product)."""
        if key not in self.shared:
            self.shared[key] = self.accumulator(stem, update)
        return self.shared[key]

    def let(self, expression: str) -> str:
        """A name bound to ``expression`` after the feature loop (used more than once)."""
        name = self.fresh("t")
        self.after.append(f"{name} = {expression}")
        return name


def _scaled_sqdist(k: Stationary, src: TileSource, d: int) -> str:
    """``Σ_k ((x_k − z_k) / l_k)²``: differences first, then the lengthscale, as numpy's
    exact path does (a far row keeps the digits of a small difference)."""
    ell = np.asarray(k.lengthscale, dtype=float)
    if ell.ndim == 0:
        plain = src.once("sqdist", "sq", "diff * diff")
        return src.let(f"{plain} * {src.param(1.0 / float(ell) ** 2)}")
    if ell.shape != (d,):
        raise ValueError(f"{type(k).__name__}: lengthscale has {ell.shape[0]} entries but the "
                         f"data has {d} features; give one per feature or a scalar.")
    base = len(src.params)
    src.params.extend((1.0 / ell ** 2).tolist())
    return src.accumulator("sqa", f"diff * diff * tl.load(p_ptr + {base} + k)")


def _gaussian(k: Gaussian, src: TileSource, d: int) -> str:
    return f"tl.exp(-0.5 * {_scaled_sqdist(k, src, d)})"


def _matern(k: Stationary, src: TileSource, d: int) -> str:
    nu = 0.5 if isinstance(k, Laplacian) else float(k.nu)
    r = src.let(f"tl.sqrt({_scaled_sqdist(k, src, d)})")
    if nu == 0.5:
        return f"tl.exp(-{r})"
    # a plain float's repr: numpy 2 writes its scalars as np.float64(…), unknown to Triton
    a = src.let(f"{float(np.sqrt(3.0 if nu == 1.5 else 5.0))!r} * {r}")
    poly = f"(1.0 + {a})" if nu == 1.5 else f"(1.0 + {a} + {a} * {a} / 3.0)"
    return f"({poly} * tl.exp(-{a}))"


def _rational(k: RationalQuadratic, src: TileSource, d: int) -> str:
    alpha = float(k.alpha)
    base = f"(1.0 + {_scaled_sqdist(k, src, d)} * {src.param(0.5 / alpha)})"
    return f"tl.exp(-{src.param(alpha)} * tl.log({base}))"


def _periodic(k: Periodic, src: TileSource, d: int) -> str:
    plain = src.once("sqdist", "sq", "diff * diff")
    s = src.let(f"tl.sin(tl.sqrt({plain}) * {src.param(np.pi / float(k.period))})")
    return f"tl.exp({src.param(-2.0 / float(k.lengthscale) ** 2)} * {s} * {s})"


def _dot(src: TileSource) -> str:
    return src.once("dot", "dt", "xk[:, None] * zk[None, :]")


def _linear(k: Linear, src: TileSource, d: int) -> str:
    return _dot(src)


def _dot_product(k: DotProduct, src: TileSource, d: int) -> str:
    return f"({_dot(src)} + {src.param(float(k.sigma_0) ** 2)})"


def _polynomial(k: Polynomial, src: TileSource, d: int) -> str:
    return _integer_power(f"({_dot(src)} + {src.param(k.c)})", int(k.degree), src)


def _integer_power(base: str, p: int, src: TileSource) -> str:
    """``base ** p`` by repeated squaring into named tiles (Triton has no integer pow)."""
    result, square = None, src.let(base)
    while True:
        if p & 1:
            result = square if result is None else src.let(f"{result} * {square}")
        p >>= 1
        if not p:
            return result
        square = src.let(f"{square} * {square}")


def _constant(k: Constant, src: TileSource, d: int) -> str:
    return src.param(k.constant_value)


def _scaled(k: Scaled, src: TileSource, d: int) -> str:
    return f"({src.param(k.constant)} * {emit(k.kernel, src, d)})"


def _sum(k: Sum, src: TileSource, d: int) -> str:
    return f"({emit(k.k1, src, d)} + {emit(k.k2, src, d)})"


def _product(k: Product, src: TileSource, d: int) -> str:
    return f"({emit(k.k1, src, d)} * {emit(k.k2, src, d)})"


def _power(k: Power, src: TileSource, d: int) -> str:
    return _integer_power(emit(k.kernel, src, d), int(k.power), src)


def _exp(k: Exp, src: TileSource, d: int) -> str:
    return f"tl.exp({emit(k.kernel, src, d)})"


#: One emitter per kernel class (exact type: a subclass may change the values).
EMITTERS: dict[type, Callable[..., str]] = {
    Gaussian: _gaussian, Laplacian: _matern, Matern: _matern, RationalQuadratic: _rational,
    Periodic: _periodic, Linear: _linear, DotProduct: _dot_product, Polynomial: _polynomial,
    Constant: _constant, Scaled: _scaled, Sum: _sum, Product: _product, Power: _power,
    Exp: _exp,
}


class NoTritonSource(Exception):
    """The kernel holds a part with no Triton emitter; the message names it."""


def emit(kernel: Kernel, src: TileSource, d: int) -> str:
    """The expression of ``kernel``'s tile, adding the lines it needs to ``src``."""
    emitter = EMITTERS.get(type(kernel))
    if emitter is None:
        raise NoTritonSource(f"{type(kernel).__name__} has no Triton form")
    return emitter(kernel, src, d)


def tile_source(kernel: Kernel, d: int) -> tuple[list[str], np.ndarray]:
    """The lines computing ``K`` (a BN × BM tile) for ``kernel`` on d features, and the
    parameter vector they read (float64).

    Raises :class:`NoTritonSource` for a kernel with a part Triton cannot express.
    """
    if kernel.has_white:
        stripped = kernel.without_white()
        if stripped is None:
            raise NoTritonSource("white noise only: its blocks are zero")
        kernel = stripped
    src = TileSource()
    value = emit(kernel, src, d)
    loop = ["for k in tl.static_range(D):",
            "    xk = tl.load(x_ptr + rows * D + k, mask=rmask, other=0.0).to(CT)",
            "    zk = tl.load(z_ptr + cols * D + k, mask=cmask, other=0.0).to(CT)",
            "    diff = xk[:, None] - zk[None, :]"]
    loop += [f"    {line}" for line in src.per_feature] if src.per_feature else ["    pass"]
    # a kernel of constants alone is a scalar: the zeros tile gives it the tile's shape
    lines = src.before + loop + src.after + [f"K = {value} + tl.zeros([BN, BM], dtype=CT)"]
    return lines, np.asarray(src.params, dtype=np.float64)
