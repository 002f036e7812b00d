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
``D`` (features, a constexpr) and ``tl``. The loop over features is written out, one
block per feature, so each feature's parameters are read at a fixed offset; for few
features, x's columns are loaded once before the walk over z (:data:`HOIST_MAX`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..kernels import Kernel
from ..kernels.algebra import Exp, Power, Product, Scaled, Sum
from ..kernels.constant import Constant, White
from ..kernels.dot import DotProduct, Linear, Polynomial
from ..kernels.periodic import Periodic
from ..kernels.rational import RationalQuadratic
from ..kernels.stationary import MATERN_FAR, Gaussian, Laplacian, Matern, Stationary


@dataclass
class TileSource:
    """Source lines being built for one kernel tile, and the parameter vector they read.

    ``per_feature`` lines run once per feature k (with ``xk``, ``zk`` and ``diff`` the
    k-th coordinates and their difference; ``{k}`` in a line is replaced by k);
    ``after`` lines run once every feature is in; ``params`` are the numbers read as
    ``p_ptr[i]``.
    """

    grads: bool = False
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


#: A kernel's tile: the expression of its values, and of their derivatives by each of its
#: log-hyperparameters in ``kernel.theta``'s order (empty unless ``src.grads``).
Tile = tuple[str, list[str]]


def _free(k: Kernel, name: str) -> bool:
    return any(free == name for free, _, _ in k._free())


def _scaled_sqdist(k: Stationary, src: TileSource, d: int,
                   factor: float = 1.0) -> tuple[str, list[str]]:
    """``factor · r²``, ``r² = Σ_k ((x_k − z_k) / l_k)²`` (differences first, then the
    lengthscale, as numpy's exact path: a far row keeps the digits of a small difference),
    and the squared scaled differences ``s²`` each lengthscale entry's derivative needs:
    ``[r²]`` for a scalar lengthscale, one ``s_k²`` per feature for ARD (when
    ``src.grads``, which takes ``factor`` 1). ``factor`` is folded into the lengthscale's
    parameters, so it costs no multiply per entry."""
    ell = np.asarray(k.lengthscale, dtype=float)
    if ell.ndim and ell.shape != (d,):
        raise ValueError(f"{type(k).__name__}: lengthscale has {ell.shape[0]} entries but the "
                         f"data has {d} features; give one per feature or a scalar.")
    with np.errstate(over="ignore", divide="ignore"):
        weight = factor / ell**2
    if not np.isfinite(weight).all():
        return _differences_scaled_first(src, d, ell, factor)
    if ell.ndim == 0:
        plain = src.once("sqdist", "sq", "diff * diff")
        r2 = src.let(f"{plain} * {src.param(weight)}")
        return r2, [r2]
    base = len(src.params)
    src.params.extend(weight.tolist())
    r2 = src.accumulator("sqa", f"diff * diff * tl.load(p_ptr + {base} + {{k}})")
    if not src.grads:
        return r2, []
    parts = []
    for j in range(d):  # one tile per feature, after the loop (the loop keeps one diff)
        parts.append(src.let(f"{_diff(j)} * {_diff(j)} * tl.load(p_ptr + {base + j})"))
    return r2, parts


def _differences_scaled_first(src: TileSource, d: int, ell: np.ndarray,
                              factor: float) -> tuple[str, list[str]]:
    """:func:`_scaled_sqdist` for a lengthscale whose ``factor / l²`` overflows (l below
    ~1e-154): each difference is scaled by ``√|factor| / l`` before it is squared, as
    ``0 · inf`` would be NaN where x = z; the factor's sign is applied to the sum once."""
    base, sign = len(src.params), "-" if factor < 0 else ""
    src.params.extend(np.broadcast_to(np.sqrt(abs(factor)) / ell, (d,)).tolist())
    r2 = src.accumulator("sqa", f"(diff * tl.load(p_ptr + {base} + {{k}})) * "
                                f"(diff * tl.load(p_ptr + {base} + {{k}}))")
    r2 = src.let(f"-{r2}") if sign else r2
    if not src.grads or ell.ndim == 0:
        return r2, [r2] if src.grads else []
    parts = []
    for j in range(d):
        scaled = f"({_diff(j)} * tl.load(p_ptr + {base + j}))"
        parts.append(src.let(f"{sign}{scaled} * {scaled}"))
    return r2, parts


def _load_x(k: int) -> str:
    """Feature k of the tile's rows of x, in the compute dtype."""
    return f"tl.load(x_ptr + rows * D + {k}, mask=rmask, other=0.0).to(CT)"


def _load_z(k: int) -> str:
    """Feature k of the tile's rows of z, in the compute dtype."""
    return f"tl.load(z_ptr + cols * D + {k}, mask=cmask, other=0.0).to(CT)"


def _diff(j: int) -> str:
    """The tile of ``x_j − z_j``, read again after the features' loop."""
    return f"({_load_x(j)}[:, None] - {_load_z(j)}[None, :])"


def _lengthscale_grads(k: Stationary, src: TileSource, g: str, s2: list[str]) -> list[str]:
    """``∂K/∂log l_k = g(r) s_k²`` (g = −k'(r)/r) when the lengthscale is learnable."""
    return [f"({g} * {part})" for part in s2] if src.grads and _free(k, "lengthscale") else []


def _gaussian(k: Gaussian, src: TileSource, d: int) -> Tile:
    if not src.grads:  # e^(-r²/2) as 2^(-r² log2(e) / 2): one multiply, and exp2 is the
        # GPU's own instruction in float32
        scaled, _ = _scaled_sqdist(k, src, d, factor=-0.5 * np.log2(np.e))
        return src.let(f"tl.exp2({scaled})"), []
    r2, s2 = _scaled_sqdist(k, src, d)
    value = src.let(f"tl.exp(-0.5 * {r2})")
    return value, _lengthscale_grads(k, src, value, s2)


def _matern(k: Stationary, src: TileSource, d: int) -> Tile:
    nu = 0.5 if isinstance(k, Laplacian) else float(k.nu)
    r2, s2 = _scaled_sqdist(k, src, d)
    r = src.let(f"tl.sqrt({r2})")
    if nu == 0.5:  # g = e^{-r} / r, taken as 0 at r = 0 where s² = 0 (as numpy's)
        value = src.let(f"tl.exp(-{r})")
        g = f"tl.where({r} > 0.0, {value} / tl.where({r} > 0.0, {r}, 1.0), 0.0)"
        return value, _lengthscale_grads(k, src, src.let(g) if src.grads else "", s2)
    # a plain float's repr: numpy 2 writes its scalars as np.float64(…), unknown to Triton
    a = src.let(f"tl.minimum({float(np.sqrt(3.0 if nu == 1.5 else 5.0))!r} * {r}, "
                f"{MATERN_FAR!r})")  # far pairs: poly · 0, never ∞ · 0
    e = src.let(f"tl.exp(-{a})")
    poly = f"(1.0 + {a})" if nu == 1.5 else f"(1.0 + {a} + {a} * {a} / 3.0)"
    g = f"3.0 * {e}" if nu == 1.5 else f"{5.0 / 3.0!r} * (1.0 + {a}) * {e}"
    return src.let(f"{poly} * {e}"), _lengthscale_grads(k, src, src.let(g), s2)


def _rational(k: RationalQuadratic, src: TileSource, d: int) -> Tile:
    alpha = float(k.alpha)
    r2, s2 = _scaled_sqdist(k, src, d)
    base = src.let(f"1.0 + {r2} * {src.param(0.5 / alpha)}")
    a = src.param(alpha)
    value = src.let(f"tl.exp(-{a} * tl.log({base}))")
    grads = []
    if src.grads and _free(k, "alpha"):  # K (r² / (2 base) - alpha log base)
        grads.append(f"({value} * ({r2} / (2.0 * {base}) - {a} * tl.log({base})))")
    return value, grads + _lengthscale_grads(k, src, f"({value} / {base})", s2)


def _periodic(k: Periodic, src: TileSource, d: int) -> Tile:
    plain = src.once("sqdist", "sq", "diff * diff")
    arg = src.let(f"tl.sqrt({plain}) * {src.param(np.pi / float(k.period))}")
    s = src.let(f"tl.sin({arg})")
    inv_l2 = 1.0 / float(k.lengthscale) ** 2
    value = src.let(f"tl.exp({src.param(-2.0 * inv_l2)} * {s} * {s})")
    if not src.grads:
        return value, []
    four = src.param(4.0 * inv_l2)
    grads = [f"({four} * {s} * {s} * {value})"] if _free(k, "lengthscale") else []
    if _free(k, "period"):
        grads.append(f"({four} * {arg} * {s} * tl.cos({arg}) * {value})")
    return value, grads


def _dot(src: TileSource) -> str:
    return src.once("dot", "dt", "xk[:, None] * zk[None, :]")


def _linear(k: Linear, src: TileSource, d: int) -> Tile:
    return _dot(src), []


def _dot_product(k: DotProduct, src: TileSource, d: int) -> Tile:
    level = src.param(float(k.sigma_0) ** 2)
    grads = [f"(2.0 * {level})"] if src.grads and _free(k, "sigma_0") else []
    return f"({_dot(src)} + {level})", grads


def _polynomial(k: Polynomial, src: TileSource, d: int) -> Tile:
    return _integer_power(f"({_dot(src)} + {src.param(k.c)})", int(k.degree), src), []


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


def _constant(k: Constant, src: TileSource, d: int) -> Tile:
    c = src.param(k.constant_value)
    return c, [c] if src.grads and _free(k, "constant_value") else []


def _white(k: White, src: TileSource, d: int) -> Tile:
    # zero in every cross block, its derivative too (the noise is the models' diagonal)
    return "0.0", ["0.0"] * k.n_dims if src.grads else []


def _scaled(k: Scaled, src: TileSource, d: int) -> Tile:
    value, grads = emit(k.kernel, src, d)
    c = src.param(k.constant)
    own = [f"({c} * {value})"] if src.grads and _free(k, "constant") else []
    return f"({c} * {value})", own + [f"({c} * {g})" for g in grads]


def _sum(k: Sum, src: TileSource, d: int) -> Tile:
    (v1, g1), (v2, g2) = emit(k.k1, src, d), emit(k.k2, src, d)
    return f"({v1} + {v2})", g1 + g2


def _product(k: Product, src: TileSource, d: int) -> Tile:
    (v1, g1), (v2, g2) = emit(k.k1, src, d), emit(k.k2, src, d)
    if src.grads:
        v1, v2 = src.let(v1), src.let(v2)
    return f"({v1} * {v2})", [f"({g} * {v2})" for g in g1] + [f"({v1} * {g})" for g in g2]


def _power(k: Power, src: TileSource, d: int) -> Tile:
    value, grads = emit(k.kernel, src, d)
    p = int(k.power)
    if not grads:
        return _integer_power(value, p, src), []
    below = _integer_power(value, p - 1, src) if p > 1 else "1.0"
    below = src.let(below)
    return src.let(f"{below} * {value}"), [f"({p} * {below} * {g})" for g in grads]


def _exp(k: Exp, src: TileSource, d: int) -> Tile:
    value, grads = emit(k.kernel, src, d)
    e = src.let(f"tl.exp({value})")
    return e, [f"({e} * {g})" for g in grads]


#: One emitter per kernel class (exact type: a subclass may change the values).
EMITTERS: dict[type, Callable[..., Tile]] = {
    Gaussian: _gaussian, Laplacian: _matern, Matern: _matern, RationalQuadratic: _rational,
    Periodic: _periodic, Linear: _linear, DotProduct: _dot_product, Polynomial: _polynomial,
    Constant: _constant, White: _white, Scaled: _scaled, Sum: _sum, Product: _product,
    Power: _power, Exp: _exp,
}


class NoTritonSource(Exception):
    """The kernel holds a part with no Triton emitter; the message names it."""


def emit(kernel: Kernel, src: TileSource, d: int) -> Tile:
    """The expressions of ``kernel``'s tile and derivatives, adding the lines they need to
    ``src``."""
    emitter = EMITTERS.get(type(kernel))
    if emitter is None:
        raise NoTritonSource(f"{type(kernel).__name__} has no Triton form")
    return emitter(kernel, src, d)


#: Up to this many features, x's columns are loaded once per program, before its walk
#: over z, and kept in registers; more would crowd the registers the tile needs.
HOIST_MAX = 16


@dataclass
class TileLines:
    """A kernel's tile as source: ``prologue`` runs once per program (before the walk
    over z), ``tile`` once per tile and leaves ``K`` (and ``G0`` … with grads);
    ``params`` is the parameter vector they read (float64)."""

    prologue: list[str]
    tile: list[str]
    params: np.ndarray


def tile_source(kernel: Kernel, d: int, grads: bool = False) -> TileLines:
    """The source computing ``K`` (a BN × BM tile) for ``kernel`` on d features. With
    ``grads``, also ``G0`` … ``G{p-1}``, the tiles of ``∂K/∂θ_j`` for the p
    log-hyperparameters of ``kernel.theta`` (White's are zero in these cross blocks).

    Raises :class:`NoTritonSource` for a kernel with a part Triton cannot express.
    """
    if kernel.has_white and not grads:  # its blocks are zero: leave its terms out
        stripped = kernel.without_white()
        if stripped is None:
            raise NoTritonSource("white noise only: its blocks are zero")
        kernel = stripped
    src = TileSource(grads=grads)
    value, derivatives = emit(kernel, src, d)
    assert not grads or len(derivatives) == kernel.n_dims, (kernel, derivatives)
    hoist = bool(src.per_feature) and d <= HOIST_MAX
    prologue = [f"x{k} = {_load_x(k)}" for k in range(d)] if hoist else []
    features = []
    for k in range(d if src.per_feature else 0):
        features += [f"xk = x{k}" if hoist else f"xk = {_load_x(k)}", f"zk = {_load_z(k)}",
                     "diff = xk[:, None] - zk[None, :]"]
        features += [line.replace("{k}", str(k)) for line in src.per_feature]
    # a kernel of constants alone is a scalar: the zeros tile gives it the tile's shape (a
    # tile needs none: adding zeros would cost an addition per entry)
    zeros = "tl.zeros([BN, BM], dtype=CT)"
    tile = src.before + features + src.after
    tile.append(f"K = {value}" if src.per_feature else f"K = {value} + {zeros}")
    tile += [f"G{j} = {g} + {zeros}" for j, g in enumerate(derivatives)]
    return TileLines(prologue, tile, np.asarray(src.params, dtype=np.float64))
