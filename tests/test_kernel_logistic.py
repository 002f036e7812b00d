"""KernelLogisticRegression against scikit-learn's LogisticRegression (linear kernel) and a
dense scipy minimisation of the same objective (Gaussian kernel), on real data sets."""

import dask.array as da
import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.utils.estimator_checks import parametrize_with_checks

import dkern
from dkern import KernelLogisticRegression
from dkern.errors import ConvergenceWarning
from dkern.kernels import Gaussian, Linear

pytestmark = pytest.mark.usefixtures("sync_scheduler")


def _standardised(loader):
    """A bundled scikit-learn data set, features standardised, rows in a fixed random order."""
    X, y = loader(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(X))
    return ((X - X.mean(0)) / X.std(0))[order], y[order]


X_BC, Y_BC = _standardised(load_breast_cancer)  # 569 rows, 30 features, 2 classes
X_TRAIN, Y_TRAIN, X_TEST = X_BC[:300], Y_BC[:300], X_BC[300:]
X_IRIS, Y_IRIS = _standardised(load_iris)  # 150 rows, 4 features, 3 classes


def _sklearn_lr(n, alpha):
    """LogisticRegression minimising the same objective, to its solver's precision.

    With K = XXᵀ and w = Xᵀβ: f = Kβ = Xw and βᵀKβ = ‖w‖², so dkern's objective is
    1/n Σ ℓ(ỹ xᵢᵀw) + α/2 ‖w‖² = α (C Σ ℓ + ½‖w‖²) with C = 1 / (n α): scikit-learn's, up
    to the factor α (the minimiser over β spans the minimiser over w: representer theorem).
    """
    return LogisticRegression(fit_intercept=False, C=1 / (n * alpha), solver="newton-cholesky",
                              tol=1e-12, max_iter=1000)


# ------------------------------------------------------------------ oracles on real data
def test_linear_kernel_equals_sklearn_logistic_regression_on_breast_cancer():
    alpha = 1e-2
    model = KernelLogisticRegression(Linear(), alpha=alpha, tol=1e-10).fit(X_TRAIN, Y_TRAIN)
    ref = _sklearn_lr(300, alpha).fit(X_TRAIN, Y_TRAIN)
    P = model.predict_proba(X_TEST)
    assert P.shape == (269, 2) and model.converged_ and model.n_iter_ <= 12  # measured 8
    assert np.abs(P - ref.predict_proba(X_TEST)).max() <= 1e-5  # measured 1e-12
    np.testing.assert_allclose(model.decision_function(X_TEST), ref.decision_function(X_TEST),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(model.predict(X_TEST), ref.predict(X_TEST))
    np.testing.assert_array_equal(model.classes_, ref.classes_)
    np.testing.assert_allclose(X_TRAIN.T @ model.dual_coef_, ref.coef_[0], rtol=1e-6, atol=1e-8)


def test_linear_kernel_one_vs_rest_equals_sklearn_on_iris():
    alpha = 1e-2
    labels = np.array(["setosa", "versicolor", "virginica"])[Y_IRIS]
    X, y, X_new = X_IRIS[:100], labels[:100], X_IRIS[100:]
    model = KernelLogisticRegression(Linear(), alpha=alpha, tol=1e-10).fit(X, y)
    ref = OneVsRestClassifier(_sklearn_lr(100, alpha)).fit(X, y)
    P = model.predict_proba(X_new)
    assert P.shape == (50, 3) and model.dual_coef_.shape == (100, 3)
    assert np.abs(P - ref.predict_proba(X_new)).max() <= 1e-5  # measured 3e-12
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(model.predict(X_new), ref.predict(X_new))
    np.testing.assert_array_equal(model.classes_, ref.classes_)


def _dense_minimum(K, t, alpha):
    """β minimising 1/n Σ log(1 + exp(−ỹ (Kβ)ᵢ)) + α/2 βᵀKβ with dense K, by scipy's
    trust-region Newton with the exact gradient K(g/n + αβ) and Hessian K(W/n)K + αK."""
    n, s = len(t), 2 * t - 1

    def fun(beta):
        f = K @ beta
        return np.logaddexp(0, -s * f).mean() + alpha / 2 * beta @ f

    def jac(beta):
        f = K @ beta
        return K @ ((expit(f) - t) / n + alpha * beta)

    def hess(beta):
        p = expit(K @ beta)
        return K @ ((p * (1 - p) / n)[:, None] * K) + alpha * K

    return minimize(fun, np.zeros(n), jac=jac, hess=hess, method="trust-exact",
                    options={"gtol": 1e-12}).x


@pytest.mark.parametrize("solver", ["newton-cg", "gd"])
def test_gaussian_kernel_equals_a_dense_minimisation(solver):
    """Both solvers reach the minimiser scipy finds with dense K, in probabilities at new
    points (the coefficients themselves are ill-determined where K is near singular)."""
    X, y, X_new, alpha, kernel = X_TRAIN[:120], Y_TRAIN[:120], X_TEST[:60], 0.05, Gaussian(4.0)
    beta = _dense_minimum(kernel(X, X), y.astype(float), alpha)
    want = expit(kernel(X_new, X) @ beta)
    model = KernelLogisticRegression(kernel, alpha=alpha, solver=solver, tol=1e-9,
                                     random_state=0).fit(X, y)
    assert model.converged_ and model.solver_ == solver
    assert np.abs(model.predict_proba(X_new)[:, 1] - want).max() <= 1e-6  # measured 6e-9
    assert model.n_iter_ <= (10 if solver == "newton-cg" else 100)  # measured 4 and 50


def test_lazy_inputs_give_the_in_memory_fit_and_lazy_predictions(tmp_path):
    """X and y from dask (3 row chunks), Zarr arrays and (url, path): the same β and
    probabilities as numpy input; predictions of lazy X stay lazy."""
    X, y, X_new = X_IRIS[:90], Y_IRIS[:90], X_IRIS[90:]
    params = {"kernel": Gaussian(2.0), "alpha": 0.05, "tol": 1e-10}
    ref = KernelLogisticRegression(**params).fit(X, y)
    url = str(tmp_path / "iris.zarr")
    dkern.io.write_arrays(url, {"X": X, "y": y, "X_new": X_new}, chunk_rows=30)
    inputs = [(da.from_array(X, chunks=(30, -1)), da.from_array(y, chunks=30)),
              (dkern.io.open_array(url, "X"), dkern.io.open_array(url, "y")),
              ((url, "X"), (url, "y"))]
    for Xl, yl in inputs:
        model = KernelLogisticRegression(**params).fit(Xl, yl)
        assert isinstance(model.dual_coef_, da.Array)
        np.testing.assert_allclose(model.dual_coef_.compute(), ref.dual_coef_, atol=1e-9)
        P = model.predict_proba((url, "X_new"))
        assert isinstance(P, da.Array)
        np.testing.assert_allclose(P.compute(), ref.predict_proba(X_new), atol=1e-10)
        np.testing.assert_array_equal(model.predict((url, "X_new")).compute(),
                                      ref.predict(X_new))


@pytest.mark.parametrize("labels, lazy", [(np.array(["benign", "malignant"]), False),
                                          (np.array([0, 1, 2]), True)])
def test_save_and_load_round_trip(tmp_path, labels, lazy):
    X, codes = (X_TRAIN[:80], Y_TRAIN[:80]) if len(labels) == 2 else (X_IRIS[:90], Y_IRIS[:90])
    X_new = X_TEST[:20] if len(labels) == 2 else X_IRIS[90:]
    Xf = da.from_array(X, chunks=(45, -1)) if lazy else X
    model = KernelLogisticRegression(Gaussian(3.0), alpha=0.1).fit(Xf, labels[codes])
    dkern.save(model, tmp_path / "klr.zarr")
    back = dkern.load(tmp_path / "klr.zarr")
    assert isinstance(back, KernelLogisticRegression) and back.get_params() == model.get_params()
    assert isinstance(back.dual_coef_, da.Array) == lazy
    np.testing.assert_array_equal(back.classes_, model.classes_)
    assert back.classes_.dtype == model.classes_.dtype
    assert (back.n_iter_, back.converged_, back.solver_) == (model.n_iter_, model.converged_,
                                                             model.solver_)
    np.testing.assert_array_equal(back.residuals_, model.residuals_)
    P, got = model.predict_proba(X_new), back.predict_proba(X_new)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(P))


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("params, error, message", [
    ({"alpha": 0.0}, ValueError, r"alpha must be a finite number > 0 for solver='newton-cg' "
                                 r"\(the weight of the penalty"),
    ({"alpha": -1.0, "solver": "gd"}, ValueError, "alpha must be a finite number > 0 for "
                                                  "solver='gd'"),
    ({"alpha": float("nan")}, ValueError, "alpha must be a finite number > 0"),
    ({"solver": "lbfgs"}, ValueError, r"solver must be one of \['newton-cg', 'gd'\]; got "
                                      "'lbfgs'"),
    ({"tol": 0}, ValueError, "tol must be a finite number > 0"),
    ({"max_iter": 0}, ValueError, "max_iter must be None or an integer >= 1; got 0"),
    ({"kernel": "rbf"}, TypeError, "kernel must be a dkern kernel"),
])
def test_bad_parameters_are_refused_naming_them(params, error, message):
    with pytest.raises(error, match=message):
        KernelLogisticRegression(**params).fit(X_IRIS[:20], Y_IRIS[:20])


def test_bad_labels_and_shapes_are_refused():
    X = X_IRIS[:20]
    with pytest.raises(ValueError, match="at least 2 classes in y; got 1 class"):
        KernelLogisticRegression().fit(X, np.zeros(20))
    with pytest.raises(ValueError, match="requires y to be passed"):
        KernelLogisticRegression().fit(X, None)
    with pytest.raises(ValueError, match="y has 19 rows but X has 20"):
        KernelLogisticRegression().fit(X, Y_IRIS[:19])
    with pytest.raises(ValueError, match="Unknown label type"):
        KernelLogisticRegression().fit(X, np.linspace(0, 1, 20))
    model = KernelLogisticRegression().fit(X, Y_IRIS[:20] > 0)
    with pytest.raises(ValueError, match="X has 3 features, but KernelLogisticRegression is "
                                         "expecting 4"):
        model.predict(X[:, :3])
    with pytest.raises(NotFittedError):
        KernelLogisticRegression().predict_proba(X)


def test_newton_warns_when_stopped_at_max_iter():
    with pytest.warns(ConvergenceWarning, match="Newton stopped at max_iter=1"):
        model = KernelLogisticRegression(Linear(), alpha=1e-3, max_iter=1).fit(X_TRAIN, Y_TRAIN)
    assert not model.converged_ and model.residuals_.shape == (2, 1)


# The checks test the estimator API, not the optimum (the oracle tests above do): tol 1e-2
# stops each of their many small fits a Newton step or two earlier (the checks took 85 s at
# tol 1e-4, 48 s at 1e-2), and the fits still classify the checks' blobs as they require.
@parametrize_with_checks([KernelLogisticRegression(tol=1e-2)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)
