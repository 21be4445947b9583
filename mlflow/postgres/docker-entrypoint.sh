#!/bin/bash
# First start: initdb with POSTGRES_USER/POSTGRES_PASSWORD, create POSTGRES_DB, run the
# scripts in /docker-entrypoint-initdb.d/ (as the official postgres image does); then serve.
set -euo pipefail
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "${1:-postgres}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "POSTGRES_PASSWORD is not set" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA"
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    psql=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password)
    if [ "$POSTGRES_DB" != postgres ]; then
        "${psql[@]}" --dbname postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sql) echo "running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
            *.sh) echo "running $f"; . "$f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
fi
if [ "${1:-postgres}" = postgres ]; then
    shift || true
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
