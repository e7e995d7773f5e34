#!/bin/sh
# Entry point of the faas-gpu stack image.
#
# The stack reads its basic-auth credentials from $FAAS_GPU_HOME/secrets/ (basic-auth-user,
# basic-auth-password) and generates them there on first start. Orchestrators mount secrets
# read-only (Swarm: /run/secrets/, Kubernetes: a secret volume), so when FAAS_GPU_CREDENTIALS_DIR
# names a folder holding both files, they are copied into $FAAS_GPU_HOME/secrets/ (mode 0600)
# before the command runs. Without it, the credentials in the state volume are used or generated.
set -eu

: "${FAAS_GPU_HOME:=/var/lib/faas-gpu}"
export FAAS_GPU_HOME

if [ -n "${FAAS_GPU_CREDENTIALS_DIR:-}" ]; then
    for f in basic-auth-user basic-auth-password; do
        if [ ! -s "$FAAS_GPU_CREDENTIALS_DIR/$f" ]; then
            echo "entrypoint: FAAS_GPU_CREDENTIALS_DIR=$FAAS_GPU_CREDENTIALS_DIR has no (or an empty) $f" >&2
            exit 1
        fi
    done
    umask 077
    mkdir -p "$FAAS_GPU_HOME/secrets"
    chmod 700 "$FAAS_GPU_HOME/secrets"
    for f in basic-auth-user basic-auth-password; do
        cat "$FAAS_GPU_CREDENTIALS_DIR/$f" > "$FAAS_GPU_HOME/secrets/$f.tmp"
        mv "$FAAS_GPU_HOME/secrets/$f.tmp" "$FAAS_GPU_HOME/secrets/$f"
    done
fi

exec "$@"
