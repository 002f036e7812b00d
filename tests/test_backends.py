"""Backends: selection (the KeOps check survives a crashing KeOps; explicit choices fail
clearly), and the block seam: every backend implements the BlockBackend protocol, and KeOps'
smoothing sums and k nearest neighbours equal numpy's on real data, with proof KeOps ran.

Real data: scikit-learn's bundled diabetes study (442 rows; body-mass index, blood pressure
and serum s5, standardised) and handwritten digits (1,797 rows of 64 integer pixels: many
neighbours at equal distance, exactly, so ties to the lower index are tested for real).
"""

import logging
import sys

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_digits

import dkern
from dkern.backends import (
    BackendStatus,
    BackendUnavailableError,
    BlockBackend,
    KeopsBlocks,
    NumpyBlocks,
    keops_backend,
    resolve_backend,
    select,
)
from dkern.kernels import Gaussian, Laplacian


@pytest.fixture
def fresh_status():
    select.keops_status.cache_clear()
    yield
    select.keops_status.cache_clear()


def test_a_segfaulting_keops_is_reported_not_fatal(monkeypatch, fresh_status):
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(select, "_KEOPS_CHECK", crash)
    status = select.keops_status()
    assert not status.available and "crashed (signal 11)" in status.detail


def test_a_crash_that_a_preload_avoids_names_the_preload(monkeypatch, fresh_status, tmp_path):
    """The H100 / CUDA 13 case: the check crashes unless the pip package's libnvrtc is
    preloaded; the reason then says what to export."""
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libnvrtc.so.13", "libnvrtc-builtins.so.13.0"):
        (lib / name).write_bytes(b"")  # the loader refuses and ignores them: only names count
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)  # found anew, on sys.path
    preload = select.nvrtc_preload()
    assert preload == f"{lib / 'libnvrtc-builtins.so.13.0'}:{lib / 'libnvrtc.so.13'}"
    monkeypatch.setattr(select, "_KEOPS_CHECK", (
        "import os, signal\n"
        "if 'libnvrtc.so.13' not in os.environ.get('LD_PRELOAD', ''):\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "print('2.3')"))
    status = select.keops_status()
    assert not status.available
    assert status.detail.startswith(f"KeOps check compile crashed (signal 11), and ran with "
                                    f"LD_PRELOAD={preload} ")
    assert status.detail.endswith("export that before starting Python and the workers")


def _fake_pip_nvrtc(tmp_path, monkeypatch):
    """A pip-style ``nvidia/cu13/lib`` whose two libraries are a real, harmless shared
    object (Python's own _ctypes extension), and a CUDA driver that ``find_library``
    reports."""
    import _ctypes
    import ctypes.util

    real = getattr(_ctypes, "__file__", None)
    if real is None:
        pytest.skip("this Python has _ctypes built in: no shared object to stand in")
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libnvrtc.so.13", "libnvrtc-builtins.so.13.0"):
        (lib / name).symlink_to(real)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    find = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library",
                        lambda name: "libcuda.so.1" if name == "cuda" else find(name))
    return lib


def test_pip_nvrtc_is_loaded_first_where_a_driver_is(monkeypatch, fresh_status, tmp_path):
    """On a CUDA machine with the pip nvrtc, dkern loads it into the global scope before
    KeOps compiles, and its KeOps check child does the same (the libraries as arguments)."""
    lib = _fake_pip_nvrtc(tmp_path, monkeypatch)
    pinned = select.pin_pip_nvrtc()
    assert pinned == f"{lib / 'libnvrtc-builtins.so.13.0'}:{lib / 'libnvrtc.so.13'}"
    monkeypatch.setattr(select, "_PINNED", pinned)
    # (importing pykeops here, under the patched sys.path, would lose its build folder)
    monkeypatch.setattr(select, "gpu_visible", lambda: False)
    monkeypatch.setattr(select, "_KEOPS_CHECK",
                        "import sys; assert sys.argv[1:] == " + repr(pinned.split(":"))
                        + "; print('2.3')")
    status = select.keops_status()
    assert status.available and status.detail.endswith("(pip's libnvrtc loaded first)")
    monkeypatch.setenv("DKERN_PIN_NVRTC", "0")
    assert select.pin_pip_nvrtc() is None


def test_without_a_cuda_driver_no_nvrtc_is_loaded(monkeypatch, tmp_path):
    import ctypes.util

    _fake_pip_nvrtc(tmp_path, monkeypatch)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    loaded = []
    monkeypatch.setattr(select.ctypes, "CDLL", lambda *a, **k: loaded.append(a))
    assert select.pin_pip_nvrtc() is None and loaded == []


def test_a_failing_keops_check_names_the_error(monkeypatch, fresh_status):
    monkeypatch.setattr(select, "_KEOPS_CHECK", "raise ImportError('no module named pykeops')")
    status = select.keops_status()
    assert not status.available and "ImportError: no module named pykeops" in status.detail


def test_explicit_keops_unavailable_raises_with_fix(monkeypatch):
    monkeypatch.setattr(select, "keops_status",
                        lambda: BackendStatus("keops", False, "KeOps check compile crashed"))
    with pytest.raises(BackendUnavailableError, match="backend='numpy' or 'auto'"):
        resolve_backend("keops")


def test_auto_falls_back_to_numpy_when_gpu_keops_is_broken(monkeypatch, caplog):
    monkeypatch.setattr(select, "gpu_visible", lambda: True)
    monkeypatch.setattr(select, "keops_status",
                        lambda: BackendStatus("keops", False, "KeOps check compile crashed"))
    with caplog.at_level("INFO", logger="dkern.backends.select"):
        assert resolve_backend("auto") == "numpy"
    assert "KeOps does not work" in caplog.text


def test_auto_on_a_cpu_machine_is_numpy(monkeypatch):
    monkeypatch.setattr(select, "gpu_visible", lambda: False)
    assert resolve_backend("auto") == "numpy"


def _lock_is_free(lock_file: str) -> bool:
    """Whether another process could take the KeOps compile lock ``lock_file`` right now."""
    import subprocess
    import sys

    probe = ("import fcntl, sys; f = open(sys.argv[1], 'a')\n"
             "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except OSError: sys.exit(1)")
    return subprocess.run([sys.executable, "-c", probe, lock_file]).returncode == 0


def test_first_keops_call_of_a_formula_holds_the_machine_wide_lock(monkeypatch, tmp_path):
    from dkern.backends import keops_backend

    # A private lock file: under pytest-xdist another worker's real first compile may
    # hold the machine-wide one at any moment.
    lock_file = str(tmp_path / "keops-compile.lock")
    monkeypatch.setattr(keops_backend, "LOCK_FILE", lock_file)
    key = ("test-formula", 3, 1, "<f8")
    with keops_backend._first_call_locked(key):
        assert not _lock_is_free(lock_file)  # first call: other processes wait for the compile
    assert _lock_is_free(lock_file)
    with keops_backend._first_call_locked(key):
        assert _lock_is_free(lock_file)  # compiled here already: no lock, no serialisation


# ------------------------------------------------------------------------- the block seam

def test_every_backend_implements_the_block_protocol():
    for blocks in (NumpyBlocks(), KeopsBlocks()):
        assert isinstance(blocks, BlockBackend)
    methods = {"kernel_matvec", "normal_matvec", "kernel_block", "kernel_diag",
               "weighted_log_sums", "nearest"}
    assert methods <= set(dir(BlockBackend))


@pytest.fixture
def keops_reductions(monkeypatch):
    """The KeOps reductions run while the test runs, by name: proof that KeOps did the work
    (every LazyTensor reduction of dkern's KeOps blocks goes through this one method)."""
    from pykeops.common.lazy_tensor import GenericLazyTensor

    ran: list[str] = []
    reduction = GenericLazyTensor.reduction

    def spy(self, reduction_op, *args, **kwargs):
        ran.append(reduction_op)
        return reduction(self, reduction_op, *args, **kwargs)

    monkeypatch.setattr(GenericLazyTensor, "reduction", spy)
    return ran


@pytest.fixture(scope="module")
def diabetes():
    data = load_diabetes()
    X = data.data[:, [2, 3, 8]]
    return (X - X.mean(0)) / X.std(0), (data.target - data.target.mean()) / data.target.std()


def _both(make, call):
    """``call(make(backend))`` for numpy and keops."""
    return [call(make(backend)) for backend in ("numpy", "keops")]


@pytest.mark.keops
def test_keops_kde_equals_numpy(diabetes, keops_reductions, sync_scheduler):
    X, _ = diabetes
    train = da.from_array(X[:300], chunks=(70, -1))  # five chunks: merged across them
    numpy, keops = _both(lambda b: dkern.KernelDensity(bandwidth=0.35, backend=b).fit(train),
                         lambda m: m.score_samples(X[300:]))
    np.testing.assert_allclose(keops, numpy, rtol=0, atol=1e-9)
    assert keops_reductions.count("Max_SumShiftExpWeight") == 5  # one per training chunk


@pytest.mark.keops
def test_keops_nadaraya_watson_equals_numpy_with_ard(diabetes, keops_reductions,
                                                     sync_scheduler):
    X, y = diabetes
    kernel = Gaussian([0.5, 1.0, 2.0])
    train = da.from_array(X[:300], chunks=(70, -1))
    numpy, keops = _both(
        lambda b: dkern.NadarayaWatson(kernel, bandwidth=0.4, backend=b).fit(train, y[:300]),
        lambda m: m.predict(X[300:]))
    np.testing.assert_allclose(keops, numpy, rtol=0, atol=1e-9)
    assert keops_reductions.count("Max_SumShiftExpWeight") == 5


@pytest.mark.keops
def test_keops_neighbours_equal_numpy_with_exact_ties(keops_reductions, sync_scheduler):
    X = load_digits().data.astype(np.float64)
    train, queries = da.from_array(X[:1500], chunks=(150, -1)), X[1500:]
    (d_np, i_np), (d_ko, i_ko) = _both(
        lambda b: dkern.KNeighborsRegressor(5, backend=b).fit(train, np.zeros(1500)),
        lambda m: m.kneighbors(queries))
    assert i_ko.dtype == i_np.dtype == np.int64
    np.testing.assert_array_equal(i_ko, i_np)
    np.testing.assert_allclose(d_ko, d_np, rtol=1e-9, atol=0)
    sq = ((queries[:, None, :] - X[None, :1500]) ** 2).sum(-1)  # integers: exact
    kth = np.sort(sq, axis=1)[:, 4:6]
    assert (kth[:, 0] == kth[:, 1]).any()  # the 5th and 6th tie somewhere: the rule matters
    assert keops_reductions.count("KMin_ArgKMin") == 10  # one per training chunk


@pytest.mark.keops
def test_keops_classifier_predictions_equal_numpy(keops_reductions, sync_scheduler):
    digits = load_digits()
    X, y = digits.data.astype(np.float64), digits.target
    numpy, keops = _both(
        lambda b: dkern.KNeighborsClassifier(5, weights="distance", backend=b).fit(
            X[:1500], y[:1500]),
        lambda m: m.predict_proba(X[1500:]))
    np.testing.assert_allclose(keops, numpy, rtol=1e-12, atol=0)
    assert keops_reductions.count("KMin_ArgKMin") > 0


@pytest.mark.keops
def test_kernels_without_keops_log_form_fall_back_to_numpy_logged_once(
        diabetes, keops_reductions, monkeypatch, caplog, sync_scheduler):
    X, y = diabetes
    monkeypatch.setattr(keops_backend, "_logged", set())
    train = da.from_array(X[:300], chunks=(70, -1))
    models = {"box": lambda b: dkern.KernelDensity("box", bandwidth=0.8, backend=b).fit(train),
              "Laplacian": lambda b: dkern.NadarayaWatson(Laplacian(1.5), backend=b).fit(
                  train, y[:300])}
    run = {"box": lambda m: m.score_samples(X[300:]), "Laplacian": lambda m: m.predict(X[300:])}
    with caplog.at_level(logging.INFO, logger="dkern.backends.keops_backend"):
        for name, make in models.items():
            numpy, keops = _both(make, run[name])
            np.testing.assert_array_equal(keops, numpy)
            np.testing.assert_array_equal(run[name](make("keops")), numpy)  # once more
    said = [r.getMessage() for r in caplog.records if "run with numpy" in r.getMessage()]
    assert len(said) == 2, said  # ten blocks, two passes each: one message per reason
    assert all("kernel smoothing sums" in line for line in said)
    assert "box kernel" in said[0] and "Laplacian kernel has no KeOps log form" in said[1]
    assert keops_reductions == []


def test_an_unknown_backend_is_refused_by_fit(diabetes):
    X, y = diabetes
    for model in (dkern.KernelDensity(backend="gpu"), dkern.NadarayaWatson(backend="gpu"),
                  dkern.KNeighborsRegressor(backend="gpu")):
        with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'numpy', "
                                             r"'keops', 'triton'\); got 'gpu'"):
            model.fit(X, y)
