"""Old tree against new tree, for answers rather than speed: every estimator fitted on the
same real data with each tree's ``dkern``, its predictions, standard deviations, log
marginal likelihoods and model file compared.

    python benchmarks/trees_equal.py --old 1b9ca77

Each tree runs in a fresh process (``PYTHONPATH`` names one tree) and writes what its
models answer to an ``.npz`` and its model files to a Zarr store; this process compares
them. The table gives, per estimator and output, the largest difference relative to the
output's largest magnitude, and whether the two model files hold the same arrays and the
same attributes (the format number aside). Data: scikit-learn's bundled diabetes
(regression, 442 × 10, standardised) and breast cancer (classification, first 300 rows,
first 8 features, standardised).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, scratch_dir, update_section  # noqa: E402
from trees import REPO, old_tree  # noqa: E402

# Fits every estimator with the tree on PYTHONPATH; saves answers to OUT.npz and models
# under STORE. Only the public API both trees share.
SCRIPT = """
import warnings
import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes
import dkern
from dkern.kernels import Gaussian
warnings.simplefilter("ignore")

def standard(a):
    return (a - a.mean(0)) / a.std(0)

X, y = load_diabetes(return_X_y=True)
X, y = standard(X), (y - y.mean()) / y.std()
Xt = X[::7] + 0.05
Xc, yc = load_breast_cancer(return_X_y=True)
Xc, yc = standard(Xc[:300, :8]), yc[:300]
out = {}

def keep(name, model, *answers):
    dkern.save(model, f"{STORE}/{name}.zarr")
    for label, value in answers:
        out[f"{name}/{label}"] = np.asarray(value, dtype=float)

k = Gaussian(3.0)
for solver, extra in (("exact", {}), ("cg", {"tol": 1e-10}), ("nystrom", {"n_centers": 60})):
    m = dkern.KernelRidge(k, alpha=0.1, solver=solver, random_state=0, **extra).fit(X, y)
    keep(f"krr-{solver}", m, ("predict", m.predict(Xt)))
for solver, variance in (("exact", "exact"), ("cg", "cg"), ("cg", "lanczos"),
                         ("nystrom", "nystrom")):
    m = dkern.GaussianProcessRegressor(1.0 * Gaussian(3.0), alpha=0.1, solver=solver,
                                       variance=variance, random_state=0,
                                       n_centers=60 if solver == "nystrom" else None,
                                       optimizer="lbfgs" if solver == "exact" else None,
                                       tol=1e-10).fit(X, y)
    mean, std = m.predict(Xt, return_std=True)
    keep(f"gp-{solver}-{variance}", m, ("mean", mean), ("std", std),
         ("lml", m.log_marginal_likelihood_value_))
for solver in ("exact", "cg"):
    for optimizer in ("lbfgs", None):
        m = dkern.GaussianProcessClassifier(1.0 * Gaussian(2.0), solver=solver, tol=1e-10,
                                            optimizer=optimizer, random_state=0).fit(Xc, yc)
        keep(f"gpc-{solver}-{optimizer or 'fixed'}", m, ("proba", m.predict_proba(Xc[::5])),
             ("lml", m.log_marginal_likelihood_value_))
m = dkern.KernelLogisticRegression(Gaussian(2.0), alpha=1e-3, tol=1e-10).fit(Xc, yc)
keep("klr", m, ("proba", m.predict_proba(Xc[::5])))
m = dkern.KernelDensity(bandwidth=0.7).fit(X)
keep("kde", m, ("score_samples", m.score_samples(Xt)))
m = dkern.NadarayaWatson(bandwidth=0.7).fit(X, y)
keep("nadaraya-watson", m, ("predict", m.predict(Xt)))
m = dkern.KNeighborsRegressor(7, weights="distance").fit(X, y)
keep("knn-regressor", m, ("predict", m.predict(Xt)))
m = dkern.KNeighborsClassifier(7).fit(Xc, yc)
keep("knn-classifier", m, ("proba", m.predict_proba(Xc[::5])))
np.savez(OUT, **out)
"""


def answers(tree: Path, folder: str) -> tuple[dict[str, np.ndarray], str]:
    """What ``tree``'s models answer, and the store its model files went to."""
    store, out = folder, os.path.join(folder, "answers.npz")
    script = f"STORE = {store!r}\nOUT = {out!r}\n" + SCRIPT
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, cwd=folder, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the models failed in {tree}:\n{done.stderr[-3000:]}")
    with np.load(out) as data:
        return dict(data), store


def same_file(old_store: str, new_store: str, name: str) -> str:
    """Whether two model files hold the same arrays and attributes (format and version
    aside), read with this tree's :func:`dkern.io.read_attrs` / ``open_array``."""
    from dkern.io import open_array, read_attrs

    urls = [os.path.join(store, f"{name}.zarr") for store in (old_store, new_store)]
    a, b = (read_attrs(url) for url in urls)
    for attrs in (a, b):
        attrs.pop("format", None)
        attrs.pop("dkern_version", None)
    if a != b:
        return "differ: " + ", ".join(_differences(a, b))
    names = sorted(a.get("arrays", []))
    worst = max((_relative(*(np.asarray(open_array(u, n)) for u in urls)) for n in names),
                default=0.0)
    return f"same ({len(names)} arrays, largest difference {worst:.1e})"


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The attribute paths whose values differ (one level into dicts), with both values
    where they are short."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, "(absent)"), b.get(key, "(absent)")
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict) and not prefix:
            out += _differences(x, y, f"{key}.")
        elif len(repr(x)) + len(repr(y)) < 80:
            out.append(f"`{prefix}{key}` {x!r} → {y!r}")
        else:
            out.append(f"`{prefix}{key}`")
    return out


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if not np.issubdtype(a.dtype, np.number):
        return 0.0 if np.array_equal(a, b) else float("inf")
    scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-300)
    return float(np.max(np.abs(a.astype(float) - b.astype(float)), initial=0.0)) / scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the old tree's git revision")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    old = old_tree(args.old)
    try:
        old_answers, old_store = answers(old, scratch_dir("dkern-old-answers-"))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                       check=False)
    new_answers, new_store = answers(REPO, scratch_dir("dkern-new-answers-"))
    rows = []
    for key in sorted(new_answers):
        model, output = key.split("/")
        rows.append([model, output, f"{_relative(old_answers[key], new_answers[key]):.1e}",
                     same_file(old_store, new_store, model) if output in (
                         "predict", "mean", "proba", "score_samples") else ""])
    table = markdown_table(["model", "output", "max |new − old| / max |old|",
                            "model file (format aside)"], rows)
    print(table)
    if not args.no_write:
        new = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        update_section("Old tree against new tree, answers", (
            "## Old tree against new tree: the same answers (the models redesign, issue 25)"
            f"\n\n`python benchmarks/trees_equal.py --old {args.old}`; new tree `{new}`, "
            f"on {machine()}.\n\n" + table))


if __name__ == "__main__":
    main()
