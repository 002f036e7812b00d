"""Kernelised gradient descent: KernelRidge(solver="gd") and dkern.solvers.gd against dense
numpy solves of the same systems on a real data set."""

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_diabetes

import dkern
from dkern import KernelRidge
from dkern.errors import ConvergenceWarning
from dkern.kernels import Gaussian
from dkern.models import kernel_ridge
from dkern.solvers import gd, top_eigenvalue

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def _diabetes():
    """scikit-learn's diabetes: 442 rows, 10 standardised features, standardised target."""
    X, y = load_diabetes(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()


X_ALL, Y_ALL = _diabetes()
X, Y, X_NEW = X_ALL[:150], Y_ALL[:150], X_ALL[150:200]
KERNEL, ALPHA = Gaussian(1.5), 2.0  # κ(K + αI) = 8.2 on these rows: gd takes about 150 steps


def _dense(X, y, kernel=KERNEL, alpha=ALPHA):
    K = kernel(X, X)
    return K, np.linalg.solve(K + alpha * np.eye(len(X)), y)


def test_gd_converges_to_the_exact_krr_solution():
    """c ← c + τ(y − (K + αI)c) with τ = 1/λ_max reaches the dense solution of (K + αI)c = y
    to 1e-6, within the iterations gradient descent's rate promises: the residual falls by
    at least 1 − α/λ_max per step, so ⌈ln(tol) / ln(1 − α/λ_max)⌉ steps suffice."""
    K, c = _dense(X, Y)
    tol = 1e-9
    model = KernelRidge(KERNEL, alpha=ALPHA, solver="gd", tol=tol, random_state=0).fit(X, Y)
    assert model.solver_ == "gd" and model.converged_
    np.testing.assert_allclose(model.dual_coef_, c, rtol=0, atol=1e-6 * np.abs(c).max())
    assert np.abs(model.dual_coef_ - c).max() / np.abs(c).max() < 1e-8  # measured 2e-9
    want = KERNEL(X_NEW, X) @ c
    np.testing.assert_allclose(model.predict(X_NEW), want, rtol=0, atol=1e-8)
    lam = np.linalg.eigvalsh(K)[-1] + ALPHA
    bound = int(np.ceil(np.log(tol) / np.log(1 - ALPHA / lam)))
    assert model.n_iter_ <= bound  # measured 145 steps, bound 161
    history = model.residuals_[:, 0]
    assert history.shape == (model.n_iter_ + 1,) and history[-1] <= tol
    assert np.all(np.diff(history) < 0)  # Richardson with τ <= 1/λ_max: monotone


def test_top_eigenvalue_is_the_dense_one_from_above():
    """Twenty Lanczos steps plus the Ritz residual give λ_max(K + αI) from above (up to
    rounding, 1e-12), to 1e-9."""
    K, _ = _dense(X_ALL[:300], Y_ALL[:300])
    want = np.linalg.eigvalsh(K)[-1] + ALPHA
    A = dkern.gram(KERNEL, da.from_array(X_ALL[:300], chunks=(75, -1))) + ALPHA
    got = top_eigenvalue(A, random_state=1)
    assert want * (1 - 1e-12) <= got <= want * (1 + 1e-9)


def test_gd_on_chunked_dask_data_with_two_targets():
    """Two right-hand sides (each with its own stopping test) and X in 2 row chunks: the
    solution stays on the cluster and equals the dense one."""
    Y2 = np.column_stack([Y, np.sin(X[:, 0])])
    _, c = _dense(X, Y2)
    model = KernelRidge(KERNEL, alpha=ALPHA, solver="gd", tol=1e-9, random_state=0).fit(
        da.from_array(X, chunks=(75, -1)), da.from_array(Y2, chunks=(75, -1)))
    assert isinstance(model.dual_coef_, da.Array) and model.dual_coef_.shape == (150, 2)
    np.testing.assert_allclose(model.dual_coef_.compute(), c, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def gd_fit():
    """A gd fit to tol 1e-3 (44 iterations), fitted once: the saved model and the
    uninterrupted reference of the checkpoint test."""
    return KernelRidge(KERNEL, alpha=ALPHA, solver="gd", tol=1e-3, random_state=0).fit(X, Y)


def test_gd_model_saves_and_loads(tmp_path, gd_fit):
    model = gd_fit
    dkern.save(model, tmp_path / "gd.zarr")
    back = dkern.load(tmp_path / "gd.zarr")
    assert back.solver_ == "gd" and back.n_iter_ == model.n_iter_
    np.testing.assert_array_equal(back.residuals_, model.residuals_)
    np.testing.assert_array_equal(back.predict(X_NEW), model.predict(X_NEW))


@pytest.mark.parametrize("n", [10, 200, 5000])
def test_auto_never_picks_gd(monkeypatch, n):
    """"auto" is exact up to EXACT_MAX_N and CG above (lowered to 100 here): never gd, which
    reaches the same solution after κ ln(1/tol) steps against CG's √κ."""
    monkeypatch.setattr(kernel_ridge, "EXACT_MAX_N", 100)
    assert KernelRidge()._resolve_solver("auto", n) == ("exact" if n <= 100 else "cg")


def test_gd_warns_at_max_iter_and_names_the_fixes():
    A = dkern.gram(KERNEL, X) + ALPHA
    with pytest.warns(ConvergenceWarning, match="raise max_iter, loosen tol, or increase alpha"):
        out = gd(A, Y, tol=1e-12, max_iter=5, random_state=0)
    assert out.n_iter == 5 and not out.converged.any()


def test_gd_rejects_bad_arguments():
    A = dkern.gram(KERNEL, X) + ALPHA
    with pytest.raises(ValueError, match=r"step must be a finite number > 0 \(the gradient step"):
        gd(A, Y, step=-1.0)
    with pytest.raises(ValueError, match="max_iter must be an integer >= 1; got 0"):
        gd(A, Y, step=0.1, max_iter=0)
    with pytest.raises(ValueError, match=r"B must have shape \(150,\) or \(150, t\)"):
        gd(A, Y[:10], step=0.1)
    with pytest.raises(ValueError, match="alpha must be a finite number > 0 for solver='gd'"):
        KernelRidge(solver="gd", alpha=0.0).fit(X, Y)


class Stop(Exception):
    """Raised by a callback to interrupt a fit, as a crash would."""


def test_gd_resumes_from_its_checkpoint_and_ends_bitwise_equal(tmp_path, gd_fit):
    """A fit stopped at iteration 27 resumes from the checkpoint of iteration 20 (with the
    saved step: no new Lanczos estimate) and ends bitwise equal to an uninterrupted fit
    (tol 1e-3: 44 iterations, 17 after the stop)."""
    params = {"kernel": KERNEL, "alpha": ALPHA, "solver": "gd", "tol": 1e-3, "random_state": 0,
              "checkpoint_every": 10}
    ref = gd_fit  # the same parameters without a checkpoint folder (checkpoint_every unused)
    assert ref.get_params() == {**ref.get_params(), **params, "checkpoint_every": 50}
    seen = []

    def stop_at_27(k, rel):
        seen.append(k)
        if k == 27:
            raise Stop

    ck = tmp_path / "ck"
    with pytest.raises(Stop):
        KernelRidge(checkpoint=ck, **params).fit(X, Y, callback=stop_at_27)
    seen.clear()
    model = KernelRidge(checkpoint=ck, **{**params, "random_state": 1}).fit(
        X, Y, callback=lambda k, rel: seen.append(k))
    assert seen[0] == 20 and model.n_iter_ == ref.n_iter_
    np.testing.assert_array_equal(model.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(model.residuals_, ref.residuals_)
