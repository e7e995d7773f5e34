#!/bin/sh
# Entry point of the faas-gpu stack image: every daemon (`faas-gpu serve`, `python -m scheduler`,
# `python -m gpu_manager`, `python -m procurer`) starts through it.
#
# 1. Credentials. The daemons read theirs from $FAAS_GPU_HOME/secrets/: the gateway's basic auth
#    (basic-auth-user, basic-auth-password), the cluster token the scheduler, the GPU Managers
#    and the gateway share (gpu-manager-token, `faas_gpu/credentials.py`; it also keys the MAC on
#    every datastore record), and their logins to etcd and Redis (etcd-credentials,
#    redis-credentials: user:password). Each daemon generates the first three when missing, which
#    is right on one machine and wrong across several: two nodes would make two different cluster
#    tokens. Orchestrators mount secrets read-only (Swarm: /run/secrets/, Kubernetes: a secret
#    volume), so when FAAS_GPU_CREDENTIALS_DIR names such a folder, the files of those five it
#    holds are copied into $FAAS_GPU_HOME/secrets/ (0600). The basic-auth pair comes whole or not
#    at all.
# 2. `--advertise=self` (or `--advertise self`) becomes this container's own address: a Swarm
#    task or a pod has no address to write in a file, and the scheduler and the GPU Manager
#    announce the URL others reach them at (default: their --bind, useless when it is 0.0.0.0).
set -eu

: "${FAAS_GPU_HOME:=/var/lib/faas-gpu}"
export FAAS_GPU_HOME

if [ -n "${FAAS_GPU_CREDENTIALS_DIR:-}" ]; then
    dir=$FAAS_GPU_CREDENTIALS_DIR
    found=""
    for f in basic-auth-user basic-auth-password gpu-manager-token etcd-credentials redis-credentials; do
        if [ -s "$dir/$f" ]; then found="$found $f"; fi
    done
    case "$found" in
        *basic-auth-user*basic-auth-password* | *basic-auth-password*basic-auth-user*) ;;
        *basic-auth-*)
            echo "entrypoint: $dir holds only one of basic-auth-user and basic-auth-password" >&2
            exit 1 ;;
    esac
    if [ -z "$found" ]; then
        echo "entrypoint: FAAS_GPU_CREDENTIALS_DIR=$dir holds none of basic-auth-user, basic-auth-password, gpu-manager-token, etcd-credentials, redis-credentials" >&2
        exit 1
    fi
    umask 077
    mkdir -p "$FAAS_GPU_HOME/secrets"
    chmod 700 "$FAAS_GPU_HOME/secrets"
    for f in $found; do
        cat "$dir/$f" > "$FAAS_GPU_HOME/secrets/$f.tmp"
        mv "$FAAS_GPU_HOME/secrets/$f.tmp" "$FAAS_GPU_HOME/secrets/$f"
    done
fi

self_address() {
    python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'
}

# Rebuild "$@" with --advertise=self replaced (POSIX sh: no arrays, so shift through once).
n=$#
take_value=""
while [ "$n" -gt 0 ]; do
    arg=$1
    shift
    n=$((n - 1))
    if [ -n "$take_value" ] && [ "$arg" = self ]; then
        arg=$(self_address)
    elif [ "$arg" = --advertise=self ]; then
        arg="--advertise=$(self_address)"
    fi
    take_value=""
    [ "$arg" = --advertise ] && take_value=1
    set -- "$@" "$arg"
done

exec "$@"
