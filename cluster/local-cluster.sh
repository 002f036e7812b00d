#!/usr/bin/env bash
# A scheduler and two single-threaded workers on 127.0.0.1, started by start-scheduler.sh
# and start-workers.sh (so with dkern's worker settings), to exercise dkern's remote path.
# Stops everything on Ctrl-C or when the scheduler exits.
# Environment: DKERN_PORT (8786), DKERN_DASHBOARD (127.0.0.1:8787), DKERN_NWORKERS (2),
# DKERN_MEMORY_LIMIT (per worker, default 4GiB).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${DKERN_PORT:-8786}"
export DKERN_PORT="$port"
"$here/start-scheduler.sh" --local &
scheduler=$!
trap 'kill $scheduler ${workers:-} 2>/dev/null || true' EXIT INT TERM
DKERN_NWORKERS="${DKERN_NWORKERS:-2}" DKERN_MEMORY_LIMIT="${DKERN_MEMORY_LIMIT:-4GiB}" \
    "$here/start-workers.sh" --local "tcp://127.0.0.1:$port" &
workers=$!
echo "scheduler at tcp://127.0.0.1:$port; dashboard http://${DKERN_DASHBOARD:-127.0.0.1:8787}/status" >&2
wait "$scheduler"
