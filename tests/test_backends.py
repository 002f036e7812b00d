"""Backend selection: the KeOps check survives a crashing KeOps; explicit choices fail clearly."""

import pytest

from dkern.backends import BackendStatus, BackendUnavailableError, resolve_backend, select


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


def _lock_is_free() -> bool:
    """Whether another process could take dkern's KeOps compile lock right now."""
    import subprocess
    import sys

    from dkern.backends.keops_backend import LOCK_FILE

    probe = ("import fcntl, sys; f = open(sys.argv[1], 'a')\n"
             "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except OSError: sys.exit(1)")
    return subprocess.run([sys.executable, "-c", probe, LOCK_FILE]).returncode == 0


def test_first_keops_call_of_a_formula_holds_the_machine_wide_lock():
    from dkern.backends.keops_backend import _first_call_locked

    key = ("test-formula", 3, 1, "<f8")
    with _first_call_locked(key):
        assert not _lock_is_free()  # first call: other processes wait for the compile
    assert _lock_is_free()
    with _first_call_locked(key):
        assert _lock_is_free()  # compiled here already: no lock, no serialisation
