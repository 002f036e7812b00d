"""The batch-system recipes in cluster/: what can be checked without Slurm or Kubernetes.

Slurm: the job script dask-jobqueue generates from cluster/slurm/dkern_slurm.py names the
right sbatch directives and worker command, and its export line really gives distributed
dkern's malloc settings. Kubernetes: cluster/kubernetes/daskcluster.yaml parses and names
the operator's kind, the image, the worker command and resources that match its memory
limit.
"""

import ast
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dask.utils import parse_bytes

from dkern.runtime import WORKER_MALLOC_ENV

ROOT = Path(__file__).resolve().parents[1]


def load_recipe():
    spec = importlib.util.spec_from_file_location(
        "dkern_slurm", ROOT / "cluster" / "slurm" / "dkern_slurm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def job_script():
    recipe = load_recipe()
    cluster = recipe.slurm_cluster(queue="compute", cores=8, memory="32GiB",
                                   walltime="02:30:00", account="proj42", interface="lo",
                                   local_directory="$TMPDIR/dask",
                                   dashboard_address="127.0.0.1:0")
    try:
        yield cluster.job_script()
    finally:
        cluster.close()


def test_slurm_job_script_names_the_directives(job_script):
    directives = [line for line in job_script.splitlines() if line.startswith("#SBATCH")]
    for want in ("#SBATCH -p compute", "#SBATCH -A proj42", "#SBATCH --cpus-per-task=8",
                 "#SBATCH -t 02:30:00", "#SBATCH -J dkern-worker"):
        assert want in directives, (want, directives)
    mem = [d for d in directives if d.startswith("#SBATCH --mem=")]
    assert len(mem) == 1
    job_bytes = parse_bytes(mem[0].split("=", 1)[1] + "iB")  # sbatch's G means GiB
    assert job_bytes == 32 * 2**30


def test_slurm_worker_command_runs_one_single_threaded_worker_per_core(job_script):
    command = next(line for line in job_script.splitlines() if "dask_worker" in line)
    args = shlex.split(command)
    assert args[1:3] == ["-m", "distributed.cli.dask_worker"]
    assert args[3].startswith("tcp://")  # the scheduler this process started

    def value(flag):
        return args[args.index(flag) + 1]

    assert value("--nthreads") == "1" and value("--nworkers") == "8"
    assert value("--interface") == "lo" and value("--local-directory") == "$TMPDIR/dask"
    # the workers together use the job's memory, each its share
    assert abs(8 * parse_bytes(value("--memory-limit")) - 32 * 2**30) < 2**24
    assert "--nanny" in args


def test_slurm_job_script_gives_the_workers_dkerns_malloc_settings(job_script):
    lines = job_script.splitlines()
    exports = [i for i, line in enumerate(lines) if line.startswith("export ")]
    worker = next(i for i, line in enumerate(lines) if "dask_worker" in line)
    assert len(exports) == 1 and exports[0] < worker
    # what the nanny will use when it spawns each worker, read by distributed itself in a
    # shell that ran the export line
    probe = ("import dask, distributed, json; "
             "print(json.dumps(dask.config.get('distributed.nanny.pre-spawn-environ')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    result = subprocess.run(["bash", "-c", f"{lines[exports[0]]}\n"
                             f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    environ = json.loads(result.stdout)
    for key, value in WORKER_MALLOC_ENV.items():  # upper-case names, as glibc reads them
        assert str(environ.get(key)) == value, (key, environ)
    assert environ.get("OMP_NUM_THREADS") == 1  # distributed's other defaults are kept


def k8s_bytes(quantity):
    """A Kubernetes memory quantity ("8Gi", "512Mi", "2G") in bytes."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", quantity).groups()
    scale = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[unit]
    return float(number) * scale


@pytest.fixture(scope="module")
def manifest():
    text = (ROOT / "cluster" / "kubernetes" / "daskcluster.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def test_kubernetes_manifest_is_a_dask_operator_cluster(manifest):
    assert manifest["apiVersion"] == "kubernetes.dask.org/v1"
    assert manifest["kind"] == "DaskCluster"
    scheduler = manifest["spec"]["scheduler"]["spec"]["containers"][0]
    worker = manifest["spec"]["worker"]["spec"]["containers"][0]
    assert scheduler["args"][:2] == ["dask", "scheduler"]
    assert worker["args"][:2] == ["dask", "worker"]
    assert worker["image"] == scheduler["image"] and "dkern" in worker["image"]
    ports = {p["name"]: p["containerPort"] for p in scheduler["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    assert manifest["spec"]["scheduler"]["service"]["type"] == "ClusterIP"  # not exposed


def test_kubernetes_workers_memory_limit_matches_the_container(manifest):
    worker = manifest["spec"]["worker"]["spec"]["containers"][0]
    args = worker["args"]

    def value(flag):
        return args[args.index(flag) + 1]

    resources = worker["resources"]
    assert resources["requests"] == resources["limits"]  # a Guaranteed pod
    limit = k8s_bytes(resources["limits"]["memory"])
    assert int(value("--nworkers")) * parse_bytes(value("--memory-limit")) == limit
    assert int(value("--nworkers")) * int(value("--nthreads")) == int(resources["limits"]["cpu"])
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert ast.literal_eval(env["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"]) == (
        WORKER_MALLOC_ENV)
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    volumes = {v["name"]: v for v in manifest["spec"]["worker"]["spec"]["volumes"]}
    assert mounts["data"] == "/data" and "persistentVolumeClaim" in volumes["data"]
    assert value("--local-directory") == mounts["scratch"]
