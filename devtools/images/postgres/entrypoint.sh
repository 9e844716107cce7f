#!/bin/bash
# The trial Postgres's entrypoint. On first start (no PG_VERSION in PGDATA) it makes the
# cluster: superuser POSTGRES_USER with password POSTGRES_PASSWORD, database POSTGRES_DB,
# password (scram-sha-256) logins from anywhere. Then it runs the server in the foreground.
# A first argument not starting with "-" is a command to run instead (e.g. bash); other
# arguments go to postgres (e.g. -c max_connections=200).
set -euo pipefail

if [ "$#" -gt 0 ] && [ "${1:0:1}" != "-" ]; then
    exec "$@"
fi

export PGDATA="${PGDATA:-/var/lib/postgresql/data/pgdata}"
user="${POSTGRES_USER:-postgres}"
database="${POSTGRES_DB:-$user}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "agentrun-postgres: POSTGRES_PASSWORD is empty; refusing to make a cluster without a password" >&2
        exit 1
    fi
    # A fresh volume is root's: it needs the pod's fsGroup (or an owner of uid $(id -u)).
    if ! mkdir -p "$PGDATA" 2>/dev/null || [ ! -w "$PGDATA" ]; then
        echo "agentrun-postgres: cannot write $PGDATA as uid $(id -u) (set the pod's securityContext.fsGroup: $(id -g))" >&2
        exit 1
    fi
    chmod 700 "$PGDATA"
    pwfile="$(mktemp)"
    trap 'rm -f "$pwfile"' EXIT
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    trap - EXIT
    # initdb allows only loopback addresses; the operator and the store API come from the
    # pod network.
    printf '%s\n' "host all all 0.0.0.0/0 scram-sha-256" "host all all ::/0 scram-sha-256" \
        >>"$PGDATA/pg_hba.conf"
    if [ "$database" != postgres ]; then
        quoted="\"${database//\"/\"\"}\""
        echo "CREATE DATABASE $quoted;" | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "agentrun-postgres: initialised $PGDATA (user $user, database $database)" >&2
fi

if [ ! -w /var/run/postgresql ]; then
    echo "agentrun-postgres: /var/run/postgresql is not writable (with readOnlyRootFilesystem, mount an emptyDir there)" >&2
    exit 1
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
