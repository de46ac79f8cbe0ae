//! Authorization: what a request asks (upstream's `RequestInfo` turned into authorizer
//! attributes), the authorizer chain in upstream's order (`system:masters`, then RBAC), and
//! upstream's 403.
//!
//! RBAC decisions read one snapshot of every Role, ClusterRole and binding, indexed by subject.
//! The snapshot is rebuilt from the store and swapped after every RBAC write, before the write
//! is answered, so a grant or a revocation holds as soon as the client hears of it.

use std::sync::Arc;

use http::Method;
use parking_lot::RwLock;
use serde_json::Value;
use skiff_api::StatusError;
use skiff_rbac::{Attributes, Decision, Objects, Policy};
use skiff_store::{ListOptions, Store};

use crate::handlers::Params;
use crate::node_authorizer;
use crate::tls::Identity;

/// The group whose members may do everything, before any authorizer is asked.
pub const MASTERS: &str = "system:masters";
/// Every authenticated user's group.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The user and group of a request without credentials.
pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// The API group of RBAC.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// An RBAC resource of the registry (`roles`, `clusterroles`, `rolebindings`, `clusterrolebindings`).
pub fn rbac_resource(plural: &str) -> anyhow::Result<&'static skiff_api::Resource> {
    skiff_api::registry::lookup(RBAC_GROUP, "v1", plural)
        .ok_or_else(|| anyhow::anyhow!("the registry has no {plural}.{RBAC_GROUP}"))
}

/// Subresources of a namespace (`/api/v1/namespaces/NAME/SUB`), not resources inside it.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// The authorizer attributes of a request, as upstream's `RequestInfoFactory`: resource
/// requests are `/api/VERSION/...` and `/apis/GROUP/VERSION/...`; every other path is a
/// non-resource request whose verb is the lower-case method.
pub fn attributes(method: &Method, path: &str, params: &Params) -> Attributes {
    let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let non_resource = || Attributes::non_resource(&method.as_str().to_ascii_lowercase(), path);
    if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
        return non_resource();
    }
    let mut rest = &parts[1..];
    let mut a = Attributes {
        resource_request: true,
        path: path.to_string(),
        ..Default::default()
    };
    if parts[0] == "apis" {
        if rest.len() < 3 {
            return non_resource();
        }
        a.api_group = rest[0].to_string();
        rest = &rest[1..];
    }
    a.api_version = rest[0].to_string();
    rest = &rest[1..];
    if matches!(rest.first(), Some(&"watch") | Some(&"proxy")) {
        if rest.len() < 2 {
            // Upstream cannot tell the resource either; nothing will match it.
            a.verb = rest[0].to_string();
            return a;
        }
        a.verb = rest[0].to_string();
        rest = &rest[1..];
    } else {
        a.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
    }
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        a.namespace = rest[1].to_string();
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
    }
    if let Some(r) = rest.first() {
        a.resource = r.to_string();
    }
    if let Some(n) = rest.get(1) {
        a.name = n.to_string();
    }
    if let Some(s) = rest.get(2)
        && a.verb != "proxy"
    {
        a.subresource = s.to_string();
    }
    if let Some(f) = params.get("fieldSelector") {
        a.field_selector = f.clone();
    }
    if a.name.is_empty() && a.verb == "get" {
        a.verb = if params.get("watch").is_some_and(|w| is_true(w)) {
            "watch".into()
        } else {
            "list".into()
        };
        // `kubectl get pod NAME -w` lists with `metadata.name=NAME`: authorized as that name.
        if let Some(name) = params.get("fieldSelector").and_then(|f| exact_name(f)) {
            a.name = name.to_string();
        }
    }
    if a.name.is_empty() && a.verb == "delete" {
        a.verb = "deletecollection".into();
    }
    a
}

/// A boolean query parameter's truth, as upstream's parameter codec reads it.
pub fn is_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The value a field selector requires `field` to equal (`field=x` or `field==x`).
pub fn field_value<'a>(selector: &'a str, field: &str) -> Option<&'a str> {
    selector.split(',').find_map(|term| {
        let v = term.trim().strip_prefix(field)?;
        v.strip_prefix("==").or_else(|| v.strip_prefix('='))
    })
}

/// The name a field selector requires exactly, when it is a valid path segment.
fn exact_name(selector: &str) -> Option<&str> {
    field_value(selector, "metadata.name")
        .filter(|v| !v.is_empty() && !v.contains('/') && *v != "." && *v != ".." && !v.contains('%'))
}

/// Upstream's `forbiddenMessage` with the authorizers' reason appended.
pub fn forbidden(who: &Identity, a: &Attributes, reason: &str) -> StatusError {
    let mut msg = if !a.resource_request {
        format!("User {:?} cannot {} path {:?}", who.user, a.verb, a.path)
    } else if !a.namespace.is_empty() {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
            who.user,
            a.verb,
            a.combined_resource(),
            a.api_group,
            a.namespace
        )
    } else {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
            who.user,
            a.verb,
            a.combined_resource(),
            a.api_group
        )
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    StatusError::forbidden_resource(&a.api_group, &a.resource, &a.name, &msg)
}

/// The authorizer chain and the RBAC snapshot it reads.
pub struct Authorizer {
    policy: RwLock<Arc<Policy>>,
    /// Serializes rebuilds, so the snapshot swapped in last was read last.
    rebuild: tokio::sync::Mutex<()>,
}

impl Default for Authorizer {
    fn default() -> Self {
        Authorizer {
            policy: RwLock::new(Arc::new(Policy::default())),
            rebuild: tokio::sync::Mutex::new(()),
        }
    }
}

impl Authorizer {
    /// Reads every Role, ClusterRole and binding from the store and swaps in a new snapshot.
    pub async fn refresh(&self, store: &dyn Store) -> anyhow::Result<()> {
        let _serial = self.rebuild.lock().await;
        let mut lists: Vec<Vec<Value>> = Vec::with_capacity(4);
        for plural in ["clusterroles", "roles", "clusterrolebindings", "rolebindings"] {
            let prefix = crate::objects::prefix(rbac_resource(plural)?, "");
            let listed = store.list(&prefix, ListOptions::default()).await?;
            lists.push(
                listed
                    .items
                    .iter()
                    .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
                    .collect(),
            );
        }
        let policy = Policy::build(&Objects {
            cluster_roles: lists[0].iter().collect(),
            roles: lists[1].iter().collect(),
            cluster_role_bindings: lists[2].iter().collect(),
            role_bindings: lists[3].iter().collect(),
        });
        *self.policy.write() = Arc::new(policy);
        Ok(())
    }

    /// The current RBAC snapshot.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().clone()
    }

    /// Upstream's chain: members of `system:masters` may do everything; then the Node
    /// authorizer for nodes; then RBAC. The reason is what the authorizers said: which binding
    /// allowed, or why a node has no relationship to the object, or which role is missing.
    pub async fn authorize(&self, store: &dyn Store, who: &Identity, a: &Attributes) -> (Decision, String) {
        if who.groups.iter().any(|g| g == MASTERS) {
            return (Decision::Allow, String::new());
        }
        let mut reasons = Vec::new();
        if let Some(node) = node_authorizer::node_name(who) {
            let (decision, reason) = node_authorizer::authorize(store, node, a).await;
            if decision == Decision::Allow {
                return (decision, reason);
            }
            if node.is_empty() {
                reasons.push(format!("unknown node for user {:?}", who.user));
            } else if !reason.is_empty() {
                reasons.push(reason);
            }
        }
        let (decision, reason) = self.policy().authorize(who, a);
        if decision == Decision::Allow {
            return (decision, reason);
        }
        if !reason.is_empty() {
            reasons.push(reason);
        }
        (Decision::NoOpinion, reasons.join("\n"))
    }

    /// `Ok` when the chain allows the request, else upstream's 403.
    pub async fn check(&self, store: &dyn Store, who: &Identity, a: &Attributes) -> Result<(), StatusError> {
        match self.authorize(store, who, a).await {
            (Decision::Allow, _) => Ok(()),
            (_, reason) => Err(forbidden(who, a, &reason)),
        }
    }
}

/// A GET of a pod's exec, attach or port-forward: a WebSocket upgrade into the pod.
pub fn is_stream_upgrade(a: &Attributes) -> bool {
    a.verb == "get"
        && a.api_group.is_empty()
        && a.resource == "pods"
        && matches!(a.subresource.as_str(), "exec" | "attach" | "portforward")
}

/// Whether a write to this resource changes what RBAC allows.
pub fn is_rbac(group: &str, plural: &str) -> bool {
    group == RBAC_GROUP
        && matches!(
            plural,
            "roles" | "clusterroles" | "rolebindings" | "clusterrolebindings"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: Method, uri: &str) -> Attributes {
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let params: Params = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        attributes(&method, path, &params)
    }

    #[test]
    fn request_info_as_upstream() {
        let a = attrs(Method::GET, "/api/v1/namespaces/default/pods");
        assert_eq!(
            (
                a.verb.as_str(),
                a.resource.as_str(),
                a.namespace.as_str(),
                a.resource_request
            ),
            ("list", "pods", "default", true)
        );
        let a = attrs(Method::GET, "/api/v1/namespaces/default/pods?watch=true");
        assert_eq!(a.verb, "watch");
        let a = attrs(Method::GET, "/api/v1/watch/namespaces/default/pods/web");
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "web"));
        let a = attrs(
            Method::GET,
            "/api/v1/namespaces/default/pods?fieldSelector=metadata.name%3Dweb",
        );
        // The handler decodes the query; this test passes it decoded.
        assert_eq!(a.name, "");
        let a = attrs(
            Method::GET,
            "/api/v1/namespaces/default/pods?fieldSelector=metadata.name=web&watch=1",
        );
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "web"));
        let a = attrs(Method::POST, "/api/v1/namespaces/default/pods/web/exec");
        assert_eq!(
            (a.verb.as_str(), a.combined_resource().as_str(), a.name.as_str()),
            ("create", "pods/exec", "web")
        );
        let a = attrs(Method::DELETE, "/apis/apps/v1/namespaces/default/deployments");
        assert_eq!(
            (a.verb.as_str(), a.api_group.as_str(), a.api_version.as_str()),
            ("deletecollection", "apps", "v1")
        );
        let a = attrs(Method::GET, "/api/v1/namespaces/kube-system");
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.namespace.as_str()),
            ("namespaces", "kube-system", "kube-system")
        );
        let a = attrs(Method::PUT, "/api/v1/namespaces/gone/finalize");
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("namespaces", "gone", "finalize")
        );
        let a = attrs(Method::GET, "/api/v1/nodes");
        assert_eq!((a.verb.as_str(), a.namespace.as_str()), ("list", ""));
        for p in [
            "/api",
            "/apis",
            "/apis/apps",
            "/api/v1",
            "/healthz",
            "/openapi/v3",
            "/version",
        ] {
            let a = attrs(Method::GET, p);
            assert!(!a.resource_request, "{p}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", p));
        }
    }

    #[test]
    fn forbidden_in_upstream_words() {
        let jane = Identity::new("jane", &[AUTHENTICATED]);
        let e = forbidden(&jane, &attrs(Method::GET, "/api/v1/namespaces/default/pods"), "");
        assert_eq!(e.code, 403);
        assert_eq!(e.reason, "Forbidden");
        assert_eq!(
            e.message,
            "pods is forbidden: User \"jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let e = forbidden(&jane, &attrs(Method::GET, "/apis/apps/v1/deployments"), "");
        assert_eq!(
            e.message,
            "deployments.apps is forbidden: User \"jane\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
        );
        let e = forbidden(
            &jane,
            &attrs(Method::GET, "/api/v1/namespaces/default/pods/web/log"),
            "RBAC: x",
        );
        assert_eq!(
            e.message,
            "pods \"web\" is forbidden: User \"jane\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"default\": RBAC: x"
        );
        let e = forbidden(&jane, &attrs(Method::GET, "/metrics"), "");
        assert_eq!(e.message, "forbidden: User \"jane\" cannot get path \"/metrics\"");
    }

    #[tokio::test]
    async fn masters_skip_rbac() {
        let authz = Authorizer::default();
        let store = skiff_store::MemoryStore::new();
        let root = Identity::new("root", &[MASTERS]);
        let delete = attrs(Method::DELETE, "/api/v1/nodes/n1");
        assert!(authz.check(&*store, &root, &delete).await.is_ok());
        let jane = Identity::new("jane", &[AUTHENTICATED]);
        assert_eq!(authz.check(&*store, &jane, &delete).await.unwrap_err().code, 403);
        // A node's reason comes first.
        let n1 = Identity::new("system:node:n1", &["system:nodes", AUTHENTICATED]);
        let e = authz
            .check(
                &*store,
                &n1,
                &attrs(Method::GET, "/api/v1/namespaces/default/secrets/s"),
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.message,
            "secrets \"s\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
        );
    }
}
