#!/usr/bin/env bash
# docker-compose.yml for real, on a machine without Docker or registry access: podman and
# podman-compose (PyPI), the images built here (ops/images.sh: a debootstrap base and the
# prebuilt binary and runtime). Brings up RabbitMQ, Postgres and the S3 server, migrates,
# starts the two workers, submits examples/sample.md, waits for it to be done, downloads
# every output from this host through the presigned URL `status` printed (the S3 server
# published on S3_HOST_PORT, the URLs signed for localhost) and checks it, then tears
# everything down
# (volumes too). Not part of `bash ops/test.sh` (a few minutes; run it before changing the
# images or the compose file).
#
#   bash ops/compose-check.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf 'compose-check: %s\n' "$*"; }
die() {
    printf 'compose-check: FAILED: %s\n' "$*" >&2
    exit 1
}
START=$(date +%s)

bash ops/images.sh
# The S3 image is built from the s3s-fs binary that setup installs (S3S_FROM=prebuilt).
bash ops/setup.sh --with-s3 >/dev/null
python3 -c 'import ensurepip' 2>/dev/null || apt-get install -y -qq python3-venv >/dev/null
# Containers find each other by service name (postgres, rabbitmq, s3) through the CNI
# dnsname plugin, which podman only recommends (apt leaves it out with
# --no-install-recommends): without it the workers cannot resolve `postgres`.
if ! dpkg-query -W -f='${Status}' golang-github-containernetworking-plugin-dnsname 2>/dev/null | grep -q '^install ok installed$'; then
    say "installing the CNI dnsname plugin (Debian's golang-github-containernetworking-plugin-dnsname)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        golang-github-containernetworking-plugin-dnsname >/dev/null
fi
VENV="$ROOT/.deps/compose-venv"
if ! "$VENV/bin/podman-compose" --version 2>/dev/null | grep -q "podman-compose version 1.6.0"; then
    say "installing podman-compose 1.6.0 into .deps/compose-venv"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check podman-compose==1.6.0
fi
export COMPOSE_PROJECT_NAME=narrator-check
# The S3 server's port on this host (not 9000: a developer's own server may hold it).
export S3_HOST_PORT="${S3_HOST_PORT:-19000}"
unset S3_PUBLIC_URL
export DEBIAN_IMAGE=localhost/debian:bookworm NARRATOR_FROM=prebuilt S3S_FROM=prebuilt
# Docker's image format keeps HEALTHCHECK (podman's default, OCI, drops it).
export BUILDAH_FORMAT=docker
pc() { "$VENV/bin/podman-compose" "$@"; }
OUT="$(mktemp -d)"
chmod 777 "$OUT"
teardown() {
    pc down -v >/dev/null 2>&1 || true
    # What `down` may leave (a container restarted by hand, its volume).
    podman ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" | xargs -r podman rm -f >/dev/null 2>&1 || true
    podman volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
    podman pod rm -f "pod_$COMPOSE_PROJECT_NAME" >/dev/null 2>&1 || true
    rm -rf "$OUT"
}
trap teardown EXIT
pc down -v >/dev/null 2>&1 || true
# A network made before the dnsname plugin was installed has no DNS: make it again.
podman network rm -f "${COMPOSE_PROJECT_NAME}_default" >/dev/null 2>&1 || true

say "building the compose images"
pc build >/dev/null
say "starting rabbitmq, postgres, s3"
pc up -d rabbitmq postgres s3 >/dev/null
containers() {
    podman ps --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" \
        --filter "label=com.docker.compose.service=$1" --format '{{.Names}}'
}
# No systemd here: podman runs health checks only when asked.
for service in postgres rabbitmq; do
    name="$(containers "$service")"
    [[ -n "$name" ]] || die "no $service container"
    for _ in $(seq 90); do podman healthcheck run "$name" >/dev/null 2>&1 && break; sleep 2; done
    podman healthcheck run "$name" >/dev/null 2>&1 \
        || die "$service is not healthy: $(podman healthcheck run "$name" 2>&1) $(podman logs --tail 5 "$name" 2>&1)"
    say "$service healthy"
done

say "migrate"
pc run --rm --no-deps migrate >"$OUT/migrate.log" 2>&1 || die "migrate failed: $(tail -n 5 "$OUT/migrate.log")"
say "starting two workers"
pc up -d --no-deps --scale worker=2 worker >/dev/null
mapfile -t workers < <(containers worker)
((${#workers[@]} == 2)) || die "expected 2 worker containers, found ${#workers[@]}: ${workers[*]}"
for w in "${workers[@]}"; do
    # (The log read whole first: `grep -q` ending a pipe early fails it under pipefail.)
    is_ready() { grep -q " ready" <<<"$(podman logs "$w" 2>&1)"; }
    for _ in $(seq 180); do is_ready && break; sleep 2; done
    is_ready || die "$w not ready: $(podman logs --tail 20 "$w" 2>&1)"
    podman healthcheck run "$w" >/dev/null || die "$w: the image's health check (/healthz) fails"
done
say "workers ready and healthy: ${workers[*]}"

run_narrator() { pc run --rm --no-deps -T -v "$ROOT/examples:/books:ro" worker "$@"; }
job="$(run_narrator submit /books/sample.md --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["job_id"])')"
say "submitted job $job"
status="$(run_narrator status "$job" --wait --json | tail -n 1)"
state="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["state"])' "$status")"
[[ "$state" == done ]] || die "job $job ended $state: $status"
say "job $job done"

# Every output, downloaded from this host through the presigned URL `status` printed.
python3 - "$status" >"$OUT/urls" <<'PY'
import json, sys
for o in json.loads(sys.argv[1])["outputs"]:
    print(o["name"], o["bytes"], o["url"])
PY
[[ -s "$OUT/urls" ]] || die "no outputs listed: $status"
while read -r name bytes url; do
    [[ "$url" == "http://localhost:$S3_HOST_PORT/"* ]] || die "$name: $url is not on this host's port $S3_HOST_PORT"
    # From the host, as a user would.
    curl -fsS -o "$OUT/$name" "$url" || die "download of $name from the host failed"
    got=$(stat -c %s "$OUT/$name")
    [[ "$got" == "$bytes" ]] || die "$name: $got bytes downloaded, $bytes recorded"
    case "$name" in
        *.opus | *.ogg) [[ "$(head -c 4 "$OUT/$name")" == OggS ]] || die "$name is not Ogg" ;;
        *.json) python3 -m json.tool "$OUT/$name" >/dev/null || die "$name is not JSON" ;;
    esac
    say "fetched $name ($got bytes)"
done <"$OUT/urls"

# The calibration cache is a volume the image's user can write: it holds what the workers
# measured, and a restarted worker comes back ready from it.
cached="$(podman exec "${workers[0]}" sh -c 'ls /app/.deps/cache/calibration/*.json' 2>/dev/null || true)"
[[ -n "$cached" ]] || die "no calibration in the cache volume /app/.deps/cache"
say "calibrations cached: $(echo "$cached" | xargs -n1 basename | tr '\n' ' ')"
since="$(date --iso-8601=seconds)"
podman restart "${workers[0]}" >/dev/null
for _ in $(seq 90); do podman logs --since "$since" "${workers[0]}" 2>&1 | grep -q " ready" && break; sleep 2; done
podman logs --since "$since" "${workers[0]}" 2>&1 | grep -q " ready" || die "${workers[0]} not ready after a restart"
say "${workers[0]} restarted and ready again"

say "ok in $(($(date +%s) - START)) s: compose stack up, 2 workers, sample book done, outputs fetched"
