"""Old tree against new tree: the same timed calls of dkern's public API, run alternately
with each tree's ``dkern`` on the same host and the same stores, so a refactor's cost or
gain shows as a ratio measured side by side.

    python benchmarks/trees.py --old 1b9ca77                   # every part, full size
    python benchmarks/trees.py --old 1b9ca77 --only gram toolbox --repeats 3
    python benchmarks/trees.py --old 1b9ca77 --scale 0.05      # a smoke run, prints only

The old tree is checked out with ``git worktree`` into a temporary folder; each timed run
is a fresh Python process whose ``PYTHONPATH`` names one tree (the other tree's ``dkern``
is never imported). Runs alternate old, new, old, new, … and the table gives each tree's
best and the ratio new / old of the bests (below 1: the new tree is faster).

Parts (public API only, so both trees run the same code path):

- ``gram``: ``dkern.gram(Gaussian(1), X) @ v`` in-process, n = m = 20,000, d = 8, float64
  and float32, numpy backend.
- ``falkon``: ``KernelRidge(solver="nystrom", n_centers=1,000)`` fit on 300,000 rows read
  from a Zarr store, LocalCluster(2 workers).
- ``gp-million``: ``GaussianProcessRegressor(solver="nystrom", variance="nystrom",
  n_centers=2,000)`` fit on 1,000,000 rows and mean + std of 100,000 points written to
  Zarr, LocalCluster(2 workers).
- ``toolbox``: ``KernelDensity``, ``NadarayaWatson``, ``KNeighborsRegressor`` fitted on
  200,000 stored rows, each asked for 1,000 query rows, LocalCluster(2 workers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, markdown_table, scratch_dir, update_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Each part is a script run in a fresh process; it prints one JSON object {label: seconds}.
# It may use only what both trees have: the public API as of the old tree.
COMMON = """
import json, time, warnings
import numpy as np
import dkern
from dkern.io import open_array
from dkern.kernels import Gaussian
warnings.simplefilter("ignore")
out = {}
def timed(label, f):
    start = time.perf_counter(); result = f(); out[label] = time.perf_counter() - start
    return result
"""

PARTS = {
    "gram": """
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, size=(N_GRAM, 8)); v = rng.standard_normal((N_GRAM, 1))
for dt in ("float64", "float32"):
    op = dkern.gram(Gaussian(1.0), X.astype(dt), backend="numpy")
    op.matvec(v).compute(scheduler="threads")  # warm-up
    timed(f"K v, {dt}", lambda: op.matvec(v).compute(scheduler="threads"))
""",
    "falkon": """
with dkern.connect(n_workers=2, threads_per_worker=1):
    model = dkern.KernelRidge(Gaussian(3.0), alpha=1e-3, solver="nystrom", n_centers=1000,
                              tol=1e-3, random_state=0)
    timed("fit", lambda: model.fit((URL_FALKON, "X"), (URL_FALKON, "y")))
""",
    "gp-million": """
import os, tempfile
with dkern.connect(n_workers=2, threads_per_worker=1):
    model = dkern.GaussianProcessRegressor(
        0.5 * Gaussian(np.array([0.7] + [2.2] * 7)), alpha=0.01, optimizer=None,
        solver="nystrom", variance="nystrom", n_centers=2000, random_state=0)
    timed("fit", lambda: model.fit((URL_GP, "X"), (URL_GP, "y")))
    scratch = tempfile.TemporaryDirectory()  # removed when the part's process exits
    target = (os.path.join(scratch.name, "pred.zarr"), "gp")
    timed("mean + std to Zarr",
          lambda: model.predict((URL_GP, "X_test"), return_std=True, out=target))
""",
    "toolbox": """
with dkern.connect(n_workers=2, threads_per_worker=1):
    Xq = open_array(URL_TOOLBOX, "X_test")[:1000].compute()
    X, y = (URL_TOOLBOX, "X"), (URL_TOOLBOX, "y")
    kde = dkern.KernelDensity(bandwidth=0.5).fit(X)
    timed("KDE", lambda: np.asarray(kde.score_samples(Xq)))
    nw = dkern.NadarayaWatson(bandwidth=0.5).fit(X, y)
    timed("Nadaraya-Watson", lambda: np.asarray(nw.predict(Xq)))
    knn = dkern.KNeighborsRegressor(10).fit(X, y)
    timed("kNN", lambda: np.asarray(knn.predict(Xq)))
""",
}

SIZES = {"N_GRAM": 20_000, "N_FALKON": 300_000, "N_GP": 1_000_000, "N_TOOLBOX": 200_000}


def stores(sizes: dict[str, int], only: list[str]) -> dict[str, str]:
    """The Zarr stores the parts read, written once with the new tree."""
    from dkern.io import make_regression_store

    folder = scratch_dir("dkern-trees-")
    wanted = {"falkon": ("URL_FALKON", sizes["N_FALKON"], 1_000),
              "gp-million": ("URL_GP", sizes["N_GP"], sizes["N_GP"] // 10),
              "toolbox": ("URL_TOOLBOX", sizes["N_TOOLBOX"], 1_000)}
    urls = {}
    for part, (key, n, n_test) in wanted.items():
        if part in only:
            urls[key] = os.path.join(folder, f"{part}.zarr")
            make_regression_store(urls[key], n, 8, chunk_rows=max(1_000, n // 20),
                                  n_test=n_test, seed=0)
    return urls


def run_part(tree: Path, part: str, constants: dict[str, object]) -> dict[str, float]:
    """One timed run of ``part`` in a fresh process importing ``tree``'s dkern."""
    header = "".join(f"{k} = {v!r}\n" for k, v in constants.items())
    script = header + textwrap.dedent(COMMON) + textwrap.dedent(PARTS[part]) \
        + "\nprint(json.dumps(out))\n"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, cwd=tempfile.gettempdir(), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"part {part!r} failed in {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def old_tree(rev: str) -> Path:
    """A worktree of ``rev`` in a temporary folder (removed by the caller)."""
    path = Path(scratch_dir("dkern-old-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), rev],
                   check=True)
    return path


def compare(old: Path, parts: list[str], constants: dict[str, object],
            repeats: int) -> list[list[str]]:
    """Table rows: part, timed call, best old, best new, new / old, every run."""
    rows = []
    for part in parts:
        runs: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
        for _ in range(repeats):
            for label, tree in (("old", old), ("new", REPO)):
                for call, seconds in run_part(tree, part, constants).items():
                    runs[label].setdefault(call, []).append(seconds)
        for call in runs["new"]:
            o, n = min(runs["old"][call]), min(runs["new"][call])
            every = " / ".join(f"{a:.2f}, {b:.2f}" for a, b in
                               zip(runs["old"][call], runs["new"][call], strict=True))
            rows.append([part, call, f"{o:.2f}", f"{n:.2f}", f"{n / o:.2f}", every])
            print(*rows[-1], sep=" | ", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the old tree's git revision")
    parser.add_argument("--only", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per tree")
    parser.add_argument("--scale", type=float, default=1.0, help="every size × scale")
    args = parser.parse_args()
    sizes = {k: max(2_000, int(v * args.scale)) for k, v in SIZES.items()}
    constants: dict[str, object] = {**sizes, **stores(sizes, args.only)}
    old = old_tree(args.old)
    new = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        rows = compare(old, args.only, constants, args.repeats)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                       check=False)
    table = markdown_table(["part", "timed call", "old best (s)", "new best (s)", "new / old",
                            "runs (old, new / …)"], rows)
    print(table)
    if args.scale == 1.0:
        update_section("Old tree against new tree", (
            "## Old tree against new tree (the models redesign, issue 25)\n\n"
            "`python benchmarks/trees.py --old REV`. "
            f"Old tree `{args.old}`, new tree `{new}` (uncommitted changes included), run "
            f"alternately, {args.repeats} runs each, on {machine()}. Sizes: "
            + ", ".join(f"{k} = {v:,}" for k, v in sizes.items()) + ".\n\n" + table))


if __name__ == "__main__":
    main()
