"""What ``k(x, x')`` is: kernels, their dense blocks, KeOps formulas and algebra.

Kernels: ``Gaussian`` (``RBF``), ``Laplacian``, ``Matern``, ``RationalQuadratic``,
``Periodic``, ``Linear``, ``DotProduct``, ``Polynomial``, ``Constant`` and the noise term
``White``. They compose: ``c * k``, ``k + c``, ``k1 + k2``, ``k1 * k2``, ``k ** p``,
``exp(k)``, ``warp(k, f)``. ``from_repr`` turns a kernel's ``repr`` back into the kernel;
``from_sklearn`` converts scikit-learn's kernel objects.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from .algebra import MAX_DEPTH, Exp, Power, Product, Scaled, Sum, Warp, exp, warp
from .base import Hyperparameter, Kernel
from .checks import DEFAULT_BOUNDS, FIXED, check_n_features
from .constant import Constant, White
from .convert import from_sklearn
from .dot import DotProduct, Linear, Polynomial
from .periodic import Periodic
from .psd import PSDReport, check_psd
from .rational import RationalQuadratic
from .stationary import RBF, Gaussian, Laplacian, Matern

__all__ = [
    "DEFAULT_BOUNDS", "FIXED", "MAX_DEPTH", "RBF", "Constant", "DotProduct", "Exp", "Gaussian",
    "Hyperparameter", "Kernel", "Laplacian", "Linear", "Matern", "PSDReport", "Periodic",
    "Polynomial", "Power", "Product", "RationalQuadratic", "Scaled", "Sum", "Warp", "White",
    "check_n_features", "check_psd", "exp", "from_repr", "from_sklearn", "warp",
]

_REPR_NAMES = {name: globals()[name] for name in __all__
               if name not in ("DEFAULT_BOUNDS", "FIXED", "MAX_DEPTH", "Hyperparameter", "Kernel",
                               "PSDReport", "check_n_features", "check_psd", "from_repr",
                               "from_sklearn", "warp")}
#: Syntax-tree levels a kernel's leaf adds below its operations: a call, a list, a sign and
#: a number, as in ``Gaussian(lengthscale=[-1.0])``.
_LEAF_LEVELS = 4


def from_repr(text: str) -> Kernel:
    """The kernel whose ``repr`` is ``text``, e.g. ``"(2.0 * Gaussian(lengthscale=0.5))"``.

    The text is parsed, not run: only kernel names called with numbers or lists of
    numbers, and the algebra (``kernel + kernel``, ``kernel * kernel``, ``number *
    kernel``, ``kernel ** int``) and the string ``"fixed"`` (parameter bounds) are
    understood, so a model file cannot execute code or ask for unbounded work. ``warp``
    with an arbitrary function cannot be restored.
    Every kernel dkern can build (at most ``MAX_DEPTH`` nested operations) parses back.

    Raises
    ------
    ValueError
        ``text`` is not such an expression, nests deeper than ``MAX_DEPTH`` operations,
        or a kernel rejects its parameters.
    """
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        if "too many nested" in str(err.msg):  # Python's parser stops at 200 parentheses
            raise _too_deep(text) from None
        raise ValueError(f"from_repr: {_short(text)} is not a kernel expression ({err.msg}); "
                         "write it as dkern's kernels combined with numbers, +, *, ** and exp, "
                         "e.g. '2.0 * Gaussian(lengthscale=0.5)'.") from None
    except (RecursionError, MemoryError):
        raise _too_deep(text) from None
    kernel = _evaluate(tree.body, text, 1)
    if not isinstance(kernel, Kernel):
        raise ValueError(f"from_repr: {text!r} is a {type(kernel).__name__}, not a kernel.")
    return kernel


def _evaluate(node: Any, text: str, level: int) -> Any:
    """The value of one node, ``level`` deep, of a kernel expression (see :func:`from_repr`)."""
    if level > MAX_DEPTH + _LEAF_LEVELS:  # refused before Python's recursion limit is near
        raise _too_deep(text)
    below = level + 1
    if isinstance(node, ast.Constant) and (_is_number(node.value) or node.value == FIXED):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand, text, below)
        if _is_number(value):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.List | ast.Tuple):
        items = [_evaluate(item, text, below) for item in node.elts]
        if all(_is_number(item) for item in items):  # bounds are tuples, lengthscales lists
            return items if isinstance(node, ast.List) else tuple(items)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in _REPR_NAMES):
        args = [_evaluate(arg, text, below) for arg in node.args]
        kwargs = {kw.arg: _evaluate(kw.value, text, below) for kw in node.keywords if kw.arg}
        if len(kwargs) == len(node.keywords):
            return _REPR_NAMES[node.func.id](*args, **kwargs)
    elif isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, text, below), _evaluate(node.right, text, below)
        if _algebra_allows(node.op, left, right):
            return {ast.Add: operator.add, ast.Mult: operator.mul,
                    ast.Pow: operator.pow}[type(node.op)](left, right)
    raise ValueError(f"from_repr: {_short(text)} contains {_short(ast.unparse(node))}, which is "
                     "not part of a dkern kernel expression (kernel names called with numbers, "
                     f"k1 + k2, k1 * k2, c * k, k ** p); known names: {sorted(_REPR_NAMES)}.")


def _too_deep(text: str) -> ValueError:
    return ValueError(f"from_repr: {_short(text)} nests deeper than a dkern kernel can (at most "
                      f"dkern.kernels.MAX_DEPTH = {MAX_DEPTH} operations), so no kernel has this "
                      "repr. Write long sums as a balanced tree of pairs.")


def _short(text: str, limit: int = 200) -> str:
    """``repr(text)``, its middle elided beyond ``limit`` characters (a message stays short)."""
    return repr(text) if len(text) <= limit else repr(f"{text[:limit // 2]} ... {text[-50:]}")


def _algebra_allows(op: Any, left: Any, right: Any) -> bool:
    if isinstance(op, ast.Add):
        return isinstance(left, Kernel) and isinstance(right, Kernel)
    if isinstance(op, ast.Mult):
        return (isinstance(left, Kernel) and (isinstance(right, Kernel) or _is_number(right))
                or _is_number(left) and isinstance(right, Kernel))
    return isinstance(op, ast.Pow) and isinstance(left, Kernel) and isinstance(right, int)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
