"""White noise in the models: learned as scikit-learn learns it, or refused where it cannot be.

scikit-learn's ``WhiteKernel`` adds its noise to ``k(X)`` only: the training system
``K + (alpha + noise) I``, no noise in the cross-covariances, and the predictive std
includes it (``kernel_.diag(X*)``). The oracle tests compare dkern's exact GP and SGPR with
``sklearn.gaussian_process.GaussianProcessRegressor`` on three bundled real data sets.
"""

import logging

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_linnerud, load_wine
from sklearn.gaussian_process import GaussianProcessRegressor as SkGPR
from sklearn.gaussian_process.kernels import RBF, WhiteKernel
from sklearn.gaussian_process.kernels import ConstantKernel as SkC
from sklearn.kernel_ridge import KernelRidge as SkKRR
from sklearn.preprocessing import StandardScaler

import dkern
from dkern.kernels import Constant, Gaussian, White, from_sklearn
from dkern.models import (
    GaussianProcessClassifier,
    GaussianProcessRegressor,
    KernelLogisticRegression,
    KernelRidge,
    NadarayaWatson,
)
from dkern.models.posteriors.exact import log_marginal_likelihood
from dkern.models.posteriors.sparse import SparseBound, training_data

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def _scaled(X, y):
    y = np.asarray(y, dtype=float)
    return StandardScaler().fit_transform(X), (y - y.mean(axis=0)) / y.std(axis=0)


def diabetes():
    return _scaled(*load_diabetes(return_X_y=True))  # (442, 10), disease progression


def diabetes_200():
    X, y = diabetes()
    return X[:200], y[:200]


def wine():
    X = load_wine().data  # (178, 13): alcohol predicted from the 12 other measurements
    return _scaled(X[:, 1:], X[:, 0])


def linnerud():
    data = load_linnerud()  # (20, 3): three physiological targets at once
    return _scaled(data.data, data.target)


def sk_kernel(d):
    return SkC(1.0) * RBF(np.ones(d)) + WhiteKernel(1.0)


@pytest.mark.filterwarnings("ignore:.*(upper bound|close to the specified):"
                            "sklearn.exceptions.ConvergenceWarning",
                            "ignore:.*upper bound:dkern.errors.ConvergenceWarning")
@pytest.mark.parametrize(("data", "restarts"), [
    (diabetes_200, 1), (wine, 1), (linnerud, 1),
    # all 442 rows: scikit-learn's two runs (the reference) take 12 s of CPU and dkern's
    # would take as long again; dkern's run from the kernel's start alone reaches their best
    # (the restart ends lower on every data set here, 483.7 against 478.4 on this one)
    pytest.param(diabetes, 0, marks=pytest.mark.slow)],
    ids=["diabetes_200", "wine", "linnerud", "diabetes"])
def test_learned_noise_reaches_sklearn_and_predicts_as_it_does(data, restarts):
    X, y = data()
    kernel = sk_kernel(X.shape[1])
    sk = SkGPR(kernel, n_restarts_optimizer=1, random_state=0).fit(X, y)
    ours = GaussianProcessRegressor(from_sklearn(kernel), n_restarts_optimizer=restarts,
                                    random_state=0, solver="exact").fit(X, y)
    assert ours.log_marginal_likelihood_value_ >= sk.log_marginal_likelihood_value_ - 1e-3
    assert ours.kernel_.white_noise() > 1e-3  # the noise was learned, not left at a bound
    # at scikit-learn's optimum: the same evidence and predictive, noise in the std
    at = GaussianProcessRegressor(from_sklearn(sk.kernel_), optimizer=None,
                                  solver="exact").fit(X, y)
    Xt = X[:40] + 0.1
    m_sk, s_sk = sk.predict(Xt, return_std=True)
    m, s = at.predict(Xt, return_std=True)
    np.testing.assert_allclose(m, m_sk, rtol=0, atol=1e-8)
    np.testing.assert_allclose(s, s_sk, rtol=0, atol=1e-8)
    np.testing.assert_allclose(at.predict(Xt[:10], return_cov=True)[1],
                               sk.predict(Xt[:10], return_cov=True)[1], rtol=0, atol=1e-8)
    assert abs(at.log_marginal_likelihood_value_ - sk.log_marginal_likelihood_value_) < 1e-8


@pytest.mark.parametrize("targets", [1, 3])
def test_exact_gradient_with_white_matches_sklearn_and_finite_differences(targets):
    X, Y = linnerud()
    y = Y[:, :targets]
    sk = sk_kernel(3).clone_with_theta(np.log([0.8, 1.5, 2.0, 0.7, 0.3]))
    kernel = from_sklearn(sk)
    value, grad = log_marginal_likelihood(kernel, X, y, 1e-10, True)
    sk_value, sk_grad = SkGPR(sk, optimizer=None).fit(X, y).log_marginal_likelihood(
        sk.theta, eval_gradient=True)
    assert value == pytest.approx(sk_value, abs=1e-10)
    np.testing.assert_allclose(grad, sk_grad, rtol=0, atol=1e-9)
    h, theta = 1e-6, kernel.theta
    fd = [(log_marginal_likelihood(kernel.with_theta(theta + h * e), X, y, 1e-10, False)[0]
           - log_marginal_likelihood(kernel.with_theta(theta - h * e), X, y, 1e-10, False)[0])
          / (2 * h) for e in np.eye(len(theta))]
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)


def test_sklearn_kernel_object_is_converted_with_one_info_line(caplog):
    X, y = wine()
    kernel = sk_kernel(X.shape[1])
    model = GaussianProcessRegressor(kernel, optimizer=None, solver="exact")
    with caplog.at_level(logging.INFO, logger="dkern.models._validation"):
        model.fit(X, y)
    lines = [r for r in caplog.records if "converted the scikit-learn kernel" in r.message]
    assert len(lines) == 1
    assert model.kernel is kernel  # the parameter is left as given (scikit-learn's contract)
    assert model.kernel_ == from_sklearn(kernel)
    sk = SkGPR(kernel, optimizer=None).fit(X, y)
    np.testing.assert_allclose(model.predict(X[:20]), sk.predict(X[:20]), rtol=0, atol=1e-8)


def test_kernel_ridge_adds_white_noise_to_the_training_diagonal():
    X, y = wine()
    noise, alpha = 0.3, 0.05
    sk_rbf = SkC(0.9) * RBF(np.full(X.shape[1], 2.0))
    ours = KernelRidge(sk_rbf + WhiteKernel(noise), alpha=alpha, solver="exact").fit(X, y)
    # the GP rule (K + (alpha + noise) I) c = y; scikit-learn's KernelRidge drops a
    # WhiteKernel (its pairwise_kernels passes Y = X), so its oracle is the noise in alpha
    oracle = SkKRR(kernel=sk_rbf, alpha=alpha + noise).fit(X, y)
    np.testing.assert_allclose(ours.dual_coef_, oracle.dual_coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours.predict(X[:30] - 0.2), oracle.predict(X[:30] - 0.2),
                               rtol=0, atol=1e-8)
    gp = SkGPR(sk_rbf + WhiteKernel(noise), alpha=alpha, optimizer=None).fit(X, y)
    np.testing.assert_allclose(ours.predict(X[:30]), gp.predict(X[:30]), rtol=0, atol=1e-8)


@pytest.mark.parametrize("solver", ["cg", "gd", "nystrom"])
def test_kernel_ridge_refuses_white_where_it_would_be_ignored(solver):
    X, y = wine()
    with pytest.raises(ValueError, match=r"KernelRidge\(solver=.*White.*without_white"):
        KernelRidge(Gaussian(1.0) + White(0.1), solver=solver).fit(X, y)


@pytest.mark.parametrize("solver, variance", [("exact", "lanczos"), ("cg", "lanczos")])
def test_gp_refuses_white_with_lanczos_variances(solver, variance):
    # solver="cg" with CG variances supports White: tests/test_cg_learning.py
    X, y = wine()
    with pytest.raises(ValueError, match="does not support White.*variance='cg'"):
        GaussianProcessRegressor(Gaussian(1.0) + White(0.1), solver=solver,
                                 variance=variance, optimizer=None).fit(X, y)


def _sparse_bound(kernel, X, y, M):
    Xd, Yd = training_data(X, y)
    return SparseBound(Xd, Yd, X[:M], 1e-6)


def test_sgpr_bound_gradient_includes_the_noise():
    X, y = diabetes()
    X, y = X[:200], y[:200]
    kernel = Constant(1.0) * Gaussian(np.full(10, 3.0)) + White(0.5)
    bound = _sparse_bound(kernel, X, y, 40)
    value, grad = bound(kernel, True)
    h, theta = 1e-6, kernel.theta
    fd = [(bound(kernel.with_theta(theta + h * e), False)[0]
           - bound(kernel.with_theta(theta - h * e), False)[0]) / (2 * h)
          for e in np.eye(len(theta))]
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-5)
    assert abs(grad[-1]) > 1.0  # the noise's own entry is not zero
    # every row a centre: the bound is the exact evidence, with noise alpha + White's
    full = _sparse_bound(kernel, X, y, 200)(kernel, False)[0]
    exact = log_marginal_likelihood(kernel, X, y[:, None], 1e-6, False)[0]
    assert full == pytest.approx(exact, abs=1e-6)


def test_sgpr_learns_the_noise():
    X, y = diabetes()
    X, y = X[:200], y[:200]
    kernel = Constant(1.0) * Gaussian(np.full(10, 3.0)) + White(0.5)
    start = _sparse_bound(kernel, X, y, 40)(kernel, False)[0]
    model = GaussianProcessRegressor(kernel, alpha=1e-6, solver="nystrom", n_centers=40,
                                     random_state=0).fit(X, y)
    assert model.log_marginal_likelihood_value_ > start + 10
    noise = model.kernel_.white_noise()
    assert 0.2 < noise < 1.0 and noise != 0.5
    # the predictive variance includes the noise, as scikit-learn's kernel_.diag(X*)
    assert np.all(model.predict(X[:5], return_std=True)[1] ** 2 >= noise)


def test_white_model_saves_and_loads(tmp_path):
    X, y = linnerud()
    model = GaussianProcessRegressor(sk_kernel(3), random_state=0, solver="exact").fit(X, y)
    url = str(tmp_path / "white.zarr")
    dkern.save(model, url)
    loaded = dkern.load(url)
    assert loaded.kernel_ == model.kernel_ and loaded.kernel_.has_white
    assert loaded.kernel == from_sklearn(sk_kernel(3))  # stored as its dkern equivalent
    np.testing.assert_array_equal(loaded.predict(X, return_std=True)[1],
                                  model.predict(X, return_std=True)[1])
    krr = KernelRidge(Gaussian(1.0) + White(0.2), solver="exact").fit(X, y)
    dkern.save(krr, str(tmp_path / "krr.zarr"))
    np.testing.assert_array_equal(dkern.load(str(tmp_path / "krr.zarr")).predict(X),
                                  krr.predict(X))


def test_classifiers_and_smoothers_refuse_white():
    X, _ = wine()
    labels = (X[:, 0] > 0).astype(int)
    kernel = Gaussian(1.0) + White(0.1)
    with pytest.raises(ValueError, match="GaussianProcessClassifier does not support White"):
        GaussianProcessClassifier(kernel).fit(X, labels)
    with pytest.raises(ValueError, match="KernelLogisticRegression does not support White"):
        KernelLogisticRegression(kernel).fit(X, labels)
    with pytest.raises(ValueError, match="White noise term"):
        NadarayaWatson(kernel).fit(X, X[:, 1]).predict(X[:3])


def test_classifier_takes_a_sklearn_kernel():
    X, _ = wine()
    labels = (X[:, 0] > 0).astype(int)
    kernel = SkC(1.0) * RBF(3.0)
    model = GaussianProcessClassifier(kernel, optimizer=None).fit(X, labels)
    assert model.kernel is kernel and model.kernel_ == from_sklearn(kernel)
    lazy = da.from_array(X, chunks=60)
    assert model.predict(lazy).shape == (len(X),)
