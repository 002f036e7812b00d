#!/usr/bin/env bash
# Make a private CA and the scheduler, worker and client certificates of one dkern cluster.
#
#   cluster/make-certs.sh OUTDIR NAME [NAME ...]
#
# NAME: each host name or IP address the scheduler and the workers are reached at; all go
# into the subjectAltName of the scheduler and worker certificates (distributed itself does
# not check host names, but other TLS tools do). Keys are EC P-256 (fast to make, small).
# Every file is readable by its owner only (OUTDIR 0700, files 0600). Existing files are
# never overwritten: OUTDIR must be new or empty. See cluster/TLS.md for what to copy where
# and for the trust model.
set -euo pipefail

usage() {
    echo "usage: $0 OUTDIR NAME [NAME ...]  (NAME: a host name or IP address of the" \
         "scheduler or a worker, e.g. $0 certs scheduler.example.org 10.0.0.5)" >&2
    exit 2
}
[ "$#" -ge 2 ] || usage
outdir=$1; shift
days="${DKERN_CERT_DAYS:-365}"
command -v openssl >/dev/null || { echo "$0: openssl not found; install it" >&2; exit 1; }
if [ -e "$outdir" ] && [ -n "$(ls -A "$outdir")" ]; then
    echo "$0: $outdir is not empty; refusing to overwrite certificates (use a new OUTDIR)" >&2
    exit 1
fi

umask 077
mkdir -p "$outdir"
chmod 700 "$outdir"

san=""
for name in "$@"; do
    if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
        san="$san,IP:$name"
    else
        san="$san,DNS:$name"
    fi
done
san="${san#,}"

# CA: signs certificates, nothing else. Its key stays with whoever issues certificates.
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$outdir/ca-key.pem" -out "$outdir/ca.pem" -days "$days" \
    -subj "/CN=dkern cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"

# issue ROLE EXTENDED_KEY_USAGE [SAN]: ROLE-key.pem and ROLE.pem signed by the CA.
issue() {
    local role=$1 eku=$2 alt=${3:-} ext
    ext="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyAgreement
extendedKeyUsage=$eku"
    [ -n "$alt" ] && ext="$ext
subjectAltName=$alt"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$outdir/$role-key.pem" -out "$outdir/$role.csr" \
        -subj "/CN=dkern-$role"
    openssl x509 -req -in "$outdir/$role.csr" -CA "$outdir/ca.pem" -CAkey "$outdir/ca-key.pem" \
        -CAcreateserial -out "$outdir/$role.pem" -days "$days" \
        -extfile <(printf '%s\n' "$ext")
    rm -f "$outdir/$role.csr"
}

# Scheduler and workers both listen and connect (to each other), so serverAuth and clientAuth.
issue scheduler serverAuth,clientAuth "$san"
issue worker serverAuth,clientAuth "$san"
issue client clientAuth
rm -f "$outdir/ca.srl"
chmod 600 "$outdir"/*.pem
echo "wrote $outdir/{ca,scheduler,worker,client}.pem and their -key.pem files (owner-only)" >&2
