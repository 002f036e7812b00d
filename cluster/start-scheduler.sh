#!/usr/bin/env bash
# Start dkern's Dask scheduler with the project's settings (dkern/runtime/worker.yaml).
#
#   cluster/start-scheduler.sh [--local] [dask scheduler options...]
#
# Multi-node (default): listens on tls://0.0.0.0:$DKERN_PORT with the scheduler certificate
# (DKERN_TLS_DIR from cluster/make-certs.sh, see cluster/TLS.md) and refuses unencrypted
# connections. --local: tcp://127.0.0.1, for one machine. The dashboard binds
# $DKERN_DASHBOARD (default 127.0.0.1:8787: it has no authentication; reach it from
# elsewhere through `ssh -L 8787:127.0.0.1:8787 SCHEDULER_HOST`).
# Environment: DKERN_PORT (8786), DKERN_HOST (0.0.0.0; 127.0.0.1 with --local),
# DKERN_DASHBOARD, DKERN_PYTHON (the Python with dkern installed, default `python`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/_common.sh"
if [ "${1:-}" = "--local" ]; then local_mode=1; shift; fi
tls_args scheduler
if [ "$local_mode" = 1 ]; then protocol=tcp; host="${DKERN_HOST:-127.0.0.1}"
else protocol=tls; host="${DKERN_HOST:-0.0.0.0}"; fi
exec "${dask_scheduler[@]}" --protocol "$protocol" --host "$host" --port "${DKERN_PORT:-8786}" \
    --dashboard-address "${DKERN_DASHBOARD:-127.0.0.1:8787}" "${extra[@]}" "$@"
