"""from_repr and the kernel algebra's depth limit.

Every kernel dkern can build parses back from its repr; an expression nesting more than
MAX_DEPTH operations is refused when it is built, and text deeper than any kernel is
refused by the parser, both with a message naming the limit (never a RecursionError).
"""

import functools
import operator

import numpy as np
import pytest

from dkern.kernels import MAX_DEPTH, Gaussian, Laplacian, Matern, exp, from_repr
from dkern.kernels.algebra import depth

LIMIT = f"MAX_DEPTH = {MAX_DEPTH}"


def chain(n):
    """``k1 + k2 + ... + kn`` as Python's ``sum`` builds it: n - 1 nested additions."""
    return functools.reduce(operator.add, [Gaussian(1.0 + i / n) for i in range(n)])


def balanced_sum(kernels):
    """The same sum as a balanced tree of pairs: ceil(log2 n) levels."""
    while len(kernels) > 1:
        pairs = [a + b for a, b in zip(kernels[::2], kernels[1::2], strict=False)]
        kernels = pairs + kernels[len(pairs) * 2:]
    return kernels[0]


def test_the_deepest_kernel_of_every_operation_round_trips():
    steps = [lambda k: k + Laplacian(1.0), lambda k: 2.0 * k, lambda k: k * Matern(1.0, nu=1.5),
             lambda k: k ** 2, exp]
    k = Gaussian([0.5, 2.0])
    for i in range(MAX_DEPTH):
        k = steps[i % len(steps)](k)
    assert depth(k) == MAX_DEPTH
    back = from_repr(repr(k))
    assert back == k and repr(back) == repr(k)


@pytest.mark.parametrize("grow", [
    lambda k: k + Gaussian(1.0), lambda k: Gaussian(1.0) + k, lambda k: k * Gaussian(1.0),
    lambda k: 3.0 * k, lambda k: k ** 2, exp])
def test_one_operation_beyond_the_limit_is_refused_when_built(grow):
    deepest = chain(MAX_DEPTH + 1)
    assert depth(deepest) == MAX_DEPTH
    with pytest.raises(ValueError, match=f"would nest {MAX_DEPTH + 1} operations.*{LIMIT}"):
        grow(deepest)


def test_summing_3000_kernels_is_refused_up_front():
    """It used to build, fit, and then raise RecursionError in repr (so in save)."""
    kernels = [Gaussian(1.0 + i / 3000) for i in range(3000)]
    with pytest.raises(ValueError, match=f"{LIMIT}.*balanced tree"):
        sum(kernels[1:], kernels[0])


def test_a_balanced_sum_of_1000_kernels_round_trips_and_evaluates():
    kernels = [Gaussian(1.0 + i / 1000) for i in range(1000)]
    k = balanced_sum(kernels)
    assert depth(k) == 10  # ceil(log2 1000)
    assert from_repr(repr(k)) == k
    X = np.random.default_rng(0).normal(size=(6, 3))
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    want = sum(np.exp(-sq / (2 * g.lengthscale**2)) for g in kernels)
    np.testing.assert_allclose(k(X), want, rtol=1e-12)


@pytest.mark.parametrize("text", [
    " + ".join(["Gaussian(lengthscale=1.0)"] * 3000),  # was RecursionError
    "exp(" * 150 + "Gaussian(lengthscale=1.0)" + ")" * 150,  # was a kernel no one can build
    "(" * 300 + "Gaussian(lengthscale=1.0)" + ")" * 300,  # beyond Python's 200 parentheses
], ids=["chain-3000", "exp-150", "parens-300"])
def test_text_deeper_than_any_kernel_is_refused_by_the_parser(text):
    with pytest.raises(ValueError, match=f"from_repr: .*{LIMIT}") as err:
        from_repr(text)
    assert len(str(err.value)) < 600  # the text is elided in the message, not copied whole
