#!/usr/bin/env bash
# Runs the Kubernetes manifests for real, on one machine without a cluster: renders the
# cpu-only overlay through ops/kube-check/ (the image built here, the services on this
# host, a secret with their URLs, an S3 endpoint with keys) and plays it with
# `podman kube play`, which gives containers Kubernetes' command/args semantics. The
# migrate Job's pod template is played as a Pod (podman skips Jobs) and must exit 0; the
# worker Deployment must answer its readiness probe (/readyz on port 9464); a book
# submitted from the host must be done. Kinds podman does not run (ServiceAccount, PDB,
# KEDA's ScaledObject and TriggerAuthentication) are left out here and schema-checked by
# ops/k8s-check.sh. Not part of `bash ops/test.sh` (it builds the image: minutes).
#
#   bash ops/kube-check.sh
#
# Needs PostgreSQL (127.0.0.1:5432, user postgres) and RabbitMQ (127.0.0.1:5672) on this
# host, as ops/test.sh has them; starts the S3 test server (ops/s3-server.sh, port 9010).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf 'kube-check: %s\n' "$*"; }
die() {
    printf 'kube-check: FAILED: %s\n' "$*" >&2
    exit 1
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
START=$(date +%s)

port_open 5432 || die "no PostgreSQL on 127.0.0.1:5432 (ops/test.sh starts one)"
port_open 5672 || die "no RabbitMQ on 127.0.0.1:5672 (ops/test.sh starts one)"
port_open 9464 && die "127.0.0.1:9464 is taken: the worker pod listens there (host network)"
podman image exists localhost/narrator:cpu || bash ops/images.sh
# A pod's infra container runs catatonit; without a registry podman builds its pause
# image locally from Debian's binary.
if ! command -v catatonit >/dev/null && [[ ! -x /usr/libexec/podman/catatonit ]]; then
    say "installing catatonit (Debian's package) for the pods' pause image"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends catatonit >/dev/null
fi
command -v kubectl >/dev/null || die "kubectl is missing (kubectl kustomize renders the overlay)"
export NARRATOR_S3_PORT=9010 NARRATOR_S3_BUCKET=narrator
bash ops/s3-server.sh start >/dev/null

DB=narrator_kube_check
psql_admin() { psql -q -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 -c "$1" >/dev/null; }
psql_admin "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
psql_admin "CREATE DATABASE $DB"

OUT="$(mktemp -d)"
teardown() {
    for f in workers migrate; do
        [[ -f "$OUT/$f.yaml" ]] && podman kube down "$OUT/$f.yaml" >/dev/null 2>&1 || true
    done
    podman secret rm narrator-services >/dev/null 2>&1 || true
    podman volume rm -f narrator-services >/dev/null 2>&1 || true
    psql_admin "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
    rm -rf "$OUT"
}
trap teardown EXIT

kubectl kustomize ops/kube-check >"$OUT/rendered.yaml"
# The objects podman plays, in two files: the migrate Job's pod template as a Pod, and
# the workers' Deployment, each with the ConfigMap they read.
python3 - "$OUT" <<'PY'
import sys, yaml
out = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(f"{out}/rendered.yaml")) if d]
# podman 4.3 mounts a secret volume from a podman secret holding the Secret's YAML (a
# Secret in the played file itself crashes it): written apart, made a podman secret.
secrets = [d for d in docs if d["kind"] == "Secret"]
assert len(secrets) == 1, secrets
# podman 4.3 writes a secret volume's `data` values into the files as they are, without
# the base64 decoding Kubernetes does (and ignores stringData): give it the plain values.
import base64
secret = dict(secrets[0])
secret["data"] = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
yaml.safe_dump(secret, open(f"{out}/secret.yaml", "w"), sort_keys=False, width=1 << 20)
shared = [d for d in docs if d["kind"] == "ConfigMap"]
jobs = [d for d in docs if d["kind"] == "Job"]
deployments = [d for d in docs if d["kind"] == "Deployment"]
skipped = sorted({d["kind"] for d in docs} - {"ConfigMap", "Secret", "Job", "Deployment"})
assert len(jobs) == 1 and len(deployments) == 1, (jobs, deployments)
job = jobs[0]
template = job["spec"]["template"]
pod = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": job["metadata"]["name"], "labels": template["metadata"].get("labels", {})},
    "spec": dict(template["spec"], restartPolicy="Never"),
}
# On the host's network podman refuses port mappings: the worker's declared port goes,
# and its probes name the number instead of the port's name.
for d in deployments:
    for c in d["spec"]["template"]["spec"]["containers"]:
        numbers = {p["name"]: p["containerPort"] for p in c.pop("ports", []) if "name" in p}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = c.get(probe, {}).get("httpGet")
            if get and get.get("port") in numbers:
                get["port"] = numbers[get["port"]]
yaml.safe_dump_all(shared + [pod], open(f"{out}/migrate.yaml", "w"), sort_keys=False)
yaml.safe_dump_all(shared + deployments, open(f"{out}/workers.yaml", "w"), sort_keys=False)
print("kube-check: left to ops/k8s-check.sh's schemas: " + ", ".join(skipped))
PY

podman secret rm narrator-services >/dev/null 2>&1 || true
podman secret create narrator-services "$OUT/secret.yaml" >/dev/null
# kube play copies a secret into a volume of its name, and reuses one that exists.
podman volume rm -f narrator-services >/dev/null 2>&1 || true

say "playing the migrate Job's pod"
podman kube play --network host "$OUT/migrate.yaml" >/dev/null
code="$(podman wait narrator-migrate-migrate)"
podman logs narrator-migrate-migrate >"$OUT/migrate.log" 2>&1 || true
[[ "$code" == 0 ]] || die "migrate exited $code: $(tail -n 5 "$OUT/migrate.log")"
say "migrate completed (exit 0)"

say "playing the worker Deployment"
podman kube play --network host "$OUT/workers.yaml" >/dev/null
ready=0
for _ in $(seq 240); do
    if curl -fsS -o /dev/null http://127.0.0.1:9464/readyz 2>/dev/null; then
        ready=1
        break
    fi
    sleep 1
done
worker="$(podman ps --filter label=app.kubernetes.io/component=worker --format '{{.Names}}' | grep -v infra | head -n 1)"
((ready)) || die "the worker never answered /readyz: $(podman logs --tail 20 "$worker" 2>&1)"
say "worker $worker ready on its probe (/readyz)"

bin="$ROOT/target/release/narrator"
[[ -x "$bin" ]] || cargo build --release --locked -p narrator
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB"
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/%2f"
export NARRATOR_S3_ENDPOINT="http://127.0.0.1:9010" NARRATOR_S3_BUCKET=narrator
export AWS_ACCESS_KEY_ID=narrator AWS_SECRET_ACCESS_KEY=narrator-secret AWS_REGION=us-east-1
job="$("$bin" submit examples/sample.md --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["job_id"])')"
say "submitted job $job"
status="$(timeout 600 "$bin" status "$job" --wait --json | tail -n 1)"
state="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["state"])' "$status")"
[[ "$state" == done ]] || die "job $job ended $state: $status"
outputs="$(python3 -c 'import json,sys; print(" ".join(o["name"] for o in json.loads(sys.argv[1])["outputs"]))' "$status")"
# Every segment recorded by the pod's worker (its id is the pod's name, from the
# Deployment's fieldRef), none by anything else.
by="$(psql -At -h 127.0.0.1 -U postgres -d "$DB" -c "SELECT string_agg(DISTINCT worker, ',') FROM segments WHERE job_id = '$job'")"
[[ "$by" == narrator-worker-cpu-pod-* && "$by" != *,* ]] || die "job $job's segments were recorded by '$by', not by the pod"
say "job $job done by the pod's worker $by: $outputs"
say "ok in $(($(date +%s) - START)) s"
