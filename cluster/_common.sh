# Shared by start-scheduler.sh and start-workers.sh (sourced, not run).
#
# DASK_CONFIG: dkern's worker settings (dkern/runtime/worker.yaml), found through the Python
# that runs dask, so the file always matches the installed dkern.
python="${DKERN_PYTHON:-python}"
DASK_CONFIG="$("$python" -m dkern.runtime)" || {
    echo "$0: '$python -m dkern.runtime' failed: install dkern in this environment" \
         "(pip install dkern, or pip install -e . in the repository), or set DKERN_PYTHON" >&2
    exit 1
}
export DASK_CONFIG
# distributed's nanny prefers a variable already in the environment to the file's
# pre-spawn-environ: drop inherited malloc settings so the file's apply.
unset MALLOC_TRIM_THRESHOLD_ MALLOC_MMAP_THRESHOLD_
dask_scheduler=("$python" -m distributed.cli.dask_scheduler)
dask_worker=("$python" -m distributed.cli.dask_worker)

local_mode=0
extra=()

# tls_args ROLE: with --local nothing; otherwise TLS with the ROLE's certificate (files of
# cluster/make-certs.sh in $DKERN_TLS_DIR, or each path given on its own) and every
# connection required to be encrypted.
tls_args() {
    local role=$1 dir="${DKERN_TLS_DIR:-}"
    [ "$local_mode" = 1 ] && return 0
    ca="${DKERN_TLS_CA:-${dir:+$dir/ca.pem}}"
    cert="${DKERN_TLS_CERT:-${dir:+$dir/$role.pem}}"
    key="${DKERN_TLS_KEY:-${dir:+$dir/$role-key.pem}}"
    for f in "$ca" "$cert" "$key"; do
        if [ -z "$f" ] || [ ! -r "$f" ]; then
            echo "$0: multi-node mode needs TLS files: set DKERN_TLS_DIR to the output of" \
                 "cluster/make-certs.sh (or DKERN_TLS_CA, DKERN_TLS_CERT, DKERN_TLS_KEY);" \
                 "missing or unreadable: '${f:-(unset)}'. For one machine use --local." >&2
            exit 1
        fi
    done
    # dask reads this lowercase key from the environment (an upper-case name in a key, as in
    # MALLOC_TRIM_THRESHOLD_, would not survive that route: hence the YAML file).
    export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
    extra=(--tls-ca-file "$ca" --tls-cert "$cert" --tls-key "$key")
}
