#!/usr/bin/env bash
# Start this node's dkern workers with the project's settings (dkern/runtime/worker.yaml:
# memory fractions, malloc environment, the trimming preload).
#
#   cluster/start-workers.sh [--local] SCHEDULER_ADDRESS [dask worker options...]
#
# CPU node: one single-threaded worker process per core (dkern's numpy backend runs BLAS
# single-threaded inside each task; the parallelism comes from the tasks). GPU node
# (nvidia-smi lists GPUs): one worker per GPU, each seeing only its own, 2 threads.
# Multi-node (default): TLS with the worker certificate (DKERN_TLS_DIR, see cluster/TLS.md)
# and encryption required. --local: tcp on 127.0.0.1, for one machine.
# Environment: DKERN_NWORKERS (cores, or GPUs), DKERN_MEMORY_LIMIT (per worker; default
# this node's memory / workers), KEOPS_CACHE_FOLDER (default ~/.cache/keops-dkern: a
# node-local directory for compiled KeOps formulas), DKERN_PYTHON.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/_common.sh"
if [ "${1:-}" = "--local" ]; then local_mode=1; shift; fi
[ "$#" -ge 1 ] || { echo "usage: $0 [--local] SCHEDULER_ADDRESS [dask worker options]" >&2; exit 2; }
scheduler=$1; shift
tls_args worker
[ "$local_mode" = 1 ] && extra+=(--host 127.0.0.1)
# Worker dashboards have no authentication either: loopback unless told otherwise.
extra+=(--dashboard-address "${DKERN_WORKER_DASHBOARD:-127.0.0.1:0}")
export KEOPS_CACHE_FOLDER="${KEOPS_CACHE_FOLDER:-$HOME/.cache/keops-dkern}"
memory=(--memory-limit "${DKERN_MEMORY_LIMIT:-auto}")
gpus=0
command -v nvidia-smi >/dev/null && gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
if [ "$gpus" -gt 0 ]; then
    # One process per GPU: each nanny gets CUDA_VISIBLE_DEVICES before its worker starts.
    pids=()
    for ((i = 0; i < ${DKERN_NWORKERS:-$gpus}; i++)); do
        CUDA_VISIBLE_DEVICES=$i "${dask_worker[@]}" "$scheduler" --nworkers 1 --nthreads 2 \
            --name "$(hostname)-gpu$i" "${memory[@]}" "${extra[@]}" "$@" &
        pids+=($!)
    done
    trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
    wait
else
    exec "${dask_worker[@]}" "$scheduler" --nworkers "${DKERN_NWORKERS:-$(nproc)}" --nthreads 1 \
        "${memory[@]}" "${extra[@]}" "$@"
fi
