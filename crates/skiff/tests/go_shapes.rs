//! The shape of every object as upstream's Go encoder writes it: each field upstream's types
//! always write (no `omitempty`, or a struct) is in what Skiff answers, for every served kind
//! that has objects, as created and as listed. The fields come from
//! `skiff_api::go_emitted`, generated from upstream's k8s.io/api and k8s.io/apimachinery
//! sources by `scripts/gen-go-emitted.py`; the definitions each object and field stand for
//! come from the server's own OpenAPI document.

#![cfg(test)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::{Cluster, eventually};
use serde_json::Value;
use skiff_api::go_emitted::ALWAYS_WRITTEN;

/// Objects of many kinds, as users write them: what the controllers make of them joins them.
const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shapes}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm, namespace: shapes}
data: {a: b}
---
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: shapes}
stringData: {a: b}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: sa, namespace: shapes}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shapes}
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shapes}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: busybox:latest}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: shapes}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: busybox:latest}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: shapes}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: agent, image: busybox:latest}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: once, namespace: shapes}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: once, image: busybox:latest}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly, namespace: shapes}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{name: nightly, image: busybox:latest}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shapes}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: shapes}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 3
  metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: shapes}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: shapes}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: [{kind: ServiceAccount, name: sa, namespace: shapes}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: shapes-aggregate}
aggregationRule:
  clusterRoleSelectors: [{matchLabels: {shapes: "yes"}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: shapes}
spec:
  podSelector: {}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shapes}
spec:
  defaultBackend: {service: {name: web, port: {number: 80}}}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: shapes-high}
value: 1000
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: shapes}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: LimitRange
metadata: {name: limits, namespace: shapes}
spec:
  limits: [{type: Container, default: {cpu: 100m}}]
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: quota, namespace: shapes}
spec:
  hard: {pods: "50"}
"#;

/// Definition name by group, version and kind, and every definition, from `/openapi/v2`.
struct Schemas {
    by_gvk: HashMap<(String, String, String), String>,
    definitions: serde_json::Map<String, Value>,
}

impl Schemas {
    fn load(c: &Cluster) -> Schemas {
        let doc: Value = serde_json::from_str(&c.k(&["get", "--raw", "/openapi/v2"])).expect("openapi");
        let definitions = doc["definitions"].as_object().cloned().unwrap_or_default();
        let mut by_gvk = HashMap::new();
        for (name, def) in &definitions {
            for gvk in def["x-kubernetes-group-version-kind"].as_array().into_iter().flatten() {
                let s = |k: &str| gvk[k].as_str().unwrap_or("").to_string();
                by_gvk.insert((s("group"), s("version"), s("kind")), name.clone());
            }
        }
        Schemas { by_gvk, definitions }
    }

    fn of(&self, obj: &Value) -> Option<&str> {
        let api_version = obj["apiVersion"].as_str()?;
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = obj["kind"].as_str()?.to_string();
        self.by_gvk
            .get(&(group.to_string(), version.to_string(), kind))
            .map(String::as_str)
    }
}

fn reference(schema: &Value) -> Option<&str> {
    schema["$ref"]
        .as_str()
        .or_else(|| schema["allOf"][0]["$ref"].as_str())
        .and_then(|r| r.strip_prefix("#/definitions/"))
}

/// Every always-written field missing from `v` (of definition `def`) and its parts, as
/// `Definition.field`.
fn missing(schemas: &Schemas, written: &HashMap<&str, Vec<&str>>, def: &str, v: &Value, out: &mut BTreeSet<String>) {
    let Value::Object(m) = v else { return };
    if let Some(fields) = written.get(def) {
        for f in fields {
            if !m.contains_key(*f) {
                out.insert(format!("{def}.{f}"));
            }
        }
    }
    let Some(props) = schemas.definitions.get(def).and_then(|d| d["properties"].as_object()) else {
        return;
    };
    for (k, child) in m {
        let Some(schema) = props.get(k) else { continue };
        if let Some(r) = reference(schema) {
            missing(schemas, written, r, child, out);
        } else if let Some(r) = reference(&schema["items"]) {
            for item in child.as_array().into_iter().flatten() {
                missing(schemas, written, r, item, out);
            }
        } else if let Some(r) = reference(&schema["additionalProperties"]) {
            for value in child.as_object().into_iter().flat_map(|o| o.values()) {
                missing(schemas, written, r, value, out);
            }
        }
    }
}

#[test]
fn every_object_has_the_fields_upstreams_go_types_always_write() {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "2"]);
    let ready = eventually(Duration::from_secs(30), || {
        (c.k(&["get", "nodes"]).matches(" Ready ").count() == 2).then_some(())
    });
    assert!(ready.is_some(), "{}", c.k(&["get", "nodes"]));
    let schemas = Schemas::load(&c);
    let written: HashMap<&str, Vec<&str>> = ALWAYS_WRITTEN
        .iter()
        .map(|(def, fields)| (*def, fields.iter().map(|(f, _)| *f).collect()))
        .collect();

    // As created: the answers kubectl prints.
    let created = c.stdin_kubectl(&["create", "-f", "-", "-o", "json"], MANIFESTS);
    let mut gaps = BTreeSet::new();
    let mut seen = 0;
    let mut check = |obj: &Value, gaps: &mut BTreeSet<String>| {
        if let Some(def) = schemas.of(obj) {
            seen += 1;
            missing(&schemas, &written, def, obj, gaps);
        }
    };
    // One JSON document per object.
    let answers: Vec<Value> = serde_json::Deserializer::from_str(&created)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .expect("created objects");
    assert_eq!(answers.len(), MANIFESTS.matches("\nkind: ").count(), "{created}");
    for obj in &answers {
        check(obj, &mut gaps);
    }
    // As listed, once the controllers have made their objects (pods, ReplicaSets, endpoints,
    // revisions, events, leases).
    let pods = eventually(Duration::from_secs(60), || {
        (c.k(&["get", "pods", "-n", "shapes", "-o", "name"]).lines().count() >= 5).then_some(())
    });
    assert!(pods.is_some(), "{}", c.k(&["get", "all", "-n", "shapes"]));
    let resources = c.k(&["api-resources", "--verbs=list", "-o", "name"]);
    let mut kinds = BTreeSet::new();
    for resource in resources
        .lines()
        .filter(|r| !r.ends_with("metrics.k8s.io") && !r.starts_with("componentstatuses"))
    {
        let listed: Value = serde_json::from_str(&c.k(&["get", resource, "-A", "-o", "json"])).expect("a list");
        for obj in listed["items"].as_array().into_iter().flatten() {
            kinds.insert(obj["kind"].as_str().unwrap_or("").to_string());
            check(obj, &mut gaps);
        }
    }
    assert!(seen > 200, "only {seen} objects checked");
    assert!(kinds.len() > 30, "only {} kinds had objects: {kinds:?}", kinds.len());
    assert!(
        gaps.is_empty(),
        "fields upstream always writes, missing:\n{}",
        gaps.into_iter().collect::<Vec<_>>().join("\n")
    );
}
