#!/bin/sh
# OpenFaaS's certifier against `faas-gpu up --runtime docker` (a dockerd of its own in a network
# namespace of its own; see run_docker.py and docs/DOCKER-RUNTIME.md "The certifier").
#
#   tests/certifier/run_docker.sh CERTIFIER_SRC [OUT_DIR] [-- extra run_docker.py args, e.g. --run Test_Invoke]
#
# CERTIFIER_SRC: the openfaas/certifier source tree (with vendor/; e.g.
#   git clone https://github.com/openfaas/certifier, or a `git archive` of a mirror of it).
# Needs root (namespaces, dockerd), Debian's docker.io, mmdebstrap (or a cached base image) and
# golang-go (installed here when missing). Nothing is pulled: the Go build is offline
# (-mod=vendor, GOPROXY=off) and the images the certifier deploys are built locally.
set -eu
if [ $# -lt 1 ]; then
    sed -n '2,11p' "$0" >&2
    exit 2
fi
SRC=$(cd "$1" && pwd)
shift
OUT=out/certifier-docker
if [ $# -gt 0 ] && [ "$1" != "--" ]; then OUT=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
if ! command -v go >/dev/null 2>&1; then
    apt-get install -y golang-go >/dev/null
fi
mkdir -p "$OUT"
BIN=$(cd "$OUT" && pwd)/certifier.test
export GOFLAGS=-mod=vendor GOPROXY=off
export GOCACHE="${GOCACHE:-$HOME/.cache/faas-gpu/go-build}"
echo "[certify-docker] go test -c $SRC/tests -> $BIN" >&2
(cd "$SRC" && go test -c -o "$BIN" ./tests)
exec "$REPO/.venv/bin/python" -m tests.certifier.run_docker --certifier-src "$SRC" --certifier-bin "$BIN" --out "$OUT" "$@"
