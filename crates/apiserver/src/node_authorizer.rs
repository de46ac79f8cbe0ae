//! Upstream's Node authorizer (`plugin/pkg/auth/authorizer/node`): a node (`system:node:NAME`
//! in `system:nodes`) reads only its own Node and Lease, the pods bound to it, and the
//! secrets, configmaps, claims, volumes and service account tokens those pods use. Every other
//! request of a node is held to the static rules of the `system:node` role.
//!
//! Upstream keeps a graph fed by informers; here the relationship is read from the store's
//! in-memory state at the moment of the request (the pods of the namespace, filtered on their
//! bytes before any is parsed), so it is never behind the write that created it.

use std::sync::LazyLock;

use serde_json::Value;
use skiff_rbac::{Attributes, Decision, PolicyRule};
use skiff_store::{ListOptions, Store};

use crate::tls::Identity;

const NODE_USER_PREFIX: &str = "system:node:";
const NODES_GROUP: &str = "system:nodes";

/// The node a caller is: `None` for callers that are not nodes, `Some("")` for a member of
/// `system:nodes` whose name does not say which node (upstream's `NodeIdentity`).
pub fn node_name(who: &Identity) -> Option<&str> {
    let name = who.user.strip_prefix(NODE_USER_PREFIX)?;
    who.groups.iter().any(|g| g == NODES_GROUP).then_some(name)
}

/// The rules every node has for what the authorizer does not subdivide (upstream's
/// `NodeRules()`, the rules of the `system:node` role).
static NODE_RULES: LazyLock<Vec<PolicyRule>> = LazyLock::new(|| {
    skiff_rbac::bootstrap::cluster_roles()
        .iter()
        .find(|r| r.pointer("/metadata/name").and_then(Value::as_str) == Some("system:node"))
        .and_then(|r| r.get("rules"))
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default()
});

type Verdict = (Decision, String);

fn no(reason: impl Into<String>) -> Verdict {
    (Decision::NoOpinion, reason.into())
}

fn allow() -> Verdict {
    (Decision::Allow, String::new())
}

/// What the object a node asks for is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Secret,
    ConfigMap,
    Claim,
    Volume,
    ServiceAccount,
}

/// The Node authorizer's decision on a request of node `node`.
pub async fn authorize(store: &dyn Store, node: &str, a: &Attributes) -> Verdict {
    if node.is_empty() {
        // The chain names the user (`unknown node for user "system:node:"`).
        return no("");
    }
    if a.resource_request {
        match (a.api_group.as_str(), a.resource.as_str()) {
            ("", "secrets") => return read_namespaced(store, node, Kind::Secret, a).await,
            ("", "configmaps") => return read_namespaced(store, node, Kind::ConfigMap, a).await,
            ("", "persistentvolumeclaims") if a.subresource == "status" => {
                if !matches!(a.verb.as_str(), "update" | "patch") {
                    return no("can only get/update/patch this type");
                }
                return related(store, node, Kind::Claim, a).await;
            }
            ("", "persistentvolumeclaims") => return get(store, node, Kind::Claim, a).await,
            ("", "persistentvolumes") => return get(store, node, Kind::Volume, a).await,
            ("", "serviceaccounts") => {
                if a.verb != "create" || a.name.is_empty() {
                    return no("can only create tokens for individual service accounts");
                }
                if a.subresource != "token" {
                    return no("can only create token subresource of serviceaccount");
                }
                if a.namespace == "kube-system"
                    && skiff_rbac::skiff_policy::NODE_COMPONENT_SERVICE_ACCOUNTS.contains(&a.name.as_str())
                {
                    // The agent's own parts; NodeRestriction binds their tokens to this Node.
                    return allow();
                }
                return related(store, node, Kind::ServiceAccount, a).await;
            }
            ("discovery.k8s.io", "endpointslices") => return dns_slice(node, a),
            ("coordination.k8s.io", "leases") => return lease(node, a),
            ("", "nodes") => return self_node(node, a),
            ("", "pods") => return pod(store, node, a).await,
            _ => {}
        }
    }
    if NODE_RULES.iter().any(|r| r.allows(a)) {
        return allow();
    }
    no("")
}

async fn read_namespaced(store: &dyn Store, node: &str, kind: Kind, a: &Attributes) -> Verdict {
    if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
        return no("can only read resources of this type");
    }
    if !a.subresource.is_empty() {
        return no("cannot read subresource");
    }
    if a.namespace.is_empty() {
        return no("can only read namespaced object of this type");
    }
    related(store, node, kind, a).await
}

async fn get(store: &dyn Store, node: &str, kind: Kind, a: &Attributes) -> Verdict {
    if a.verb != "get" {
        return no("can only get individual resources of this type");
    }
    if !a.subresource.is_empty() {
        return no("cannot get subresource");
    }
    related(store, node, kind, a).await
}

fn lease(node: &str, a: &Attributes) -> Verdict {
    if !matches!(a.verb.as_str(), "get" | "create" | "update" | "patch" | "delete") {
        return no("can only get, create, update, patch, or delete a node lease");
    }
    if a.namespace != "kube-node-lease" {
        return no("can only access leases in the \"kube-node-lease\" system namespace");
    }
    // The name of a create is checked by NodeRestriction, which sees the object.
    if a.verb != "create" && a.name != node {
        return no("can only access node lease with the same name as the requesting node");
    }
    allow()
}

/// Skiff's own rule: a node's agent answers cluster DNS and publishes where in the EndpointSlice
/// `kube-system/kube-dns-NODE`, which is the one slice it may read or write (NodeRestriction
/// checks the name of a create, and what the slice says).
fn dns_slice(node: &str, a: &Attributes) -> Verdict {
    if !matches!(a.verb.as_str(), "get" | "create" | "update" | "patch" | "delete") || !a.subresource.is_empty() {
        return no("can only get, create, update, patch, or delete its own cluster DNS EndpointSlice");
    }
    if a.namespace != "kube-system" {
        return no("can only access endpointslices in the \"kube-system\" system namespace");
    }
    if a.verb != "create" && a.name != format!("kube-dns-{node}") {
        return no(format!("can only access the endpointslice kube-dns-{node}"));
    }
    allow()
}

fn self_node(node: &str, a: &Attributes) -> Verdict {
    match (a.subresource.as_str(), a.verb.as_str()) {
        // NodeRestriction limits a node to its own object.
        ("", "create" | "update" | "patch") | ("status", "update" | "patch") => allow(),
        ("", "get" | "list" | "watch") => match a.name.as_str() {
            n if n == node => allow(),
            "" => no(format!("node '{node}' cannot read all nodes, only its own Node object")),
            other => no(format!("node '{node}' cannot read '{other}', only its own Node object")),
        },
        _ => no(""),
    }
}

async fn pod(store: &dyn Store, node: &str, a: &Attributes) -> Verdict {
    match (a.subresource.as_str(), a.verb.as_str()) {
        ("", "get") => get(store, node, Kind::Pod, a).await,
        ("", "list" | "watch") => {
            if crate::request::field_value(&a.field_selector, "spec.nodeName") == Some(node) {
                return allow();
            }
            if !a.name.is_empty() {
                return related(store, node, Kind::Pod, a).await;
            }
            no("can only list/watch pods with spec.nodeName field selector")
        }
        // Mirror pods, their statuses and evictions: NodeRestriction limits them to the node's pods.
        ("", "create" | "delete") | ("status", "update" | "patch") | ("eviction", "create") => allow(),
        _ => no(""),
    }
}

async fn related(store: &dyn Store, node: &str, kind: Kind, a: &Attributes) -> Verdict {
    if a.name.is_empty() {
        return no("No Object name found");
    }
    match has_path(store, node, kind, &a.namespace, &a.name).await {
        Ok(true) => allow(),
        Ok(false) => no(format!("no relationship found between node '{node}' and this object")),
        Err(e) => {
            tracing::warn!(error = %e, node, "reading the node authorizer's relationships failed");
            no(format!("no relationship found between node '{node}' and this object"))
        }
    }
}

/// The pods bound to `node` in `namespace` (every namespace when empty), filtered on their
/// stored bytes before they are parsed.
async fn node_pods(store: &dyn Store, node: &str, namespace: &str) -> anyhow::Result<Vec<Value>> {
    let prefix = if namespace.is_empty() {
        "/registry/pods/".to_string()
    } else {
        format!("/registry/pods/{namespace}/")
    };
    let needle = format!("\"nodeName\":{}", serde_json::to_string(node)?);
    let listed = store.list(&prefix, ListOptions::default()).await?;
    Ok(listed
        .items
        .iter()
        .filter(|kv| memchr_find(&kv.value, needle.as_bytes()))
        .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
        .collect())
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn has_path(store: &dyn Store, node: &str, kind: Kind, namespace: &str, name: &str) -> anyhow::Result<bool> {
    if kind == Kind::Volume {
        // node <- pod <- claim <- volume
        for pod in node_pods(store, node, "").await? {
            let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
            for claim in references(&pod, Kind::Claim) {
                let key = format!("/registry/persistentvolumeclaims/{ns}/{claim}");
                let Some(kv) = store.get(&key).await? else { continue };
                let pvc: Value = serde_json::from_slice(&kv.value)?;
                if pvc.pointer("/spec/volumeName").and_then(Value::as_str) == Some(name) {
                    return Ok(true);
                }
            }
        }
        return Ok(false);
    }
    let pods = node_pods(store, node, namespace).await?;
    Ok(pods.iter().any(|pod| match kind {
        Kind::Pod => pod.pointer("/metadata/name").and_then(Value::as_str) == Some(name),
        _ => references(pod, kind).iter().any(|r| r == name),
    }))
}

/// The names of the objects of `kind` a pod uses, as upstream's `VisitPodSecretNames`,
/// `VisitPodConfigmapNames` and the graph's claim and service account edges.
pub fn references(pod: &Value, kind: Kind) -> Vec<String> {
    let mut out = Vec::new();
    let spec = &pod["spec"];
    let mut push = |v: Option<&Value>| {
        if let Some(s) = v.and_then(Value::as_str).filter(|s| !s.is_empty()) {
            out.push(s.to_string());
        }
    };
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten());
    let volumes = spec["volumes"].as_array().into_iter().flatten();
    match kind {
        Kind::ServiceAccount => push(spec.get("serviceAccountName")),
        Kind::Secret => {
            for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
                push(s.get("name"));
            }
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    push(e.pointer("/valueFrom/secretKeyRef/name"));
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    push(e.pointer("/secretRef/name"));
                }
            }
            for v in volumes {
                push(v.pointer("/secret/secretName"));
                for source in v
                    .pointer("/projected/sources")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    push(source.pointer("/secret/name"));
                }
                for path in [
                    "/azureFile/secretName",
                    "/cephfs/secretRef/name",
                    "/cinder/secretRef/name",
                    "/flexVolume/secretRef/name",
                    "/rbd/secretRef/name",
                    "/scaleIO/secretRef/name",
                    "/iscsi/secretRef/name",
                    "/storageos/secretRef/name",
                    "/csi/nodePublishSecretRef/name",
                ] {
                    push(v.pointer(path));
                }
            }
        }
        Kind::ConfigMap => {
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    push(e.pointer("/valueFrom/configMapKeyRef/name"));
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    push(e.pointer("/configMapRef/name"));
                }
            }
            for v in volumes {
                push(v.pointer("/configMap/name"));
                for source in v
                    .pointer("/projected/sources")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    push(source.pointer("/configMap/name"));
                }
            }
        }
        Kind::Claim => {
            let pod_name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            for v in volumes {
                push(v.pointer("/persistentVolumeClaim/claimName"));
                if v.get("ephemeral").is_some()
                    && let Some(vol) = v.get("name").and_then(Value::as_str)
                {
                    push(Some(&Value::String(format!("{pod_name}-{vol}"))));
                }
            }
        }
        Kind::Pod | Kind::Volume => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skiff_store::MemoryStore;

    async fn put(store: &dyn Store, key: &str, v: Value) {
        store.create(key, serde_json::to_vec(&v).unwrap()).await.unwrap();
    }

    fn a(verb: &str, resource: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(verb, "", resource, ns, name)
    }

    #[test]
    fn node_identity() {
        assert_eq!(node_name(&Identity::new("system:node:n1", &[NODES_GROUP])), Some("n1"));
        assert_eq!(node_name(&Identity::new("system:node:n1", &[])), None);
        assert_eq!(node_name(&Identity::new("jane", &[NODES_GROUP])), None);
    }

    #[tokio::test]
    async fn nodes_read_what_their_pods_use() {
        let store = MemoryStore::new();
        let s = &*store;
        put(s, "/registry/pods/default/web", json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "n1", "serviceAccountName": "default",
                "containers": [{"name": "c", "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "p"}}}]}],
                "volumes": [{"name": "cfg", "configMap": {"name": "settings"}}, {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}})).await;
        put(
            s,
            "/registry/pods/default/other",
            json!({"metadata": {"name": "other", "namespace": "default"},
            "spec": {"nodeName": "n2", "containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "theirs"}}]}]}}),
        )
        .await;
        put(
            s,
            "/registry/persistentvolumeclaims/default/data",
            json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv1"}}),
        )
        .await;

        assert_eq!(
            authorize(s, "n1", &a("get", "secrets", "default", "db")).await.0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n1", &a("watch", "configmaps", "default", "settings"))
                .await
                .0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n1", &a("get", "secrets", "default", "theirs")).await,
            no("no relationship found between node 'n1' and this object")
        );
        assert_eq!(
            authorize(s, "n2", &a("get", "secrets", "default", "theirs")).await.0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n1", &a("list", "secrets", "default", "")).await,
            no("No Object name found")
        );
        assert_eq!(
            authorize(s, "n1", &a("delete", "secrets", "default", "db")).await,
            no("can only read resources of this type")
        );
        assert_eq!(
            authorize(s, "n1", &a("get", "persistentvolumeclaims", "default", "data"))
                .await
                .0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n1", &a("get", "persistentvolumes", "", "pv1")).await.0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n2", &a("get", "persistentvolumes", "", "pv1")).await.0,
            Decision::NoOpinion
        );
        let token = a("create", "serviceaccounts", "default", "default").with_subresource("token");
        assert_eq!(authorize(s, "n1", &token).await.0, Decision::Allow);
        assert_eq!(
            authorize(s, "n1", &a("get", "pods", "default", "web")).await.0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n1", &a("get", "pods", "default", "other")).await.0,
            Decision::NoOpinion
        );
    }

    #[tokio::test]
    async fn nodes_see_only_themselves() {
        let store = MemoryStore::new();
        let s = &*store;
        assert_eq!(
            authorize(s, "n1", &a("get", "nodes", "", "n1")).await.0,
            Decision::Allow
        );
        assert_eq!(
            authorize(s, "n1", &a("get", "nodes", "", "n2")).await,
            no("node 'n1' cannot read 'n2', only its own Node object")
        );
        assert_eq!(
            authorize(s, "n1", &a("list", "nodes", "", "")).await,
            no("node 'n1' cannot read all nodes, only its own Node object")
        );
        let mut list = a("list", "pods", "", "");
        assert_eq!(
            authorize(s, "n1", &list).await,
            no("can only list/watch pods with spec.nodeName field selector")
        );
        list.field_selector = "spec.nodeName=n1".into();
        assert_eq!(authorize(s, "n1", &list).await.0, Decision::Allow);
        let lease =
            |name: &str| Attributes::resource("update", "coordination.k8s.io", "leases", "kube-node-lease", name);
        assert_eq!(authorize(s, "n1", &lease("n1")).await.0, Decision::Allow);
        assert_eq!(
            authorize(s, "n1", &lease("n2")).await,
            no("can only access node lease with the same name as the requesting node")
        );
        // Not subdivided: the system:node role's rules.
        let event = Attributes::resource("create", "", "events", "default", "");
        assert_eq!(authorize(s, "n1", &event).await.0, Decision::Allow);
        let deploy = Attributes::resource("create", "apps", "deployments", "default", "");
        assert_eq!(authorize(s, "n1", &deploy).await, no(""));
    }
}
