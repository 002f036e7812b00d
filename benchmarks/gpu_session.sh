#!/usr/bin/env bash
# The GPU checks of one lent GPU machine, in one go (such a machine is lent rarely and briefly,
# and cannot reach a package index): install the carried wheels, record the machine, see
# whether KeOps compiles with nothing exported (dkern loads pip's libnvrtc itself), time the
# Gram matvec (benchmarks/gram.py --gpu, Triton's tile sweep first) and Falkon's normal
# product per column split (benchmarks/gpu_splits.py), run the Triton tests
# compiled for the GPU, and run benchmarks/gpu_scale.py (Nyström KRR at 10^7 rows, the sparse
# GP at 10^6) in what is left. Each step has its own time limit inside BUDGET_S, so a hang
# costs only that step.
#
#   bash benchmarks/gpu_session.sh        # in the repo root, with the wheels in .whl/
#   STEPS="tests scale" bash benchmarks/gpu_session.sh   # only these steps (and the facts)
#
# STEPS (default: all of gram, splits, tests, scale) picks the steps after the facts. The
# 2026-11-27 session measured gram and splits; what it could not is scale (RESULTS.md).
#
# .whl/ holds what the machine lacks (dask, distributed, zarr and their needs, pykeops and
# keopscore), downloaded for its Python as the workplace's device notes describe.
# Results go to $OUT (default /tmp/gpu-session): the logs and the updated RESULTS.md.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET_S=${BUDGET_S:-550}
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
# seconds for a step: at most $1, leaving $2 for the steps after it, and never under 10
# (timeout 0 would mean no limit at all)
limit() { local want=$1 have; have=$(( $(left) - ${2:-0} )); have=$(( have < 10 ? 10 : have ))
          echo $(( want < have ? want : have )); }
step() { echo "=== $(date +%T) (+$(( $(date +%s) - START )) s) $*"; }
STEPS=${STEPS:-gram splits tests scale}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD

step facts
{ nvidia-smi; nvcc --version | tail -2
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__, torch.cuda.get_device_name())"
  # no LD_PRELOAD here: does dkern's own libnvrtc load make KeOps compile?
  timeout 120 python3 -m dkern info; } > "$OUT/facts.txt" 2>&1
cat "$OUT/facts.txt"
if ! grep -q '"keops": {"available": true' "$OUT/facts.txt"; then
    # the fallback that worked on the H100: the pip package's libnvrtc preloaded
    NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" \
         2>/dev/null)
    [ -f "$NV/libnvrtc.so.13" ] && export LD_PRELOAD="$NV/libnvrtc-builtins.so.13.0:$NV/libnvrtc.so.13"
    echo "KeOps did not run without LD_PRELOAD; using LD_PRELOAD=${LD_PRELOAD:-none}"
fi

wanted gram && {
step gram
# best of 3: one launch against the operator is a difference of a few per cent
timeout "$(limit "${GRAM_S:-150}" 300)" python3 benchmarks/gram.py --gpu --n "${N:-1000000}" \
    --dims 3 --repeats 3 --no-cluster --no-torch-loop --tile-sweep ${SWEEP:-float32} 2>&1 \
    | tee "$OUT/gram.log" | grep -v "^20..-..-.. " | tail -45
cp benchmarks/RESULTS.md "$OUT/"
}

wanted splits && {
step splits
timeout "$(limit "${SPLITS_S:-60}" 280)" python3 benchmarks/gpu_splits.py 2>&1 \
    | tee "$OUT/splits.log" | grep -v "^20..-..-.. " | tail -20
cp benchmarks/RESULTS.md "$OUT/"
}

wanted tests && {
step triton tests
# the CPU-interpreter tests, compiled for the GPU instead (the one that checks that the
# interpreter runs skips itself there); eight processes share the compiling
TRITON_INTERPRET=0 timeout "$(limit "${TESTS_S:-100}" 200)" python3 -m pytest -q \
    -p no:cacheprovider -n 8 tests/test_triton.py 2>&1 | tee "$OUT/tests.log" | tail -25
}

wanted scale && {
step gpu_scale
SCALE_S=$(limit 400 10)
[ "$SCALE_S" -ge 60 ] || { echo "gpu_scale skipped: ${SCALE_S} s left"; exit 0; }
# Triton first: KeOps' figures are in RESULTS.md since the H200 session (SCALE_BACKENDS)
timeout "$SCALE_S" python3 benchmarks/gpu_scale.py --budget $(( SCALE_S - 15 )) \
    --backend ${SCALE_BACKENDS:-triton keops} 2>&1 \
    | tee "$OUT/scale.log" | grep -v "^20..-..-.. " | tail -60
cp benchmarks/RESULTS.md "$OUT/"
}

step done
