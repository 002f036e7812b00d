"""Stationary kernels ``k(x, x') = g(||x - x'|| / lengthscale)``.

The dense block uses one matrix product per block: with ``s = (x - c) / l`` and
``h = ||s||² / 2`` the augmented rows ``[s, -h_x, 1]`` and ``[s, 1, -h_z]`` have
inner product ``s_x·s_z - h_x - h_z = -||s_x - s_z||² / 2 = G``, so BLAS returns the
(halved, negated) squared distances directly and only the elementwise ``g``
remains. That expanded form rounds with an error of about ``ε (h_x + h_z)``: small
next to ``|G|`` for most pairs, but catastrophic for two rows close to each other and
far from the centre ``c`` (``x = 1e9 + 0.3``, ``z = 1e9 + 0.1`` with ``c = 0``: every
digit of ``G = -0.02`` lost). Two measures keep every value accurate to its own
scale, whatever else the tile holds:

* ``c`` is a coordinatewise median of Z's rows, not their mean: one far row cannot move it,
  so the bulk of the rows keeps small norms (and ``x - c`` is exact for rows near c).
* The pairs where the rounding bound is not small next to the value itself,
  ``h_x + h_z > max(|G|, floor) / near``, are recomputed from the differences of the
  uncentred rows, ``((x - z) / l)²`` summed (never from centred rows, which lost the
  digits of a far row when the centre was subtracted). The exponential kernels take
  ``floor = 1``, ``near = EXP_NEAR``: an error ``δ`` in G moves ``e^G`` by ``e^G δ``, so
  only ``|G|`` up to about 1 needs its relative accuracy; on ordinary data no row
  reaches ``h > 1 / EXP_NEAR`` and the check costs two passes over n + m numbers, not
  over the tile. The kernels that take a square root (Laplacian, Matérn) turn ``δ``
  into ``√δ`` near ``r = 0``, so they take ``floor = 0``, ``near = NEAR``: every pair
  closer than a small fraction of its own norms is recomputed.

With a far row in the tile only the few pairs near it are recomputed; the rest keep
the matrix product's speed. The thresholds are set for float64. Blocks of two float32
operands are computed in float32 with the same thresholds, so their values are
accurate to a few hundred float32 ulps, not a few (a float64 block would cost twice
the product); the models compute in float64 whatever the data's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.spatial.distance import cdist

from . import fastexp
from .base import Kernel
from .checks import DEFAULT_BOUNDS, Array, as_pair, check_bounds, check_positive_params

_MATERN_NUS = (0.5, 1.5, 2.5)
#: Pairs with ``|G| < NEAR * (h_x + h_z)`` get exact distances in the root-taking kernels:
#: there the rounding error of the expanded form, amplified by the square root, would
#: exceed ~1e-12 relative in ``r``.
NEAR = 1e-4
#: Pairs with ``max(|G|, 1) < EXP_NEAR * (h_x + h_z)`` get exact values in the kernels that
#: exponentiate G (Gaussian, and the log weights of kernel smoothing): elsewhere the
#: expanded form's error ``≈ ε (h_x + h_z)`` moves ``e^G`` by less than ~1e-13 absolute.
EXP_NEAR = 1e-3
#: Scaled half norms ``h_x + h_z`` above this share of the dtype's largest value could
#: overflow the expanded form (``|G| <= 2 (h_x + h_z)``; then inf - inf = NaN): such a tile
#: is computed from differences instead.
FAR_H = 0.25
#: Rows of Z whose median is the centre (a sample: the median of 2048 rows costs a third
#: of a tile's exponentials).
CENTRE_SAMPLE = 64


class Stationary(Kernel):
    """Shared code of the kernels that depend on ``||x - x'|| / lengthscale`` only.

    Parameters
    ----------
    lengthscale : float or sequence of float, default=1.0
        ``l > 0``; a sequence gives one lengthscale per feature (ARD).
    lengthscale_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Range of every lengthscale entry when hyperparameters are learned; ``"fixed"``
        keeps the lengthscale out of ``theta``.
    **aliases
        scikit-learn's spellings ``length_scale`` and ``length_scale_bounds``.
    """

    _hyperparameters: tuple[str, ...] = ("lengthscale",)
    _aliases = {"length_scale": "lengthscale", "length_scale_bounds": "lengthscale_bounds"}

    def __init__(self, lengthscale: float | Array = 1.0,
                 lengthscale_bounds: Any = DEFAULT_BOUNDS, **aliases: Any) -> None:
        self.lengthscale = lengthscale
        self.lengthscale_bounds = lengthscale_bounds
        super().__init__(**aliases)

    def _validate(self) -> None:
        check_positive_params(self.lengthscale, "lengthscale", type(self).__name__)
        check_bounds(self.lengthscale_bounds, "lengthscale_bounds", type(self).__name__)

    def _value_and_gradient(self, X: Array, Z: Array, diag: bool) -> tuple[Array, Array]:
        p = self.n_dims
        if diag:  # k(x, x) = g(0) = 1 whatever the lengthscale
            return np.ones(len(X)), np.zeros((len(X), p))
        r2, S = self._scaled_sq_differences(X, Z)
        K, g = self._profile(np.sqrt(r2))
        # With r = ||x - z|| / l: dK/d log l_k = -k'(r) / r * s_k² = g(r) s_k² (s_k the
        # scaled difference in feature k; s² = r² for an isotropic l).
        return K, (g[:, :, None] * S)[:, :, :p]

    def _scaled_sq_differences(self, X: Array, Z: Array) -> tuple[Array, Array]:
        """``r²`` (n, m) and the squared scaled differences per lengthscale entry: (n, m, d)
        for ARD, (n, m, 1) holding r² for an isotropic lengthscale."""
        ell = self._lengthscale(X)
        # differences first, then the lengthscale: scaling first rounds a far row's
        # coordinates to its own magnitude, losing the digits of a small difference
        if np.ndim(ell) == 1:
            S = np.square((X[:, None, :] - Z[None, :, :]) / ell)
            return S.sum(axis=2), S
        # differences, not the expanded form: its cancellation would be amplified here
        r2 = cdist(X, Z, "sqeuclidean") / np.square(ell)
        return r2, r2[:, :, None]

    def _profile(self, r: Array) -> tuple[Array, Array]:
        """``k(r)`` and ``g(r) = -k'(r) / r`` (0 where r = 0 for the non-smooth kernels)."""
        raise NotImplementedError

    def _lengthscale(self, X: Array) -> Array:
        """The lengthscale as an array of X's dtype: a scalar, or one entry per feature."""
        ell = np.asarray(self.lengthscale, dtype=np.result_type(X.dtype, np.float32))
        if ell.ndim == 1 and ell.shape[0] != X.shape[1]:
            raise ValueError(f"{type(self).__name__}: lengthscale has {ell.shape[0]} entries but "
                             f"the data has {X.shape[1]} features; give one per feature or a "
                             "scalar.")
        return ell

    def half_neg_sqdist(self, X: Array, Z: Array, exact_near: bool = False) -> Array:
        """``-||x - z||² / (2 l²)`` for every pair; shape (n, m), X's float dtype.

        By one matrix product on rows centred on Z's median; the pairs whose expanded
        value may have lost digits to cancellation are recomputed from their
        differences (module docstring). ``exact_near`` selects the stricter criterion
        of the kernels that take a square root.
        """
        dtype = np.result_type(X.dtype, Z.dtype, np.float32)
        square = X is Z  # k(X): its diagonal pairs are x with itself
        X, Z = X.astype(dtype, copy=False), Z.astype(dtype, copy=False)
        ell = self._lengthscale(X)
        centre = robust_centre(Z)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # checked next
            Xs, Zs = (X - centre) / ell, (Z - centre) / ell
            hx = 0.5 * np.einsum("ij,ij->i", Xs, Xs)
            hz = 0.5 * np.einsum("ij,ij->i", Zs, Zs)
        largest = float(hx.max(initial=0.0)) + float(hz.max(initial=0.0))
        if not largest < FAR_H * float(np.finfo(dtype).max):
            # the lengthscale in float64: in float32 one below ~1.4e-45 is 0, and 0 / 0
            return _half_neg_sqdist_by_features(X, Z, np.asarray(self.lengthscale, np.float64))
        ones_x, ones_z = np.ones((len(Xs), 1), dtype), np.ones((len(Zs), 1), dtype)
        G = np.hstack([Xs, -hx[:, None], ones_x]) @ np.hstack([Zs, ones_z, -hz[:, None]]).T
        if square:  # exactly 0, as diag() says, not 0 within ε h
            np.fill_diagonal(G, 0.0)
        # Rounding can leave values of order eps·h above 0. Clamping would cost a pass over
        # the tile: exp takes them to 1 + O(eps), and exact_near recomputes them exactly.
        near, floor = (NEAR, 0.0) if exact_near else (EXP_NEAR, 1.0)
        rows, cols = _cancelled_pairs(G, hx, hz, near, floor)
        if len(rows):  # uncentred differences: subtracting a far centre loses digits
            G[rows, cols] = -0.5 * np.square((X[rows] - Z[cols]) / ell).sum(axis=1)
        return G

    def _keops_sqdist(self, X: Array, Z: Array) -> Any:
        return keops_scaled_sqdist(X, Z, self._lengthscale(X))

    def diag(self, X: Array) -> Array:
        X = np.asarray(X)
        return np.ones(len(X), dtype=np.result_type(X.dtype, np.float32))


class Gaussian(Stationary):
    """Gaussian (RBF) kernel ``k(x, x') = exp(-||x - x'||² / (2 l²))``.

    Parameters
    ----------
    lengthscale : float or sequence of float, default=1.0
        ``l > 0``, one per feature for ARD. ``gamma`` of scikit-learn's ``rbf`` is ``1 / (2 l²)``.
    lengthscale_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        Range of every lengthscale entry when hyperparameters are learned (as
        scikit-learn's ``length_scale_bounds``); ``"fixed"`` keeps it out of ``theta``.
    """

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        K = self.half_neg_sqdist(X, Z)
        return fastexp.exp(K, out=K)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        return (-0.5 * self._keops_sqdist(X, Z)).exp()

    def _profile(self, r: Array) -> tuple[Array, Array]:
        K = np.exp(-0.5 * r * r)
        return K, K


RBF = Gaussian


class Laplacian(Stationary):
    """Laplacian kernel ``k(x, x') = exp(-||x - x'|| / l)``.

    Parameters
    ----------
    lengthscale : float or sequence of float, default=1.0
        ``l > 0``, one per feature for ARD.
    lengthscale_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        See :class:`Gaussian`.
    """

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        R = _distance(self.half_neg_sqdist(X, Z, exact_near=True))
        np.negative(R, out=R)
        return fastexp.exp(R, out=R)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        return (-self._keops_sqdist(X, Z).sqrt()).exp()

    def _profile(self, r: Array) -> tuple[Array, Array]:
        return _matern_profile(r, 0.5)


class Matern(Stationary):
    """Matérn kernel of smoothness ``nu`` in {0.5, 1.5, 2.5}, with ``r = ||x - x'|| / l``.

    ``nu=0.5``: ``exp(-r)``; ``nu=1.5``: ``(1 + √3 r) exp(-√3 r)``;
    ``nu=2.5``: ``(1 + √5 r + 5 r² / 3) exp(-√5 r)`` (scikit-learn's ``Matern``).

    Parameters
    ----------
    lengthscale : float or sequence of float, default=1.0
        ``l > 0``, one per feature for ARD.
    nu : {0.5, 1.5, 2.5}, default=1.5
        Smoothness; other values have no closed form here. Fixed (never in ``theta``).
    lengthscale_bounds : (float, float) or "fixed", default=(1e-5, 1e5)
        See :class:`Gaussian`.
    """

    def __init__(self, lengthscale: float | Array = 1.0, nu: float = 1.5,
                 lengthscale_bounds: Any = DEFAULT_BOUNDS, **aliases: Any) -> None:
        self.nu = nu
        super().__init__(lengthscale, lengthscale_bounds, **aliases)

    def _profile(self, r: Array) -> tuple[Array, Array]:
        return _matern_profile(r, self.nu)

    def _validate(self) -> None:
        super()._validate()
        if self.nu not in _MATERN_NUS:
            raise ValueError(f"Matern: nu must be one of {_MATERN_NUS}; got {self.nu!r}.")

    def _block(self, X: Array, Z: Array | None = None) -> Array:
        X, Z = as_pair(X, Z)
        R = _distance(self.half_neg_sqdist(X, Z, exact_near=True))
        if self.nu == 0.5:
            np.negative(R, out=R)
            return fastexp.exp(R, out=R)
        a = np.sqrt(3.0) if self.nu == 1.5 else np.sqrt(5.0)
        R *= a  # R now holds a·r
        np.minimum(R, MATERN_FAR, out=R)  # far pairs: poly · 0, never ∞ · 0
        poly = 1.0 + R if self.nu == 1.5 else 1.0 + R + R * R / 3.0
        np.negative(R, out=R)
        fastexp.exp(R, out=R)
        return np.multiply(poly, R, out=R)

    def keops_formula(self, X: Array, Z: Array) -> Any:
        r = self._keops_sqdist(X, Z).sqrt()
        if self.nu == 0.5:
            return (-r).exp()
        a = float(np.sqrt(3.0) if self.nu == 1.5 else np.sqrt(5.0))
        ar = (a * r).clamp(0.0, MATERN_FAR)  # far pairs: poly · 0, never ∞ · 0
        poly = 1.0 + ar if self.nu == 1.5 else 1.0 + ar + ar * ar / 3.0
        return poly * (-ar).exp()


#: Where a Matérn kernel's ``a·r`` is capped: e^{-800} is 0 in float64, so the value
#: there is exactly 0, and the polynomial stays finite (a pair ~1e154 apart, or one whose
#: r² overflowed to ∞, gave ∞ · 0 = NaN).
MATERN_FAR = 800.0


def _matern_profile(r: Array, nu: float) -> tuple[Array, Array]:
    """``k(r)`` and ``g(r) = -k'(r) / r`` of the Matérn kernel of smoothness ``nu``."""
    if nu == 0.5:  # k = e^{-r}, g = e^{-r} / r: infinite at r = 0, where s² = 0 (scikit-learn: 0)
        K = np.exp(-r)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(r > 0, K / np.where(r > 0, r, 1.0), 0.0)
        return K, g
    a = np.sqrt(3.0) if nu == 1.5 else np.sqrt(5.0)
    r = np.minimum(r, MATERN_FAR / a)  # far pairs: poly · 0, never ∞ · 0
    e = np.exp(-a * r)
    if nu == 1.5:  # k = (1 + √3 r) e^{-√3 r}, g = 3 e^{-√3 r}
        return (1.0 + a * r) * e, 3.0 * e
    # k = (1 + √5 r + 5 r² / 3) e^{-√5 r}, g = 5/3 (1 + √5 r) e^{-√5 r}
    return (1.0 + a * r + 5.0 * r * r / 3.0) * e, 5.0 / 3.0 * (1.0 + a * r) * e


def _half_neg_sqdist_by_features(X: Array, Z: Array, ell: Array) -> Array:
    """``-||(x - z) / l||² / 2`` summed feature by feature from differences: for rows whose
    scaled norms pass float's range (far rows, or lengthscales tiny next to X's values),
    where the expanded form gives inf - inf = NaN. A difference that overflows once scaled
    gives -inf (the kernel value 0) and equal rows give exactly 0, as scikit-learn's do."""
    ells = np.broadcast_to(ell, (X.shape[1],))
    out = np.zeros((len(X), len(Z)), dtype=np.result_type(X.dtype, Z.dtype))
    with np.errstate(over="ignore"):
        for k in range(X.shape[1]):
            out += np.square(np.subtract.outer(X[:, k], Z[:, k]) / ells[k])
    out *= -0.5
    return out


def _cancelled_pairs(G: Array, hx: Array, hz: Array, near: float,
                     floor: float) -> tuple[Array, Array]:
    """(rows, cols) of the pairs with ``max(|G|, floor) < near (h_x + h_z)``.

    There the expanded form's rounding error ``≈ ε (h_x + h_z)`` is not small next to
    ``max(|G|, floor)``. With ``floor > 0`` only rows (columns) whose ``h`` plus the
    largest ``h`` of the other side exceeds ``floor / near`` can hold such a pair, so
    only where they cross is searched: nowhere on ordinary data.
    """
    least = floor / near  # h_x + h_z must exceed it
    if G.size == 0 or hx.max() + hz.max() <= least:
        return np.empty(0, np.intp), np.empty(0, np.intp)
    rows = np.flatnonzero(hx + hz.max() > least)
    cols = np.flatnonzero(hz + hx.max() > least)
    if len(rows) < G.shape[0] or len(cols) < G.shape[1]:
        G, hx, hz = G[np.ix_(rows, cols)], hx[rows], hz[cols]
    # A pair qualifies only if G > -near (h_x + max h_z): one comparison with a bound per
    # row (or per column, whichever side has the smaller norms), then the exact test on
    # the few candidates. Far rows on both sides make all candidates: one exact pass.
    if hz.max() <= hx.max():
        candidates = G > (-near * (hx + hz.max()))[:, None]
    else:
        candidates = G > (-near * (hx.max() + hz))[None, :]
    flat = np.flatnonzero(candidates)
    if len(flat) > G.size // 8:
        flat = np.flatnonzero(G > np.add.outer(-near * hx, -near * hz))
    r, c = np.divmod(flat, G.shape[1])
    bound = near * (hx[r] + hz[c])
    keep = G.ravel()[flat] > -bound
    if floor:
        keep &= bound > floor
    return rows[r[keep]], cols[c[keep]]


def robust_centre(Z: Array) -> Array:
    """A coordinatewise (lower) median of at most ``CENTRE_SAMPLE`` evenly spaced rows of Z.

    Any centre gives correct distances (the pairs it leaves far from it are
    recomputed); a robust one keeps that set small, as one far row cannot move it. A
    row of Z per coordinate, so ``x - c`` is exact for rows near it (Sterbenz).
    """
    if len(Z) == 0:
        return np.zeros(Z.shape[1], Z.dtype)
    sample = Z[::-(-len(Z) // CENTRE_SAMPLE)]
    middle = (len(sample) - 1) // 2
    return np.partition(sample, middle, axis=0)[middle]


def _distance(half_neg_sqdist: Array) -> Array:
    """``||x - z|| / l`` from ``-||x - z||² / (2 l²)``, in place."""
    R = np.multiply(half_neg_sqdist, -2.0, out=half_neg_sqdist)
    return np.sqrt(R, out=R)


def keops_scaled_sqdist(X: Array, Z: Array, ell: Array, factor: float = 1.0) -> Any:
    """KeOps' ``factor · ‖(x − z) / ℓ‖²``: the stationary kernels' formula, and (factor
    −1/2) the Gaussian log weights of the KeOps log-sums.

    Differences first, then the lengthscale (see ``_value_and_gradient``). A scalar ℓ is
    one multiply by ``factor / ℓ²``, unless that overflows (x = z would give 0 · inf) or
    underflows to 0 (pykeops turns a LazyTensor times 0.0 into a plain number): then, as
    for one ℓ per feature, the differences are scaled feature by feature.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    Z : ndarray of shape (m, d)
    ell : float or ndarray of shape (d,)
        The lengthscale(s), > 0.
    factor : float, default=1.0

    Returns
    -------
    pykeops.numpy.LazyTensor
        Of shape (n, m, 1), symbolic.
    """
    from pykeops.numpy import LazyTensor

    x = LazyTensor(np.ascontiguousarray(X)[:, None, :])
    z = LazyTensor(np.ascontiguousarray(Z)[None, :, :])
    with np.errstate(over="ignore", divide="ignore"):
        constant = factor / ell**2
    if np.ndim(ell) == 0 and 0 < abs(constant) < np.inf:
        return x.sqdist(z) * float(constant)
    inverse = np.ascontiguousarray(np.broadcast_to(1.0 / ell, (X.shape[1],)))
    scaled = ((x - z) * LazyTensor(inverse)).sqnorm2()
    return scaled if factor == 1.0 else scaled * factor
