# Sourced by the benchmarks that count the control plane's work (control_plane_statements.sh,
# many_books.sh), with BENCH set to the script's name for its messages:
#   say / die MESSAGE           a line to stderr (die: FAILED, exit 1)
#   bench_prepare               BIN: the release build (built here) unless BIN is set (to
#                               measure another build, e.g. an older commit's, side by
#                               side); the S3 test server started, its settings exported
#   private_pg_start DIR PORT   a private PostgreSQL with pg_stat_statements preloaded
#                               (initdb in DIR/pg, 127.0.0.1:PORT; sets PGBIN), so the
#                               shared one (5432) is not touched and its statements do not
#                               mix in; PG_EXTRA_OPTS adds server options
#   private_pg_stop DIR         stop it (immediate)
#   as_pg CMD...                run CMD as the postgres user when root
#   ticks PID                   CPU ticks of a process and its waited-for children
#   pg_ticks DIR                CPU ticks of the private PostgreSQL in DIR/pg: the
#                               postmaster (with its exited backends) and its live backends

say() { printf '%s: %s\n' "$BENCH" "$*" >&2; }
die() {
    printf '%s: FAILED: %s\n' "$BENCH" "$*" >&2
    exit 1
}

bench_prepare() {
    if [[ -z "${BIN:-}" ]]; then
        BIN="$ROOT/target/release/narrator"
        cargo build --release --locked -q -p narrator
    fi
    eval "$(bash "$ROOT/ops/s3-server.sh" env)"
    bash "$ROOT/ops/s3-server.sh" start >/dev/null
}

as_pg() { if ((EUID == 0)); then runuser -u postgres -- "$@"; else "$@"; fi; }

private_pg_start() {
    local dir="$1" port="$2"
    PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    [[ -x "$PGBIN/initdb" ]] || {
        echo "no PostgreSQL server binaries in /usr/lib/postgresql (bash ops/setup.sh --test installs them)" >&2
        return 1
    }
    [[ -n "$(ls /usr/share/postgresql/*/extension/pg_stat_statements.control 2>/dev/null)" ]] || {
        echo "pg_stat_statements is not installed (Debian's postgresql-contrib)" >&2
        return 1
    }
    mkdir -p "$dir/pg"
    chmod 755 "$dir"
    ((EUID == 0)) && chown postgres:postgres "$dir/pg"
    # Each step checked: `set -e` does not apply inside a function called with `||`.
    as_pg "$PGBIN/initdb" -A trust -U postgres --no-sync -D "$dir/pg" >/dev/null || return 1
    as_pg "$PGBIN/pg_ctl" -w -D "$dir/pg" -l "$dir/pg/log" -o "-p $port -k $dir/pg \
        -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements \
        -c pg_stat_statements.track=all -c max_connections=300 -c fsync=off ${PG_EXTRA_OPTS:-}" \
        start >/dev/null || {
        echo "the private PostgreSQL did not start (port $port taken?): $(tail -n 2 "$dir/pg/log")" >&2
        return 1
    }
    psql -X -qtA -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c "CREATE EXTENSION pg_stat_statements" >/dev/null || return 1
}

private_pg_stop() {
    [[ -n "${PGBIN:-}" ]] && as_pg "$PGBIN/pg_ctl" -D "$1/pg" -m immediate stop >/dev/null 2>&1
    return 0
}

# utime stime cutime cstime of /proc/PID/stat.
ticks() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat" 2>/dev/null || echo 0; }

pg_ticks() {
    local main total=0 p
    main="$(head -n 1 "$1/pg/postmaster.pid")"
    total=$(ticks "$main")
    for p in $(pgrep -P "$main"); do total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
    echo "$total"
}
