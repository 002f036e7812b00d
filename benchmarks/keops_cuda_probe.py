#!/usr/bin/env python3
"""Probe why pykeops/keopscore crash on a CUDA 13 GPU machine, and try fixes.

Run on the GPU machine (pykeops + keopscore importable, e.g. PYTHONPATH=/tmp/site):

    PYTHONUNBUFFERED=1 python3 benchmarks/keops_cuda_probe.py

What it does, all within ~4 minutes (KEOPS_PROBE_BUDGET seconds, default 225):

1. Prints facts (GPU/driver, the libnvrtc / libnvrtc-builtins / libcudart /
   libcuda files on the machine and which ones ctypes.find_library picks, the
   CUDA header folders and whether they hold nvrtc.h, cuda_fp16.h and
   nv/target, environment variables, keopscore's detected configuration).
   The parent process never loads a CUDA library itself.
2. Runs every attempt in its own subprocess (``python -X faulthandler``), all
   attempts in parallel, each with its own fresh KEOPS_CACHE_FOLDER and a
   timeout. A keops attempt runs the Gaussian example
   ``Sum_j Exp(-Sum((a_i-b_j)**2)) * c_j`` on 1000 x 500 float32 points and
   checks it against numpy to 1e-4. The child prints ``PROBE_STAGE`` markers
   (python codegen, nvrtc Compile, module load, kernel launch) so the table
   shows where a crash happened; faulthandler prints the Python frame.
   "nvrtc_direct" attempts bypass keops: they compile and launch a small
   Gaussian kernel with ctypes through each libnvrtc found (driver loaded).
3. If a keops attempt died by a signal, re-runs it under cuda-gdb (when
   present) on the same cache folder to get a native backtrace.
4. Prints a table (attempt, outcome, seconds, last stage) and writes
   keops_probe.json and keops_probe_logs.txt into $OUT (or /tmp).

Extra nvrtc builds to try (for example an unpacked CUDA 12 nvrtc) can be
named with KEOPS_PROBE_EXTRA_NVRTC=dir1:dir2, each dir holding libnvrtc.so.N
and its libnvrtc-builtins; a nvrtc.h in dir/../include is used when present.
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

T0 = time.time()
BUDGET = float(os.environ.get("KEOPS_PROBE_BUDGET", "225"))
ATTEMPT_TIMEOUT = float(os.environ.get("KEOPS_PROBE_TIMEOUT", "120"))
M_POINTS, N_POINTS, DIM = 1000, 500, 3
TOL = 1e-4
HERE = os.path.abspath(__file__)


def elapsed():
    return time.time() - T0


# ---------------------------------------------------------------------------
# Child side
# ---------------------------------------------------------------------------


def _stage(name, extra=""):
    print(f"\nPROBE_STAGE {name} t={elapsed():.1f}s {extra}", flush=True)


def _mapped_libs(pattern=r"nvrtc|libcuda|cudart|cccl"):
    out = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and re.search(pattern, parts[-1]):
                    out.add(parts[-1])
    except OSError:
        pass
    return sorted(out)


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    a = (0.6 * rng.random((M_POINTS, DIM))).astype(np.float32)
    b = (0.6 * rng.random((N_POINTS, DIM))).astype(np.float32)
    c = rng.random((N_POINTS, 1)).astype(np.float32)
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    d2 = ((a64[:, None, :] - b64[None, :, :]) ** 2).sum(-1)
    ref = np.exp(-d2) @ c64
    return a, b, c, ref


def _check(out, ref):
    import numpy as np

    out = np.asarray(out, dtype=np.float64).reshape(ref.shape)
    err = float(np.max(np.abs(out - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
    return err <= TOL, err


def _patch_find_library(overrides):
    if not overrides:
        return
    import ctypes.util

    orig = ctypes.util.find_library

    def find_library(name):
        if name in overrides:
            return overrides[name]
        return orig(name)

    ctypes.util.find_library = find_library
    print(f"PROBE_NOTE find_library overrides: {overrides}", flush=True)


def _instrument_keops():
    """Wrap keops internals to print stage markers (no behaviour change)."""
    try:
        from keopscore.binders.LinkCompile import LinkCompile

        orig_write = LinkCompile.write_code

        def write_code(self):
            orig_write(self)
            _stage(
                "nvrtc_Compile",
                "(python codegen done, calling nvrtc_jit Compile -> "
                f"{getattr(self, 'gencode_file', '?')}) "
                f"maps={_mapped_libs()}",
            )

        LinkCompile.write_code = write_code

        orig_get = LinkCompile.get_dll_and_params

        def get_dll_and_params(self):
            _stage("codegen", f"({type(self).__name__})")
            r = orig_get(self)
            _stage("codegen_done", "(nvrtc Compile returned, binary written)")
            return r

        LinkCompile.get_dll_and_params = get_dll_and_params
    except Exception as e:  # pragma: no cover - depends on keops version
        print(f"PROBE_NOTE could not instrument LinkCompile: {e!r}", flush=True)
    try:
        from pykeops.common.keops_io.LoadKeOps_nvrtc import LoadKeOps_nvrtc_class as L

        orig_p2 = L.init_phase2

        def init_phase2(self):
            _stage("module_load", "(import pykeops_nvrtc, KeOps_module ctor: cuModuleLoadDataEx)")
            r = orig_p2(self)
            _stage("module_loaded")
            return r

        L.init_phase2 = init_phase2
        orig_call = L.call_keops

        def call_keops(self, nx, ny):
            _stage("launch", f"(nx={nx}, ny={ny})")
            r = orig_call(self, nx, ny)
            _stage("launch_done")
            return r

        L.call_keops = call_keops
    except Exception as e:
        print(f"PROBE_NOTE could not instrument LoadKeOps_nvrtc: {e!r}", flush=True)


def _keops_config_dump():
    info = {}
    try:
        import keopscore
        from keopscore.config import config, cuda_config

        info["keopscore_version"] = getattr(keopscore, "__version__", "?")
        info["keopscore_file"] = keopscore.__file__
        for k in (
            "_use_cuda",
            "libcuda_folder",
            "libnvrtc_folder",
            "cuda_include_path",
            "cuda_version",
            "n_gpus",
            "gpu_compile_flags",
            "nvrtc_flags",
            "cuda_block_size",
            "cuda_message",
            "cxx_compiler",
        ):
            if hasattr(cuda_config, k):
                info["cuda_config." + k] = getattr(cuda_config, k)
        for getter in ("get_build_folder", "get_cpp_flags", "get_cxx_compiler"):
            try:
                info["config." + getter] = getattr(config, getter)()
            except Exception as e:
                info["config." + getter] = repr(e)
        if getattr(cuda_config, "_use_cuda", False):
            try:
                import keopscore.binders.nvrtc.Gpu_link_compile as G

                info["Gpu_link_compile.nvrtc_include"] = G.nvrtc_include
                info["Gpu_link_compile.low_level_code_prefix"] = (
                    G.Gpu_link_compile.low_level_code_prefix
                )
                info["Gpu_link_compile.jit_compile_dll"] = G.jit_compile_dll()
                info["Gpu_link_compile.jit_compile_dll_exists"] = os.path.exists(
                    G.jit_compile_dll()
                )
                info["Gpu_link_compile.compile_command"] = G.Gpu_link_compile.get_compile_command(
                    sourcename=G.jit_compile_src, dllname=G.jit_compile_dll()
                )
            except Exception as e:
                info["Gpu_link_compile"] = repr(e)
    except Exception as e:
        info["error"] = repr(e)
    info["mapped_libs"] = _mapped_libs()
    return info


def child_keops(cfg):
    import faulthandler

    faulthandler.dump_traceback_later(max(5.0, cfg.get("timeout", 120) - 8), exit=True)
    _stage("start", f"python={sys.version.split()[0]}")
    _patch_find_library(cfg.get("find_library"))
    for p in cfg.get("preload", []):
        import ctypes

        ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        print(f"PROBE_NOTE preloaded {p}", flush=True)
    if cfg.get("torch_first"):
        _stage("import_torch")
        import torch

        print(
            f"PROBE_NOTE torch {torch.__version__} cuda={torch.version.cuda} "
            f"available={torch.cuda.is_available()}",
            flush=True,
        )
        torch.zeros(1, device="cuda")  # create the primary context first
    _stage("import_keopscore", "(config detection + nvrtc_jit compile)")
    import keopscore  # noqa: F401

    if cfg.get("force_ptx"):
        from keopscore.binders.nvrtc import Gpu_link_compile as G

        G.Gpu_link_compile.low_level_code_prefix = "ptx_"
        if os.path.exists(G.jit_compile_dll()):
            os.remove(G.jit_compile_dll())
        G.Gpu_link_compile.compile_jit_compile_dll()
        print("PROBE_NOTE forced PTX mode and recompiled nvrtc_jit", flush=True)
    _stage("import_pykeops", "(pykeops_nvrtc binder compile)")
    import pykeops

    _instrument_keops()
    cfgdump = _keops_config_dump()
    print("PROBE_CONFIG " + json.dumps(cfgdump, default=str), flush=True)
    backend = cfg.get("backend", "GPU")
    a, b, c, ref = _data()
    formula = "Exp(-Sum((a-b)**2)) * c"
    aliases = [f"a = Vi({DIM})", f"b = Vj({DIM})", "c = Vj(1)"]
    if cfg.get("torch_first"):
        import torch
        from pykeops.torch import Genred

        g = Genred(formula, aliases, reduction_op="Sum", axis=1)
        ta, tb, tc = (torch.from_numpy(x).cuda() for x in (a, b, c))
        _stage("first_call")
        out = g(ta, tb, tc, backend=backend).cpu().numpy()
    else:
        from pykeops.numpy import Genred

        g = Genred(formula, aliases, reduction_op="Sum", axis=1, dtype="float32")
        _stage("first_call")
        out = g(a, b, c, backend=backend)
    ok, err = _check(out, ref)
    _stage("checked", f"ok={ok} relerr={err:.3e}")
    print(
        "PROBE_RESULT " + json.dumps({"ok": ok, "relerr": err, "pykeops": pykeops.__version__}),
        flush=True,
    )
    faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 3


_KERNEL_SRC = r"""
extern "C" __global__ void gauss(int M, int N, const float *x, const float *y,
                                 const float *c, float *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= M) return;
  float s = 0.0f;
  for (int j = 0; j < N; j++) {
    float d = 0.0f;
    for (int k = 0; k < 3; k++) {
      float t = x[i * 3 + k] - y[j * 3 + k];
      d += t * t;
    }
    s += expf(-d) * c[j];
  }
  out[i] = s;
}
"""


def child_nvrtc_direct(cfg):
    """Compile + launch a small kernel through one libnvrtc, using ctypes only."""
    import ctypes
    import faulthandler
    from ctypes import byref, c_char_p, c_int, c_size_t, c_uint64, c_void_p

    faulthandler.dump_traceback_later(max(5.0, cfg.get("timeout", 60) - 5), exit=True)
    _stage("start")
    src = _KERNEL_SRC
    if cfg.get("src_file"):
        with open(cfg["src_file"]) as f:
            src = f.read()
    if cfg.get("no_driver"):
        # compile only, without the driver loaded first (nvrtc may still dlopen it itself)
        nv = ctypes.CDLL(cfg["lib"], mode=ctypes.RTLD_GLOBAL)
        v1, v2 = c_int(), c_int()
        nv.nvrtcVersion(byref(v1), byref(v2))
        prog = c_void_p()
        nv.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(c_void_p),
            c_char_p,
            c_char_p,
            c_int,
            c_void_p,
            c_void_p,
        ]
        nv.nvrtcCreateProgram(byref(prog), src.encode(), b"gauss.cu", 0, None, None)
        opts_l = [cfg.get("arch", "-arch=sm_90").encode(), b"-use_fast_math"]
        opts = (c_char_p * len(opts_l))(*opts_l)
        nv.nvrtcCompileProgram.argtypes = [c_void_p, c_int, c_void_p]
        _stage("nvrtcCompileProgram", "(no driver loaded beforehand)")
        r = nv.nvrtcCompileProgram(prog, len(opts_l), opts)
        builtins = [p for p in _mapped_libs() if "builtins" in p]
        print(
            f"PROBE_NOTE compile result {r}, nvrtc {v1.value}.{v2.value}, "
            f"builtins mapped: {builtins}, "
            f"mapped: {_mapped_libs()}",
            flush=True,
        )
        print("PROBE_RESULT " + json.dumps({"ok": r == 0, "compile_result": r}), flush=True)
        faulthandler.cancel_dump_traceback_later()
        return 0 if r == 0 else 4
    cu = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)

    def chk(name, r):
        if r != 0:
            msg = c_char_p()
            try:
                cu.cuGetErrorName(r, byref(msg))
            except Exception:
                pass
            raise RuntimeError(f"{name} failed: {r} {msg.value}")

    chk("cuInit", cu.cuInit(0))
    drv = c_int()
    cu.cuDriverGetVersion(byref(drv))
    dev = c_int()
    chk("cuDeviceGet", cu.cuDeviceGet(byref(dev), 0))
    maj, mnr = c_int(), c_int()
    chk("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(byref(maj), 75, dev))
    chk("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(byref(mnr), 76, dev))
    print(
        f"PROBE_NOTE driver API version {drv.value}, device cc {maj.value}.{mnr.value}", flush=True
    )
    for p in cfg.get("preload", []):
        ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
    nv = ctypes.CDLL(cfg["lib"], mode=ctypes.RTLD_GLOBAL)
    v1, v2 = c_int(), c_int()
    nv.nvrtcVersion(byref(v1), byref(v2))
    print(f"PROBE_NOTE nvrtcVersion {v1.value}.{v2.value} from {cfg['lib']}", flush=True)
    nv.nvrtcGetErrorString.restype = c_char_p
    prog = c_void_p()
    nv.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(c_void_p),
        c_char_p,
        c_char_p,
        c_int,
        c_void_p,
        c_void_p,
    ]
    # keops passes name=NULL and numHeaders=0; do the same when replaying keops' own source
    name = None if cfg.get("src_file") else b"gauss.cu"
    r = nv.nvrtcCreateProgram(byref(prog), src.encode(), name, 0, None, None)
    if r:
        raise RuntimeError(f"nvrtcCreateProgram {r}")
    kind = cfg.get("target", "cubin")
    arch = f"-arch={'sm' if kind == 'cubin' else 'compute'}_{maj.value}{mnr.value}"
    opts_l = [arch.encode(), b"-use_fast_math"]
    opts = (c_char_p * len(opts_l))(*opts_l)
    nv.nvrtcCompileProgram.argtypes = [c_void_p, c_int, c_void_p]
    _stage("nvrtcCompileProgram", arch)
    r = nv.nvrtcCompileProgram(prog, len(opts_l), opts)
    n = c_size_t()
    nv.nvrtcGetProgramLogSize(prog, byref(n))
    logbuf = ctypes.create_string_buffer(n.value + 1)
    nv.nvrtcGetProgramLog(prog, logbuf)
    builtins = [p for p in _mapped_libs() if "builtins" in p]
    print(
        f"PROBE_NOTE compile result {r} ({nv.nvrtcGetErrorString(r)}) builtins mapped: {builtins}",
        flush=True,
    )
    print(f"PROBE_NOTE mapped: {_mapped_libs()}", flush=True)
    if logbuf.value.strip():
        print("PROBE_NOTE nvrtc log: " + logbuf.value.decode(errors="replace")[:1500], flush=True)
    if r:
        raise RuntimeError(f"nvrtcCompileProgram returned {r}")
    if cfg.get("compile_only"):
        print("PROBE_RESULT " + json.dumps({"ok": True, "compile_result": r}), flush=True)
        faulthandler.cancel_dump_traceback_later()
        return 0
    get_size = nv.nvrtcGetCUBINSize if kind == "cubin" else nv.nvrtcGetPTXSize
    get = nv.nvrtcGetCUBIN if kind == "cubin" else nv.nvrtcGetPTX
    size = c_size_t()
    get_size(prog, byref(size))
    img = ctypes.create_string_buffer(size.value)
    get(prog, img)
    _stage("module_load", f"{kind} {size.value} bytes")
    ctx = c_void_p()
    chk("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(byref(ctx), dev))
    chk("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    mod, fn = c_void_p(), c_void_p()
    chk("cuModuleLoadData", cu.cuModuleLoadData(byref(mod), img))
    chk("cuModuleGetFunction", cu.cuModuleGetFunction(byref(fn), mod, b"gauss"))
    a, b, c, ref = _data()
    out = __import__("numpy").zeros((M_POINTS,), dtype="float32")
    ptrs = []
    for arr in (a, b, c, out):
        d = c_uint64()
        chk("cuMemAlloc_v2", cu.cuMemAlloc_v2(byref(d), c_size_t(arr.nbytes)))
        chk(
            "cuMemcpyHtoD_v2",
            cu.cuMemcpyHtoD_v2(d, arr.ctypes.data_as(c_void_p), c_size_t(arr.nbytes)),
        )
        ptrs.append(d)
    Mi, Ni = c_int(M_POINTS), c_int(N_POINTS)
    args = [Mi, Ni] + ptrs
    params = (c_void_p * len(args))(*[ctypes.cast(byref(x), c_void_p) for x in args])
    _stage("launch")
    block = 128
    grid = (M_POINTS + block - 1) // block
    cu.cuLaunchKernel.argtypes = [c_void_p] + [ctypes.c_uint] * 7 + [c_void_p, c_void_p, c_void_p]
    chk("cuLaunchKernel", cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, params, None))
    chk("cuCtxSynchronize", cu.cuCtxSynchronize())
    chk(
        "cuMemcpyDtoH_v2",
        cu.cuMemcpyDtoH_v2(out.ctypes.data_as(c_void_p), ptrs[3], c_size_t(out.nbytes)),
    )
    ok, err = _check(out.reshape(-1, 1), ref)
    print(
        "PROBE_RESULT " + json.dumps({"ok": ok, "relerr": err, "nvrtc": f"{v1.value}.{v2.value}"}),
        flush=True,
    )
    faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 3


def child_libversions(cfg):
    """Load candidate libs by path and print their versions (no device work)."""
    import ctypes
    from ctypes import byref, c_int

    res = {}
    # (library kind, its version function, how to name the version it reports)
    probes = [("nvrtc", "nvrtcVersion", 2, "nvrtc {}.{}"),
              ("cudart", "cudaRuntimeGetVersion", 1, "cudart {}"),
              ("cuda", "cuDriverGetVersion", 1, "driver API {}")]
    for kind, function, outputs, label in probes:
        for path in cfg.get(kind, []):
            try:
                values = [c_int() for _ in range(outputs)]
                getattr(ctypes.CDLL(path), function)(*(byref(v) for v in values))
                res[path] = label.format(*(v.value for v in values))
            except Exception as e:
                res[path] = repr(e)
    print("PROBE_RESULT " + json.dumps(res), flush=True)
    return 0


def child_config(cfg):
    import faulthandler

    faulthandler.dump_traceback_later(max(5.0, cfg.get("timeout", 60) - 5), exit=True)
    _patch_find_library(cfg.get("find_library"))
    import keopscore  # noqa: F401

    print("PROBE_RESULT " + json.dumps(_keops_config_dump(), default=str), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0


def child_main(cfg):
    mode = cfg["mode"]
    fn = {
        "keops": child_keops,
        "nvrtc_direct": child_nvrtc_direct,
        "libversions": child_libversions,
        "config": child_config,
    }[mode]
    return fn(cfg)


# ---------------------------------------------------------------------------
# Parent side: facts
# ---------------------------------------------------------------------------


def sh(cmd, timeout=20):
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired:
        return f"(timed out after {timeout}s)"
    except Exception as e:
        return f"({e!r})"


def ldconfig_map():
    out = {}
    for line in sh("ldconfig -p", 10).splitlines():
        m = re.match(r"\s*(\S+)\s+\((.*?)\)\s+=>\s+(\S+)", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(3))
    return out


def site_dirs():
    dirs = set()
    for p in sys.path:
        if p.endswith("site-packages") or p.endswith("dist-packages") or p == "/tmp/site":
            dirs.add(p)
    for p in glob.glob("/opt/*/.venv/lib/python3*/site-packages") + glob.glob(
        sys.prefix + "/lib/python3*/site-packages"
    ):
        dirs.add(p)
    return sorted(d for d in dirs if os.path.isdir(d))


def find_files():
    """Look for the CUDA libs and headers that matter, in likely places."""
    roots = [
        "/usr/local",
        "/usr/lib",
        "/usr/lib64",
        "/usr/include",
        "/opt",
        "/lib",
        "/tmp/site",
        os.path.expanduser("~"),
    ]
    for d in site_dirs():
        roots.append(os.path.join(d, "nvidia"))
    for var in ("LD_LIBRARY_PATH", "LIBRARY_PATH", "CUDA_PATH", "CUDA_HOME"):
        roots += [d for d in os.environ.get(var, "").split(":") if d]
    roots = [r for r in dict.fromkeys(roots) if os.path.isdir(r)]
    names = [
        "libnvrtc.so*",
        "libnvrtc.alt.so*",
        "libnvrtc-builtins*.so*",
        "libcudart.so*",
        "libcuda.so*",
        "nvrtc.h",
        "cuda.h",
        "cuda_fp16.h",
    ]
    expr = " -o ".join(f"-name '{n}'" for n in names)
    prune = "\\( -path '*/site-packages/torch' -o -path '*/site-packages/jax*' \\) -prune"
    cmd = f"find {' '.join(roots)} {prune} -o \\( {expr} \\) -print 2>/dev/null"
    out = sh(cmd, 25)
    files = sorted(set(line for line in out.splitlines() if line.startswith("/")))
    return files


def real(p):
    try:
        return os.path.realpath(p)
    except OSError:
        return p


def collect_facts():
    facts = {}
    facts["python"] = sys.executable + " " + sys.version.split()[0]
    facts["nvidia_smi"] = sh(
        "nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader",
        20,
    )
    facts["nvidia_smi_header"] = "\n".join(sh("nvidia-smi", 20).splitlines()[:4])
    facts["nvcc"] = " | ".join(sh("nvcc --version", 10).splitlines()[-2:])
    facts["gxx"] = (
        sh("g++ --version", 10).splitlines()[0] if shutil.which("g++") else "g++ not found"
    )
    facts["cuda_gdb"] = (
        os.environ.get("KEOPS_PROBE_GDB")
        or shutil.which("cuda-gdb")
        or next(iter(glob.glob("/usr/local/cuda*/bin/cuda-gdb")), None)
        or shutil.which("gdb")
    )
    env_names = [
        "CUDA_PATH",
        "CUDA_HOME",
        "CUDA_ROOT",
        "LD_LIBRARY_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "CPLUS_INCLUDE_PATH",
        "LD_PRELOAD",
        "CXX",
        "CXXFLAGS",
        "PYTHONPATH",
        "KEOPS_CACHE_FOLDER",
        "KEOPS_VERBOSE",
        "CUDA_VISIBLE_DEVICES",
        "CONDA_PREFIX",
        "PATH",
    ]
    facts["env"] = {k: os.environ.get(k) for k in env_names}
    facts["pybind11_includes"] = sh(f"{sys.executable} -m pybind11 --includes", 20)
    import ctypes.util  # lookup only, loads nothing

    facts["find_library"] = {
        n: ctypes.util.find_library(n) for n in ("cuda", "nvrtc", "cudart", "dl")
    }
    ldc = ldconfig_map()
    facts["ldconfig"] = {
        k: v for k, v in ldc.items() if re.match(r"lib(nvrtc|cudart|cuda\.|nvidia-ptxjit)", k)
    }
    files = find_files()
    facts["files"] = files
    # which file each find_library result would resolve to
    resolved = {}
    for n, so in facts["find_library"].items():
        if so:
            cand = ldc.get(so) or [f for f in files if os.path.basename(f) == so]
            resolved[n] = cand
    facts["find_library_resolved"] = resolved
    # headers
    inc = {}
    include_dirs = sorted(
        set(
            os.path.dirname(f) for f in files if f.endswith(("/cuda.h", "/nvrtc.h", "/cuda_fp16.h"))
        )
    )
    for d in include_dirs:
        cuda_h = os.path.join(d, "cuda.h")
        ver = None
        if os.path.isfile(cuda_h):
            m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", open(cuda_h, errors="replace").read())
            ver = m.group(1) if m else None
        if (
            ver is None
            and not os.path.isfile(os.path.join(d, "nvrtc.h"))
            and not os.path.isfile(os.path.join(d, "cuda_fp16.h"))
        ):
            continue  # e.g. /usr/include/linux/cuda.h, not a CUDA toolkit header
        inc[d] = {
            "CUDA_VERSION(cuda.h)": ver,
            "nvrtc.h": os.path.isfile(os.path.join(d, "nvrtc.h")),
            "cuda_fp16.h": os.path.isfile(os.path.join(d, "cuda_fp16.h")),
            "nv/target": os.path.isfile(os.path.join(d, "nv", "target")),
            "cccl/nv/target": os.path.isfile(os.path.join(d, "cccl", "nv", "target")),
        }
    facts["include_dirs"] = inc
    # keops packages (without importing them)
    import importlib.util

    for pkg in ("keopscore", "pykeops"):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.origin:
            d = os.path.dirname(spec.origin)
            vf = os.path.join(d, "keops_version")
            facts[pkg] = f"{open(vf).read().strip() if os.path.isfile(vf) else '?'} at {d}"
        else:
            facts[pkg] = "NOT importable"
    default_cache = os.path.join(
        os.path.expanduser("~"), ".cache", "keops" + facts["keopscore"].split()[0]
    )
    facts["default_cache"] = default_cache
    stale = glob.glob(os.path.join(default_cache, "*", "nvrtc_jit*.so")) + glob.glob(
        os.path.join(default_cache, "*", "pykeops_nvrtc*.so")
    )
    facts["default_cache_files"] = (
        sh("ls -la --time-style=+%F_%T " + " ".join(f"'{p}'" for p in stale), 10) if stale else ""
    )
    # RUNPATH of each libnvrtc (does it find its builtins by itself?)
    facts["readelf_runpath"] = {
        f: sh(f"readelf -d {f} 2>/dev/null | grep -E 'RUNPATH|RPATH|SONAME'", 10)
        for f in files
        if re.search(r"/libnvrtc(\.alt)?\.so", f)
    }
    return facts


def nvrtc_candidates(facts):
    """Distinct libnvrtc.so.N files (by real path), with their builtins and header."""
    cands = []
    seen = set()
    extra = [d for d in os.environ.get("KEOPS_PROBE_EXTRA_NVRTC", "").split(":") if d]
    paths = [f for f in facts["files"] if re.search(r"/libnvrtc\.so\.\d+$", f)]
    for d in extra:
        paths += glob.glob(os.path.join(d, "libnvrtc.so.*"))
    for p in paths:
        if not re.search(r"/libnvrtc\.so\.\d+$", p):
            continue
        rp = real(p)
        if rp in seen or not os.path.isfile(rp):
            continue
        seen.add(rp)
        d = os.path.dirname(p)
        major = p.rsplit(".", 1)[-1]
        builtins = sorted(glob.glob(os.path.join(d, f"libnvrtc-builtins.so.{major}.*")))
        hdr = None
        for h in (
            os.path.join(d, "..", "include", "nvrtc.h"),
            os.path.join(d, "..", "..", "include", "nvrtc.h"),
        ):
            if os.path.isfile(h):
                hdr = os.path.normpath(os.path.dirname(h))
                break
        if "site-packages" in p:
            tag = "pip"
        elif any(p.startswith(x) for x in extra):
            tag = "extra"
        else:
            tag = "sys"
        tag += "_cu" + major
        n = sum(1 for c in cands if c["tag"].startswith(tag))
        if n:
            tag += f"_{n}"
        cands.append(
            {
                "tag": tag,
                "lib": p,
                "real": rp,
                "major": major,
                "dir": d,
                "builtins": builtins,
                "include": hdr,
            }
        )
    return cands


def driver_libcuda(facts):
    ldc = ldconfig_map()
    for p in ldc.get("libcuda.so.1", []):
        if os.path.exists(p):
            return p
    for f in facts["files"]:
        if f.endswith("/libcuda.so.1") and "stubs" not in f:
            return f
    return None


def pick_cudart(facts, major):
    files = [f for f in facts["files"] if re.search(r"/libcudart\.so\.\d+$", f)]
    same = [f for f in files if f.endswith("." + major)]
    pool = same or [f for f in files if f.endswith(".13")] or files
    return pool[0] if pool else None


def build_root(base, cand, facts):
    """A CUDA root whose include/ and lib/ are consistent with one libnvrtc."""
    root = os.path.join(base, "root_" + cand["tag"])
    inc = os.path.join(root, "include")
    lib = os.path.join(root, "lib")
    os.makedirs(inc, exist_ok=True)
    os.makedirs(lib, exist_ok=True)
    inc_dirs = []
    if cand["include"]:
        inc_dirs.append(cand["include"])
    for d, _info in facts["include_dirs"].items():
        if os.path.isfile(os.path.join(d, "cuda.h")):
            inc_dirs.append(d)
    for d in list(inc_dirs):
        if os.path.isdir(os.path.join(d, "cccl")):
            inc_dirs.append(os.path.join(d, "cccl"))
    for d in dict.fromkeys(inc_dirs):
        for name in os.listdir(d):
            dst = os.path.join(inc, name)
            if not os.path.lexists(dst):
                os.symlink(os.path.join(d, name), dst)
    m = cand["major"]
    links = {f"libnvrtc.so.{m}": cand["real"], "libnvrtc.so": cand["real"]}
    for b in cand["builtins"]:
        links[os.path.basename(b)] = real(b)
    cudart = pick_cudart(facts, m)
    if cudart:
        cm = cudart.rsplit(".", 1)[-1]
        links[f"libcudart.so.{cm}"] = real(cudart)
        links["libcudart.so"] = real(cudart)
    drv = driver_libcuda(facts)
    if drv:
        links["libcuda.so"] = real(drv)
    for name, target in links.items():
        dst = os.path.join(lib, name)
        if not os.path.lexists(dst):
            os.symlink(target, dst)
    overrides = {"nvrtc": os.path.join(lib, f"libnvrtc.so.{m}")}
    if cudart:
        overrides["cudart"] = os.path.join(lib, f"libcudart.so.{cudart.rsplit('.', 1)[-1]}")
    env = {
        "CUDA_PATH": root,
        "CUDA_HOME": root,
        "LIBRARY_PATH": lib
        + (":" + os.environ["LIBRARY_PATH"] if os.environ.get("LIBRARY_PATH") else ""),
        "LD_LIBRARY_PATH": lib
        + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else ""),
    }
    ok = all(os.path.exists(os.path.join(inc, h)) for h in ("cuda.h", "nvrtc.h", "cuda_fp16.h"))
    return root, env, overrides, ok


# ---------------------------------------------------------------------------
# Parent side: attempts
# ---------------------------------------------------------------------------


class Attempt:
    def __init__(self, name, cfg, env_extra=None, why="", wrapper=None, cache=None):
        self.name = name
        self.cfg = dict(cfg)
        self.env_extra = env_extra or {}
        self.why = why
        self.wrapper = wrapper
        self.cache = cache
        self.proc = None
        self.t_start = None
        self.seconds = None
        self.rc = None
        self.timed_out = False
        self.out = ""
        self.outcome = "not run"
        self.stage = ""
        self.result = None
        self.config = None
        self.post = ""

    def start(self, base, timeout):
        if self.cache is None:
            self.cache = tempfile.mkdtemp(
                prefix="cache_" + re.sub(r"\W+", "_", self.name) + "_", dir=base
            )
        self.cfg["timeout"] = timeout
        self.timeout = timeout
        env = dict(os.environ)
        env["KEOPS_CACHE_FOLDER"] = self.cache
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        for k, v in self.env_extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        slug = re.sub(r"\W+", "_", self.name)
        cfg_path = os.path.join(base, slug + ".json")
        with open(cfg_path, "w") as f:
            json.dump(self.cfg, f)
        cmd = [sys.executable, "-X", "faulthandler", HERE, "--child", cfg_path]
        if self.wrapper:
            cmd = self.wrapper + cmd
        self.logf = open(os.path.join(base, slug + ".log"), "w+")
        self.t_start = time.time()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=base,
        )

    def poll(self):
        if self.proc is None or self.rc is not None:
            return True
        r = self.proc.poll()
        if r is None and time.time() - self.t_start > self.timeout:
            self.timed_out = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            r = self.proc.wait()
        if r is None:
            return False
        self.rc = r
        self.seconds = time.time() - self.t_start
        self.logf.flush()
        self.logf.seek(0)
        self.out = self.logf.read()
        self.logf.close()
        self.classify()
        return True

    def classify(self):
        stages = re.findall(r"PROBE_STAGE (\S+)", self.out)
        self.stage = stages[-1] if stages else ""
        for line in self.out.splitlines():
            if line.startswith("PROBE_RESULT "):
                try:
                    self.result = json.loads(line[len("PROBE_RESULT ") :])
                except ValueError:
                    pass
            if line.startswith("PROBE_CONFIG "):
                try:
                    self.config = json.loads(line[len("PROBE_CONFIG ") :])
                except ValueError:
                    pass
        if self.timed_out:
            self.outcome = "timeout"
        elif self.rc == 1 and re.search(r"^Timeout \(\d+:\d\d:\d\d\)!", self.out, re.M):
            self.outcome = "timeout (child watchdog, traceback in log)"
        elif self.rc is not None and self.rc < 0:
            try:
                self.outcome = "signal " + signal.Signals(-self.rc).name
            except ValueError:
                self.outcome = f"signal {-self.rc}"
        elif "Segmentation fault" in self.out and self.wrapper:
            self.outcome = "signal SIGSEGV (under debugger)"
        elif self.rc == 0:
            if isinstance(self.result, dict) and self.result.get("ok") is False:
                self.outcome = "wrong result"
            else:
                self.outcome = "ok"
        elif self.rc == 3:
            self.outcome = "wrong result"
        elif self.rc == 4:
            self.outcome = "nvrtc compile failed"
        else:
            errs = re.findall(r"^(\w*(?:Error|Exception)\b.*)$", self.out, re.M)
            self.outcome = "error: " + (errs[-1][:160] if errs else f"rc={self.rc}")

    def note(self):
        if isinstance(self.result, dict) and "relerr" in self.result:
            return f"relerr={self.result['relerr']:.2e}"
        kerr = re.findall(r"\[KeOps\].*(?:error|Error).*", self.out)
        if kerr:
            return kerr[-1][:150]
        nv = re.findall(r"^PROBE_NOTE (compile result.*|nvrtcVersion.*)$", self.out, re.M)
        if nv:
            return nv[-1][:150]
        if self.outcome.startswith("signal"):
            fr = re.findall(r'^\s+File "([^"]+)", line (\d+) in (\S+)', self.out, re.M)
            if fr:
                f, ln, fn = fr[0]  # faulthandler lists the innermost frame first
                return f"crashed in {os.path.basename(f)}:{ln} {fn}"
        return ""


def summarize_build(a):
    """List the cache folder and show how its .so files resolve nvrtc/cuda."""
    lines = []
    others = 0
    for root, _, fs in os.walk(a.cache):
        for f in sorted(fs):
            p = os.path.join(root, f)
            if not (f.endswith(".so") or f.startswith(("cubin_", "ptx_")) or f.endswith(".cu")):
                others += 1
                continue
            try:
                lines.append(f"  {os.path.relpath(p, a.cache)} {os.path.getsize(p)}")
            except OSError:
                pass
            if f.endswith(".so") and ("nvrtc" in f or "pykeops" in f):
                needed = sh(f"readelf -d '{p}' 2>/dev/null | grep -E 'NEEDED|RUNPATH|RPATH'", 10)
                undef = sh(
                    f"nm -D --undefined-only '{p}' 2>/dev/null | grep -cE ' (nvrtc|cu[A-Z])'", 10
                )
                ldd = sh(f"ldd '{p}' 2>&1 | grep -E 'nvrtc|cuda|not found'", 10)
                lines.append(f"    NEEDED/RUNPATH: {needed.replace(chr(10), '; ') or '-'}")
                lines.append(
                    f"    undefined nvrtc*/cu* symbols: {undef}; "
                    f"ldd: {ldd.replace(chr(10), '; ') or '(no nvrtc/cuda deps)'}"
                )
    lines.append(f"  (+{others} other files)")
    return "\n".join(lines[:60])


def run_batch(attempts, base, timeout):
    for a in attempts:
        a.start(base, timeout)
        time.sleep(0.2)
    while True:
        done = [a.poll() for a in attempts]  # poll every attempt, every round
        if all(done):
            break
        time.sleep(0.5)


def tail(text, n=25):
    return "\n".join(text.strip().splitlines()[-n:])


def parent_main():
    out_dir = os.environ.get("OUT") or "/tmp"
    os.makedirs(out_dir, exist_ok=True)
    base = tempfile.mkdtemp(prefix="keops_probe_")
    print(f"== keops CUDA probe (budget {BUDGET:.0f}s, work dir {base})", flush=True)

    facts = collect_facts()
    print("== facts", flush=True)
    for k in (
        "python",
        "nvidia_smi",
        "nvidia_smi_header",
        "nvcc",
        "gxx",
        "cuda_gdb",
        "keopscore",
        "pykeops",
        "pybind11_includes",
        "find_library",
        "find_library_resolved",
        "ldconfig",
        "default_cache",
    ):
        print(f"-- {k}: {facts.get(k)}")
    print("-- env:")
    for k, v in facts["env"].items():
        if v is not None:
            print(f"   {k}={v}")
    print("-- files found:")
    for f in facts["files"]:
        print(f"   {f}" + (f" -> {real(f)}" if os.path.islink(f) else ""))
    print("-- include dirs:")
    for d, info in facts["include_dirs"].items():
        print(f"   {d}: {info}")
    print("-- libnvrtc RUNPATH/SONAME:")
    for f, s in facts["readelf_runpath"].items():
        print(f"   {f}: {s.replace(chr(10), '; ')}")
    if facts["default_cache_files"]:
        print("-- default keops cache contents (stale binaries?):\n" + facts["default_cache_files"])
    print(f"-- facts took {elapsed():.1f}s", flush=True)

    gpu = (
        bool(re.search(r"\S", facts["nvidia_smi"]))
        and "not found" not in facts["nvidia_smi"]
        and "failed" not in facts["nvidia_smi"].lower()
    )
    if not gpu:
        print(
            "!! no GPU visible (nvidia-smi gave no GPU): GPU attempts will fail fast; "
            "CPU attempts still run"
        )

    cands = nvrtc_candidates(facts)
    print("-- libnvrtc candidates:")
    for c in cands:
        print(
            f"   {c['tag']}: {c['lib']} (real {c['real']}), builtins={c['builtins']}, "
            f"nvrtc.h dir={c['include']}"
        )

    # versions of candidate libraries (child: never load CUDA libs in the parent)
    lv_cfg = {
        "mode": "libversions",
        "nvrtc": [c["lib"] for c in cands],
        "cudart": sorted(set(f for f in facts["files"] if re.search(r"/libcudart\.so\.\d+$", f))),
        "cuda": [p for p in [driver_libcuda(facts)] if p],
    }
    lv = Attempt("libversions", lv_cfg, why="versions")
    run_batch([lv], base, 30)
    facts["lib_versions"] = lv.result
    print(
        f"-- library versions: {json.dumps(lv.result, indent=1) if lv.result else tail(lv.out, 8)}",
        flush=True,
    )

    # ------------------------------------------------------------------ attempts
    attempts = []
    gpu_cfg = {"mode": "keops", "backend": "GPU"}
    attempts.append(
        Attempt("keops_config", {"mode": "config"}, why="keopscore's detected config, as-is")
    )
    attempts.append(Attempt("baseline", gpu_cfg, why="environment as-is, fresh cache"))
    attempts.append(
        Attempt(
            "cpu_sanity",
            {"mode": "keops", "backend": "CPU"},
            why="CPU backend: pykeops itself and this probe's machinery",
        )
    )
    for c in cands:
        attempts.append(
            Attempt(
                f"nvrtc_direct[{c['tag']}]",
                {"mode": "nvrtc_direct", "lib": c["lib"]},
                why="ctypes: nvrtc compile + driver load/launch, no keops, env as-is",
            )
        )
        if c["builtins"]:
            ld = {"LD_LIBRARY_PATH": c["dir"] + ":" + os.environ.get("LD_LIBRARY_PATH", "")}
            attempts.append(
                Attempt(
                    f"nvrtc_direct[{c['tag']}]+ldpath",
                    {"mode": "nvrtc_direct", "lib": c["lib"]},
                    env_extra=ld,
                    why="same, with its own builtins on LD_LIBRARY_PATH",
                )
            )
            attempts.append(
                Attempt(
                    f"nvrtc_direct[{c['tag']}]+ldpath+nodrv",
                    {"mode": "nvrtc_direct", "lib": c["lib"], "no_driver": True},
                    env_extra=ld,
                    why="compile only, libcuda not loaded first (does nvrtc<->driver crash?)",
                )
            )
    cccl = [
        os.path.join(d, "cccl")
        for d in facts["include_dirs"]
        if os.path.isdir(os.path.join(d, "cccl"))
    ]
    if cccl:
        attempts.append(
            Attempt(
                "baseline+cccl_include",
                gpu_cfg,
                env_extra={
                    "CPLUS_INCLUDE_PATH": ":".join(
                        cccl + [os.environ.get("CPLUS_INCLUDE_PATH", "")]
                    ).rstrip(":")
                },
                why="CUDA 13 moved CCCL (nv/target) to include/cccl: add it for g++",
            )
        )
    # which candidate does keops pick as-is?
    fl = facts["find_library"].get("nvrtc")
    base_cand = None
    for c in cands:
        if fl and (
            os.path.basename(c["lib"]) == fl
            or c["real"] in [real(p) for p in facts["find_library_resolved"].get("nvrtc", [])]
        ):
            base_cand = c
            break
    if base_cand and base_cand["builtins"]:
        attempts.append(
            Attempt(
                "baseline+ldpath_builtins",
                gpu_cfg,
                env_extra={
                    "LD_LIBRARY_PATH": base_cand["dir"]
                    + ":"
                    + os.environ.get("LD_LIBRARY_PATH", "")
                },
                why=f"LD_LIBRARY_PATH so {base_cand['tag']} finds its own builtins",
            )
        )
        attempts.append(
            Attempt(
                "baseline+LD_PRELOAD",
                gpu_cfg,
                env_extra={
                    "LD_PRELOAD": ":".join(
                        [real(base_cand["builtins"][0]), base_cand["real"]]
                        + ([os.environ["LD_PRELOAD"]] if os.environ.get("LD_PRELOAD") else [])
                    )
                },
                why=f"LD_PRELOAD {base_cand['tag']}'s builtins + libnvrtc",
            )
        )
    first_root = None
    for c in cands:
        root, env, overrides, ok = build_root(base, c, facts)
        if not ok:
            print(f"   (root for {c['tag']} lacks cuda.h/nvrtc.h/cuda_fp16.h: {root})")
        cfg = dict(gpu_cfg, find_library=overrides)
        attempts.append(
            Attempt(
                f"root[{c['tag']}]",
                cfg,
                env_extra=env,
                why=f"consistent CUDA_PATH root: headers + lib + builtins of {c['tag']}",
            )
        )
        if first_root is None and c["major"] == "13":
            first_root = (c, env, overrides)
    if first_root is None and cands:
        c = cands[0]
        _, env, overrides, _ = build_root(base, c, facts)
        first_root = (c, env, overrides)
    if first_root:
        c, env, overrides = first_root
        attempts.append(
            Attempt(
                f"root[{c['tag']}]+ptx",
                dict(gpu_cfg, find_library=overrides, force_ptx=True),
                env_extra=env,
                why="same root, PTX instead of CUBIN (driver JIT)",
            )
        )
        attempts.append(
            Attempt(
                f"root[{c['tag']}]+torch",
                dict(gpu_cfg, find_library=overrides, torch_first=True),
                env_extra=env,
                why="same root, torch imported first, pykeops.torch on cuda tensors",
            )
        )
    attempts.append(
        Attempt(
            "baseline+torch",
            dict(gpu_cfg, torch_first=True),
            why="environment as-is, torch imported first",
        )
    )
    if "nvrtc_jit" in facts["default_cache_files"]:  # binaries left by an earlier run
        attempts.append(
            Attempt(
                "default_cache(stale?)",
                gpu_cfg,
                env_extra={"KEOPS_CACHE_FOLDER": None},
                why="the default ~/.cache/keops folder as found",
                cache=facts["default_cache"],
            )
        )

    only = os.environ.get("KEOPS_PROBE_ONLY")
    if only:
        attempts = [a for a in attempts if re.search(only, a.name)]
    t_left = BUDGET - elapsed()
    timeout = max(20.0, min(ATTEMPT_TIMEOUT, t_left - 75))
    print(
        f"== running {len(attempts)} attempts in parallel (timeout {timeout:.0f}s each)", flush=True
    )
    for a in attempts:
        print(f"   - {a.name}: {a.why}")
    run_batch(attempts, base, timeout)
    for a in attempts:
        if a.name == "default_cache(stale?)":
            a.cache = facts["default_cache"]

    # --------------------------------------------------------------- cuda-gdb
    crashed = [
        a for a in attempts if a.outcome.startswith("signal") and a.cfg.get("mode") == "keops"
    ]
    gdb = facts.get("cuda_gdb")
    t_left = BUDGET - elapsed()
    if crashed and gdb and t_left > 25:
        a0 = crashed[0]
        wrapper = [
            gdb,
            "-q",
            "-batch",
            "-nx",
            "-ex",
            "set pagination off",
            "-ex",
            "set confirm off",
            "-ex",
            "set print thread-events off",
            "-ex",
            "set print inferior-events off",
            "-ex",
            "run",
            "-ex",
            "bt 25",
            "-ex",
            "info registers rip",
            "-ex",
            "x/4i $pc",
            "-ex",
            "info sharedlibrary",
            "-ex",
            "kill",
            "--args",
        ]
        g = Attempt(
            f"cuda-gdb[{a0.name}]",
            a0.cfg,
            env_extra=a0.env_extra,
            wrapper=wrapper,
            cache=a0.cache,
            why="native backtrace of the crash, same cache (binaries reused)",
        )
        phase2 = [g]
        # replay keops' own generated .cu through the same libnvrtc, with ctypes only
        for a in crashed:
            if a.stage != "nvrtc_Compile":
                continue
            cus = glob.glob(os.path.join(a.cache, "*", "*.cu"))
            libs = re.findall(r"'([^']*/libnvrtc[^'/]*\.so[^']*)'", a.out)
            if cus and libs:
                env = dict(a.env_extra)
                env["LD_LIBRARY_PATH"] = ":".join(
                    [os.path.dirname(libs[0])]
                    + [env.get("LD_LIBRARY_PATH") or os.environ.get("LD_LIBRARY_PATH", "")]
                ).rstrip(":")
                phase2.append(
                    Attempt(
                        f"nvrtc_direct[keops .cu of {a.name}]",
                        {
                            "mode": "nvrtc_direct",
                            "lib": libs[0],
                            "src_file": cus[0],
                            "compile_only": True,
                        },
                        env_extra=env,
                        why="keops' generated source, same libnvrtc, no keops binary",
                    )
                )
                break
        print(
            f"== phase 2: {[x.name for x in phase2]} (timeout {min(90, t_left - 8):.0f}s)",
            flush=True,
        )
        run_batch(phase2, base, min(90.0, t_left - 8))
        attempts += phase2
        bt = re.findall(
            r"^(#\d+ .*|Program received signal.*|Thread .* received signal.*|=> .*)$", g.out, re.M
        )
        libs = [
            line
            for line in g.out.splitlines()
            if re.search(r"nvrtc|libcuda|cudart|keops|pykeops", line) and "0x" in line
        ]
        g.post = "\n".join(bt[:40] + ["-- shared libs (nvrtc/cuda/keops):"] + libs[:30])
    elif crashed:
        print(f"== no native backtrace (cuda-gdb={gdb}, time left {t_left:.0f}s)")

    # ----------------------------------------------------------------- report
    log_lines = []
    print("\n== details", flush=True)
    for a in attempts:
        if a.cfg.get("mode") == "keops" and a.cache and os.path.isdir(a.cache) and not a.wrapper:
            a.post = summarize_build(a)
        head = (f"--- {a.name}: {a.outcome} after {a.seconds or 0:.1f}s, "
                f"last stage '{a.stage}' ({a.why})")
        print(head)
        i = a.out.find("Fatal Python error:")
        if i >= 0 and not a.wrapper:
            fh = [
                line
                for line in a.out[i:].splitlines()[:40]
                if line.strip() and not line.startswith("Extension modules")
            ]
            print("    faulthandler:\n      " + "\n      ".join(fh))
        elif (a.outcome != "ok" or a.cfg.get("mode") in ("config",)) and not a.wrapper:
            print("    last lines:\n      " + tail(a.out, 14).replace("\n", "\n      "))
        if a.post:
            print("    " + a.post.replace("\n", "\n    "))
        log_lines += [head, a.out, a.post, ""]

    print("\n== summary")
    rows = [(a.name, a.outcome, f"{a.seconds or 0:.1f}", a.stage, a.note()) for a in attempts]
    w = [
        max(len(r[i]) for r in rows + [("attempt", "outcome", "seconds", "last stage", "note")])
        for i in range(4)
    ]
    w[1] = min(w[1], 60)
    print(
        f"{'attempt':<{w[0]}}  {'outcome':<{w[1]}}  {'seconds':>{w[2]}}  "
        f"{'last stage':<{w[3]}}  note"
    )
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1][: w[1]]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    ok = [
        a.name
        for a in attempts
        if a.outcome == "ok" and a.cfg.get("mode") == "keops" and a.cfg.get("backend") == "GPU"
    ]
    print(f"\nGPU keops attempts that worked: {ok or 'none'}")
    print(f"total {elapsed():.1f}s")

    report = {
        "facts": facts,
        "candidates": cands,
        "attempts": [
            {
                "attempt": a.name,
                "why": a.why,
                "outcome": a.outcome,
                "seconds": round(a.seconds or 0, 1),
                "rc": a.rc,
                "last_stage": a.stage,
                "note": a.note(),
                "result": a.result,
                "keops_config": a.config,
                "env_extra": a.env_extra,
                "cfg": a.cfg,
                "stderr_tail": tail(a.out, 30),
                "post": a.post,
            }
            for a in attempts
        ],
        "gpu_keops_ok": ok,
        "total_seconds": round(elapsed(), 1),
    }
    jpath = os.path.join(out_dir, "keops_probe.json")
    with open(jpath, "w") as f:
        json.dump(report, f, indent=1, default=str)
    lpath = os.path.join(out_dir, "keops_probe_logs.txt")
    with open(lpath, "w") as f:
        f.write("\n".join(s[-30000:] for s in log_lines))
    print(f"wrote {jpath} and {lpath}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        with open(sys.argv[2]) as f:
            sys.exit(child_main(json.load(f)))
    sys.exit(parent_main())
