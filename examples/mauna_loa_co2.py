"""A Gaussian process on the Mauna Loa CO₂ record, as the textbook does it.

    python examples/mauna_loa_co2.py [--out co2.png] [--until 2010] [--holdout 3]

The Mauna Loa record of 1958-2001 (NOAA's weekly means, shipped offline by ``statsmodels`` as
``statsmodels.datasets.co2``: the record of scikit-learn's example "Forecasting of CO2 level on
Mona Loa dataset using GPR", averaged by month as it does), modelled as that example and
Rasmussen & Williams (2006, section 5.4.3) do, in ppm and years, from the same start (dkern's
``Gaussian`` is scikit-learn's ``RBF``, ``Periodic`` its ``ExpSineSquared``):

* a long-term rising trend: ``50² · Gaussian(50)``;
* a yearly cycle whose shape may drift: ``2² · Gaussian(100) · Periodic(1, period=1)``;
* medium-term irregularities: ``0.5² · RationalQuadratic(1, alpha=1)``;
* noise: correlated over weeks, ``0.1² · Gaussian(0.1)``, and white, ``White(0.1²)``,
  whose level is learned with the rest (no fixed ``alpha``).

The period is fixed at one year, as in scikit-learn's example; the other eleven
hyperparameters are learned within scikit-learn's bounds, (1e-5, 1e5).

As scikit-learn, the targets are centred (their mean subtracted; ``normalize_y=False``)
and the hyperparameters maximise the exact log marginal likelihood from the start above.
The last ``--holdout`` years are kept out of the fit. scikit-learn's
``GaussianProcessRegressor`` is fitted on the same months from the same kernel, as the
oracle. Printed: the learned kernel, both log marginal likelihoods, the in-sample and
held-out RMSE, and how many held-out months lie inside the predictive mean ± 2σ (σ
includes the learned noise, as scikit-learn's ``return_std`` does). The mean ± 2σ from
1958 to ``--until`` is saved as a PNG (``--out``).

Exits with status 1 unless: dkern's LML is at least scikit-learn's (less 1e-3), no
``ConvergenceWarning`` was raised (none of the learned hyperparameters ends on a bound),
at least ``MIN_COVERAGE`` of the held-out months lie inside the band, and the RMSEs are
below 0.5 ppm (in-sample) and 1 ppm (held out).
"""

import argparse
import sys
import warnings

import matplotlib
import numpy as np
import statsmodels.datasets
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor as SklearnGPR
from sklearn.gaussian_process import kernels as sk

import dkern
from dkern.kernels import Gaussian, Periodic, RationalQuadratic, White

matplotlib.use("Agg")  # no display needed: the plot goes to a file
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

#: The share of held-out months inside mean ± 2σ the example requires.
MIN_COVERAGE = 0.90


def monthly_co2():
    """Decimal years (n, 1) and CO₂ in ppm (n,) of the monthly Mauna Loa means (months
    with no weekly measurement are left out)."""
    weekly = statsmodels.datasets.co2.load_pandas().data
    monthly = weekly.resample("MS").mean().dropna()
    t = monthly.index.year + (monthly.index.month - 0.5) / 12
    return t.to_numpy(dtype=float)[:, None], monthly["co2"].to_numpy(dtype=float)


def co2_kernel():
    """scikit-learn's CO₂ kernel and start, in dkern's classes."""
    trend = 50.0**2 * Gaussian(lengthscale=50.0)
    seasonal = 2.0**2 * Gaussian(lengthscale=100.0) \
        * Periodic(lengthscale=1.0, period=1.0, period_bounds="fixed")
    irregular = 0.5**2 * RationalQuadratic(lengthscale=1.0, alpha=1.0)
    noise = 0.1**2 * Gaussian(lengthscale=0.1) + White(noise_level=0.1**2)
    return trend + seasonal + irregular + noise


def sklearn_co2_kernel():
    """The same kernel in scikit-learn's classes (the same theta, in the same order)."""
    trend = 50.0**2 * sk.RBF(length_scale=50.0)
    seasonal = 2.0**2 * sk.RBF(length_scale=100.0) \
        * sk.ExpSineSquared(length_scale=1.0, periodicity=1.0, periodicity_bounds="fixed")
    irregular = 0.5**2 * sk.RationalQuadratic(length_scale=1.0, alpha=1.0)
    noise = 0.1**2 * sk.RBF(length_scale=0.1) + sk.WhiteKernel(noise_level=0.1**2)
    return trend + seasonal + irregular + noise


def fit_recording_warnings(model, t, y):
    """``model.fit(t, y)`` and the messages of the ConvergenceWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)  # dkern's is a subclass
        model.fit(t, y)
    for w in caught:  # anything else is shown as usual
        if not issubclass(w.category, ConvergenceWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


def plot(path, t_train, y_train, t_held, y_held, t_grid, mean, std):
    """The mean ± 2σ over the whole record (left) and over the held-out years (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.5), width_ratios=(2, 1))
    for ax in axes:
        ax.fill_between(t_grid[:, 0], mean - 2 * std, mean + 2 * std, color="tab:blue",
                        alpha=0.3, label="mean ± 2σ (noise included)")
        ax.plot(t_grid[:, 0], mean, color="tab:blue", lw=1, label="posterior mean")
        ax.plot(t_train[:, 0], y_train, ".", ms=2, color="black", label="fitted months")
        ax.plot(t_held[:, 0], y_held, ".", ms=3, color="tab:red", label="held-out months")
    axes[0].set(xlabel="year", ylabel="CO₂ (ppm)", title="Mauna Loa CO₂: dkern GP")
    axes[0].legend(loc="upper left", fontsize="small")
    zoom = (t_grid[:, 0] >= t_held[0, 0] - 2) & (t_grid[:, 0] <= t_held[-1, 0] + 0.5)
    low, high = (mean - 2 * std)[zoom].min(), (mean + 2 * std)[zoom].max()
    axes[1].set(xlim=(t_held[0, 0] - 2, t_held[-1, 0] + 0.5), ylim=(low - 1, high + 1),
                xlabel="year", title="held-out years")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="co2.png", help="where to save the PNG")
    parser.add_argument("--until", type=float, default=2010.0, help="predict up to this year")
    parser.add_argument("--holdout", type=int, default=3, help="last years kept out of the fit")
    args = parser.parse_args(argv)

    t, y = monthly_co2()
    held = t[:, 0] >= t[-1, 0] - args.holdout + 1 / 24  # the last `holdout` years' months
    y_mean = y[~held].mean()  # the GP's prior mean is 0: centre the ppm values (as scikit-learn)
    gp = dkern.GaussianProcessRegressor(co2_kernel(), solver="exact", normalize_y=False)
    issues = fit_recording_warnings(gp, t[~held], y[~held] - y_mean)
    oracle = SklearnGPR(sklearn_co2_kernel(), normalize_y=False)
    issues += [f"scikit-learn: {m}" for m in fit_recording_warnings(oracle, t[~held],
                                                                    y[~held] - y_mean)]

    fitted = gp.predict(t[~held]) + y_mean
    predicted, std = gp.predict(t[held], return_std=True)  # std includes White's noise
    predicted += y_mean
    inside = np.abs(y[held] - predicted) <= 2 * std
    rmse_in = float(np.sqrt(np.mean((fitted - y[~held]) ** 2)))
    rmse_held = float(np.sqrt(np.mean((predicted - y[held]) ** 2)))
    lml, lml_sklearn = gp.log_marginal_likelihood_value_, oracle.log_marginal_likelihood_value_
    t_grid = np.linspace(t[0, 0], args.until, 1000)[:, None]
    mean, band = gp.predict(t_grid, return_std=True)
    plot(args.out, t[~held], y[~held], t[held], y[held], t_grid, mean + y_mean, band)

    years = np.floor(t[held, 0]).astype(int)
    by_year = ", ".join(f"{year} {inside[years == year].mean():.0%}" for year in np.unique(years))
    print(f"learned kernel: {gp.kernel_!r}")
    print(f"log marginal likelihood: {lml:.3f} (scikit-learn: {lml_sklearn:.3f}, the same "
          "kernel, start and months)")
    print(f"in-sample RMSE: {rmse_in:.3f} ppm on {np.sum(~held)} months; held-out RMSE: "
          f"{rmse_held:.3f} ppm on the last {np.sum(held)} months")
    print(f"held-out months inside mean ± 2σ: {inside.sum()} of {inside.size} "
          f"({inside.mean():.1%}; by year: {by_year})")
    print(f"convergence warnings: {len(issues)}" + "".join(f"\n  {m}" for m in issues))
    print(f"plot of the mean ± 2σ up to {args.until:g}: {args.out}")

    failed = [name for name, bad in [
        ("dkern's LML below scikit-learn's", lml < lml_sklearn - 1e-3),
        ("a ConvergenceWarning", bool(issues)),
        (f"held-out coverage below {MIN_COVERAGE:.0%}", inside.mean() < MIN_COVERAGE),
        ("in-sample RMSE of 0.5 ppm or more", rmse_in >= 0.5),
        ("held-out RMSE of 1 ppm or more", rmse_held >= 1.0)] if bad]
    if failed:
        print("FAILED: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
