"""GaussianProcessClassifier against scikit-learn's on real data, its solvers, inputs and checks."""

import dask
import dask.array as da
import numpy as np
import pytest
from scipy import integrate
from scipy.special import expit
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.gaussian_process import GaussianProcessClassifier as SklearnGPC
from sklearn.gaussian_process.kernels import RBF, ConstantKernel
from sklearn.utils.estimator_checks import parametrize_with_checks

import dkern
from dkern import GaussianProcessClassifier
from dkern.errors import ConvergenceWarning
from dkern.kernels import Gaussian
from dkern.models import _gpc_predict, _laplace, _laplace_evidence, gp_classifier


def _standardised(loader):
    """A bundled scikit-learn data set, features standardised, rows in a fixed random order."""
    X, y = loader(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(X))
    X = (X - X.mean(0)) / X.std(0)
    return X[order], y[order]


X_BC, Y_BC = _standardised(load_breast_cancer)  # 569 rows, 30 features, 2 classes
X_TRAIN, Y_TRAIN, X_TEST = X_BC[:300], Y_BC[:300], X_BC[300:]
X_WINE, Y_WINE = _standardised(load_wine)  # 178 rows, 13 features, 3 classes

# dkern kernel, the same kernel in scikit-learn (fixed: optimizer=None uses it as given)
KERNELS = {
    "gaussian": (Gaussian(5.0), RBF(5.0, "fixed")),
    "scaled": (3.0 * Gaussian(4.0), ConstantKernel(3.0, "fixed") * RBF(4.0, "fixed")),
}


@pytest.fixture(scope="module", params=sorted(KERNELS))
def binary_pair(request):
    """dkern's and scikit-learn's classifiers fitted on the same breast cancer rows."""
    ours, theirs = KERNELS[request.param]
    return (GaussianProcessClassifier(ours, optimizer=None).fit(X_TRAIN, Y_TRAIN),
            SklearnGPC(theirs, optimizer=None).fit(X_TRAIN, Y_TRAIN))


# ------------------------------------------------------------------ oracles on real data
def test_binary_matches_sklearn_on_breast_cancer(binary_pair):
    model, ref = binary_pair
    P = model.predict_proba(X_TEST)
    assert P.shape == (269, 2) and model.solver_ == "exact"
    assert np.abs(P - ref.predict_proba(X_TEST)).max() <= 1e-4  # measured 1e-8
    lml = model.log_marginal_likelihood()
    assert lml == pytest.approx(ref.log_marginal_likelihood_value_, rel=1e-6)  # measured 1e-16
    assert model.log_marginal_likelihood_value_ == lml
    np.testing.assert_array_equal(model.predict(X_TEST), ref.predict(X_TEST))
    np.testing.assert_array_equal(model.classes_, ref.classes_)
    assert model.pi_.shape == (300,) and model.n_iter_.shape == (1,)


def test_probit_option_is_the_probit_formula_on_sklearns_latents(binary_pair):
    """probabilities="probit" is σ(μ/√(1 + πv/8)) on the latent mean and variance (scikit-learn's
    latent_mean_and_variance as the reference), and differs from the erf-sum by < 1e-2."""
    model, ref = binary_pair
    mean, var = ref.latent_mean_and_variance(X_TEST)
    probit = GaussianProcessClassifier(model.kernel, optimizer=None,
                                       probabilities="probit").fit(X_TRAIN, Y_TRAIN)
    got = probit.predict_proba(X_TEST)[:, 1]
    np.testing.assert_allclose(got, expit(mean / np.sqrt(1 + np.pi * var / 8)), atol=1e-6)
    assert np.abs(got - model.predict_proba(X_TEST)[:, 1]).max() < 1e-2  # measured 7e-3


@pytest.mark.parametrize("mean, var", [(0.0, 1.0), (1.5, 0.3), (-2.0, 4.0), (4.0, 10.0)])
def test_erf_sum_approximates_the_logistic_gaussian_integral(mean, var):
    """The default probabilities are E[σ(f)], f ~ N(mean, var), to the erf-sum's accuracy:
    checked by quadrature, not against scikit-learn."""
    want = integrate.quad(lambda f: expit(f) * np.exp(-(f - mean) ** 2 / (2 * var))
                          / np.sqrt(2 * np.pi * var), -np.inf, np.inf)[0]
    assert _laplace.proba_erf(np.array([mean]), np.array([var]))[0] == pytest.approx(want,
                                                                                     abs=2e-3)


def test_one_vs_rest_matches_sklearn_on_wine():
    X, y, X_new = X_WINE[:120], Y_WINE[:120], X_WINE[120:]
    model = GaussianProcessClassifier(2.0 * Gaussian(3.0), optimizer=None).fit(X, y)
    ref = SklearnGPC(ConstantKernel(2.0, "fixed") * RBF(3.0, "fixed"), optimizer=None).fit(X, y)
    P = model.predict_proba(X_new)
    assert P.shape == (58, 3) and model.pi_.shape == (120, 3) and model.n_iter_.shape == (3,)
    assert np.abs(P - ref.predict_proba(X_new)).max() <= 1e-4  # measured 1e-10
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    assert model.log_marginal_likelihood() == pytest.approx(ref.log_marginal_likelihood_value_,
                                                            rel=1e-6)
    np.testing.assert_array_equal(model.predict(X_new), ref.predict(X_new))


@pytest.mark.usefixtures("sync_scheduler")
def test_cg_gives_the_exact_probabilities_and_lml(monkeypatch):
    """solver="cg" runs the Newton and variance solves by CG on the lazy B: the same
    probabilities as the dense path to 1e-6, and within EXACT_MAX_N the same LML (B factored
    densely once at CG's mode for log det B). Above the limit (lowered here to 100 rows)
    "auto" chooses CG, and the LML is NaN."""
    X, y = X_TRAIN[:120], Y_TRAIN[:120]
    exact = GaussianProcessClassifier(3.0 * Gaussian(4.0), optimizer=None,
                                      solver="exact").fit(X, y)
    lazy = GaussianProcessClassifier(3.0 * Gaussian(4.0), optimizer=None, solver="cg",
                                     tol=1e-8).fit(da.from_array(X, 60), y)
    assert isinstance(lazy.pi_, da.Array)
    got = lazy.predict_proba(X_TEST[:60])
    assert np.abs(got - exact.predict_proba(X_TEST[:60])).max() <= 1e-6  # measured 6e-9
    np.testing.assert_allclose(lazy.pi_.compute(), exact.pi_, atol=1e-6)  # measured 1e-8
    assert lazy.log_marginal_likelihood() == pytest.approx(
        exact.log_marginal_likelihood_value_, rel=1e-6)  # measured 6e-12
    monkeypatch.setattr(gp_classifier, "EXACT_MAX_N", 100)
    with pytest.warns(ConvergenceWarning, match="Newton stopped"):  # one step: enough here
        above = GaussianProcessClassifier(3.0 * Gaussian(4.0), optimizer=None,
                                          max_iter_predict=1).fit(X, y)
    assert above.solver_ == "cg" and np.isnan(above.log_marginal_likelihood())


def test_cg_gives_the_exact_probabilities_at_a_learned_large_amplitude():
    """The kernel scikit-learn learns on these rows has amplitude 858: CG to the default
    tol = 1e-8 left probabilities 3e-3 from the exact ones (the B solves' error reaches the
    latent mean times the amplitude), so the solves run to tol / max k(x, x): the same
    probabilities as the dense path (and scikit-learn's) to 1e-6."""
    X, y = X_BC[:200], Y_BC[:200]
    kernel = 857.92 * Gaussian(16.89)
    exact = GaussianProcessClassifier(kernel, optimizer=None, solver="exact").fit(X, y)
    lazy = GaussianProcessClassifier(kernel, optimizer=None, solver="cg",
                                     backend="numpy").fit(X, y)
    assert np.abs(lazy.predict_proba(X) - exact.predict_proba(X)).max() <= 1e-6


def test_cg_refuses_variances_its_solves_cannot_resolve():
    """At amplitude 1e7, CG's attainable residual (about 1e-4) is far above tol / max
    k(x, x): on 200 rows the latent variances k** − k*ᵀ S B⁻¹ S k* came out negative and
    the probabilities NaN or 0, where the exact solver gives scikit-learn's (0.44 to 0.48).
    Now the variances' error bound (‖z‖ ‖r‖) is checked and a clear error names the fix
    (here, on 100 rows); the exact path keeps scikit-learn's answer (to 1e-6)."""
    X, y = X_BC[:100], Y_BC[:100]
    kernel = 1e7 * Gaussian(16.89)
    lazy = GaussianProcessClassifier(kernel, optimizer=None, solver="cg", backend="numpy")
    with pytest.warns(ConvergenceWarning):
        lazy.fit(X, y)
    with pytest.warns(ConvergenceWarning), \
            pytest.raises(dkern.errors.DkernError,
                          match=r"latent variances are uncertain.*solver=.exact."):
        lazy.predict_proba(X[:5])
    exact = GaussianProcessClassifier(kernel, optimizer=None, solver="exact").fit(X, y)
    want = SklearnGPC(ConstantKernel(1e7, "fixed") * RBF(16.89, "fixed"),
                      optimizer=None).fit(X, y).predict_proba(X[:5])
    assert np.abs(exact.predict_proba(X[:5]) - want).max() <= 1e-6


def test_cg_model_on_numpy_rows_outlives_the_cluster_that_fitted_it():
    """pi_ of numpy rows comes to the client (it was persisted on the fitting cluster, so
    predicting under the next Client failed with "lost dependencies")."""
    from distributed import Client, LocalCluster

    model = GaussianProcessClassifier(3.0 * Gaussian(4.0), optimizer=None, solver="cg",
                                      tol=1e-5)
    probabilities = []
    for _ in range(2):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address=":0") as cluster, Client(cluster) as client, \
                dask.config.set(scheduler=client):
            if not probabilities:
                model.fit(X_TRAIN[:80], Y_TRAIN[:80])
            probabilities.append(model.predict_proba(X_TEST[:20]))
    assert isinstance(model.pi_, np.ndarray)
    np.testing.assert_allclose(probabilities[1], probabilities[0], atol=1e-10)


# ------------------------------------------------------ the Laplace LML and learning
@pytest.mark.parametrize("constant, lengthscale", [(3.0, 4.0), (0.5, 1.5), (20.0, 10.0),
                                                   (1.0, 30.0)])
def test_lml_and_gradient_at_theta_match_sklearn(constant, lengthscale):
    """R&W Alg. 5.1 (explicit term and the implicit one through the mode) against
    scikit-learn's _BinaryGPCLaplace on the breast cancer rows, at theta away from the
    fitted one."""
    model = GaussianProcessClassifier(3.0 * Gaussian(4.0), optimizer=None).fit(X_TRAIN, Y_TRAIN)
    ref = SklearnGPC(ConstantKernel(3.0) * RBF(4.0), optimizer=None).fit(X_TRAIN, Y_TRAIN)
    theta = np.log([constant, lengthscale])
    value, grad = model.log_marginal_likelihood(theta, eval_gradient=True)
    want_value, want_grad = ref.log_marginal_likelihood(theta, eval_gradient=True)
    assert value == pytest.approx(want_value, rel=1e-6)  # measured 4e-14
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)  # measured 4e-14
    assert model.log_marginal_likelihood(theta) == value


@pytest.fixture(scope="module")
def learned_pair():
    """Both classifiers learning (L-BFGS-B) from the same start on the breast cancer rows."""
    return (GaussianProcessClassifier(3.0 * Gaussian(4.0)).fit(X_TRAIN, Y_TRAIN),
            SklearnGPC(ConstantKernel(3.0) * RBF(4.0)).fit(X_TRAIN, Y_TRAIN))


def test_learned_hyperparameters_match_sklearn(learned_pair):
    model, ref = learned_pair
    assert model.kernel_.theta != pytest.approx(np.log([3.0, 4.0]), abs=0.1)  # it moved
    assert model.log_marginal_likelihood_value_ >= ref.log_marginal_likelihood_value_ - 1e-3
    np.testing.assert_allclose(model.kernel_.theta, ref.kernel_.theta, atol=1e-3)  # meas. 2e-11
    # the same optimum, so the same probabilities up to how closely L-BFGS-B reaches it
    assert np.abs(model.predict_proba(X_TEST) - ref.predict_proba(X_TEST)).max() <= 1e-4  # 1e-8
    # the value reported is the evidence of the fitted kernel, and that is a maximum
    value, grad = model.log_marginal_likelihood(model.kernel_.theta, eval_gradient=True)
    assert value == pytest.approx(model.log_marginal_likelihood_value_, rel=1e-12)
    assert np.abs(grad).max() < 1e-3


def test_default_kernel_has_nothing_to_learn():
    """As scikit-learn's default, 1.0 * RBF(1.0) with both parameters fixed."""
    model = GaussianProcessClassifier().fit(X_SMALL, Y_SMALL)
    assert len(model.kernel_.theta) == 0 and model.kernel_ == model._check_params()
    ref = SklearnGPC(optimizer=None).fit(X_SMALL, Y_SMALL)
    assert np.abs(model.predict_proba(X_TEST) - ref.predict_proba(X_TEST)).max() <= 1e-4


def test_callable_optimizer_gets_scikit_learns_objective():
    """obj_func(theta) is (-LML, -gradient), as scikit-learn's; the optimizer's theta is used."""
    seen = []

    def optimizer(obj_func, initial_theta, bounds):
        seen.append((obj_func(initial_theta), initial_theta, bounds))
        return np.log([2.0, 6.0]), obj_func(np.log([2.0, 6.0]), eval_gradient=False)

    model = GaussianProcessClassifier(3.0 * Gaussian(4.0), optimizer=optimizer).fit(X_TRAIN,
                                                                                    Y_TRAIN)
    (value, grad), start, bounds = seen[0]
    want = model.log_marginal_likelihood(start, eval_gradient=True)
    assert value == pytest.approx(-want[0], rel=1e-12)
    np.testing.assert_allclose(grad, -want[1], rtol=1e-12)
    np.testing.assert_allclose(bounds, np.log([[1e-5, 1e5]] * 2))
    assert model.kernel_ == 2.0 * Gaussian(6.0)


def test_one_vs_rest_learns_a_kernel_per_class_as_sklearn():
    """scikit-learn's one-vs-rest learns each binary problem's kernel on its own (its
    CompoundKernel); its LML at theta is the mean over the classes, theta shared by every
    class or given per class."""
    X, y = X_WINE[:120], Y_WINE[:120]
    model = GaussianProcessClassifier(2.0 * Gaussian(3.0)).fit(X, y)
    ref = SklearnGPC(ConstantKernel(2.0) * RBF(3.0)).fit(X, y)
    assert len(model.kernel_) == 3
    np.testing.assert_allclose(np.concatenate([k.theta for k in model.kernel_]),
                               ref.kernel_.theta, atol=1e-3)  # measured 2e-9
    assert model.log_marginal_likelihood_value_ >= ref.log_marginal_likelihood_value_ - 1e-3
    assert np.abs(model.predict_proba(X_WINE[120:]) - ref.predict_proba(X_WINE[120:])).max() \
        <= 1e-4  # measured 1e-9
    for theta in [np.log([1.5, 2.0]), np.log([1.5, 2.0, 4.0, 5.0, 0.7, 3.0])]:
        assert model.log_marginal_likelihood(theta) == pytest.approx(
            ref.log_marginal_likelihood(theta), rel=1e-6)


def test_one_vs_rest_gradient_is_the_mean_of_the_binary_gradients():
    """scikit-learn has no multi-class gradient: the reference is its binary classifiers on
    each class against the rest, averaged (theta shared) or each scaled by 1/3 (per class)."""
    X, y = X_WINE[:120], Y_WINE[:120]
    model = GaussianProcessClassifier(2.0 * Gaussian(3.0), optimizer=None).fit(X, y)
    binaries = [SklearnGPC(ConstantKernel(2.0) * RBF(3.0), optimizer=None).fit(X, y == k)
                for k in range(3)]
    theta = np.log([1.5, 2.0])
    value, grad = model.log_marginal_likelihood(theta, eval_gradient=True)
    refs = [b.log_marginal_likelihood(theta, eval_gradient=True) for b in binaries]
    assert value == pytest.approx(np.mean([r[0] for r in refs]), rel=1e-6)
    np.testing.assert_allclose(grad, np.mean([r[1] for r in refs], axis=0), rtol=1e-6)
    _, grad = model.log_marginal_likelihood(np.tile(theta, 3), eval_gradient=True)
    np.testing.assert_allclose(grad, np.concatenate([r[1] for r in refs]) / 3, rtol=1e-6)


# --------------------------------------------------------------------------- inputs
@pytest.mark.usefixtures("sync_scheduler")
def test_dask_and_zarr_inputs_match_numpy(tmp_path):
    X, y = X_TRAIN[:120], Y_TRAIN[:120]
    want = GaussianProcessClassifier(Gaussian(5.0), optimizer=None).fit(X, y).predict_proba(
        X_TEST)
    url = str(tmp_path / "data.zarr")
    dkern.io.write_arrays(url, {"X": X, "y": y.astype(np.float64), "Xt": X_TEST}, chunk_rows=50)
    for Xin, yin, Xt in [(da.from_array(X, 40), da.from_array(y, 40), da.from_array(X_TEST, 100)),
                         ((url, "X"), (url, "y"), (url, "Xt"))]:
        model = GaussianProcessClassifier(Gaussian(5.0), optimizer=None).fit(Xin, yin)
        np.testing.assert_allclose(model.predict_proba(Xt), want, rtol=1e-12, atol=1e-14)
        assert model.n_features_in_ == 30


def test_batches_and_rebuilt_factors_give_the_same_probabilities(monkeypatch):
    """Test rows are processed in batches, and a model without its Cholesky factors (as a model
    file stores only pi_, not n x n factors) rebuilds them from pi_: neither changes a value."""
    model = GaussianProcessClassifier(Gaussian(5.0), optimizer=None).fit(X_TRAIN[:100],
                                                                         Y_TRAIN[:100])
    want = model.predict_proba(X_TEST)
    monkeypatch.setattr(_gpc_predict, "PREDICT_BATCH", 7)
    del model._chols
    # rounding only: BLAS sums by other block sizes, amplified by the erf-sum's weights (~2e3)
    np.testing.assert_allclose(model.predict_proba(X_TEST), want, rtol=0, atol=1e-10)


def test_string_labels():
    labels = np.array(["benign", "malignant"])[Y_TRAIN[:100]]
    model = GaussianProcessClassifier(Gaussian(5.0), optimizer=None).fit(X_TRAIN[:100], labels)
    assert model.classes_.tolist() == ["benign", "malignant"]
    assert set(model.predict(X_TEST)) <= {"benign", "malignant"}


# --------------------------------------------------------------------------- bad input
X_SMALL, Y_SMALL = X_TRAIN[:40], Y_TRAIN[:40]


def test_more_than_two_classes_refused_by_the_binary_option():
    with pytest.raises(ValueError, match=r"multi_class='binary' allows two classes in y; got 3"):
        GaussianProcessClassifier(multi_class="binary").fit(X_WINE[:40], Y_WINE[:40])


def test_single_class_refused():
    with pytest.raises(ValueError, match=r"requires 2 or more distinct classes in y; got 1 class"):
        GaussianProcessClassifier().fit(X_SMALL, np.zeros(40))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_labels_refused(bad):
    y = Y_SMALL.astype(float)
    y[3] = bad
    with pytest.raises(ValueError, match="Input y contains"):
        GaussianProcessClassifier().fit(X_SMALL, y)


def test_nan_in_x_refused():
    X = X_SMALL.copy()
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        GaussianProcessClassifier().fit(X, Y_SMALL)


def test_continuous_y_refused():
    with pytest.raises(ValueError, match="Unknown label type"):
        GaussianProcessClassifier().fit(X_SMALL, np.linspace(0, 1, 40))


def test_shapes_refused():
    with pytest.raises(ValueError, match="y has 39 rows but X has 40"):
        GaussianProcessClassifier().fit(X_SMALL, Y_SMALL[:39])
    with pytest.raises(ValueError, match=r"takes one column of class labels, shape "
                       r"\(n_samples,\); got y of shape \(40, 2\)"):
        GaussianProcessClassifier().fit(X_SMALL, np.column_stack([Y_SMALL, Y_SMALL]))
    model = GaussianProcessClassifier().fit(X_SMALL, Y_SMALL)
    with pytest.raises(ValueError, match="X has 5 features, but GaussianProcessClassifier is "
                                         "expecting 30 features"):
        model.predict_proba(X_SMALL[:, :5])


@pytest.mark.parametrize("param, value, message", [
    ("optimizer", "bogus", r"optimizer must be 'lbfgs' \(or scikit-learn's name "
                           r"'fmin_l_bfgs_b'\), a callable optimizer\(obj_func, "
                           r"initial_theta, bounds\) -> \(theta, value\), or None; got 'bogus'"),
    ("n_restarts_optimizer", -1, "n_restarts_optimizer must be an integer >= 0; got -1"),
    ("n_restarts_optimizer", 1.5, "n_restarts_optimizer must be an integer >= 0; got 1.5"),
    ("solver", "lanczos", r"solver must be one of \['auto', 'exact', 'cg'\]"),
    ("probabilities", "logit", r"probabilities must be one of \['sklearn', 'probit'\]"),
    ("multi_class", "one_vs_one", r"multi_class must be one of \['one_vs_rest', 'binary'\]"),
    ("max_iter_predict", 0, r"max_iter_predict must be an integer >= 1 \(Newton steps\)"),
    ("max_iter_predict", None, "max_iter_predict must be an integer >= 1"),
    ("tol", -1.0, "tol must be a finite number > 0"),
])
def test_bad_parameters_named(param, value, message):
    with pytest.raises(ValueError, match=message):
        GaussianProcessClassifier(**{param: value}).fit(X_SMALL, Y_SMALL)


def test_kernel_must_be_a_kernel_object():
    with pytest.raises(TypeError, match="kernel must be a dkern kernel .* got str"):
        GaussianProcessClassifier("rbf").fit(X_SMALL, Y_SMALL)
    # a scikit-learn kernel object is converted (tests/test_white_models.py)
    model = GaussianProcessClassifier(RBF(1.0), optimizer=None).fit(X_SMALL, Y_SMALL)
    assert model.kernel_ == Gaussian(1.0)


def test_exact_above_its_limit_refused(monkeypatch):
    monkeypatch.setattr(gp_classifier, "EXACT_MAX_N", 30)
    with pytest.raises(ValueError, match="solver='exact' .* allows n <= 30; got n=40. Use "
                                         "solver='cg'"):
        GaussianProcessClassifier(solver="exact").fit(X_SMALL, Y_SMALL)


def test_lml_theta_of_the_wrong_size_and_gradient_without_theta_refused():
    model = GaussianProcessClassifier(2.0 * Gaussian(3.0), optimizer=None).fit(X_SMALL, Y_SMALL)
    with pytest.raises(ValueError, match=r"theta must hold 2 log-hyperparameters \(one per name "
                                         r"in \['constant', 'kernel__lengthscale'\]\); got shape "
                                         r"\(3,\)"):
        model.log_marginal_likelihood(np.log([2.0, 3.0, 4.0]))
    with pytest.raises(ValueError, match="Gradient can only be evaluated for theta!=None"):
        model.log_marginal_likelihood(eval_gradient=True)
    wine = GaussianProcessClassifier(2.0 * Gaussian(3.0), optimizer=None).fit(X_WINE[:40],
                                                                              Y_WINE[:40])
    with pytest.raises(ValueError, match=r"or 6 \(each class's kernel in turn\); got shape "
                                         r"\(3,\)"):
        wine.log_marginal_likelihood(np.log([2.0, 3.0, 4.0]))


def test_learning_above_the_dense_limit_refused(monkeypatch):
    monkeypatch.setattr(gp_classifier, "EXACT_MAX_N", 30)
    with pytest.raises(ValueError, match=r"learning hyperparameters \(optimizer='lbfgs'\) .* "
                                         "n <= 30; got n=40. Learn them on a subsample"):
        GaussianProcessClassifier(Gaussian(5.0)).fit(X_SMALL, Y_SMALL)
    monkeypatch.setattr(gp_classifier, "EXACT_MAX_N", 100)
    model = GaussianProcessClassifier(Gaussian(5.0), optimizer=None).fit(X_SMALL, Y_SMALL)
    monkeypatch.setattr(gp_classifier, "EXACT_MAX_N", 30)
    with pytest.raises(ValueError, match="at theta needs dense n x n factors, n <= 30; this "
                                         "model has n=40"):
        model.log_marginal_likelihood(np.log([2.0]))


def test_start_outside_the_bounds_refused():
    with pytest.raises(ValueError, match=r"lengthscale = 5 lies outside its bounds \(0.1, 1\)"):
        GaussianProcessClassifier(Gaussian(5.0, lengthscale_bounds=(0.1, 1.0))).fit(X_SMALL,
                                                                                   Y_SMALL)


def test_optimizer_failure_warns_and_keeps_the_best_value_found(monkeypatch):
    """A gradient that contradicts the value (here: its sign flipped) stops L-BFGS-B's line
    search: a warning with the best value, and a finite LML of the kernel kept, never NaN."""
    exact = _laplace_evidence.log_evidence

    def wrong_gradient(*args):
        value, grad = exact(*args)
        return value, -grad

    monkeypatch.setattr(_laplace_evidence, "log_evidence", wrong_gradient)
    with pytest.warns(ConvergenceWarning, match="L-BFGS-B stopped without converging"):
        model = GaussianProcessClassifier(3.0 * Gaussian(4.0)).fit(X_SMALL, Y_SMALL)
    assert np.isfinite(model.log_marginal_likelihood_value_)
    assert model.log_marginal_likelihood_value_ == pytest.approx(
        exact(model.kernel_, X_SMALL, Y_SMALL.astype(float), 100, False)[0], rel=1e-12)


def test_newton_cap_warns():
    with pytest.warns(ConvergenceWarning, match="Newton stopped at max_iter_predict=1") as got:
        GaussianProcessClassifier(Gaussian(5.0), optimizer=None,
                                  max_iter_predict=1).fit(X_SMALL, Y_SMALL)
    # one step: no earlier objective to compare with (it used to say "rising by inf")
    assert all("inf" not in str(w.message) for w in got)


# --------------------------------------------------------------------------- scikit-learn API
# Every check passes: no expected failures to list (measured with scikit-learn 1.9.1). The
# checks exercise validation and the estimator contract, which do not depend on the solver;
# the CG path is checked against the dense one numerically above (its checks took 10 minutes).
@parametrize_with_checks([GaussianProcessClassifier()])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.parametrize("solver", ["exact", "cg"])
def test_the_training_rows_are_the_model_s_own(solver):
    """Changing the caller's X after fit changes no probability (scikit-learn copies the
    rows); on the old code the model kept the caller's array."""
    X, y = load_breast_cancer(return_X_y=True)
    X = (X[:150] - X[:150].mean(axis=0)) / X[:150].std(axis=0)
    Q = X[:5].copy()
    gpc = GaussianProcessClassifier(solver=solver, optimizer=None).fit(X, y[:150])
    before = gpc.predict_proba(Q)
    X[:] = 0.0
    np.testing.assert_allclose(gpc.predict_proba(Q), before, rtol=1e-9)
