"""Exact-GP learning at any n: the log marginal likelihood and its gradient estimated by one
preconditioned CG solve (SLQ + Hutchinson), against the dense ones on real data (diabetes)."""

import dask.array as da
import numpy as np
import pytest
import scipy.linalg as sla
from sklearn.datasets import load_diabetes

import dkern
import dkern.models._gp_exact_learning as exact_learning
import dkern.models._gp_sparse_learning as sparse_learning
from dkern import gram
from dkern.kernels import Gaussian, White
from dkern.models.posteriors.evidence import estimated_log_marginal_likelihood
from dkern.models.posteriors.exact import log_marginal_likelihood
from dkern.operators.gradients import gram_gradient_products
from dkern.solvers import NystromPreconditioner, cg
from dkern.solvers.slq import quadrature_log_forms


def _diabetes(n):
    X, y = load_diabetes(return_X_y=True)
    return 10 * X[:n, :4], (y[:n] - y[:n].mean()) / y[:n].std()


def test_cg_recurrence_gives_the_lanczos_quadrature_of_the_preconditioned_log():
    """Run to convergence, the tridiagonal read off CG's steps gives ``gᵀ log(Ĉ) g`` exactly
    (to rounding), Ĉ the scaled preconditioned operator, g the probe's whitened start."""
    X, _ = _diabetes(120)
    kernel, alpha = Gaussian(1.5), 0.05
    P = NystromPreconditioner(kernel, X, alpha, 20, pivots="rpcholesky", random_state=0)
    G = np.random.default_rng(1).standard_normal((len(X), 3))
    Z = (np.sqrt(P.scale) * P.sqrt_apply(da.from_array(G, chunks=(60, 3)))).compute()
    result = cg(gram(kernel, X) + alpha, Z, preconditioner=P, tol=1e-12)
    forms = quadrature_log_forms(result.coefficients, P.scale)

    Q = P.factor.compute()
    S = P.scale * np.linalg.inv(np.eye(len(X)) + Q @ P.core @ Q.T)  # the preconditioner, C ≈ S
    root = np.real(sla.sqrtm(S))
    C_hat = np.linalg.solve(root, np.linalg.solve(root, kernel(X) + alpha * np.eye(len(X))).T)
    w, V = np.linalg.eigh((C_hat + C_hat.T) / 2)
    dense = np.einsum("ij,ij->j", G, (V * np.log(w)) @ V.T @ G)
    np.testing.assert_allclose(forms, dense, rtol=1e-8, atol=1e-8)
    assert P.logdet() == pytest.approx(np.linalg.slogdet(S / P.scale)[1], rel=1e-10)


def test_estimate_agrees_with_the_dense_likelihood_within_its_standard_errors():
    X, y = _diabetes(200)
    kernel = 1.2 * Gaussian([1.0, 2.0, 1.5, 3.0]) + White(0.5)
    value, gradient = log_marginal_likelihood(kernel, X, y[:, None], 1e-6, True)
    est = estimated_log_marginal_likelihood(kernel, X, y, 1e-6, eval_gradient=True,
                                            n_probes=24, rank=40, tol=1e-8, random_state=3)
    assert 0 < est.value_stderr < 1.0
    assert abs(est.value - value) < 4 * est.value_stderr
    assert np.all(np.abs(est.gradient - gradient) < 4 * est.gradient_stderr + 1e-6)
    # the White term's gradient is the noise's: present and estimated, not dropped
    assert abs(gradient[-1]) > 1 and np.sign(est.gradient[-1]) == np.sign(gradient[-1])


def test_estimate_is_unbiased_over_seeds_and_deterministic_per_seed():
    """The mean of 4 seeds' estimates is within 4 standard errors of the mean (σ/√4) of
    the dense value: the quadrature's and the probes' bias is below that; one seed twice
    gives the same number (the optimizer sees one function)."""
    X, y = _diabetes(100)
    kernel = 0.8 * Gaussian(1.2) + White(0.3)
    value, _ = log_marginal_likelihood(kernel, X, y[:, None], 1e-6, False)
    runs = [estimated_log_marginal_likelihood(kernel, X, y, 1e-6, eval_gradient=False,
                                              n_probes=8, rank=10, tol=1e-6, random_state=s)
            for s in range(4)]
    values = np.array([r.value for r in runs])
    stderr = np.mean([r.value_stderr for r in runs]) / np.sqrt(len(runs))
    assert abs(values.mean() - value) < 4 * stderr, (values, value, stderr)
    again = estimated_log_marginal_likelihood(kernel, X, y, 1e-6, eval_gradient=False,
                                              n_probes=8, rank=10, tol=1e-6, random_state=0)
    assert again.value == runs[0].value


def test_cg_posterior_with_white_equals_the_exact_one():
    """White's noise on the CG operator's diagonal, not in its blocks: the same mean and
    std (noise included, as scikit-learn's) as the dense GP."""
    X, y = _diabetes(200)
    kernel = 1.2 * Gaussian(2.0) + White(0.4)
    exact = dkern.GaussianProcessRegressor(kernel, solver="exact", optimizer=None).fit(X, y)
    by_cg = dkern.GaussianProcessRegressor(kernel, solver="cg", optimizer=None, alpha=1e-6,
                                           tol=1e-10).fit(X, y)
    mean_e, std_e = exact.predict(X[:30] + 0.05, return_std=True)
    mean_c, std_c = by_cg.predict(X[:30] + 0.05, return_std=True)
    np.testing.assert_allclose(mean_c, mean_e, atol=1e-6)
    np.testing.assert_allclose(std_c, std_e, atol=1e-6)
    assert std_c.min() > np.sqrt(0.4)  # the noise is in the std


def test_cg_learning_above_the_exact_limit_reaches_the_dense_optimum(monkeypatch):
    """Above EXACT_MAX_N (lowered here to 100) solver="cg" learns C·RBF + White: from the
    sparse bound's optimum on 15 centres (lowered from 500, so that every row is not a
    centre), L-BFGS-B on the CG estimate; its θ's dense LML is within 0.1 of the dense
    optimum's (120 rows). (θ itself may differ along the likelihood's flat ridge of c
    against ℓ.) From the kernel's own start the estimate alone got within 0.03 in 36
    evaluations (benchmarks/RESULTS.md), too slow for this suite."""
    X, y = _diabetes(120)
    kernel = 1.0 * Gaussian(1.0) + White(1.0)
    dense = dkern.GaussianProcessRegressor(kernel, solver="exact", alpha=1e-6).fit(X, y)
    monkeypatch.setattr(exact_learning, "EXACT_MAX_N", 100)
    monkeypatch.setattr(sparse_learning, "WARM_START_CENTERS", 15)
    gradients = []
    estimate = exact_learning.estimated_log_marginal_likelihood
    monkeypatch.setattr(exact_learning, "estimated_log_marginal_likelihood", lambda *a, **kw: (
        gradients.append(kw["eval_gradient"]) or estimate(*a, **kw)))
    model = dkern.GaussianProcessRegressor(kernel, solver="cg", alpha=1e-6, tol=1e-8,
                                           preconditioner_rank=20, random_state=0).fit(X, y)
    reached, _ = log_marginal_likelihood(model.kernel_, X, y[:, None], 1e-6, False)
    assert reached > dense.log_marginal_likelihood_value_ - 0.1
    assert sum(gradients) >= 1  # the exact objective's estimate was optimised, not only F
    assert model.log_marginal_likelihood_value_ == pytest.approx(reached, abs=1.0)
    assert model.solver_ == "cg"


@pytest.mark.parametrize("kernel", [1.5 * Gaussian([1.0, 2.0, 0.5, 1.0]) + White(0.1),
                                    White(0.2) + Gaussian(1.3), Gaussian([1.0, 1.0, 2.0, 3.0])])
@pytest.mark.parametrize("far", [0.0, 1e4])
@pytest.mark.parametrize("cache", [True, False])
def test_gradient_products_from_cached_blocks_equal_the_derivative_blocks(kernel, far, cache):
    """The expanded products on cached blocks, or on tiles computed again (c · Gaussian +
    White; X centred, so any offset is harmless) equal the derivative tiles to 1e-11
    relative; with one row ``far`` away, where the expansion would cancel, the derivative
    tiles are used instead."""
    X, _ = _diabetes(150)
    X = X + 1e6
    X[0] += far
    V = da.from_array(np.random.default_rng(0).standard_normal((150, 3)), chunks=(75, 3))
    K = gram(kernel.without_white(), X, backend="numpy", dtype=np.float64)
    assert K.cache_blocks(10**9)
    np.testing.assert_allclose((K @ V).compute(), kernel.without_white()(X) @ V.compute(),
                               rtol=1e-12, atol=1e-12)
    got = gram_gradient_products(kernel, X, V, backend="numpy",
                                 cached=K if cache else None).compute()
    want = np.einsum("ijp,jt->itp", kernel.gradient(X, X), V.compute())
    np.testing.assert_allclose(got, want, atol=1e-11 * np.abs(want).max())


def test_trust_regions_reach_a_far_optimum_without_a_far_trial_step():
    """lbfgs_on_estimate on a quadratic whose optimum lies 3.5 from the start in log
    space: it reaches it (1e-6) through successive regions, and no trial θ lies more than
    ESTIMATE_TRUST_RADIUS from a θ evaluated before it."""
    optimum = np.array([3.5, -2.0, 0.5])
    scale = np.array([40.0, 1.0, 5.0])
    trials = []

    def objective(theta):
        trials.append(np.array(theta))
        r = np.asarray(theta) - optimum
        return float(0.5 * np.sum(scale * r**2)), scale * r

    bounds = np.array([[-10.0, 10.0], [-2.5, 10.0], [-10.0, 10.0]])
    theta, value = exact_learning.lbfgs_on_estimate(objective, np.zeros(3), bounds)
    np.testing.assert_allclose(theta, optimum, atol=1e-6)
    assert value == pytest.approx(0.0, abs=1e-9)
    assert len({t.tobytes() for t in trials}) == len(trials)  # each θ evaluated once
    radius = exact_learning.ESTIMATE_TRUST_RADIUS
    for k in range(1, len(trials)):  # every region is centred on a θ already evaluated
        nearest = min(np.max(np.abs(trials[k] - t)) for t in trials[:k])
        assert nearest <= radius + 1e-9


def test_trust_regions_return_the_best_theta_evaluated():
    """A value and gradient that disagree, as the estimate's do near the optimum: L-BFGS-B
    ends on a failed line search at an iterate worse than one it evaluated (scipy's own
    result here: 0.15971 against 0.15950 seen); lbfgs_on_estimate returns the best seen."""
    seen = []

    def objective(theta):
        theta = np.asarray(theta)
        value = float(np.sum((theta - 1.0) ** 2) + 0.3 * np.sin(7 * theta).sum())
        seen.append((value, theta.copy()))
        return value, 2 * (theta - 1.3)

    theta, value = exact_learning.lbfgs_on_estimate(objective, np.zeros(2),
                                                    np.array([[-3.0, 3.0]] * 2))
    best_value, best_theta = min(seen, key=lambda s: s[0])
    assert value == best_value
    np.testing.assert_array_equal(theta, best_theta)
    assert objective(theta)[0] == value


def test_a_trial_estimate_needing_many_more_cg_steps_counts_as_worse(monkeypatch):
    """After the first estimate (4 CG steps here), each CG solve is capped at
    max(ESTIMATE_MIN_STEPS, ESTIMATE_STEP_FACTOR × 4); one that reaches the cap is -inf,
    so the optimizer steps back instead of waiting on an ill-conditioned trial point."""
    from dkern.models.posteriors.evidence import EvidenceEstimate

    caps, steps = [], iter([4, 7, 10**6])

    def fake(k, X, y, alpha, *, max_iter, **_):
        caps.append(max_iter)
        n_iter = min(next(steps), max_iter or 10**6)
        return EvidenceEstimate(-float(n_iter), 0.1, np.ones(2), np.zeros(2), n_iter)

    monkeypatch.setattr(exact_learning, "estimated_log_marginal_likelihood", fake)
    lml = exact_learning.cg_estimated_likelihood(None, None, 0.1, rank=10, tol=1e-4,
                                                 backend="numpy", seed=0)
    kernel = 1.0 * Gaussian(1.0)
    cap = max(exact_learning.ESTIMATE_MIN_STEPS, exact_learning.ESTIMATE_STEP_FACTOR * 4)
    assert lml(kernel, True)[0] == -4.0 and lml(kernel, True)[0] == -7.0
    value, gradient = lml(kernel, True)
    assert caps == [None, cap, cap]
    assert value == -np.inf and np.array_equal(gradient, np.zeros(2))


def test_trust_regions_step_back_from_estimates_counted_as_worse():
    """Past |θ| > 1.5 every estimate 'stops unconverged' (inf here, the objective being
    -ln p); the optimum beyond is not reached, the best finite θ seen is returned."""
    def objective(theta):
        theta = np.asarray(theta)
        if np.abs(theta).max() > 1.5:
            return np.inf, np.zeros_like(theta)
        return float(np.sum((theta - 2.0) ** 2)), 2 * (theta - 2.0)

    theta, value = exact_learning.lbfgs_on_estimate(objective, np.zeros(1),
                                                    np.array([[-3.0, 3.0]]))
    assert np.isfinite(value) and 0.5 < theta[0] <= 1.5 and value == objective(theta)[0]


def test_trust_regions_shrink_when_the_first_trial_stops_unconverged():
    """Past |θ| > 0.3 every estimate 'stops unconverged' (inf). L-BFGS-B's first trial
    (to the box's edge at radius 1) is inf, on which it stops at once (the n = 100,000
    run in benchmarks/RESULTS.md ended so, at its start); the region then shrinks by
    ESTIMATE_SHRINK and the next rounds move towards the optimum at 2 as far as the
    estimates allow."""
    def objective(theta):
        theta = np.asarray(theta)
        if np.abs(theta).max() > 0.3:
            return np.inf, np.zeros_like(theta)
        return float(np.sum((theta - 2.0) ** 2)), 2 * (theta - 2.0)

    theta, value = exact_learning.lbfgs_on_estimate(objective, np.zeros(2),
                                                    np.array([[-3.0, 3.0]] * 2))
    assert value == objective(theta)[0] < objective(np.zeros(2))[0]
    assert np.all((0.2 < theta) & (theta <= 0.3))
