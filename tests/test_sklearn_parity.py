"""scikit-learn parity of the estimators' API (issue 27 item 7), each against
scikit-learn's own estimator on real data (scikit-learn's bundled diabetes study).

The KDE's bandwidth rules are tested with the KDE (tests/test_smoothing.py).
"""

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from sklearn.kernel_ridge import KernelRidge as SklearnKernelRidge
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score

import dkern


@pytest.fixture(autouse=True)
def _sync(sync_scheduler):
    """Dask's synchronous scheduler: numpy data, no cluster needed."""


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()


@pytest.mark.parametrize("make", [lambda: dkern.KernelRidge(),
                                  lambda: dkern.KernelRidge(kernel=None, solver="exact")])
def test_grid_search_over_the_default_kernels_lengthscale(make):
    """A grid over the default kernel's hyperparameter works (it raised "'NoneType' object
    has no attribute 'set_params'") and picks what scikit-learn's grid over the same
    kernel picks: Gaussian(ℓ) is RBF with gamma = 1/(2ℓ²); the same scores to 1e-10."""
    X, y = _diabetes()
    ells = [2.0, 4.0, 8.0, 16.0]
    folds = KFold(4, shuffle=True, random_state=0)
    ours = GridSearchCV(make(), {"kernel__lengthscale": ells, "alpha": [0.1, 1.0]},
                        cv=folds).fit(X, y)
    theirs = GridSearchCV(SklearnKernelRidge(kernel="rbf"),
                          {"gamma": [1 / (2 * e**2) for e in ells], "alpha": [0.1, 1.0]},
                          cv=folds).fit(X, y)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"],
                               theirs.cv_results_["mean_test_score"], rtol=0, atol=1e-10)
    assert ours.best_params_["alpha"] == theirs.best_params_["alpha"]
    assert 1 / (2 * ours.best_params_["kernel__lengthscale"] ** 2) == \
        pytest.approx(theirs.best_params_["gamma"], rel=1e-15)


def test_nested_kernel_params_on_the_default_gp_kernel_make_it_explicit():
    gp = dkern.GaussianProcessRegressor().set_params(kernel__kernel__lengthscale=3.0)
    assert gp.kernel == dkern.GaussianProcessRegressor._default_kernel().set_params(
        kernel__lengthscale=3.0)
    assert dkern.GaussianProcessRegressor().kernel is None
    clf = dkern.GaussianProcessClassifier().set_params(kernel__constant=2.0)
    assert clf.kernel.constant == 2.0 and clf.kernel.hyperparameters[0].fixed
    gp = dkern.GaussianProcessRegressor()
    with pytest.raises(ValueError, match="Scaled has no parameter 'k2'"):
        gp.set_params(kernel__k2__lengthscale=3.0)
    assert gp.kernel is None  # a refused key leaves the estimator as it was


@pytest.mark.parametrize("C", [0.05, 1.0])
def test_klr_takes_sklearns_C(C, tmp_path):
    """KernelLogisticRegression(Linear(), C=C) is LogisticRegression(C=C,
    fit_intercept=False) on the breast cancer study: probabilities to 1e-8; a saved model
    keeps C."""
    X, y = _breast_cancer()
    ours = dkern.KernelLogisticRegression(dkern.kernels.Linear(), C=C, tol=1e-12).fit(
        X[:300], y[:300])
    theirs = LogisticRegression(C=C, fit_intercept=False, solver="newton-cholesky",
                                tol=1e-12, max_iter=1000).fit(X[:300], y[:300])
    np.testing.assert_allclose(ours.predict_proba(X[300:]), theirs.predict_proba(X[300:]),
                               rtol=0, atol=1e-8)
    dkern.save(ours, tmp_path / "klr.zarr")
    back = dkern.load(tmp_path / "klr.zarr")
    assert back.C == C and back.alpha == 1.0
    np.testing.assert_array_equal(back.predict_proba(X[300:]), ours.predict_proba(X[300:]))


def test_klr_grid_over_C_and_its_refusals():
    """A grid over C works; C with a non-default alpha, or C <= 0, is refused by name."""
    X, y = _breast_cancer()
    # tol 1e-2: the grid's plumbing is the point, not each fit's optimum (fewer Newton steps)
    search = GridSearchCV(dkern.KernelLogisticRegression(dkern.kernels.Linear(), tol=1e-2),
                          {"C": [0.001, 0.1]}, cv=2).fit(X[:120], y[:120])
    assert search.best_params_["C"] in (0.001, 0.1)
    with pytest.raises(ValueError, match="give alpha or C, not both: got alpha=0.5 and C=1"):
        dkern.KernelLogisticRegression(alpha=0.5, C=1).fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="C must be a finite number > 0 .* got -1"):
        dkern.KernelLogisticRegression(C=-1).fit(X[:50], y[:50])


def _breast_cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), y


class _SeesX(dkern.KernelRidge):
    """Records the type of each X its fit is given (cross_val_score fits clones)."""

    fitted_on: list = []

    def fit(self, X, y, **kwargs):
        _SeesX.fitted_on.append(type(X))
        return super().fit(X, y, **kwargs)


def test_cross_val_score_on_a_zarr_array_stays_lazy_and_scores_as_sklearn(tmp_path):
    """scikit-learn's model selection indexes X by rows, which a ``(url, path)`` tuple has
    not (scikit-learn itself rejects it: "inconsistent numbers of samples: [2, 442]"); the
    array dkern.io.open_array gives is a dask array: each fold is a lazy row selection of the
    store, and the scores equal scikit-learn's KernelRidge on the same numbers (1e-10)."""
    X, y = _diabetes()
    url = str(tmp_path / "d.zarr")
    dkern.io.write_arrays(url, {"X": X}, chunk_rows=100)
    folds = KFold(3, shuffle=True, random_state=0)
    _SeesX.fitted_on.clear()
    ours = cross_val_score(_SeesX(dkern.kernels.Gaussian(3.0), alpha=0.5, solver="exact"),
                           dkern.io.open_array(url, "X"), y, cv=folds)
    theirs = cross_val_score(SklearnKernelRidge(alpha=0.5, kernel="rbf", gamma=1 / 18), X, y,
                             cv=folds)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-10)
    assert _SeesX.fitted_on == [da.Array] * 3
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: \[2, 442\]"):
        cross_val_score(dkern.KernelRidge(), (url, "X"), y, cv=folds)


def test_krr_sample_weight_equals_sklearns_and_is_refused_by_iterative_solvers():
    """fit(sample_weight=) as scikit-learn's KernelRidge on diabetes (zero weights and two
    targets included): the same dual coefficients and predictions (1e-10), by "exact" and by
    "auto" (which picks it); integer weights with alpha scaled are not repeated rows in kernel
    ridge, so the reference is scikit-learn itself. The iterative solvers refuse weights by
    name, as do bad weights."""
    X, y = _diabetes()
    w = np.random.default_rng(0).integers(0, 4, size=len(X)).astype(float)
    Y = np.column_stack([y, y ** 2])
    theirs = SklearnKernelRidge(alpha=0.3, kernel="rbf", gamma=1 / 18).fit(X[:300], Y[:300],
                                                                             sample_weight=w[:300])
    for solver in ("exact", "auto"):
        ours = dkern.KernelRidge(dkern.kernels.Gaussian(3.0), alpha=0.3, solver=solver).fit(
            X[:300], Y[:300], sample_weight=w[:300])
        np.testing.assert_allclose(ours.dual_coef_, theirs.dual_coef_, rtol=0, atol=1e-10)
        np.testing.assert_allclose(ours.predict(X[300:]), theirs.predict(X[300:]), rtol=0,
                                   atol=1e-10)
    one = dkern.KernelRidge(dkern.kernels.Gaussian(3.0), alpha=0.3).fit(X[:300], y[:300],
                                                                         sample_weight=w[:300])
    np.testing.assert_allclose(one.predict(X[300:]), theirs.predict(X[300:])[:, 0], atol=1e-10)
    for solver in ("cg", "nystrom", "gd"):
        with pytest.raises(ValueError, match=f"sample_weight is supported by solver='exact' .*"
                                             f"got solver='{solver}'"):
            dkern.KernelRidge(solver=solver).fit(X, y, sample_weight=w)
    with pytest.raises(ValueError, match="got solver='auto', n_centers=20"):
        dkern.KernelRidge(n_centers=20).fit(X, y, sample_weight=w)
    with pytest.raises(ValueError, match="sample_weight must be finite and >= 0 .* got a weight"):
        dkern.KernelRidge().fit(X, y, sample_weight=-w)
    scalar = dkern.KernelRidge(dkern.kernels.Gaussian(3.0), alpha=0.3).fit(X[:300], y[:300],
                                                                          sample_weight=2.0)
    np.testing.assert_allclose(scalar.dual_coef_, SklearnKernelRidge(
        alpha=0.3, kernel="rbf", gamma=1 / 18).fit(X[:300], y[:300], sample_weight=2.0)
        .dual_coef_, atol=1e-10)
    with pytest.raises(dkern.errors.NotPositiveDefiniteError, match="singular .* alpha=0"):
        dkern.KernelRidge(alpha=0.0, solver="exact").fit(X, y, sample_weight=w)


@pytest.mark.parametrize("load", [load_iris, load_wine])
def test_multinomial_klr_equals_sklearns_logistic_regression(load, tmp_path):
    """multi_class="multinomial" with the linear kernel is scikit-learn's (multinomial)
    LogisticRegression(fit_intercept=False) at the same C: probabilities to 1e-6 (its
    L-BFGS stops near there), the same predictions; a saved model gives the same."""
    X, y = load(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    ours = dkern.KernelLogisticRegression(dkern.kernels.Linear(), C=0.5,
                                          multi_class="multinomial", tol=1e-8).fit(X, y)
    theirs = LogisticRegression(fit_intercept=False, C=0.5, tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), atol=1e-6)
    np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))
    assert ours.converged_ and ours.residuals_.shape == (ours.n_iter_ + 1, 3)
    dkern.save(ours, tmp_path / "m.zarr")
    np.testing.assert_array_equal(dkern.load(tmp_path / "m.zarr").predict_proba(X),
                                  ours.predict_proba(X))


def test_multinomial_klr_with_a_gaussian_kernel_minimises_the_softmax_objective():
    """With a Gaussian kernel the fitted β minimises the dense objective
    Σ(logsumexp(F) − Tᵀ F) + c/2 tr(βᵀKβ): its gradient K(π − T + cβ) is ~0 and a dense
    L-BFGS-B from the fit cannot lower the objective (1e-8 relative); lazy rows give the
    same fit; two classes are the binary problem; gd and unknown values are refused."""
    from scipy.optimize import minimize
    from scipy.special import logsumexp, softmax

    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    kernel = dkern.kernels.Gaussian(1.5)
    model = dkern.KernelLogisticRegression(kernel, alpha=0.01, multi_class="multinomial",
                                           tol=1e-10).fit(X, y)
    K, T, c = kernel(X, X), np.eye(3)[y], len(X) * 0.01

    def objective(flat):
        beta = flat.reshape(-1, 3)
        F = K @ beta
        value = (logsumexp(F, axis=1) - (T * F).sum(1)).sum() + c / 2 * (beta * F).sum()
        return value, (K @ (softmax(F, axis=1) - T + c * beta)).ravel()

    value, gradient = objective(model.dual_coef_.ravel())
    assert np.abs(gradient).max() < 1e-7 * len(X)
    best = minimize(objective, model.dual_coef_.ravel(), jac=True, method="L-BFGS-B",
                    options={"ftol": 1e-15, "gtol": 1e-12})
    assert best.fun >= value - 1e-8 * abs(value)
    lazy = dkern.KernelLogisticRegression(kernel, alpha=0.01, multi_class="multinomial",
                                          tol=1e-10).fit(da.from_array(X, chunks=40), y)
    np.testing.assert_allclose(np.asarray(lazy.dual_coef_), model.dual_coef_, atol=1e-8)
    two = (y > 0).astype(int)
    np.testing.assert_allclose(
        dkern.KernelLogisticRegression(kernel, multi_class="multinomial").fit(X, two)
        .predict_proba(X), dkern.KernelLogisticRegression(kernel).fit(X, two).predict_proba(X))
    with pytest.raises(ValueError, match="multi_class='multinomial' is solved by "
                                         "solver='newton-cg'; got solver='gd'"):
        dkern.KernelLogisticRegression(multi_class="multinomial", solver="gd").fit(X, y)
    with pytest.raises(ValueError, match=r"multi_class must be one of \['ovr', 'multinomial'\]"):
        dkern.KernelLogisticRegression(multi_class="softmax").fit(X, y)
