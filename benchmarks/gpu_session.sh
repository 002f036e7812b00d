#!/usr/bin/env bash
# The GPU checks of one lent GPU machine, in one go (such a machine is lent rarely and briefly,
# and cannot reach a package index): install the carried wheels, record the machine, time the
# Gram matvec (benchmarks/gram.py --gpu), run the Triton tests compiled for the GPU, and probe
# why KeOps crashes there. Each step has its own time limit, so a hang costs only that step.
#
#   bash benchmarks/gpu_session.sh        # in the repo root, with the wheels in .whl/
#
# .whl/ holds what the machine lacks (dask, distributed, zarr and their needs, pykeops and
# keopscore), downloaded for its Python as the workplace's device notes describe.
# Results go to $OUT (default /tmp/gpu-session): the logs and the updated RESULTS.md.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
# KeOps crashes in nvrtc_jit's Compile when the process maps two libnvrtc.so.13 (the CUDA
# toolkit's, which keopscore finds, and the pip package's, which the image's Python loads);
# preloading the pip package's libnvrtc and its builtins made it compile and run
# (benchmarks/keops_cuda_probe.py, RESULTS.md). KEOPS_PRELOAD=0 leaves it out.
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" \
     2>/dev/null)
if [ "${KEOPS_PRELOAD:-1}" = 1 ] && [ -f "$NV/libnvrtc.so.13" ]; then
    export LD_PRELOAD="$NV/libnvrtc-builtins.so.13.0:$NV/libnvrtc.so.13"
fi

{ nvidia-smi; nvcc --version | tail -2
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -m dkern info; } > "$OUT/facts.txt" 2>&1

timeout "${GRAM_S:-240}" python3 benchmarks/gram.py --gpu --n "${N:-1000000}" --dims 3 \
    --repeats 1 --no-cluster --tile-sweep ${SWEEP:-float32} 2>&1 | tee "$OUT/gram.log" | tail -40
cp benchmarks/RESULTS.md "$OUT/"

# the CPU-interpreter tests, compiled for the GPU instead (the first test, which checks
# that the interpreter runs, fails here by design)
TRITON_INTERPRET=0 timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider \
    tests/test_triton.py 2>&1 | tee "$OUT/tests.log" | tail -15

if [ "${PROBE:-1}" = 1 ] && [ -f benchmarks/keops_cuda_probe.py ]; then
    # a cut-down CUDA 12.9 nvrtc (header, lib, builtins), if carried: one more attempt
    for tarball in .whl/nvrtc_cu12_*.tar.xz; do
        [ -f "$tarball" ] && mkdir -p /tmp/nv12 && tar -xJf "$tarball" -C /tmp/nv12 \
            && export KEOPS_PROBE_EXTRA_NVRTC=/tmp/nv12/lib
    done
    KEOPS_PROBE_BUDGET=${PROBE_BUDGET_S:-200} timeout "${PROBE_S:-240}" python3 benchmarks/keops_cuda_probe.py 2>&1 \
        | tee "$OUT/probe.log" | tail -60
fi
