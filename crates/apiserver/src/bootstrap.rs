//! The bootstrap RBAC policy, reconciled at every start as upstream's
//! `poststarthook/rbac/bootstrap-roles`: missing roles and bindings are created, missing rules,
//! subjects, labels and annotations are added back, bindings whose roleRef changed are created
//! again, and objects annotated `rbac.authorization.kubernetes.io/autoupdate: "false"` are left
//! as they are. Nothing a user added is removed; what an earlier version granted and this one
//! no longer does is deleted by name (`skiff_policy::RETIRED`). The service accounts Skiff's
//! bindings name are created when missing.

use anyhow::Context;
use serde_json::{Value, json};
use skiff_rbac::bootstrap::{self as policy, Reconcile};
use skiff_store::StoreError;

use crate::ApiState;
use crate::objects;

/// Reconciles every bootstrap role and binding, then loads the authorizer's snapshot.
pub async fn reconcile(state: &ApiState) -> anyhow::Result<()> {
    let roles = policy::cluster_roles()
        .into_iter()
        .chain(skiff_rbac::skiff_policy::cluster_roles())
        .map(|r| ("clusterroles", r))
        .chain(policy::roles().into_iter().map(|r| ("roles", r)))
        .chain(skiff_rbac::skiff_policy::roles().into_iter().map(|r| ("roles", r)));
    for (plural, expected) in roles {
        reconcile_one(state, plural, &expected, policy::reconcile_role).await?;
    }
    let bindings = policy::cluster_role_bindings()
        .into_iter()
        .chain(skiff_rbac::skiff_policy::cluster_role_bindings())
        .map(|b| ("clusterrolebindings", b))
        .chain(policy::role_bindings().into_iter().map(|b| ("rolebindings", b)))
        .chain(
            skiff_rbac::skiff_policy::role_bindings()
                .into_iter()
                .map(|b| ("rolebindings", b)),
        );
    for (plural, expected) in bindings {
        reconcile_one(state, plural, &expected, policy::reconcile_binding).await?;
    }
    for (plural, name) in skiff_rbac::skiff_policy::RETIRED {
        retire(state, plural, name).await?;
    }
    for name in skiff_rbac::skiff_policy::NODE_COMPONENT_SERVICE_ACCOUNTS {
        ensure_service_account(state, name).await?;
    }
    state.authz.refresh(&*state.store).await
}

/// Creates the service account `kube-system/NAME` a binding above names, when missing: node
/// agents ask for its tokens (as kubeadm creates `kube-system/kube-proxy` for kube-proxy).
async fn ensure_service_account(state: &ApiState, name: &str) -> anyhow::Result<()> {
    let res = skiff_api::registry::lookup("", "v1", "serviceaccounts").context("serviceaccounts")?;
    let key = objects::key(res, "kube-system", name);
    if state.store.get(&key).await?.is_some() {
        return Ok(());
    }
    let sa = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "kube-system"},
    });
    create(state, &key, sa).await
}

/// Deletes a bootstrap object an earlier version made and this one no longer wants, unless it
/// is not Skiff's (no bootstrapping label) or its `autoupdate` annotation says `"false"`.
async fn retire(state: &ApiState, plural: &str, name: &str) -> anyhow::Result<()> {
    let res = crate::authz::rbac_resource(plural)?;
    let key = objects::key(res, "", name);
    let Some(kv) = state.store.get(&key).await? else {
        return Ok(());
    };
    let Some(obj) = objects::decode_kv(&kv) else {
        return Ok(());
    };
    let ours = obj
        .pointer("/metadata/labels/kubernetes.io~1bootstrapping")
        .and_then(Value::as_str)
        == Some("rbac-defaults");
    let kept = obj
        .pointer("/metadata/annotations/rbac.authorization.kubernetes.io~1autoupdate")
        .and_then(Value::as_str)
        == Some("false");
    if !ours || kept {
        return Ok(());
    }
    tracing::info!(key, "deleting a retired bootstrap RBAC object");
    match state.store.delete(&key, Some(kv.mod_revision)).await {
        Ok(_) | Err(StoreError::NotFound(_)) | Err(StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reconcile_one(
    state: &ApiState,
    plural: &str,
    expected: &Value,
    decide: fn(Option<&Value>, &Value) -> Reconcile,
) -> anyhow::Result<()> {
    let res = crate::authz::rbac_resource(plural)?;
    let key = objects::key(res, objects::namespace(expected), objects::name(expected));
    let current = state.store.get(&key).await?;
    let existing = current.as_ref().and_then(objects::decode_kv);
    match decide(existing.as_ref(), expected) {
        Reconcile::Unchanged => Ok(()),
        Reconcile::Create(obj) => create(state, &key, obj).await,
        Reconcile::Update(obj) => {
            let rev = current.map(|kv| kv.mod_revision).unwrap_or_default();
            tracing::info!(key, "updating a bootstrap RBAC object");
            match state.store.update(&key, objects::encode_for_store(&obj), rev).await {
                // Changed meanwhile by a client: its version stands until the next start.
                Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound(_)) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Reconcile::Recreate(obj) => {
            tracing::info!(key, "recreating a bootstrap RBAC binding whose roleRef changed");
            let rev = current.map(|kv| kv.mod_revision);
            match state.store.delete(&key, rev).await {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            create(state, &key, obj).await
        }
    }
}

async fn create(state: &ApiState, key: &str, mut obj: Value) -> anyhow::Result<()> {
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        md.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
    }
    match state.store.create(key, objects::encode_for_store(&obj)).await {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, labels: Value, annotations: Value) -> Value {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:nodes"}],
        })
    }

    /// An earlier version's grant to every node goes at the next start; an object of the same
    /// name that is not Skiff's, or that its owner froze, stays.
    #[tokio::test]
    async fn retired_bootstrap_objects_are_deleted_unless_someone_else_owns_them() {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = crate::ApiState::for_tests(dir.path());
        let ours = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
        let key = |plural: &str, name: &str| objects::key(crate::authz::rbac_resource(plural).unwrap(), "", name);
        let write = |k: String, v: Value| {
            let store = state.store.clone();
            async move { store.create(&k, objects::encode_for_store(&v)).await.unwrap() }
        };
        write(
            key("clusterrolebindings", "skiff:node"),
            binding(
                "skiff:node",
                ours.clone(),
                json!({"rbac.authorization.kubernetes.io/autoupdate": "true"}),
            ),
        )
        .await;
        write(
            key("clusterrolebindings", "skiff:local-path-provisioner"),
            binding("skiff:local-path-provisioner", json!({}), json!({})),
        )
        .await;
        write(
            key("clusterroles", "skiff:node"),
            binding(
                "skiff:node",
                ours,
                json!({"rbac.authorization.kubernetes.io/autoupdate": "false"}),
            ),
        )
        .await;
        reconcile(&state).await.unwrap();
        let exists = |k: String| {
            let store = state.store.clone();
            async move { store.get(&k).await.unwrap().is_some() }
        };
        assert!(!exists(key("clusterrolebindings", "skiff:node")).await);
        assert!(exists(key("clusterrolebindings", "skiff:local-path-provisioner")).await);
        assert!(exists(key("clusterroles", "skiff:node")).await);
        assert!(exists(key("clusterrolebindings", "skiff:node:network")).await);
        for name in skiff_rbac::skiff_policy::NODE_COMPONENT_SERVICE_ACCOUNTS {
            assert!(exists(format!("/registry/serviceaccounts/kube-system/{name}")).await);
        }
    }
}
