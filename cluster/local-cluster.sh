#!/usr/bin/env bash
# A scheduler and two single-threaded workers on localhost, to exercise dkern's remote path.
# Stops everything on Ctrl-C or when the scheduler exits.
set -euo pipefail
port="${DKERN_PORT:-8786}"
dask scheduler --host 127.0.0.1 --port "$port" --dashboard-address 127.0.0.1:8787 &
scheduler=$!
trap 'kill $scheduler ${worker:-} 2>/dev/null || true' EXIT INT TERM
sleep 3
dask worker "tcp://127.0.0.1:$port" --nworkers 2 --nthreads 1 --memory-limit 4GiB &
worker=$!
echo "scheduler at tcp://127.0.0.1:$port; dashboard http://127.0.0.1:8787/status" >&2
wait "$scheduler"
