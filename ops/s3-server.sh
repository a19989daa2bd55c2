#!/usr/bin/env bash
# The S3-compatible test server: s3s-fs (filesystem-backed, checks SigV4 signatures),
# installed by ops/setup.sh --with-s3 into .deps/s3/s3s-fs (`start` runs that when missing).
#
#   ops/s3-server.sh start    unless 127.0.0.1:PORT already answers: start s3s-fs there in
#                             the background (log .deps/s3/server.log, data .deps/s3/data,
#                             emptied on each fresh start), wait until it answers;
#                             then make sure the bucket exists
#   ops/s3-server.sh stop     stop the server this script started (pid in .deps/s3/server.pid)
#   ops/s3-server.sh status   say whether it answers
#   ops/s3-server.sh env      print the export lines a client needs
#
# Settings (environment, with defaults):
#   NARRATOR_S3_PORT=9010  NARRATOR_S3_BUCKET=narrator
#   AWS_ACCESS_KEY_ID=narrator  AWS_SECRET_ACCESS_KEY=narrator-secret  (test credentials)
#   NARRATOR_S3_KEEP_DATA=1    keep .deps/s3/data on a fresh start
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
S3DIR="$ROOT/.deps/s3"
BIN="$S3DIR/s3s-fs/bin/s3s-fs"
DATA="$S3DIR/data"
LOG="$S3DIR/server.log"
PIDFILE="$S3DIR/server.pid"
PORT="${NARRATOR_S3_PORT:-9010}"
BUCKET="${NARRATOR_S3_BUCKET:-narrator}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-narrator}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-narrator-secret}"

say() { printf 's3-server: %s\n' "$*"; }
die() {
    printf 's3-server: ERROR: %s\n' "$*" >&2
    exit 1
}
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
our_pid() { # the pid of the server this script started, if it still runs
    local pid
    [[ -f "$PIDFILE" ]] || return 1
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" && -d "/proc/$pid" ]] && grep -q s3s-fs "/proc/$pid/cmdline" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}
ensure_bucket() {
    # s3s-fs keeps bucket B as the folder DATA/B: creating it is a mkdir. A server that
    # this script did not start is left alone (its owner made the bucket).
    if our_pid >/dev/null; then
        mkdir -p "$DATA/$BUCKET"
    fi
}

case "${1:-}" in
    start)
        if answers; then
            ensure_bucket
            say "127.0.0.1:$PORT already answers; nothing started (bucket $BUCKET)"
            exit 0
        fi
        # Not part of the plain set-up (`narrator run` never uses it): built on first use.
        [[ -x "$BIN" ]] || bash "$(dirname "${BASH_SOURCE[0]}")/setup.sh" --with-s3 >&2
        [[ -x "$BIN" ]] || die "$BIN is missing: run bash ops/setup.sh --with-s3"
        mkdir -p "$S3DIR"
        if [[ "${NARRATOR_S3_KEEP_DATA:-0}" != 1 ]]; then
            rm -rf "$DATA"
        fi
        mkdir -p "$DATA/$BUCKET"
        # setsid: the server outlives the shell (and the test run) that started it.
        setsid "$BIN" --host 127.0.0.1 --port "$PORT" \
            --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" \
            "$DATA" >>"$LOG" 2>&1 </dev/null &
        echo $! >"$PIDFILE"
        for _ in $(seq 100); do
            answers && break
            [[ -d "/proc/$(cat "$PIDFILE")" ]] || die "s3s-fs exited at once; see $LOG"
            sleep 0.1
        done
        answers || die "s3s-fs does not answer on 127.0.0.1:$PORT after 10 s; see $LOG"
        say "s3s-fs started on http://127.0.0.1:$PORT (pid $(cat "$PIDFILE"), bucket $BUCKET, data $DATA, log $LOG)"
        ;;
    stop)
        if pid="$(our_pid)"; then
            kill "$pid"
            for _ in $(seq 50); do [[ -d "/proc/$pid" ]] || break; sleep 0.1; done
            rm -f "$PIDFILE"
            say "stopped (pid $pid)"
        else
            rm -f "$PIDFILE"
            say "no server started by this script is running"
        fi
        ;;
    status)
        if answers; then say "127.0.0.1:$PORT answers"; else say "127.0.0.1:$PORT does not answer"; exit 1; fi
        ;;
    env)
        echo "export NARRATOR_S3_ENDPOINT=http://127.0.0.1:$PORT"
        echo "export NARRATOR_S3_BUCKET=$BUCKET"
        echo "export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID"
        echo "export AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY"
        echo "export AWS_REGION=${AWS_REGION:-us-east-1}"
        ;;
    *)
        sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
        [[ "${1:-}" == -h || "${1:-}" == --help ]] || exit 2
        ;;
esac
