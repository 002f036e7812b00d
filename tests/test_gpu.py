"""The KeOps GPU path through dask, against dense float64 products (skipped without a GPU)."""

import dask
import dask.array as da
import numpy as np
import pytest

import dkern
from dkern.backends import resolve_backend
from dkern.backends.blocks import KeopsBlocks
from dkern.kernels import Gaussian, Matern

pytestmark = [pytest.mark.gpu, pytest.mark.keops]
RNG = np.random.default_rng(3)


def test_auto_picks_keops_on_a_gpu():
    assert resolve_backend("auto") == "keops"


@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_gpu_matvec_matches_dense_and_really_uses_keops(dtype, tol, monkeypatch):
    calls = []
    real = KeopsBlocks.kernel_matvec

    def counting(self, x, z, v, *, kernel):
        calls.append(z.shape)
        return real(self, x, z, v, kernel=kernel)

    monkeypatch.setattr(KeopsBlocks, "kernel_matvec", counting)
    X, Z = RNG.normal(size=(3001, 5)), RNG.normal(size=(2003, 5))
    V = RNG.normal(size=(2003, 3))
    kernel = Gaussian(1.1) + 0.5 * Matern(2.0, 2.5)
    op = dkern.gram(kernel, da.from_array(X.astype(dtype), chunks=(1000, -1)),
                    da.from_array(Z.astype(dtype), chunks=(1000, -1)), backend="auto")
    with dask.config.set(scheduler="threads"):
        got = (op @ V).compute()
    want = kernel(X, Z) @ V
    assert op.backend == "keops" and len(calls) == 4 * 3  # 4 row x 3 column chunks
    assert np.abs(got - want).max() / np.abs(want).max() < tol
