"""``connect(gpus=…)``: one worker per GPU, each seeing only its own through
``CUDA_VISIBLE_DEVICES`` (checked here without a GPU: the variable is what CUDA reads)."""

import os

import pytest

import dkern
from dkern.runtime import gpus as gpus_module
from dkern.runtime.gpus import gpu_ids


def _visible_device():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.distributed
def test_one_worker_per_gpu_each_seeing_its_own_also_after_a_restart():
    with dkern.connect(gpus=[0, 3]) as client:
        workers = client.scheduler_info()["workers"]
        assert sorted((w["name"], w["nthreads"]) for w in workers.values()) == \
            [("gpu0", 2), ("gpu3", 2)]
        names = {address: w["name"] for address, w in workers.items()}
        seen = client.run(_visible_device)
        assert {names[address]: device for address, device in seen.items()} == \
            {"gpu0": "0", "gpu3": "3"}
        client.restart()
        assert sorted(client.run(_visible_device).values()) == ["0", "3"]
    assert _visible_device() is None  # the client's own process is left as it was


def _blas_threads():
    from threadpoolctl import threadpool_info

    return sorted({lib["num_threads"] for lib in threadpool_info()
                   if lib["user_api"] == "blas"})


def _preloads(dask_worker):
    return [getattr(p, "name", p) for p in dask_worker.preloads]


@pytest.mark.distributed
def test_a_gpu_worker_has_dkern_s_settings_and_its_share_of_the_cores_for_blas():
    """One GPU worker on this host: dkern's worker preload (its workers started after
    connect's settings were gone, once), and BLAS on every core (CPU workers keep one)."""
    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: a share of them is one thread, as the CPU workers have")
    with dkern.connect(gpus=1) as client:
        assert list(client.run(_preloads).values()) == [["dkern.runtime.preload"]]
        assert list(client.run(_blas_threads).values()) == [[cores]]
    with dkern.connect(n_workers=1) as client:
        assert list(client.run(_blas_threads).values()) == [[1]]


@pytest.mark.parametrize("gpus, want", [(2, [0, 1]), ([2, 0], [2, 0]), ((1,), [1])])
def test_gpu_ids_takes_a_count_or_indices(gpus, want):
    assert gpu_ids(gpus) == want


@pytest.mark.parametrize("gpus, says", [
    (0, "gpus must be at least 1"), ([1, 1], "lists a GPU twice"), ("0", "got '0'"),
    ([], "got []"), ([-1], "got [-1]"), ([True], "got [True]"), (False, "got False"),
    (1.5, "got 1.5"),
])
def test_bad_gpus_are_refused_naming_the_argument(gpus, says):
    with pytest.raises(ValueError, match="gpus") as error:
        gpu_ids(gpus)
    assert says in str(error.value)


def test_gpus_true_counts_what_nvidia_smi_lists(monkeypatch):
    monkeypatch.setattr(gpus_module, "visible_gpus", lambda: 2)
    assert gpu_ids(True) == [0, 1]
    monkeypatch.setattr(gpus_module, "visible_gpus", lambda: 0)
    with pytest.raises(ValueError, match="gpus=True asks for one worker per GPU, but "
                                         "nvidia-smi lists no CUDA GPU here"):
        gpu_ids(True)


def test_gpus_with_a_remote_scheduler_or_n_workers_is_refused_before_connecting():
    with pytest.raises(ValueError, match="start that cluster's GPU workers with "
                                         "cluster/start-workers.sh"):
        dkern.connect("tcp://127.0.0.1:1", gpus=1)
    with pytest.raises(ValueError, match="with gpus there is one worker per GPU; give one"):
        dkern.connect(gpus=1, n_workers=2)


def test_gpu_facts_read_nvidia_smi(tmp_path, monkeypatch):
    """What `dkern info` reports per GPU, from nvidia-smi's CSV and header (a stand-in
    script printing what the H100 of benchmarks/RESULTS.md printed)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    'case "$1" in\n'
                    '  --query-gpu=*) echo "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04" ;;\n'
                    '  *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   '
                    'CUDA Version: 13.0     |" ;;\n'
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpus_module.gpu_facts() == [{"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB",
                                        "driver": "580.159.04", "cuda": "13.0"}]
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpus_module.gpu_facts() == []
