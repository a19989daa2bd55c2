#!/bin/sh
# First start: a cluster with password authentication over TCP; then the server.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pw="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" >"$pw"
    initdb -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 --pwfile="$pw" >/dev/null
    rm -f "$pw"
    echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
    createdb -U postgres "${POSTGRES_DB:-narrator}"
    pg_ctl -D "$PGDATA" -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
