// Validates every KEDA object in the YAML files given against the schemas that
// @kubernetes-models/keda generates from KEDA's CRDs (required fields, types, enums).
// Core Kubernetes kinds are checked by kubernetes-validate (ops/k8s-check.sh); other
// kinds are ignored here. Exit 1 with one line per invalid object.
"use strict";
const fs = require("fs");
const yaml = require("js-yaml");
const models = {
  ScaledObject: require("@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject").ScaledObject,
  ScaledJob: require("@kubernetes-models/keda/keda.sh/v1alpha1/ScaledJob").ScaledJob,
  TriggerAuthentication: require("@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication")
    .TriggerAuthentication,
};
// Fields of a RabbitMQ trigger's metadata that KEDA reads (KEDA's rabbitmq scaler docs);
// the CRD types metadata as a free map, so a misspelt key would pass silently.
const RABBITMQ_METADATA = new Set([
  "host", "hostFromEnv", "protocol", "mode", "value", "activationValue", "queueName",
  "vhostName", "usernameFromEnv", "passwordFromEnv", "unsafeSsl", "timeout",
  "excludeUnacknowledged", "pageSize", "useRegex", "operation",
]);
let bad = 0;
let seen = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.loadAll(fs.readFileSync(file, "utf8"))) {
    if (!doc || doc.apiVersion !== "keda.sh/v1alpha1") continue;
    const name = `${file}: ${doc.kind}/${doc.metadata && doc.metadata.name}`;
    const Model = models[doc.kind];
    if (!Model) {
      console.log(`${name}: unknown KEDA kind`);
      bad++;
      continue;
    }
    seen++;
    try {
      new Model(doc).validate();
    } catch (e) {
      console.log(`${name}: ${e.message}`);
      bad++;
      continue;
    }
    for (const t of (doc.spec && doc.spec.triggers) || []) {
      if (t.type !== "rabbitmq") continue;
      const unknown = Object.keys(t.metadata || {}).filter((k) => !RABBITMQ_METADATA.has(k));
      if (unknown.length) {
        console.log(`${name}: unknown rabbitmq trigger metadata ${unknown.join(", ")}`);
        bad++;
      }
      if (!t.metadata || !t.metadata.queueName) {
        console.log(`${name}: a rabbitmq trigger without queueName`);
        bad++;
      }
    }
  }
}
console.log(`KEDA objects: ${seen} checked, ${bad} invalid`);
process.exit(bad ? 1 : 0);
