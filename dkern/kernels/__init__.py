"""What ``k(x, x')`` is: kernels, their dense blocks, KeOps formulas and algebra.

Kernels compose: ``c * k``, ``k1 + k2``, ``k1 * k2``, ``k ** p``, ``exp(k)``,
``warp(k, f)``. ``from_repr`` turns a kernel's ``repr`` back into the kernel.
"""

from __future__ import annotations

from .algebra import Exp, Power, Product, Scaled, Sum, Warp, exp, warp
from .base import Kernel
from .dot import Linear, Polynomial
from .psd import PSDReport, check_psd
from .stationary import RBF, Gaussian, Laplacian, Matern

__all__ = [
    "RBF", "Exp", "Gaussian", "Kernel", "Laplacian", "Linear", "Matern", "PSDReport", "Polynomial",
    "Power", "Product", "Scaled", "Sum", "Warp", "check_psd", "exp", "from_repr", "warp",
]

_REPR_NAMES = {name: globals()[name] for name in __all__ if name not in ("from_repr", "warp")}


def from_repr(text: str) -> Kernel:
    """The kernel whose ``repr`` is ``text``, e.g. ``"(2.0 * Gaussian(lengthscale=0.5))"``.

    Only kernel names, numbers, lists and the algebra operators are understood;
    no other Python runs (``warp`` with an arbitrary function cannot be restored).
    """
    import ast

    allowed = (ast.Expression, ast.Call, ast.Name, ast.Load, ast.Constant, ast.keyword, ast.List,
               ast.Tuple, ast.BinOp, ast.Add, ast.Mult, ast.Pow, ast.UnaryOp, ast.USub)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"from_repr: {text!r} is not a kernel expression ({err.msg}).") from None
    for node in ast.walk(tree):
        if not isinstance(node, allowed) or (isinstance(node, ast.Name)
                                             and node.id not in _REPR_NAMES):
            raise ValueError(f"from_repr: {text!r} contains {ast.dump(node)[:60]}, which is not "
                             f"a dkern kernel expression; known names: {sorted(_REPR_NAMES)}.")
    kernel = eval(compile(tree, "<kernel>", "eval"), {"__builtins__": {}}, dict(_REPR_NAMES))
    if not isinstance(kernel, Kernel):
        raise ValueError(f"from_repr: {text!r} evaluates to {type(kernel).__name__}, not a kernel.")
    return kernel
