//! Real inputs the mutators start from: objects as `kubectl create -f` / `apply` send them, the
//! patches kubectl's commands send (label, scale, cordon, taint, rollout restart and undo,
//! apply), selectors and quantities in the forms clients write.

use serde_json::{Value, json};

/// `(plural, namespaced, object)`: one valid object of each kind the request-path targets write.
pub fn objects() -> Vec<(&'static str, bool, Value)> {
    vec![
        (
            "configmaps",
            true,
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "labels": {"app": "web"}, "annotations": {"a": "b"}},
                "data": {"key": "value", "other.txt": "line\n"}
            }),
        ),
        (
            "secrets",
            true,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s"}, "type": "Opaque",
                "data": {"password": "aHVudGVyMg=="}, "stringData": {"user": "admin"}
            }),
        ),
        (
            "pods",
            true,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "labels": {"app": "web", "tier": "fe"}},
                "spec": {
                    "containers": [{
                        "name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                        "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}],
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 5}
                    }],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                    "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                    "nodeSelector": {"disk": "ssd"},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                    ]}}}
                }
            }),
        ),
        (
            "deployments",
            true,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "d", "labels": {"app": "web"}},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                    "template": {
                        "metadata": {"labels": {"app": "web", "tier": "fe"}},
                        "spec": {"containers": [{"name": "c", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}]}
                    }
                }
            }),
        ),
        (
            "services",
            true,
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "svc"},
                "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}], "type": "ClusterIP"}
            }),
        ),
        (
            "cronjobs",
            true,
            json!({
                "apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": "cj"},
                "spec": {"schedule": "*/5 * * * *", "concurrencyPolicy": "Forbid", "jobTemplate": {"spec": {"template": {"spec": {
                    "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox", "command": ["date"]}]
                }}}}}
            }),
        ),
        (
            "roles",
            true,
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "r"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
            }),
        ),
        (
            "nodes",
            false,
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
                "spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]},
                "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}, "allocatable": {"cpu": "3800m", "memory": "7Gi", "pods": "110"}}
            }),
        ),
    ]
}

/// `(content type, body)`: patches as kubectl's commands send them.
pub fn patches() -> Vec<(&'static str, Value)> {
    let smp = "application/strategic-merge-patch+json";
    let merge = "application/merge-patch+json";
    let json = "application/json-patch+json";
    vec![
        (merge, json!({"metadata": {"labels": {"k": "v", "app": null}}})),
        (merge, json!({"spec": {"replicas": 4}})),
        (merge, json!({"data": {"key": null, "new": "x"}})),
        (smp, json!({"spec": {"unschedulable": true}})),
        (
            smp,
            json!({"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}}),
        ),
        (
            smp,
            json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2024-01-01T00:00:00Z"}}}}}),
        ),
        (
            smp,
            json!({
                "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
                "spec": {
                    "$setElementOrder/containers": [{"name": "c"}],
                    "containers": [{"name": "c", "image": "busybox:1.37", "$setElementOrder/env": [{"name": "A"}], "env": [{"name": "A", "value": "2"}]}],
                    "$retainKeys": ["containers"]
                }
            }),
        ),
        (
            smp,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "$patch": "delete"}]}}}}),
        ),
        (
            smp,
            json!({"spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
        ),
        (
            smp,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["b"]}}),
        ),
        (
            json,
            json!([
                {"op": "replace", "path": "/spec/template", "value": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
                {"op": "replace", "path": "/metadata/annotations", "value": {"deployment.kubernetes.io/revision": "1"}}
            ]),
        ),
        (
            json,
            json!([
                {"op": "test", "path": "/metadata/name", "value": "p"},
                {"op": "add", "path": "/metadata/labels/new~1key", "value": "x"},
                {"op": "remove", "path": "/metadata/labels/app"},
                {"op": "copy", "from": "/metadata/name", "path": "/metadata/annotations"},
                {"op": "move", "from": "/metadata/labels", "path": "/metadata/annotations"},
                {"op": "add", "path": "/spec/containers/-", "value": {"name": "d", "image": "x"}}
            ]),
        ),
    ]
}

/// Label selectors as clients write them (`-l`, `matchLabels` rendered by client-go).
pub const LABEL_SELECTORS: &[&str] = &[
    "",
    "app=web",
    "app==web,tier!=db",
    "app in (web, api),!legacy",
    "env notin (prod),track",
    "example.com/part-of=x",
    "a=,b",
    "app.kubernetes.io/name in (a,b,c)",
    "!a,!b,c!=d",
];

/// Field selectors kubectl and controllers send.
pub const FIELD_SELECTORS: &[&str] = &[
    "",
    "metadata.name=p",
    "spec.nodeName=n1,status.phase!=Succeeded",
    "metadata.namespace==default",
    "involvedObject.name=p,involvedObject.namespace=default,involvedObject.uid=1234,involvedObject.kind=Pod",
    "spec.nodeName=",
    "metadata.name=a\\,b",
    "type=kubernetes.io/service-account-token",
];

/// Quantities in every notation upstream accepts.
pub const QUANTITIES: &[&str] = &[
    "0",
    "1",
    "100m",
    "1.5",
    "64Mi",
    "1Gi",
    "2e3",
    "1E-3",
    "0.1",
    "-1",
    "+5k",
    "12Ei",
    "1n",
    "500u",
    "9223372036854775807",
    ".5",
    "5.",
    "1e18",
    "3800m",
    "110",
];
