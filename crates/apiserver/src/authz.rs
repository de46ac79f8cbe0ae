//! Authorization: what a request asks (upstream's `RequestInfo` turned into authorizer
//! attributes), the authorizer chain in upstream's order (`system:masters`, then RBAC), and
//! upstream's 403.
//!
//! RBAC decisions read one snapshot of every Role, ClusterRole and binding, indexed by subject.
//! The snapshot is rebuilt from the store and swapped after every RBAC write, before the write
//! is answered, so a grant or a revocation holds as soon as the client hears of it; every
//! replica also watches the RBAC objects ([`spawn_sync`]) and rebuilds on each change, so a
//! write through another replica holds here within moments. A replica that cannot bring its
//! snapshot up to date (the store is unhealthy, a rebuild failed) refuses what RBAC would
//! allow rather than answer from a stale grant, and says so in `/readyz`.

use std::sync::Arc;

use parking_lot::RwLock;
use serde_json::Value;
use skiff_api::StatusError;
use skiff_rbac::{Attributes, Decision, Objects, Policy};
use skiff_store::{ListOptions, Store};

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

/// Why RBAC refuses while its snapshot is not known current.
pub const STALE_REASON: &str = "RBAC: this API server could not bring its view of roles and bindings up to date";

/// The authorizer chain and the RBAC snapshot it reads.
pub struct Authorizer {
    policy: RwLock<Arc<Policy>>,
    /// Serializes rebuilds, so the snapshot swapped in last was read last.
    rebuild: tokio::sync::Mutex<()>,
    /// Why the snapshot is not known current (`None`: it is).
    stale: RwLock<Option<String>>,
}

impl Default for Authorizer {
    fn default() -> Self {
        Authorizer {
            policy: RwLock::new(Arc::new(Policy::default())),
            rebuild: tokio::sync::Mutex::new(()),
            stale: RwLock::new(None),
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

    /// Why the snapshot cannot be trusted, when it cannot (`/readyz` reports it).
    pub fn stale(&self) -> Option<String> {
        self.stale.read().clone()
    }

    fn set_stale(&self, why: Option<String>) {
        let mut stale = self.stale.write();
        match (&*stale, &why) {
            (None, Some(w)) => tracing::error!(reason = %w, "RBAC refuses until its snapshot is current again"),
            (Some(_), None) => tracing::info!("the RBAC snapshot is current again"),
            _ => {}
        }
        *stale = why;
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
        if self.stale.read().is_some() {
            // Fail closed: a grant this snapshot holds may have been revoked since.
            reasons.push(STALE_REASON.to_string());
            return (Decision::NoOpinion, reasons.join("\n"));
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

/// How often the sync checks the store's health and rebuilds without a change.
const SYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a snapshot that could not be brought up to date is still trusted: about as long as
/// a change takes to reach a replica anyway; a store that blinks (a member restarting) costs no
/// refusals, one that stays away does.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Keeps this replica's RBAC snapshot current: a rebuild after every change to a Role,
/// ClusterRole or binding (written through any replica: the store's watch brings it) and every
/// [`SYNC_PERIOD`]; once the store has been unhealthy, or rebuilds have failed, for
/// [`STALE_AFTER`], the authorizer refuses what only RBAC would allow until a rebuild succeeds.
pub fn spawn_sync(state: Arc<crate::ApiState>) {
    tokio::spawn(async move {
        let prefixes: Vec<String> = ["clusterroles", "roles", "clusterrolebindings", "rolebindings"]
            .iter()
            .filter_map(|p| rbac_resource(p).ok())
            .map(|r| crate::objects::prefix(r, ""))
            .collect();
        let mut triggers = crate::resync::Triggers::new(state.store.clone(), prefixes, SYNC_PERIOD, "RBAC");
        // The health check runs on its own clock too: a watch that cannot be set up again
        // (the store is away) holds `triggers` back.
        let mut tick = tokio::time::interval(SYNC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut current_at = std::time::Instant::now();
        loop {
            tokio::select! {
                _ = triggers.next() => {}
                _ = tick.tick() => {}
            }
            let failure = match state.store.health().await {
                Err(e) => Some(format!("the store is unhealthy: {e}")),
                Ok(_) => match state.authz.refresh(&*state.store).await {
                    Ok(()) => None,
                    Err(e) => Some(format!("rebuilding the snapshot failed: {e}")),
                },
            };
            match failure {
                None => {
                    current_at = std::time::Instant::now();
                    state.authz.set_stale(None);
                }
                Some(why) if current_at.elapsed() >= STALE_AFTER => state.authz.set_stale(Some(why)),
                Some(why) => tracing::warn!(reason = %why, "the RBAC snapshot could not be brought up to date"),
            }
        }
    });
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

    use http::Method;

    fn attrs(method: Method, uri: &str) -> Attributes {
        crate::request::parse(&method, uri, &Default::default())
            .expect("path")
            .attributes()
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
    async fn a_stale_snapshot_refuses_what_it_would_grant() {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = crate::ApiState::for_tests(dir.path());
        crate::bootstrap::reconcile(&state).await.unwrap();
        let (authz, store) = (&state.authz, &*state.store);
        let anyone = Identity::new("jane", &[AUTHENTICATED]);
        let version = Attributes::non_resource("get", "/version");
        assert!(authz.check(store, &anyone, &version).await.is_ok());
        authz.set_stale(Some("the store is unhealthy".into()));
        let e = authz.check(store, &anyone, &version).await.unwrap_err();
        assert!(e.message.ends_with(STALE_REASON), "{}", e.message);
        // Masters are not RBAC's to refuse.
        let root = Identity::new("root", &[MASTERS]);
        assert!(authz.check(store, &root, &version).await.is_ok());
        authz.set_stale(None);
        assert!(authz.check(store, &anyone, &version).await.is_ok());
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
